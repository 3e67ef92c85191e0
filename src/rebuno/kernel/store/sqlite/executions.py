"""SQL for the `executions` table and its row mapping.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Execution, Origin
from rebuno.kernel.store.base import ExecutionFilter, Omitted, Page
from rebuno.kernel.store.columns import Layout, names
from rebuno.kernel.store.sqlite.errors import refusals
from rebuno.kernel.store.sqlite.timestamps import (
    from_micros,
    from_micros_or_none,
    to_micros,
    to_micros_or_none,
)
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
_SELECTED = ", ".join(COLUMNS)
_TERMINAL = "('completed', 'failed', 'cancelled')"
# A list page: `COLUMNS` with an input or output over the page's limit (the `?`s) left out,
# and then the two sizes, in bytes of UTF-8.
_LIMITED = {
    "input": "CASE WHEN length(CAST(input AS BLOB)) > ? THEN 'null' ELSE input END",
    "output": "CASE WHEN length(CAST(output AS BLOB)) > ? THEN NULL ELSE output END",
}
_LISTED = ", ".join(
    [_LIMITED.get(column, column) for column in COLUMNS]
    + ["length(CAST(input AS BLOB))", "length(CAST(output AS BLOB))"]
)
_LISTED_ROW = Layout(COLUMNS, ("input_size", "output_size"))


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
        created_at=from_micros(created_at),
        deadline_at=from_micros_or_none(deadline_at),
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
        updated_at=from_micros(updated_at),
        last_event_seq=last_event_seq,
        parent_execution_id=parent_execution_id,
        admitted_at=from_micros_or_none(admitted_at),
        has_children=bool(has_children),
        has_resources=bool(has_resources),
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


def get(conn: sqlite3.Connection, execution_id: str) -> Execution:
    row = conn.execute(f"SELECT {_SELECTED} FROM executions WHERE id = ?", (execution_id,))
    found = row.fetchone()
    if found is None:
        raise NotFound(f"execution {execution_id} not found")
    return to_record(found)


def insert(
    conn: sqlite3.Connection, execution: Execution, policy_bundle: str | None = None
) -> None:
    """Raises `NotFound` when the agent is not registered: its foreign key is the check."""
    with refusals(f"execution {execution.id}", missing=f"agent {execution.agent_id} not found"):
        conn.execute(
            f"INSERT INTO executions ({_SELECTED}, policy_bundle)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                execution.id,
                execution.agent_id,
                execution.origin.agent_version,
                execution.origin.input,
                execution.status.value,
                execution.output,
                execution.failure_reason,
                to_micros(execution.origin.created_at),
                to_micros(execution.updated_at),
                to_micros_or_none(execution.origin.deadline_at),
                execution.last_event_seq,
                execution.origin.idempotency_key,
                execution.parent_execution_id,
                execution.origin.created_by,
                execution.origin.on_behalf_of,
                execution.origin.session,
                to_micros_or_none(execution.admitted_at),
                execution.origin.spawned_by_execution_id,
                execution.origin.spawned_by_step_id,
                execution.origin.forked_from,
                execution.origin.fork_seq,
                int(execution.has_children),
                int(execution.has_resources),
                policy_bundle,
            ),
        )


def find(conn: sqlite3.Connection, agent_id: str, idempotency_key: str) -> Execution | None:
    """The agent's execution created under this idempotency key, if any (§27.1)."""
    row = conn.execute(
        f"SELECT {_SELECTED} FROM executions WHERE agent_id = ? AND idempotency_key = ?",
        (agent_id, idempotency_key),
    ).fetchone()
    return None if row is None else to_record(row)


def mark_parent(conn: sqlite3.Connection, execution_id: str) -> None:
    conn.execute(
        "UPDATE executions SET has_children = 1 WHERE id = ? AND has_children = 0",
        (execution_id,),
    )


def mark_resources(conn: sqlite3.Connection, execution_id: str) -> None:
    conn.execute(
        "UPDATE executions SET has_resources = 1 WHERE id = ? AND has_resources = 0",
        (execution_id,),
    )


