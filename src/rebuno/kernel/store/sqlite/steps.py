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
from rebuno.kernel.store.columns import Layout, names
from rebuno.kernel.store.sqlite.errors import refusals
from rebuno.kernel.store.sqlite.timestamps import from_micros_or_none, to_micros_or_none
from rebuno.protocol.enums import Idempotency, StepKind, StepStatus

COLUMNS = names("""
    step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency, args,
    result, error, usage_input, usage_output, proposed_seq, started_at, completed_at
""")
"""The columns of a `Step`, in the order `to_record` takes them."""
APART = names("affected_keys")
"""The table's other column, read and written on its own (`resources.py`)."""
_SELECTED = ", ".join(COLUMNS)
_TERMINAL = ("succeeded", "failed", "denied", "cancelled")
# A step list: `COLUMNS` with each payload over the limit (the first three `?`) left out, and
# then the three sizes, in bytes of UTF-8.
_PAYLOADS = ("args", "result", "error")
_LIMITED = {
    payload: f"CASE WHEN length(CAST({payload} AS BLOB)) > ? THEN NULL ELSE {payload} END"
    for payload in _PAYLOADS
}
_LISTED = ", ".join(
    [_LIMITED.get(column, column) for column in COLUMNS]
    + [f"length(CAST({payload} AS BLOB))" for payload in _PAYLOADS]
)
_LISTED_ROW = Layout(COLUMNS, ("args_size", "result_size", "error_size"))
_WHOLE = 2**63 - 1
"""A limit no payload reaches: the use cases' own reads get every step whole."""


def to_record(row: Sequence[Any]) -> Step:
    (
        step_id,
        execution_id,
        kind,
        target,
        args_hash,
        occurrence,
        status,
        idempotency,
        args,
        result,
        error,
        usage_input,
        usage_output,
        proposed_seq,
        started_at,
        completed_at,
    ) = row
    return Step(
        step_id=step_id,
        execution_id=execution_id,
        kind=StepKind(kind),
        target=target,
        args_hash=args_hash,
        occurrence=occurrence,
        status=StepStatus(status),
        idempotency=Idempotency(idempotency),
        args=args,
        result=result,
        error=error,
        usage_input=usage_input,
        usage_output=usage_output,
        proposed_seq=proposed_seq,
        started_at=from_micros_or_none(started_at),
        completed_at=from_micros_or_none(completed_at),
    )


def find(conn: sqlite3.Connection, step_id: str) -> Step | None:
    row = conn.execute(f"SELECT {_SELECTED} FROM steps WHERE step_id = ?", (step_id,)).fetchone()
    return None if row is None else to_record(row)


def find_many(conn: sqlite3.Connection, execution_id: str, step_ids: Sequence[str]) -> list[Step]:
    marks = ", ".join("?" * len(step_ids))
    rows = conn.execute(
        f"SELECT {_SELECTED} FROM steps WHERE execution_id = ? AND step_id IN ({marks})",
        (execution_id, *step_ids),
    ).fetchall()
    return [to_record(row) for row in rows]


def insert(conn: sqlite3.Connection, step: Step) -> None:
    with refusals(f"step {step.step_id}"):
        conn.execute(
            f"""INSERT INTO steps ({_SELECTED})
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


def _listed(row: Sequence[Any], payload_limit: int) -> Step:
    columns, sizes = _LISTED_ROW.split(row)
    record = to_record(columns)
    omitted = tuple(
        (name, size)
        for name, size in zip(_PAYLOADS, sizes, strict=True)
        if size is not None and size > payload_limit
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
    (spent,) = row
    return int(spent)
