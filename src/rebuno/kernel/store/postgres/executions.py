"""SQL for the `executions` table: the execution record, its listing and its sweeps.

Functions take an `Executor`: a transaction's session or a pooled connection in autocommit
(one committed statement). A transaction's row writes are operations of `rebuno_apply`
(`writes.py`).
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Execution, Origin
from rebuno.kernel.store.base import ExecutionFilter, Omitted, Page
from rebuno.kernel.store.columns import Layout, names, qualified
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import ExecutionStatus

COLUMNS = names("""
    id, agent_id, agent_version, input, status, output, failure_reason, created_at, updated_at,
    deadline_at, last_event_seq, idempotency_key, parent_execution_id, created_by, on_behalf_of,
    session, admitted_at, spawned_by_execution_id, spawned_by_step_id, forked_from, fork_seq,
    has_children, has_resources
""")
"""The columns of an `Execution`, in the order `to_record` takes them."""
APART = names("state, policy_bundle, restoration")
"""The table's other columns, each read and written on its own: never part of the record."""
SELECTED = qualified("e", COLUMNS)

TERMINAL = "('completed', 'failed', 'cancelled')"

_GET = f"SELECT {SELECTED} FROM executions e WHERE e.id = %s"
_HOLD = f"{_GET} FOR KEY SHARE"
_FIND = f"SELECT {SELECTED} FROM executions e WHERE e.agent_id = %s AND e.idempotency_key = %s"
_STATE = "SELECT state FROM executions WHERE id = %s"
# A list page: `COLUMNS` with an input or output over the page's limit (the first two `%s`)
# left out, then the two sizes. `octet_length` reads a stored value's size from its header, so
# a large one left out is never fetched or decompressed.
_LIMITED = {
    "input": "CASE WHEN octet_length(e.input) > %s THEN 'null' ELSE e.input END",
    "output": "CASE WHEN octet_length(e.output) > %s THEN NULL ELSE e.output END",
}
_LISTED = ", ".join(_LIMITED.get(column, f"e.{column}") for column in COLUMNS)
_LISTED_ROW = Layout(COLUMNS, ("input_size", "output_size"))
_LIST = f"SELECT {_LISTED}, octet_length(e.input), octet_length(e.output) FROM executions e"
_OVERDUE = """
    SELECT id FROM executions
    WHERE status IN ('pending', 'running', 'blocked') AND deadline_at <= %s AND id > %s
    ORDER BY id LIMIT %s
"""
# What goes with the executions a retention statement deletes (`gone`), in the same statement:
# only approvals cascade (the rows a step writes have no foreign key, `001_baseline.sql`).
# Ends the statement with how many went.
_CHILDREN_GONE = """, dispatches_gone AS (
        DELETE FROM dispatches WHERE execution_id IN (SELECT id FROM gone) RETURNING id
    ), counters_gone AS (
        DELETE FROM dispatch_step_counters
        WHERE dispatch_id IN (SELECT id FROM dispatches_gone)
    ), events_gone AS (
        DELETE FROM events WHERE execution_id IN (SELECT id FROM gone)
    ), steps_gone AS (
        DELETE FROM steps WHERE execution_id IN (SELECT id FROM gone)
    ), resources_gone AS (
        DELETE FROM resources WHERE execution_id IN (SELECT id FROM gone)
    ), checkpoints_gone AS (
        DELETE FROM resource_checkpoints WHERE execution_id IN (SELECT id FROM gone)
    )
    SELECT count(*) FROM gone
"""
# The children go in the same statement (`_CHILDREN_GONE`). An execution another one names as
# its parent stays, so that one's `previous` keeps answering (§24.6); it goes on a later pass
# once the other has gone.
_DELETE_TERMINAL = f"""
    WITH gone AS (
        DELETE FROM executions WHERE id IN (
            SELECT id FROM executions e
            WHERE status IN {TERMINAL} AND updated_at < %(cutoff)s AND session IS NULL
                AND NOT EXISTS (
                    SELECT 1 FROM executions child WHERE child.parent_execution_id = e.id)
            LIMIT %(limit)s FOR UPDATE SKIP LOCKED
        )
        RETURNING id
    ){_CHILDREN_GONE}"""


