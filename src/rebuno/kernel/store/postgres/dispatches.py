"""SQL for `dispatches` and `dispatch_step_counters`: the delivery queue, its leases and the
per-attempt occurrence counters.

A claim never takes an execution lock: `FOR UPDATE SKIP LOCKED` lets replicas claim side by
side without waiting on each other or on a submission that holds a lease row.
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from rebuno.kernel.domain.dispatch import MAX_AGENT_LEASE_SECONDS
from rebuno.kernel.domain.records import Dispatch
from rebuno.kernel.store.base import ClaimedDispatch
from rebuno.kernel.store.columns import Layout, names, qualified
from rebuno.kernel.store.postgres import agents, executions
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import DispatchStatus
from rebuno.protocol.extensions import AgentInstance

CHANNEL = "rebuno_dispatch"
"""Notified by `rebuno_apply` when a dispatch is inserted, with the enqueuing store's tag."""
RECLAIM_PAGE = 100

COLUMNS = names("""
    id, execution_id, status, attempt, max_attempts, next_attempt_at, locked_by, locked_at,
    created_at, updated_at
""")
"""The columns of a `Dispatch`, in the order `to_record` takes them."""
APART = names("instance_name, instance_incarnation")
"""The table's other columns: who acknowledged the attempt (`set_instance`), never read with
the record."""
COUNTER_COLUMNS = names("dispatch_id, kind, target, args_hash, consumed")
"""The columns of `dispatch_step_counters`: an attempt's occurrences consumed per step key."""
SELECTED = qualified("d", COLUMNS)

_GET = f"SELECT {SELECTED} FROM dispatches d WHERE d.id = %s"
_CLAIM = f"""
    WITH due AS (
        SELECT id, status = 'pending' AND attempt > 0 AS reclaimed FROM dispatches
        WHERE status IN ('pending', 'failed') AND next_attempt_at <= %(now)s
        ORDER BY next_attempt_at LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), reset AS (
        DELETE FROM dispatch_step_counters c USING due WHERE c.dispatch_id = due.id
    ), d AS (
        UPDATE dispatches d SET status = 'in_flight', attempt = d.attempt + 1,
            locked_by = %(replica)s, locked_at = %(now)s, updated_at = %(now)s,
            instance_name = NULL, instance_incarnation = NULL
        FROM due WHERE d.id = due.id
        RETURNING d.*
    )
    SELECT {SELECTED}, {executions.SELECTED}, {agents.SELECTED}, due.reclaimed
    FROM d JOIN due ON due.id = d.id
    JOIN executions e ON e.id = d.execution_id JOIN agents a ON a.id = e.agent_id
    ORDER BY d.next_attempt_at, d.id
"""
_CLAIMED = Layout(COLUMNS, executions.COLUMNS, agents.COLUMNS, ("reclaimed",))
_QUEUE = """
    SELECT count(*) FILTER (WHERE next_attempt_at <= %s), min(next_attempt_at) FROM dispatches
    WHERE status IN ('pending', 'failed')
"""
# Effective lease (§12.3): the agent's own when set and at least 10 s, else the default. A
# stored value out of today's range counts as `effective_lease` says (at most a week; NaN as
# unset), so no row can put the statement out of range and stop the reaper for all the others.
_RECLAIM = f"""
    UPDATE dispatches d SET status = 'pending', next_attempt_at = %(now)s, locked_by = NULL,
        locked_at = NULL, updated_at = %(now)s
    FROM (
        SELECT d.id FROM dispatches d
        JOIN executions e ON e.id = d.execution_id JOIN agents a ON a.id = e.agent_id
        WHERE d.status = 'in_flight'
            AND d.locked_at < %(now)s - make_interval(secs => CASE
                WHEN a.lease_timeout_seconds >= 10 AND a.lease_timeout_seconds <> 'NaN'
                THEN least(a.lease_timeout_seconds, {MAX_AGENT_LEASE_SECONDS})
                ELSE %(default_lease)s END)
        LIMIT {RECLAIM_PAGE}
        FOR UPDATE OF d SKIP LOCKED
    ) expired
    WHERE d.id = expired.id
"""

