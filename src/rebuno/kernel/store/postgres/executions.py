"""SQL for the `executions` table: the execution record, its listing and its sweeps.

Functions take an `Executor`: a transaction's session or a pooled connection in autocommit
(one committed statement). A transaction's row writes are operations of `rebuno_apply`
(`writes.py`).
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.store.base import ExecutionFilter, Page
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import ExecutionStatus

COLUMNS = (
    "e.id, e.agent_id, e.agent_version, e.input, e.status, e.output, e.failure_reason,"
    " e.created_at, e.updated_at, e.deadline_at, e.last_event_seq"
)
WIDTH = 11
"""How many columns `COLUMNS` names: where an execution ends in a joined row."""

TERMINAL = "('completed', 'failed', 'cancelled')"

_GET = f"SELECT {COLUMNS} FROM executions e WHERE e.id = %s"
# A list page: `COLUMNS` with an input or output over the page's limit (the first two `%s`)
# left out, then the two sizes. `octet_length` reads a stored value's size from its header, so
# a large one left out is never fetched or decompressed.
_LISTED = (
    "e.id, e.agent_id, e.agent_version,"
    " CASE WHEN octet_length(e.input) > %s THEN 'null' ELSE e.input END, e.status,"
    " CASE WHEN octet_length(e.output) > %s THEN NULL ELSE e.output END, e.failure_reason,"
    " e.created_at, e.updated_at, e.deadline_at, e.last_event_seq,"
    " octet_length(e.input), octet_length(e.output)"
)
_OVERDUE = """
    SELECT id FROM executions
    WHERE status IN ('pending', 'running', 'blocked') AND deadline_at <= %s AND id > %s
    ORDER BY id LIMIT %s
"""
# The children go in the same statement: only approvals still cascade (008_hot_path_keys).
_DELETE_TERMINAL = f"""
    WITH gone AS (
        DELETE FROM executions WHERE id IN (
            SELECT id FROM executions
            WHERE status IN {TERMINAL} AND updated_at < %(cutoff)s
            LIMIT %(limit)s FOR UPDATE SKIP LOCKED
        )
        RETURNING id
    ), dispatches_gone AS (
        DELETE FROM dispatches WHERE execution_id IN (SELECT id FROM gone) RETURNING id
    ), counters_gone AS (
        DELETE FROM dispatch_step_counters
        WHERE dispatch_id IN (SELECT id FROM dispatches_gone)
    ), events_gone AS (
        DELETE FROM events WHERE execution_id IN (SELECT id FROM gone)
    ), steps_gone AS (
        DELETE FROM steps WHERE execution_id IN (SELECT id FROM gone)
    )
    SELECT count(*) FROM gone
"""


def from_row(row: Sequence[Any]) -> Execution:
    return Execution(
        id=row[0],
        agent_id=row[1],
        agent_version=row[2],
        input=row[3],
        status=ExecutionStatus(row[4]),
        output=row[5],
        failure_reason=row[6],
        created_at=row[7],
        updated_at=row[8],
        deadline_at=row[9],
        last_event_seq=row[10],
    )


def _listed(row: Sequence[Any], payload_limit: int) -> Execution:
    record = from_row(row)
    omitted = tuple(
        (name, size)
        for name, size in (("input", row[WIDTH]), ("output", row[WIDTH + 1]))
        if size is not None and size > payload_limit
    )
    return replace(record, omitted=omitted) if omitted else record


async def get(conn: Executor, execution_id: str) -> Execution:
    cur = await conn.execute(_GET, (execution_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return from_row(row)


async def list_page(conn: Executor, flt: ExecutionFilter) -> Page[Execution]:
    # Only the conditions in use are written out, so each combination gets a plan that uses
    # its index (a prepared `(%s IS NULL OR ...)` would not).
    conditions: list[str] = []
    params: list[Any] = []
    for clause, value in (
        ("e.agent_id = %s", flt.agent_id),
        ("e.status = %s", flt.status.value if flt.status is not None else None),
        ("e.id < %s", flt.cursor),
    ):
        if value is not None:
            conditions.append(clause)
            params.append(value)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    params = [flt.payload_limit, flt.payload_limit, *params, flt.limit + 1]
    cur = await conn.execute(
        f"SELECT {_LISTED} FROM executions e {where} ORDER BY e.id DESC LIMIT %s", params
    )
    rows = await cur.fetchall()
    items = [_listed(row, flt.payload_limit) for row in rows[: flt.limit]]
    next_cursor = items[-1].id if len(rows) > flt.limit and items else None
    return Page(items=items, next_cursor=next_cursor)


async def list_overdue(conn: Executor, now: datetime, limit: int, after: str) -> list[str]:
    cur = await conn.execute(_OVERDUE, (now, after, limit))
    return [row[0] for row in await cur.fetchall()]


async def delete_terminal_before(conn: Executor, cutoff: datetime, limit: int) -> int:
    """Deletes up to `limit` terminal executions with their children; how many."""
    cur = await conn.execute(_DELETE_TERMINAL, {"cutoff": cutoff, "limit": limit})
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