def set_restoration(conn: sqlite3.Connection, execution_id: str, restoration: str) -> None:
    conn.execute("UPDATE executions SET restoration = ? WHERE id = ?", (restoration, execution_id))


def get_restoration(conn: sqlite3.Connection, execution_id: str) -> str | None:
    row = conn.execute("SELECT restoration FROM executions WHERE id = ?", (execution_id,))
    found = row.fetchone()
    if found is None:
        return None
    (value,) = found
    return None if value is None else str(value)


def set_state(conn: sqlite3.Connection, execution_id: str, state: str) -> None:
    conn.execute("UPDATE executions SET state = ? WHERE id = ?", (state, execution_id))


def get_own_policy(conn: sqlite3.Connection, execution_id: str) -> str | None:
    """The execution's own policy bundle (§26.4); None when its agent's applies."""
    row = conn.execute("SELECT policy_bundle FROM executions WHERE id = ?", (execution_id,))
    found = row.fetchone()
    if found is None:
        return None
    (value,) = found
    return None if value is None else str(value)


def get_state(conn: sqlite3.Connection, execution_id: str) -> str | None:
    """The `state` the execution was completed with (§24.5); None when it has none."""
    row = conn.execute("SELECT state FROM executions WHERE id = ?", (execution_id,)).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    (state,) = row
    return None if state is None else str(state)


_CHANGEABLE = ("status", "output", "failure_reason", "updated_at")
"""What `update` may write besides `last_event_seq`, in the order of its statement."""


def update(conn: sqlite3.Connection, execution: Execution, before: Execution | None = None) -> None:
    """Writes the execution's status, outcome, `updated_at` and `last_event_seq`. `before`:
    the row as this transaction read it, when it did; only the columns that differ from it
    are then written (a step moves `last_event_seq` alone). A column left out of the
    statement costs nothing: writing `status`, even unchanged, rewrites the entries of the
    three indexes on it and runs the terminal guard, three times the cost of the rest."""
    values = {
        "status": execution.status.value,
        "output": execution.output,
        "failure_reason": execution.failure_reason,
        "updated_at": to_micros(execution.updated_at),
    }
    if before is not None:
        kept = {
            "status": before.status.value,
            "output": before.output,
            "failure_reason": before.failure_reason,
            "updated_at": to_micros(before.updated_at),
        }
        values = {name: value for name, value in values.items() if kept[name] != value}
    assignments = "".join(f"{name} = ?, " for name in values)
    with refusals(f"execution {execution.id}"):
        cursor = conn.execute(
            f"UPDATE executions SET {assignments}last_event_seq = ? WHERE id = ?",
            (*values.values(), execution.last_event_seq, execution.id),
        )
    if cursor.rowcount == 0:
        raise NotFound(f"execution {execution.id} not found")


