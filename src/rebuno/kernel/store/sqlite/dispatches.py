"""SQL for the dispatch queue: `dispatches`, their occurrence counters, claims and leases.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection and
wraps the writes in its single-writer transaction.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from rebuno.kernel.domain.dispatch import MAX_AGENT_LEASE_SECONDS
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Dispatch, Lease
from rebuno.kernel.store.base import ClaimedDispatch, StepKey
from rebuno.kernel.store.columns import Layout, names, qualified
from rebuno.kernel.store.sqlite import agents, executions
from rebuno.kernel.store.sqlite.errors import refusals
from rebuno.kernel.store.sqlite.timestamps import (
    from_micros,
    from_micros_or_none,
    to_micros,
    to_micros_or_none,
)
from rebuno.protocol.enums import DispatchStatus
from rebuno.protocol.extensions import AgentInstance

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
_SELECTED = ", ".join(COLUMNS)
_CLAIMED = Layout(COLUMNS, executions.COLUMNS, agents.COLUMNS)
_MIN_AGENT_LEASE = timedelta(seconds=10)
"""An agent's own `lease_timeout_seconds` counts only from this much (§12.3)."""
RECLAIM_PAGE = 100


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
        next_attempt_at=from_micros(next_attempt_at),
        locked_by=locked_by,
        locked_at=from_micros_or_none(locked_at),
        created_at=from_micros(created_at),
        updated_at=from_micros(updated_at),
    )


def find(conn: sqlite3.Connection, dispatch_id: str) -> Dispatch | None:
    row = conn.execute(f"SELECT {_SELECTED} FROM dispatches WHERE id = ?", (dispatch_id,))
    found = row.fetchone()
    return None if found is None else to_record(found)


def insert(conn: sqlite3.Connection, dispatch: Dispatch) -> None:
    with refusals(f"dispatch {dispatch.id}"):
        conn.execute(
            f"INSERT INTO dispatches ({_SELECTED}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                dispatch.id,
                dispatch.execution_id,
                dispatch.status.value,
                dispatch.attempt,
                dispatch.max_attempts,
                to_micros(dispatch.next_attempt_at),
                dispatch.locked_by,
                to_micros_or_none(dispatch.locked_at),
                to_micros(dispatch.created_at),
                to_micros(dispatch.updated_at),
            ),
        )


def update(conn: sqlite3.Connection, dispatch: Dispatch) -> None:
    cursor = conn.execute(
        """UPDATE dispatches SET status = ?, attempt = ?, next_attempt_at = ?, locked_by = ?,
               locked_at = ?, updated_at = ?
           WHERE id = ?""",
        (
            dispatch.status.value,
            dispatch.attempt,
            to_micros(dispatch.next_attempt_at),
            dispatch.locked_by,
            to_micros_or_none(dispatch.locked_at),
            to_micros(dispatch.updated_at),
            dispatch.id,
        ),
    )
    if cursor.rowcount == 0:
        raise NotFound(f"dispatch {dispatch.id} not found")


def retire(conn: sqlite3.Connection, execution_id: str, now: datetime) -> None:
    conn.execute(
        """UPDATE dispatches SET status = 'exhausted', locked_by = NULL, locked_at = NULL,
               updated_at = ?
           WHERE execution_id = ? AND status != 'exhausted'""",
        (to_micros(now), execution_id),
    )


def renew_lease(conn: sqlite3.Connection, execution_id: str, lease: Lease, now: datetime) -> bool:
    """The strong lease check (§12.4), the one place this store writes it: renews `locked_at`
    only when the lease owns the live dispatch of this execution, and says whether it did."""
    cursor = conn.execute(
        """UPDATE dispatches SET locked_at = ?
           WHERE id = ? AND execution_id = ? AND attempt = ? AND status = 'in_flight'""",
        (to_micros(now), lease.dispatch_id, execution_id, lease.attempt),
    )
    return cursor.rowcount > 0


def set_occurrence(conn: sqlite3.Connection, dispatch_id: str, key: StepKey, consumed: int) -> None:
    with refusals(f"occurrence counter of dispatch {dispatch_id}"):
        conn.execute(
            """INSERT INTO dispatch_step_counters (dispatch_id, kind, target, args_hash, consumed)
               VALUES (?, ?, ?, ?, ?)
               ON CONFLICT (dispatch_id, kind, target, args_hash)
               DO UPDATE SET consumed = max(consumed, excluded.consumed)""",
            (dispatch_id, key.kind.value, key.target, key.args_hash, consumed),
        )


def counters(
    conn: sqlite3.Connection, dispatch_id: str, keys: Sequence[StepKey]
) -> dict[StepKey, int]:
    """The occurrences this dispatch's attempt has consumed for each of `keys` it used."""
    wanted = {(key.kind.value, key.target, key.args_hash): key for key in keys}
    rows = conn.execute(
        """SELECT kind, target, args_hash, consumed FROM dispatch_step_counters
           WHERE dispatch_id = ? AND (kind, target, args_hash) IN (
               SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                   json_extract(value, '$[2]') FROM json_each(?))""",
        (dispatch_id, json.dumps(list(wanted))),
    ).fetchall()
    return {wanted[(kind, target, hashed)]: int(used) for kind, target, hashed, used in rows}