def to_record(row: Sequence[Any]) -> Execution:
    (
        id,
        agent_id,
        agent_version,
        input,
        status,
        output,
        failure_reason,
        created_at,
        updated_at,
        deadline_at,
        last_event_seq,
        idempotency_key,
        parent_execution_id,
        created_by,
        on_behalf_of,
        session,
        admitted_at,
        spawned_by_execution_id,
        spawned_by_step_id,
        forked_from,
        fork_seq,
        has_children,
        has_resources,
    ) = row
    origin = Origin(
        agent_version=agent_version,
        input=input,
        created_at=created_at,
        deadline_at=deadline_at,
        idempotency_key=idempotency_key,
        created_by=created_by,
        on_behalf_of=on_behalf_of,
        session=session,
        spawned_by_execution_id=spawned_by_execution_id,
        spawned_by_step_id=spawned_by_step_id,
        forked_from=forked_from,
        fork_seq=fork_seq,
    )
    return Execution(
        id=id,
        agent_id=agent_id,
        origin=origin,
        status=ExecutionStatus(status),
        output=output,
        failure_reason=failure_reason,
        updated_at=updated_at,
        last_event_seq=last_event_seq,
        parent_execution_id=parent_execution_id,
        admitted_at=admitted_at,
        has_children=has_children,
        has_resources=has_resources,
    )


def _listed(row: Sequence[Any], payload_limit: int) -> tuple[Execution, Omitted]:
    """The record of a list page's row, and the payloads the page left out of it."""
    columns, (input_size, output_size) = _LISTED_ROW.split(row)
    omitted = tuple(
        (name, size)
        for name, size in (("input", input_size), ("output", output_size))
        if size is not None and size > payload_limit
    )
    return to_record(columns), omitted


