"""SQL for the `executions` table and its row mapping.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
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
    " updated_at, deadline_at, last_event_seq"
)
WIDTH = 11
"""How many columns `COLUMNS` names: where an execution ends in a joined row."""


def prefixed(alias: str) -> str:
    """`COLUMNS` qualified by a table alias, for a joined query."""
    return ", ".join(f"{alias}.{column.strip()}" for column in COLUMNS.split(","))


_TERMINAL = "('completed', 'failed', 'cancelled')"
# A list page: `COLUMNS` with an input or output over the page's limit (the `?`s) left out,
# and then the two sizes, in bytes of UTF-8.
_LISTED = (
    "id, agent_id, agent_version,"
    " CASE WHEN length(CAST(input AS BLOB)) > ? THEN 'null' ELSE input END, status,"
    " CASE WHEN length(CAST(output AS BLOB)) > ? THEN NULL ELSE output END, failure_reason,"
    " created_at, updated_at, deadline_at, last_event_seq,"
    " length(CAST(input AS BLOB)), length(CAST(output AS BLOB))"
)


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
    )


def _listed(row: tuple[Any, ...], payload_limit: int) -> Execution:
    record = to_record(row)
    omitted = tuple(
        (name, size)
        for name, size in (("input", row[WIDTH]), ("output", row[WIDTH + 1]))
        if size is not None and size > payload_limit
    )
    return replace(record, omitted=omitted) if omitted else record


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
            f"INSERT INTO executions ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            ),
        )


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
        f"SELECT {_LISTED} FROM executions {where} ORDER BY id DESC LIMIT ?",
        (flt.payload_limit, flt.payload_limit, *params, flt.limit + 1),
    ).fetchall()
    items = [_listed(row, flt.payload_limit) for row in rows[: flt.limit]]
    next_cursor = items[-1].id if len(rows) > flt.limit and items else None
    return Page(items=items, next_cursor=next_cursor)


def list_overdue(conn: sqlite3.Connection, now: datetime, limit: int, after: str) -> list[str]:
    rows = conn.execute(
        """SELECT id FROM executions
           WHERE status IN ('pending', 'running', 'blocked') AND deadline_at <= ? AND id > ?
           ORDER BY id LIMIT ?""",
        (to_micros(now), after, limit),
    ).fetchall()
    return [row[0] for row in rows]


def delete_terminal_before(conn: sqlite3.Connection, cutoff: datetime, limit: int) -> int:
    """Deletes one page of expired terminal executions; their children go by cascade."""
    cursor = conn.execute(
        f"""DELETE FROM executions WHERE id IN (
                SELECT id FROM executions
                WHERE status IN {_TERMINAL} AND updated_at < ? LIMIT ?)""",
        (to_micros(cutoff), limit),
    )
    return cursor.rowcount
