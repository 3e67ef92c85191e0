"""SQL for the `events` table (the append-only log) and its row mapping.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rebuno.kernel.domain.records import Event
from rebuno.kernel.store.columns import Layout, names
from rebuno.kernel.store.sqlite.errors import refusals
from rebuno.kernel.store.sqlite.timestamps import from_micros, to_micros

COLUMNS = names("execution_id, event_seq, type, payload, occurred_at")
"""The columns of an `Event`, in the order `to_record` takes them."""
_SELECTED = ", ".join(COLUMNS)
# A page of the log: a payload over the limit (the first `?`) left out, and then its size, in
# bytes of UTF-8.
_LIMITED = {"payload": "CASE WHEN length(CAST(payload AS BLOB)) > ? THEN 'null' ELSE payload END"}
_LISTED = ", ".join(_LIMITED.get(column, column) for column in COLUMNS)
_LISTED_ROW = Layout(COLUMNS, ("payload_size",))


def to_record(row: Sequence[Any]) -> Event:
    execution_id, event_seq, type, payload, occurred_at = row
    return Event(
        execution_id=execution_id,
        event_seq=event_seq,
        type=type,
        payload=payload,
        occurred_at=from_micros(occurred_at),
    )


_ROWS_PER_INSERT = 100
"""Events one INSERT writes at most (5 parameters each, far below SQLite's limit)."""
_INSERT = f"INSERT INTO events ({_SELECTED}) VALUES "
_ROW = "(?, ?, ?, ?, ?)"


def append(conn: sqlite3.Connection, events: Sequence[Event]) -> None:
    """One INSERT for a batch's events (a step appends three to five): the driver's cost is
    per statement. A statement writes all its rows or none, so when one is refused the rows
    are written again one by one, to name the event whose `event_seq` is taken."""
    for start in range(0, len(events), _ROWS_PER_INSERT):
        chunk = events[start : start + _ROWS_PER_INSERT]
        params: list[object] = []
        moment, micros = None, 0
        for event in chunk:
            if event.occurred_at is not moment:  # a batch's events share their time
                moment, micros = event.occurred_at, to_micros(event.occurred_at)
            params += (event.execution_id, event.event_seq, event.type, event.payload, micros)
        try:
            conn.execute(_INSERT + ", ".join([_ROW] * len(chunk)), params)
        except sqlite3.IntegrityError:
            _append_one_by_one(conn, chunk)
            raise


def _append_one_by_one(conn: sqlite3.Connection, events: Sequence[Event]) -> None:
    for event in events:
        with refusals(f"event {event.event_seq} of execution {event.execution_id}"):
            conn.execute(
                _INSERT + _ROW,
                (
                    event.execution_id,
                    event.event_seq,
                    event.type,
                    event.payload,
                    to_micros(event.occurred_at),
                ),
            )


def list_after(
    conn: sqlite3.Connection, execution_id: str, after_seq: int, limit: int, payload_limit: int
) -> list[Event]:
    """A page of the log; a payload over `payload_limit` bytes of UTF-8 is left out."""
    rows = conn.execute(
        f"""SELECT {_LISTED}, length(CAST(payload AS BLOB))
            FROM events WHERE execution_id = ? AND event_seq > ?
            ORDER BY event_seq LIMIT ?""",
        (payload_limit, execution_id, after_seq, limit),
    ).fetchall()
    return [_listed(row, payload_limit) for row in rows]


def _listed(row: Sequence[Any], payload_limit: int) -> Event:
    columns, (size,) = _LISTED_ROW.split(row)
    record = to_record(columns)
    return replace(record, omitted=(("payload", size),)) if size > payload_limit else record


def has_type(conn: sqlite3.Connection, execution_id: str, event_type: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM events WHERE execution_id = ? AND type = ? LIMIT 1",
        (execution_id, event_type),
    ).fetchone()
    return row is not None


def list_decisions(
    conn: sqlite3.Connection, execution_id: str, types: tuple[str, ...]
) -> list[Event]:
    """The execution's events of these types, whole, in log order."""
    marks = ", ".join("?" * len(types))
    rows = conn.execute(
        f"SELECT {_SELECTED} FROM events WHERE execution_id = ? AND type IN ({marks})"
        " ORDER BY event_seq",
        (execution_id, *types),
    ).fetchall()
    return [to_record(row) for row in rows]