def claim(
    conn: sqlite3.Connection, replica_id: str, limit: int, now: datetime
) -> list[ClaimedDispatch]:
    """Claims due rows, oldest due first; the caller holds the write transaction."""
    rows = conn.execute(
        """SELECT id, status = 'pending' AND attempt > 0 FROM dispatches
           WHERE status IN ('pending', 'failed') AND next_attempt_at <= ?
           ORDER BY next_attempt_at LIMIT ?""",
        (to_micros(now), limit),
    ).fetchall()
    if not rows:
        return []
    reclaimed = {dispatch_id for dispatch_id, again in rows if again}
    # The ids travel as one JSON array so each statement text stays fixed and cached.
    ids = json.dumps([dispatch_id for dispatch_id, _ in rows])
    conn.execute(
        """DELETE FROM dispatch_step_counters
           WHERE dispatch_id IN (SELECT value FROM json_each(?))""",
        (ids,),
    )
    micros = to_micros(now)
    conn.execute(
        """UPDATE dispatches SET status = 'in_flight', attempt = attempt + 1, locked_by = ?,
               locked_at = ?, updated_at = ?, instance_name = NULL, instance_incarnation = NULL
           WHERE id IN (SELECT value FROM json_each(?))""",
        (replica_id, micros, micros, ids),
    )
    return _claimed(conn, ids, reclaimed)


def _claimed(conn: sqlite3.Connection, ids: str, reclaimed: set[str]) -> list[ClaimedDispatch]:
    rows = conn.execute(
        f"""SELECT {qualified("d", COLUMNS)}, {qualified("e", executions.COLUMNS)},
                {qualified("a", agents.COLUMNS)}
            FROM dispatches d
            JOIN executions e ON e.id = d.execution_id
            JOIN agents a ON a.id = e.agent_id
            WHERE d.id IN (SELECT value FROM json_each(?))
            ORDER BY d.next_attempt_at, d.id""",
        (ids,),
    ).fetchall()
    return [_claim(row, reclaimed) for row in rows]


def _claim(row: Sequence[Any], reclaimed: set[str]) -> ClaimedDispatch:
    dispatch, execution, agent = _CLAIMED.split(row)
    record = to_record(dispatch)
    return ClaimedDispatch(
        dispatch=record,
        execution=executions.to_record(execution),
        agent=agents.to_record(agent),
        reclaimed=record.id in reclaimed,
    )


def queue(conn: sqlite3.Connection, now: datetime) -> tuple[int, datetime | None]:
    row = conn.execute(
        """SELECT coalesce(sum(next_attempt_at <= ?), 0), min(next_attempt_at) FROM dispatches
        WHERE status IN ('pending', 'failed')""",
        (to_micros(now),),
    ).fetchone()
    depth, earliest = row
    return int(depth), from_micros_or_none(earliest)


def reclaim_page(conn: sqlite3.Connection, now: datetime, default_lease: timedelta) -> int:
    """Returns up to one page of expired `in_flight` rows to `pending`; `attempt` stays.

    A stored lease that is not a number, or is out of today's range (an older version's row),
    counts as `effective_lease` says, so no row can stop the reaper for the others."""
    micros = to_micros(now)
    default = default_lease // timedelta(microseconds=1)
    # No effective lease is shorter than this, so the in-flight index bounds the scan.
    shortest = min(_MIN_AGENT_LEASE, default_lease) // timedelta(microseconds=1)
    cursor = conn.execute(
        """UPDATE dispatches SET status = 'pending', next_attempt_at = :now, locked_by = NULL,
               locked_at = NULL, updated_at = :now
           WHERE id IN (
               SELECT d.id FROM dispatches d
               JOIN executions e ON e.id = d.execution_id
               JOIN agents a ON a.id = e.agent_id
               WHERE d.status = 'in_flight' AND d.locked_at < :now - :shortest
                 AND d.locked_at < :now - CASE
                     WHEN typeof(a.lease_timeout_seconds) IN ('real', 'integer')
                         AND a.lease_timeout_seconds >= 10
                     THEN CAST(round(min(a.lease_timeout_seconds, :longest) * 1000000)
                         AS INTEGER)
                     ELSE :default END
               LIMIT :page)""",
        {
            "now": micros,
            "shortest": shortest,
            "default": default,
            "longest": MAX_AGENT_LEASE_SECONDS,
            "page": RECLAIM_PAGE,
        },
    )
    return cursor.rowcount


def set_instance(
    conn: sqlite3.Connection, dispatch_id: str, attempt: int, instance: AgentInstance
) -> None:
    """Records who acknowledged this attempt, while it is still the live one."""
    conn.execute(
        """UPDATE dispatches SET instance_name = ?, instance_incarnation = ?
           WHERE id = ? AND attempt = ? AND status = 'in_flight'""",
        (instance.name, instance.incarnation, dispatch_id, attempt),
    )


def list_superseded(
    conn: sqlite3.Connection, agent_id: str, instance: AgentInstance, limit: int
) -> list[Dispatch]:
    """The agent's in-flight attempts acknowledged by another incarnation of this instance."""
    rows = conn.execute(
        f"""SELECT {qualified("d", COLUMNS)} FROM dispatches d
            JOIN executions e ON e.id = d.execution_id
            WHERE d.status = 'in_flight' AND d.instance_name = ?
              AND d.instance_incarnation != ? AND e.agent_id = ?
            ORDER BY d.id LIMIT ?""",
        (instance.name, instance.incarnation, agent_id, limit),
    ).fetchall()
    return [to_record(row) for row in rows]


def expire_lease(conn: sqlite3.Connection, dispatch_id: str, attempt: int) -> None:
    """Backdates the attempt's lease to the epoch, so the next reclaim takes it as expired."""
    conn.execute(
        """UPDATE dispatches SET locked_at = 0
           WHERE id = ? AND attempt = ? AND status = 'in_flight'""",
        (dispatch_id, attempt),
    )
