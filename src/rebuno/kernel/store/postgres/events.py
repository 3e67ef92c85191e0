"""SQL for the `events` table: the append-only log, unique on (execution_id, event_seq).

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from collections.abc import Sequence

from rebuno.kernel.domain.records import Event
from rebuno.kernel.store.postgres.connection import Connection

# One statement for any number of events: a single prepared plan and a single execution,
# however many events the use case writes.
_APPEND = """
    INSERT INTO events (execution_id, event_seq, type, payload, occurred_at)
    SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::timestamptz[])
"""
_LIST = """
    SELECT execution_id, event_seq, type, payload, occurred_at FROM events
    WHERE execution_id = %s AND event_seq > %s ORDER BY event_seq LIMIT %s
"""
_HAS_TYPE = "SELECT EXISTS (SELECT 1 FROM events WHERE execution_id = %s AND type = %s)"


async def append(conn: Connection, events: Sequence[Event]) -> None:
    if not events:
        return
    await conn.execute(
        _APPEND,
        (
            [e.execution_id for e in events],
            [e.event_seq for e in events],
            [str(e.type) for e in events],
            [e.payload for e in events],
            [e.occurred_at for e in events],
        ),
    )


async def list_after(
    conn: Connection, execution_id: str, after_seq: int, limit: int
) -> list[Event]:
    cur = await conn.execute(_LIST, (execution_id, after_seq, limit))
    return [
        Event(execution_id=r[0], event_seq=r[1], type=r[2], payload=r[3], occurred_at=r[4])
        for r in await cur.fetchall()
    ]


async def has_type(conn: Connection, execution_id: str, event_type: str) -> bool:
    cur = await conn.execute(_HAS_TYPE, (execution_id, str(event_type)))
    row = await cur.fetchone()
    return bool(row and row[0])