async def get(conn: Executor, execution_id: str) -> Execution:
    cur = await conn.execute(_GET, (execution_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return to_record(row)


async def hold(conn: Executor, execution_id: str) -> Execution:
    """Reads the execution and locks its row against deletion until the transaction ends:
    retention's `FOR UPDATE SKIP LOCKED` passes it over, and a row retention has locked first
    is waited for and then found gone."""
    cur = await conn.execute(_HOLD, (execution_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return to_record(row)


async def find(conn: Executor, agent_id: str, idempotency_key: str) -> Execution | None:
    """The agent's execution created under this idempotency key, if any (§27.1)."""
    cur = await conn.execute(_FIND, (agent_id, idempotency_key))
    row = await cur.fetchone()
    return None if row is None else to_record(row)


async def get_own_policy(conn: Executor, execution_id: str) -> str | None:
    """The execution's own policy bundle (§26.4); None when its agent's applies."""
    found = await _one(conn, "SELECT policy_bundle FROM executions WHERE id = %s", (execution_id,))
    return None if found is None else str(found)


async def get_restoration(conn: Executor, execution_id: str) -> str | None:
    """What a fork restored (§33.8.2); None when nothing."""
    found = await _one(conn, "SELECT restoration FROM executions WHERE id = %s", (execution_id,))
    return None if found is None else str(found)


async def get_state(conn: Executor, execution_id: str) -> str | None:
    """The `state` the execution was completed with (§24.5); None when it has none."""
    cur = await conn.execute(_STATE, (execution_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    (state,) = row
    return None if state is None else str(state)


async def list_page(conn: Executor, flt: ExecutionFilter) -> Page[Execution]:
    # Only the conditions in use are written out, so each combination gets a plan that uses
    # its index (a prepared `(%s IS NULL OR ...)` would not).
    conditions: list[str] = []
    params: list[Any] = []
    for clause, value in (
        ("e.agent_id = %s", flt.agent_id),
        ("e.status = %s", flt.status.value if flt.status is not None else None),
        ("e.session = %s", flt.session),
        ("e.parent_execution_id = %s", flt.parent_execution_id),
        ("e.spawned_by_execution_id = %s", flt.spawned_by),
        ("e.forked_from = %s", flt.forked_from),
        ("e.id < %s", flt.cursor),
        ("e.id >= %s", flt.floor),
    ):
        if value is not None:
            conditions.append(clause)
            params.append(value)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    params = [flt.payload_limit, flt.payload_limit, *params, flt.limit + 1]
    cur = await conn.execute(f"{_LIST} {where} ORDER BY e.id DESC LIMIT %s", params)
    rows = await cur.fetchall()
    listed = [_listed(row, flt.payload_limit) for row in rows[: flt.limit]]
    items = [record for record, _ in listed]
    omitted = {record.id: left_out for record, left_out in listed if left_out}
    next_cursor = items[-1].id if len(rows) > flt.limit and items else None
    return Page(items=items, next_cursor=next_cursor, omitted=omitted)


async def list_overdue(conn: Executor, now: datetime, limit: int, after: str) -> list[str]:
    cur = await conn.execute(_OVERDUE, (now, after, limit))
    return [execution_id for (execution_id,) in await cur.fetchall()]


async def delete_terminal_before(conn: Executor, cutoff: datetime, limit: int) -> int:
    """Deletes up to `limit` terminal executions with their children; how many."""
    cur = await conn.execute(_DELETE_TERMINAL, {"cutoff": cutoff, "limit": limit})
    row = await cur.fetchone()
    assert row is not None
    (deleted,) = row
    return int(deleted)


# -- sessions (§24) ----------------------------------------------------------------------------
LIVE = "('pending', 'running', 'blocked')"
_HELD = f"""
    SELECT EXISTS (SELECT 1 FROM executions WHERE session = %s AND admitted_at IS NOT NULL
        AND status IN {LIVE})
"""
_USED = "SELECT EXISTS (SELECT 1 FROM executions WHERE session = %s)"
_FIRST_WAITER = f"""
    SELECT {SELECTED} FROM executions e
    WHERE e.session = %s AND e.admitted_at IS NULL AND e.status = 'pending'
        AND (e.deadline_at IS NULL OR e.deadline_at > %s)
    ORDER BY e.id LIMIT 1
"""
_LAST_COMPLETED = """
    SELECT id FROM executions WHERE session = %s AND agent_id = %s AND status = 'completed'
    ORDER BY id DESC LIMIT 1
"""
_TO_ADMIT = f"""
    SELECT DISTINCT w.session FROM executions w
    WHERE w.session IS NOT NULL AND w.admitted_at IS NULL AND w.status = 'pending'
        AND NOT EXISTS (SELECT 1 FROM executions h WHERE h.session = w.session
            AND h.admitted_at IS NOT NULL AND h.status IN {LIVE})
    LIMIT %s
"""
_EXPIRED_SESSIONS = f"""
    SELECT DISTINCT e.session FROM executions e
    WHERE e.session IS NOT NULL AND e.status IN {TERMINAL} AND e.updated_at < %(cutoff)s
        AND NOT EXISTS (SELECT 1 FROM executions o WHERE o.session = e.session
            AND (o.status NOT IN {TERMINAL} OR o.updated_at >= %(cutoff)s))
        AND NOT EXISTS (SELECT 1 FROM executions m
            JOIN executions c ON c.parent_execution_id = m.id
            WHERE m.session = e.session AND c.session IS DISTINCT FROM e.session)
    LIMIT %(limit)s
"""
# Under the session's lock, so no execution joins it meanwhile. Every member is locked, or
# none is deleted: a create naming one as its parent holds its row (`hold`), and then the
# session stays for a later pass.
_DELETE_SESSION = f"""
    WITH members AS (
        SELECT id, status, updated_at FROM executions WHERE session = %(session)s
        FOR UPDATE SKIP LOCKED
    ), qualifies AS (
        SELECT 1 WHERE
            (SELECT count(*) FROM members)
                = (SELECT count(*) FROM executions WHERE session = %(session)s)
            AND NOT EXISTS (SELECT 1 FROM members
                WHERE status NOT IN {TERMINAL} OR updated_at >= %(cutoff)s)
            AND NOT EXISTS (SELECT 1 FROM executions c
                WHERE c.parent_execution_id IN (SELECT id FROM members)
                    AND c.session IS DISTINCT FROM %(session)s)
    ), gone AS (
        DELETE FROM executions
        WHERE id IN (SELECT id FROM members) AND EXISTS (SELECT 1 FROM qualifies)
        RETURNING id
    ){_CHILDREN_GONE}"""


async def _one(conn: Executor, query: str, params: Any) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    if row is None:
        return None
    (value,) = row
    return value


async def session_held(conn: Executor, session: str) -> bool:
    return bool(await _one(conn, _HELD, (session,)))


async def session_used(conn: Executor, session: str) -> bool:
    return bool(await _one(conn, _USED, (session,)))


async def first_waiter(conn: Executor, session: str, now: datetime) -> Execution | None:
    cur = await conn.execute(_FIRST_WAITER, (session, now))
    row = await cur.fetchone()
    return None if row is None else to_record(row)


async def last_completed(conn: Executor, agent_id: str, session: str) -> str | None:
    found = await _one(conn, _LAST_COMPLETED, (session, agent_id))
    return None if found is None else str(found)


async def sessions_to_admit(conn: Executor, limit: int) -> list[str]:
    cur = await conn.execute(_TO_ADMIT, (limit,))
    return [str(value) for (value,) in await cur.fetchall()]


async def expired_sessions(conn: Executor, cutoff: datetime, limit: int) -> list[str]:
    cur = await conn.execute(_EXPIRED_SESSIONS, {"cutoff": cutoff, "limit": limit})
    return [str(value) for (value,) in await cur.fetchall()]


async def delete_session(conn: Executor, session: str, cutoff: datetime) -> int:
    return int(await _one(conn, _DELETE_SESSION, {"session": session, "cutoff": cutoff}) or 0)


# -- sub-agents (§25) --------------------------------------------------------------------------
_CHILDREN = f"""
    SELECT {SELECTED} FROM executions e WHERE e.spawned_by_execution_id = %s ORDER BY e.id
"""
_UNSETTLED = f"""
    SELECT c.id FROM executions c
    JOIN executions p ON p.id = c.spawned_by_execution_id
    JOIN steps s ON s.step_id = c.spawned_by_step_id
    WHERE c.status IN {TERMINAL} AND p.status IN {LIVE} AND s.status = 'executing'
    ORDER BY c.id LIMIT %s
"""
_ORPHANS = f"""
    SELECT c.id FROM executions c
    LEFT JOIN executions p ON p.id = c.spawned_by_execution_id
    WHERE c.spawned_by_execution_id IS NOT NULL AND c.status IN {LIVE}
        AND (p.id IS NULL OR p.status IN {TERMINAL})
    ORDER BY c.id LIMIT %s
"""
_STALLED = f"""
    SELECT e.id FROM executions e
    WHERE e.status = 'blocked'
        AND NOT EXISTS (SELECT 1 FROM steps s
            WHERE s.execution_id = e.id AND s.status = 'awaiting_approval')
        AND NOT EXISTS (SELECT 1 FROM executions c
            JOIN steps s ON s.step_id = c.spawned_by_step_id
            WHERE c.spawned_by_execution_id = e.id AND c.status IN {LIVE}
                AND s.status = 'executing')
    ORDER BY e.id LIMIT %s
"""


async def children(conn: Executor, execution_id: str) -> list[Execution]:
    """The executions steps of this one started, oldest first."""
    cur = await conn.execute(_CHILDREN, (execution_id,))
    return [to_record(row) for row in await cur.fetchall()]


async def _ids(conn: Executor, query: str, limit: int) -> list[str]:
    cur = await conn.execute(query, (limit,))
    return [str(value) for (value,) in await cur.fetchall()]


async def unsettled_children(conn: Executor, limit: int) -> list[str]:
    """Ended sub-agents whose step is still executing in a live parent: a lost settlement."""
    return await _ids(conn, _UNSETTLED, limit)


async def orphans(conn: Executor, limit: int) -> list[str]:
    """Live sub-agents whose parent ended or is gone: a lost cascade."""
    return await _ids(conn, _ORPHANS, limit)


async def stalled(conn: Executor, limit: int) -> list[str]:
    """Blocked executions that nothing holds up any more."""
    return await _ids(conn, _STALLED, limit)
