"""SQL for the `executions` table and its row mapping.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.store.base import ExecutionFilter, Page
from rebuno.kernel.store.sqlite.errors import refusals
from rebuno.kernel.store.sqlite.timestamps import (
    from_micros,
    from_micros_or_none,
    to_micros,
    to_micros_or_none,
)
from rebuno.protocol.enums import ExecutionStatus

COLUMNS = (
    "id, agent_id, agent_version, input, status, output, failure_reason, created_at,"
    " updated_at, deadline_at, last_event_seq,"
    " idempotency_key, parent_execution_id, created_by, on_behalf_of"
)
WIDTH = 15
"""How many columns `COLUMNS` names: where an execution ends in a joined row."""


def prefixed(alias: str) -> str:
    """`COLUMNS` qualified by a table alias, for a joined query."""
    return ", ".join(f"{alias}.{column.strip()}" for column in COLUMNS.split(","))


_TERMINAL = "('completed', 'failed', 'cancelled')"


def to_record(row: tuple[Any, ...]) -> Execution:
    return Execution(
        id=row[0],
        agent_id=row[1],
        agent_version=row[2],
        input=row[3],
        status=ExecutionStatus(row[4]),
        output=row[5],
        failure_reason=row[6],
        created_at=from_micros(row[7]),
        updated_at=from_micros(row[8]),
        deadline_at=from_micros_or_none(row[9]),
        last_event_seq=row[10],
        idempotency_key=row[11],
        parent_execution_id=row[12],
        created_by=row[13],
        on_behalf_of=row[14],
    )


def get(conn: sqlite3.Connection, execution_id: str) -> Execution:
    row = conn.execute(f"SELECT {COLUMNS} FROM executions WHERE id = ?", (execution_id,))
    found = row.fetchone()
    if found is None:
        raise NotFound(f"execution {execution_id} not found")
    return to_record(found)


def insert(conn: sqlite3.Connection, execution: Execution) -> None:
    """Raises `NotFound` when the agent is not registered: its foreign key is the check."""
    with refusals(f"execution {execution.id}", missing=f"agent {execution.agent_id} not found"):
        conn.execute(
            f"INSERT INTO executions ({COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                execution.id,
                execution.agent_id,
                execution.agent_version,
                execution.input,
                execution.status.value,
                execution.output,
                execution.failure_reason,
                to_micros(execution.created_at),
                to_micros(execution.updated_at),
                to_micros_or_none(execution.deadline_at),
                execution.last_event_seq,
                execution.idempotency_key,
                execution.parent_execution_id,
                execution.created_by,
                execution.on_behalf_of,
            ),
        )


def find(conn: sqlite3.Connection, agent_id: str, idempotency_key: str) -> Execution | None:
    """The agent's execution created under this idempotency key, if any (§27.1)."""
    row = conn.execute(
        f"SELECT {COLUMNS} FROM executions WHERE agent_id = ? AND idempotency_key = ?",
        (agent_id, idempotency_key),
    ).fetchone()
    return None if row is None else to_record(row)


def set_state(conn: sqlite3.Connection, execution_id: str, state: str) -> None:
    conn.execute("UPDATE executions SET state = ? WHERE id = ?", (state, execution_id))


def get_state(conn: sqlite3.Connection, execution_id: str) -> str | None:
    """The `state` the execution was completed with (§24.5); None when it has none."""
    row = conn.execute("SELECT state FROM executions WHERE id = ?", (execution_id,)).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return None if row[0] is None else str(row[0])


def update(conn: sqlite3.Connection, execution: Execution) -> None:
    with refusals(f"execution {execution.id}"):
        cursor = conn.execute(
            """UPDATE executions SET status = ?, output = ?, failure_reason = ?,
                   updated_at = ?, last_event_seq = ?
               WHERE id = ?""",
            (
                execution.status.value,
                execution.output,
                execution.failure_reason,
                to_micros(execution.updated_at),
                execution.last_event_seq,
                execution.id,
            ),
        )
    if cursor.rowcount == 0:
        raise NotFound(f"execution {execution.id} not found")


def list_page(conn: sqlite3.Connection, flt: ExecutionFilter) -> Page[Execution]:
    clauses: list[str] = []
    params: list[object] = []
    for clause, value in (
        ("agent_id = ?", flt.agent_id),
        ("status = ?", None if flt.status is None else flt.status.value),
        ("id < ?", flt.cursor),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM executions {where} ORDER BY id DESC LIMIT ?",
        (*params, flt.limit + 1),
    ).fetchall()
    items = [to_record(row) for row in rows[: flt.limit]]
    next_cursor = items[-1].id if len(rows) > flt.limit and items else None
    return Page(items=items, next_cursor=next_cursor)


def list_overdue(conn: sqlite3.Connection, now: datetime, limit: int) -> list[str]:
    rows = conn.execute(
        """SELECT id FROM executions
           WHERE status IN ('pending', 'running', 'blocked') AND deadline_at <= ?
           ORDER BY deadline_at LIMIT ?""",
        (to_micros(now), limit),
    ).fetchall()
    return [row[0] for row in rows]


def delete_terminal_before(conn: sqlite3.Connection, cutoff: datetime, limit: int) -> int:
    """Deletes one page of expired terminal executions; their children go by cascade. One that
    another execution names as its parent stays, so that execution's `previous` keeps
    answering (§24.6); it goes on a later page once that one has gone."""
    cursor = conn.execute(
        f"""DELETE FROM executions WHERE id IN (
                SELECT id FROM executions AS e
                WHERE status IN {_TERMINAL} AND updated_at < ?
                    AND NOT EXISTS (
                        SELECT 1 FROM executions AS child WHERE child.parent_execution_id = e.id)
                LIMIT ?)""",
        (to_micros(cutoff), limit),
    )
    return cursor.rowcount
