"""SQL for the `steps` table: the step projection, read on every replay lookup.

Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rebuno.kernel.domain.records import Step
from rebuno.kernel.store.base import StepKey
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import Idempotency, StepKind, StepStatus

COLUMNS = (
    "s.step_id, s.execution_id, s.kind, s.target, s.args_hash, s.occurrence, s.status,"
    " s.idempotency, s.args, s.result, s.error, s.usage_input, s.usage_output,"
    " s.proposed_seq, s.started_at, s.completed_at"
)

WIDTH = 16

TERMINAL = "('succeeded', 'failed', 'denied', 'cancelled')"

_GET = f"SELECT {COLUMNS} FROM steps s WHERE s.step_id = %s"
# A step list: `COLUMNS` with each payload over the limit (the first three `%s`) left out,
# then the three sizes. `octet_length` reads a stored value's size from its header, so a large
# one left out is never fetched or decompressed.
_LISTED = (
    "s.step_id, s.execution_id, s.kind, s.target, s.args_hash, s.occurrence, s.status,"
    " s.idempotency,"
    " CASE WHEN octet_length(s.args) > %s THEN NULL ELSE s.args END,"
    " CASE WHEN octet_length(s.result) > %s THEN NULL ELSE s.result END,"
    " CASE WHEN octet_length(s.error) > %s THEN NULL ELSE s.error END,"
    " s.usage_input, s.usage_output, s.proposed_seq, s.started_at, s.completed_at,"
    " octet_length(s.args), octet_length(s.result), octet_length(s.error)"
)
_PAYLOADS = ("args", "result", "error")
_WHOLE = 2**63 - 1
"""A limit no payload reaches: the use cases' own reads get every step whole."""
_LIST = f"SELECT {_LISTED} FROM steps s WHERE s.execution_id = %s ORDER BY s.proposed_seq"
_LIST_TERMINAL = f"""
    SELECT {_LISTED} FROM steps s WHERE s.execution_id = %s AND s.status IN {TERMINAL}
    ORDER BY s.proposed_seq
"""
_LIST_STATUS = f"""
    SELECT {_LISTED} FROM steps s WHERE s.execution_id = %s AND s.status = %s
    ORDER BY s.proposed_seq
"""
# The text filter is only a cheap pre-selection; `error` is parsed in Python, so a malformed
# value can never make the query fail.
_FAILED_ERRORS = """
    SELECT error FROM steps
    WHERE execution_id = %s AND kind = %s AND target = %s AND args_hash = %s
        AND status = 'failed' AND error LIKE '%%indeterminate%%'
"""
_SPENT_TOKENS = """
    SELECT COALESCE(sum(COALESCE(usage_input, 0) + COALESCE(usage_output, 0)), 0)
    FROM steps WHERE execution_id = %s
"""


def from_row(row: Sequence[Any]) -> Step:
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
        started_at=row[14],
        completed_at=row[15],
    )


# By primary key only, the execution checked on the rows: with `execution_id = $1` in the
# statement, a plan cached while the table was small can pick the execution's index and then
# scan every step of the execution on each call.
async def get(conn: Executor, step_id: str) -> Step | None:
    cur = await conn.execute(_GET, (step_id,))
    row = await cur.fetchone()
    return None if row is None else from_row(row)


async def list_for(
    conn: Executor, execution_id: str, status: str | None, payload_limit: int = _WHOLE
) -> list[Step]:
    """`status`: `terminal`, a step status name, or None for all; in proposal order."""
    limits = (payload_limit, payload_limit, payload_limit)
    if status is None:
        cur = await conn.execute(_LIST, (*limits, execution_id))
    elif status == "terminal":
        cur = await conn.execute(_LIST_TERMINAL, (*limits, execution_id))
    else:
        cur = await conn.execute(_LIST_STATUS, (*limits, execution_id, status))
    return [_listed(row, payload_limit) for row in await cur.fetchall()]


def _listed(row: Sequence[Any], payload_limit: int) -> Step:
    record = from_row(row)
    sizes = zip(_PAYLOADS, row[WIDTH:], strict=True)
    omitted = tuple(
        (name, size) for name, size in sizes if size is not None and size > payload_limit
    )
    return replace(record, omitted=omitted) if omitted else record


async def has_indeterminate(conn: Executor, execution_id: str, key: StepKey) -> bool:
    cur = await conn.execute(
        _FAILED_ERRORS, (execution_id, key.kind.value, key.target, key.args_hash)
    )
    return any(_reason(row[0]) == "indeterminate" for row in await cur.fetchall())


def _reason(error: str) -> object:
    try:
        parsed = json.loads(error)
    except ValueError:
        return None
    return parsed.get("reason") if isinstance(parsed, dict) else None


async def spent_tokens(conn: Executor, execution_id: str) -> int:
    cur = await conn.execute(_SPENT_TOKENS, (execution_id,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0