def list_page(conn: sqlite3.Connection, flt: ExecutionFilter) -> Page[Execution]:
    clauses: list[str] = []
    params: list[object] = []
    for clause, value in (
        ("agent_id = ?", flt.agent_id),
        ("status = ?", None if flt.status is None else flt.status.value),
        ("session = ?", flt.session),
        ("parent_execution_id = ?", flt.parent_execution_id),
        ("spawned_by_execution_id = ?", flt.spawned_by),
        ("forked_from = ?", flt.forked_from),
        ("id < ?", flt.cursor),
        ("id >= ?", flt.floor),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute(
        f"SELECT {_LISTED} FROM executions {where} ORDER BY id DESC LIMIT ?",
        (flt.payload_limit, flt.payload_limit, *params, flt.limit + 1),
    ).fetchall()
    listed = [_listed(row, flt.payload_limit) for row in rows[: flt.limit]]
    items = [record for record, _ in listed]
    omitted = {record.id: left_out for record, left_out in listed if left_out}
    next_cursor = items[-1].id if len(rows) > flt.limit and items else None
    return Page(items=items, next_cursor=next_cursor, omitted=omitted)


def list_overdue(conn: sqlite3.Connection, now: datetime, limit: int, after: str) -> list[str]:
    rows = conn.execute(
        """SELECT id FROM executions
           WHERE status IN ('pending', 'running', 'blocked') AND deadline_at <= ? AND id > ?
           ORDER BY id LIMIT ?""",
        (to_micros(now), after, limit),
    ).fetchall()
    return [execution_id for (execution_id,) in rows]


def delete_terminal_before(conn: sqlite3.Connection, cutoff: datetime, limit: int) -> int:
    """Deletes one page of expired terminal executions; their children go by cascade. One that
    another execution names as its parent stays, so that execution's `previous` keeps
    answering (§24.6); it goes on a later page once that one has gone. Sessions go whole
    (`delete_session`)."""
    cursor = conn.execute(
        f"""DELETE FROM executions WHERE id IN (
                SELECT id FROM executions AS e
                WHERE status IN {_TERMINAL} AND updated_at < ? AND session IS NULL
                    AND NOT EXISTS (
                        SELECT 1 FROM executions AS child WHERE child.parent_execution_id = e.id)
                LIMIT ?)""",
        (to_micros(cutoff), limit),
    )
    return cursor.rowcount


# -- sessions (§24) ----------------------------------------------------------------------------
_LIVE = "('pending', 'running', 'blocked')"


def session_held(conn: sqlite3.Connection, session: str) -> bool:
    """Whether an admitted execution of the session is live: the one that holds it."""
    row = conn.execute(
        f"""SELECT 1 FROM executions WHERE session = ? AND admitted_at IS NOT NULL
            AND status IN {_LIVE} LIMIT 1""",
        (session,),
    ).fetchone()
    return row is not None


def session_used(conn: sqlite3.Connection, session: str) -> bool:
    row = conn.execute("SELECT 1 FROM executions WHERE session = ? LIMIT 1", (session,))
    return row.fetchone() is not None


def first_waiter(conn: sqlite3.Connection, session: str, now: datetime) -> Execution | None:
    """The session's oldest waiter whose deadline has not passed."""
    row = conn.execute(
        f"""SELECT {_SELECTED} FROM executions
            WHERE session = ? AND admitted_at IS NULL AND status = 'pending'
                AND (deadline_at IS NULL OR deadline_at > ?)
            ORDER BY id LIMIT 1""",
        (session, to_micros(now)),
    ).fetchone()
    return None if row is None else to_record(row)


def last_completed(conn: sqlite3.Connection, agent_id: str, session: str) -> str | None:
    """The agent's most recently created completed execution in the session."""
    row = conn.execute(
        """SELECT id FROM executions WHERE session = ? AND agent_id = ? AND status = 'completed'
           ORDER BY id DESC LIMIT 1""",
        (session, agent_id),
    ).fetchone()
    if row is None:
        return None
    (execution_id,) = row
    return str(execution_id)


def admit(conn: sqlite3.Connection, execution_id: str, now: datetime, parent: str | None) -> None:
    """A second admitted live execution of a session is a `Conflict` (its unique index)."""
    with refusals(f"execution {execution_id}"):
        conn.execute(
            """UPDATE executions SET admitted_at = ?,
                   parent_execution_id = COALESCE(parent_execution_id, ?)
               WHERE id = ?""",
            (to_micros(now), parent, execution_id),
        )


def sessions_to_admit(conn: sqlite3.Connection, limit: int) -> list[str]:
    """Sessions with a waiter and no holder: what a lost release left (§24.3)."""
    rows = conn.execute(
        f"""SELECT DISTINCT w.session FROM executions w
            WHERE w.session IS NOT NULL AND w.admitted_at IS NULL AND w.status = 'pending'
                AND NOT EXISTS (
                    SELECT 1 FROM executions h WHERE h.session = w.session
                        AND h.admitted_at IS NOT NULL AND h.status IN {_LIVE})
            LIMIT ?""",
        (limit,),
    ).fetchall()
    return [str(value) for (value,) in rows]


def expired_sessions(conn: sqlite3.Connection, cutoff: datetime, limit: int) -> list[str]:
    """Sessions retention may delete as a whole: every execution terminal and older than
    `cutoff`, and none named as parent by an execution of another session (§24.6)."""
    at = to_micros(cutoff)
    rows = conn.execute(
        f"""SELECT DISTINCT e.session FROM executions e
            WHERE e.session IS NOT NULL AND e.status IN {_TERMINAL} AND e.updated_at < ?
                AND NOT EXISTS (
                    SELECT 1 FROM executions o WHERE o.session = e.session
                        AND (o.status NOT IN {_TERMINAL} OR o.updated_at >= ?))
                AND NOT EXISTS (
                    SELECT 1 FROM executions m JOIN executions c ON c.parent_execution_id = m.id
                    WHERE m.session = e.session AND c.session IS NOT e.session)
            LIMIT ?""",
        (at, at, limit),
    ).fetchall()
    return [str(value) for (value,) in rows]


def delete_session(conn: sqlite3.Connection, session: str, cutoff: datetime) -> int:
    """Deletes the whole session if it still qualifies (`expired_sessions`); how many."""
    at = to_micros(cutoff)
    cursor = conn.execute(
        f"""DELETE FROM executions WHERE session = ?
            AND NOT EXISTS (
                SELECT 1 FROM executions o WHERE o.session = ?
                    AND (o.status NOT IN {_TERMINAL} OR o.updated_at >= ?))
            AND NOT EXISTS (
                SELECT 1 FROM executions m JOIN executions c ON c.parent_execution_id = m.id
                WHERE m.session = ? AND c.session IS NOT ?)""",
        (session, session, at, session, session),
    )
    return cursor.rowcount


# -- sub-agents (§25) --------------------------------------------------------------------------
def children(conn: sqlite3.Connection, execution_id: str) -> list[Execution]:
    """The executions steps of this one started, oldest first."""
    rows = conn.execute(
        f"SELECT {_SELECTED} FROM executions WHERE spawned_by_execution_id = ? ORDER BY id",
        (execution_id,),
    ).fetchall()
    return [to_record(row) for row in rows]


def unsettled_children(conn: sqlite3.Connection, limit: int) -> list[str]:
    """Ended sub-agents whose step is still executing in a live parent: a lost settlement."""
    rows = conn.execute(
        f"""SELECT c.id FROM executions c
            JOIN executions p ON p.id = c.spawned_by_execution_id
            JOIN steps s ON s.step_id = c.spawned_by_step_id
            WHERE c.status IN {_TERMINAL} AND p.status IN {_LIVE} AND s.status = 'executing'
            ORDER BY c.id LIMIT ?""",
        (limit,),
    ).fetchall()
    return [str(value) for (value,) in rows]


def orphans(conn: sqlite3.Connection, limit: int) -> list[str]:
    """Live sub-agents whose parent ended or is gone: a lost cascade."""
    rows = conn.execute(
        f"""SELECT c.id FROM executions c
            LEFT JOIN executions p ON p.id = c.spawned_by_execution_id
            WHERE c.spawned_by_execution_id IS NOT NULL AND c.status IN {_LIVE}
                AND (p.id IS NULL OR p.status IN {_TERMINAL})
            ORDER BY c.id LIMIT ?""",
        (limit,),
    ).fetchall()
    return [str(value) for (value,) in rows]


def stalled(conn: sqlite3.Connection, limit: int) -> list[str]:
    """Blocked executions that nothing holds up any more: no step awaits an approval and no
    executing step waits for a live sub-agent."""
    rows = conn.execute(
        f"""SELECT e.id FROM executions e
            WHERE e.status = 'blocked'
                AND NOT EXISTS (SELECT 1 FROM steps s
                    WHERE s.execution_id = e.id AND s.status = 'awaiting_approval')
                AND NOT EXISTS (SELECT 1 FROM executions c
                    JOIN steps s ON s.step_id = c.spawned_by_step_id
                    WHERE c.spawned_by_execution_id = e.id AND c.status IN {_LIVE}
                        AND s.status = 'executing')
            ORDER BY e.id LIMIT ?""",
        (limit,),
    ).fetchall()
    return [str(value) for (value,) in rows]
