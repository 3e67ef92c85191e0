"""SQL for the `events` table: the append-only log, unique on (execution_id, event_seq).

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rebuno.kernel.domain.records import Event
from rebuno.kernel.store.columns import Layout, names
from rebuno.kernel.store.postgres.connection import Executor

COLUMNS = names("execution_id, event_seq, type, payload, occurred_at")
"""The columns of an `Event`, in the order `to_record` takes them."""

# A payload over the limit (the first `%s`) is left out; `octet_length` reads its size from
# the stored value's header, so it is never fetched or decompressed.
_LIMITED = {"payload": "CASE WHEN octet_length(payload) > %s THEN 'null' ELSE payload END"}
_LIST = f"""
    SELECT {", ".join(_LIMITED.get(column, column) for column in COLUMNS)},
        octet_length(payload)
    FROM events
    WHERE execution_id = %s AND event_seq > %s ORDER BY event_seq LIMIT %s
"""
_LISTED_ROW = Layout(COLUMNS, ("payload_size",))
_DECISIONS = f"""
    SELECT {", ".join(COLUMNS)} FROM events
    WHERE execution_id = %s AND type = ANY(%s) ORDER BY event_seq
"""
_HAS_TYPE = "SELECT EXISTS (SELECT 1 FROM events WHERE execution_id = %s AND type = %s)"


async def list_after(
    conn: Executor, execution_id: str, after_seq: int, limit: int, payload_limit: int
) -> list[Event]:
    """A page of the log; a payload over `payload_limit` bytes is left out."""
    cur = await conn.execute(_LIST, (payload_limit, execution_id, after_seq, limit))
    return [_listed(row, payload_limit) for row in await cur.fetchall()]


def to_record(row: Sequence[Any]) -> Event:
    execution_id, event_seq, type, payload, occurred_at = row
    return Event(
        execution_id=execution_id,
        event_seq=event_seq,
        type=type,
        payload=payload,
        occurred_at=occurred_at,
    )


def _listed(row: Sequence[Any], payload_limit: int) -> Event:
    columns, (size,) = _LISTED_ROW.split(row)
    record = to_record(columns)
    return replace(record, omitted=(("payload", size),)) if size > payload_limit else record


async def has_type(conn: Executor, execution_id: str, event_type: str) -> bool:
    cur = await conn.execute(_HAS_TYPE, (execution_id, str(event_type)))
    row = await cur.fetchone()
    if row is None:
        return False
    (found,) = row
    return bool(found)


async def list_decisions(conn: Executor, execution_id: str, types: tuple[str, ...]) -> list[Event]:
    """The execution's events of these types, whole, in log order."""
    cur = await conn.execute(_DECISIONS, (execution_id, list(types)))
    return [to_record(row) for row in await cur.fetchall()]
