"""SQL for the `steps` table (the step projection) and its row mapping.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Step
from rebuno.kernel.store.base import StepKey
from rebuno.kernel.store.sqlite.errors import refusals
from rebuno.kernel.store.sqlite.timestamps import from_micros_or_none, to_micros_or_none
from rebuno.protocol.enums import Idempotency, StepKind, StepStatus

COLUMNS = (
    "step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency, args,"
    " result, error, usage_input, usage_output, proposed_seq, started_at, completed_at"
)
_TERMINAL = ("succeeded", "failed", "denied", "cancelled")
# A step list: `COLUMNS` with each payload over the limit (the first three `?`) left out, and
# then the three sizes, in bytes of UTF-8.
_LISTED = (
    "step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency,"
    " CASE WHEN length(CAST(args AS BLOB)) > ? THEN NULL ELSE args END,"
    " CASE WHEN length(CAST(result AS BLOB)) > ? THEN NULL ELSE result END,"
    " CASE WHEN length(CAST(error AS BLOB)) > ? THEN NULL ELSE error END,"
    " usage_input, usage_output, proposed_seq, started_at, completed_at,"
    " length(CAST(args AS BLOB)), length(CAST(result AS BLOB)), length(CAST(error AS BLOB))"
)
_WIDTH = 16
_PAYLOADS = ("args", "result", "error")
_WHOLE = 2**63 - 1
"""A limit no payload reaches: the use cases' own reads get every step whole."""


def to_record(row: tuple[Any, ...]) -> Step:
    return Step(
        step_id=row[0],
        execution_id=row[1],
        kind=StepKind(row[2]),
        target=row[3],
        args_hash=row[4],
        occurrence=row[5],
        status=StepStatus(row[6]),
        idempotency=Idempotency(row[7]),
        args=row[8],
        result=row[9],
        error=row[10],
        usage_input=row[11],
        usage_output=row[12],
        proposed_seq=row[13],
        started_at=from_micros_or_none(row[14]),
        completed_at=from_micros_or_none(row[15]),
    )


def find(conn: sqlite3.Connection, step_id: str) -> Step | None:
    row = conn.execute(f"SELECT {COLUMNS} FROM steps WHERE step_id = ?", (step_id,)).fetchone()
    return None if row is None else to_record(row)


def find_many(conn: sqlite3.Connection, execution_id: str, step_ids: Sequence[str]) -> list[Step]:
    marks = ", ".join("?" * len(step_ids))
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM steps WHERE execution_id = ? AND step_id IN ({marks})",
        (execution_id, *step_ids),
    ).fetchall()
    return [to_record(row) for row in rows]


def insert(conn: sqlite3.Connection, step: Step) -> None:
    with refusals(f"step {step.step_id}"):
        conn.execute(
            f"""INSERT INTO steps ({COLUMNS})
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (
                step.step_id,
                step.execution_id,
                step.kind.value,
                step.target,
                step.args_hash,
                step.occurrence,
                step.status.value,
                step.idempotency.value,
                step.args,
                step.result,
                step.error,
                step.usage_input,
                step.usage_output,
                step.proposed_seq,
                to_micros_or_none(step.started_at),
                to_micros_or_none(step.completed_at),
            ),
        )


def update(conn: sqlite3.Connection, step: Step) -> None:
    with refusals(f"step {step.step_id}"):
        cursor = conn.execute(
            """UPDATE steps SET status = ?, result = ?, error = ?, usage_input = ?,
                   usage_output = ?, started_at = ?, completed_at = ?
               WHERE step_id = ?""",
            (
                step.status.value,
                step.result,
                step.error,
                step.usage_input,
                step.usage_output,
                to_micros_or_none(step.started_at),
                to_micros_or_none(step.completed_at),
                step.step_id,
            ),
        )
    if cursor.rowcount == 0:
        raise NotFound(f"step {step.step_id} not found")


def list_for(
    conn: sqlite3.Connection, execution_id: str, status: str | None, payload_limit: int = _WHOLE
) -> list[Step]:
    """`status`: None for all, `terminal`, or one step status name; in proposal order."""
    if status is None:
        statuses: tuple[str, ...] = ()
    elif status == "terminal":
        statuses = _TERMINAL
    else:
        statuses = (status,)
    where = f"AND status IN ({', '.join('?' * len(statuses))})" if statuses else ""
    rows = conn.execute(
        f"SELECT {_LISTED} FROM steps WHERE execution_id = ? {where} ORDER BY proposed_seq",
        (payload_limit, payload_limit, payload_limit, execution_id, *statuses),
    ).fetchall()
    return [_listed(row, payload_limit) for row in rows]


def _listed(row: tuple[Any, ...], payload_limit: int) -> Step:
    record = to_record(row)
    sizes = zip(_PAYLOADS, row[_WIDTH:], strict=True)
    omitted = tuple(
        (name, size) for name, size in sizes if size is not None and size > payload_limit
    )
    return replace(record, omitted=omitted) if omitted else record


def has_indeterminate(conn: sqlite3.Connection, execution_id: str, key: StepKey) -> bool:
    # `error` is caller-supplied JSON text: only valid JSON is inspected, so a malformed
    # value can never make this query fail.
    row = conn.execute(
        """SELECT 1 FROM steps
           WHERE execution_id = ? AND kind = ? AND target = ? AND args_hash = ?
             AND status = 'failed'
             AND CASE WHEN json_valid(error) THEN json_extract(error, '$.reason') END
                 = 'indeterminate'
           LIMIT 1""",
        (execution_id, key.kind.value, key.target, key.args_hash),
    ).fetchone()
    return row is not None


def spent_tokens(conn: sqlite3.Connection, execution_id: str) -> int:
    row = conn.execute(
        """SELECT COALESCE(SUM(COALESCE(usage_input, 0) + COALESCE(usage_output, 0)), 0)
           FROM steps WHERE execution_id = ?""",
        (execution_id,),
    ).fetchone()
    return int(row[0])
