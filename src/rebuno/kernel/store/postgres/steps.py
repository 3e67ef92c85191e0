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
from rebuno.kernel.store.columns import Layout, names, qualified
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import Idempotency, StepKind, StepStatus

COLUMNS = names("""
    step_id, execution_id, kind, target, args_hash, occurrence, status, idempotency, args,
    result, error, usage_input, usage_output, proposed_seq, started_at, completed_at
""")
"""The columns of a `Step`, in the order `to_record` takes them."""
APART = names("affected_keys")
"""The table's other column, read and written on its own (`resources.py`)."""
SELECTED = qualified("s", COLUMNS)

TERMINAL = "('succeeded', 'failed', 'denied', 'cancelled')"

_GET = f"SELECT {SELECTED} FROM steps s WHERE s.step_id = %s"
# A step list: `COLUMNS` with each payload over the limit (the first three `%s`) left out,
# then the three sizes. `octet_length` reads a stored value's size from its header, so a large
# one left out is never fetched or decompressed.
_PAYLOADS = ("args", "result", "error")
_LIMITED = {
    payload: f"CASE WHEN octet_length(s.{payload}) > %s THEN NULL ELSE s.{payload} END"
    for payload in _PAYLOADS
}
_LISTED = ", ".join(
    [_LIMITED.get(column, f"s.{column}") for column in COLUMNS]
    + [f"octet_length(s.{payload})" for payload in _PAYLOADS]
)
_LISTED_ROW = Layout(COLUMNS, ("args_size", "result_size", "error_size"))
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
        started_at=started_at,
        completed_at=completed_at,
    )


# By primary key only, the execution checked on the rows: with `execution_id = $1` in the
# statement, a plan cached while the table was small can pick the execution's index and then
# scan every step of the execution on each call.
async def get(conn: Executor, step_id: str) -> Step | None:
    cur = await conn.execute(_GET, (step_id,))
    row = await cur.fetchone()
    return None if row is None else to_record(row)


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
    columns, sizes = _LISTED_ROW.split(row)
    record = to_record(columns)
    omitted = tuple(
        (name, size)
        for name, size in zip(_PAYLOADS, sizes, strict=True)
        if size is not None and size > payload_limit
    )
    return replace(record, omitted=omitted) if omitted else record


async def has_indeterminate(conn: Executor, execution_id: str, key: StepKey) -> bool:
    cur = await conn.execute(
        _FAILED_ERRORS, (execution_id, key.kind.value, key.target, key.args_hash)
    )
    return any(_reason(error) == "indeterminate" for (error,) in await cur.fetchall())


def _reason(error: str) -> object:
    try:
        parsed = json.loads(error)
    except ValueError:
        return None
    return parsed.get("reason") if isinstance(parsed, dict) else None


async def spent_tokens(conn: Executor, execution_id: str) -> int:
    cur = await conn.execute(_SPENT_TOKENS, (execution_id,))
    row = await cur.fetchone()
    if row is None:
        return 0
    (spent,) = row
    return int(spent)