_SET_INSTANCE = """
    UPDATE dispatches SET instance_name = %s, instance_incarnation = %s
    WHERE id = %s AND attempt = %s AND status = 'in_flight'
"""
_LIST_SUPERSEDED = f"""
    SELECT {SELECTED} FROM dispatches d JOIN executions e ON e.id = d.execution_id
    WHERE d.status = 'in_flight' AND d.instance_name = %s AND d.instance_incarnation <> %s
        AND e.agent_id = %s
    ORDER BY d.id LIMIT %s
"""
# The epoch: every effective lease has expired by then, and it reads back as a datetime.
_EXPIRE_LEASE = """
    UPDATE dispatches SET locked_at = 'epoch'
    WHERE id = %s AND attempt = %s AND status = 'in_flight'
"""


def to_record(row: Sequence[Any]) -> Dispatch:
    (
        id,
        execution_id,
        status,
        attempt,
        max_attempts,
        next_attempt_at,
        locked_by,
        locked_at,
        created_at,
        updated_at,
    ) = row
    return Dispatch(
        id=id,
        execution_id=execution_id,
        status=DispatchStatus(status),
        attempt=attempt,
        max_attempts=max_attempts,
        next_attempt_at=next_attempt_at,
        locked_by=locked_by,
        locked_at=locked_at,
        created_at=created_at,
        updated_at=updated_at,
    )


async def get(conn: Executor, dispatch_id: str) -> Dispatch | None:
    cur = await conn.execute(_GET, (dispatch_id,))
    row = await cur.fetchone()
    return None if row is None else to_record(row)


async def claim(
    conn: Executor, replica_id: str, limit: int, now: datetime
) -> list[ClaimedDispatch]:
    """Claims in one autocommit statement: the select, the counter reset and the update
    commit together."""
    if limit <= 0:
        return []
    cur = await conn.execute(_CLAIM, {"now": now, "limit": limit, "replica": replica_id})
    return [_claimed(row) for row in await cur.fetchall()]


def _claimed(row: Sequence[Any]) -> ClaimedDispatch:
    dispatch, execution, agent, (reclaimed,) = _CLAIMED.split(row)
    return ClaimedDispatch(
        dispatch=to_record(dispatch),
        execution=executions.to_record(execution),
        agent=agents.to_record(agent),
        reclaimed=reclaimed,
    )


async def queue(conn: Executor, now: datetime) -> tuple[int, datetime | None]:
    cur = await conn.execute(_QUEUE, (now,))
    row = await cur.fetchone()
    if row is None:
        return 0, None
    depth, earliest = row
    return int(depth), earliest


async def reclaim_page(conn: Executor, now: datetime, default_lease: timedelta) -> int:
    """Returns up to one page of expired leases to the queue; how many it returned."""
    cur = await conn.execute(_RECLAIM, {"now": now, "default_lease": default_lease.total_seconds()})
    return cur.rowcount


async def set_instance(
    conn: Executor, dispatch_id: str, attempt: int, instance: AgentInstance
) -> None:
    """Records who acknowledged this attempt, while it is still the live one."""
    await conn.execute(_SET_INSTANCE, (instance.name, instance.incarnation, dispatch_id, attempt))


async def list_superseded(
    conn: Executor, agent_id: str, instance: AgentInstance, limit: int
) -> list[Dispatch]:
    """The agent's in-flight attempts acknowledged by another incarnation of this instance."""
    cur = await conn.execute(
        _LIST_SUPERSEDED, (instance.name, instance.incarnation, agent_id, limit)
    )
    return [to_record(row) for row in await cur.fetchall()]


async def expire_lease(conn: Executor, dispatch_id: str, attempt: int) -> None:
    """Backdates the attempt's lease to the epoch, so the next reclaim takes it as expired."""
    await conn.execute(_EXPIRE_LEASE, (dispatch_id, attempt))
