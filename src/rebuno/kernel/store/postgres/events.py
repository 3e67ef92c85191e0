"""SQL for the `events` table: the append-only log, unique on (execution_id, event_seq).

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from rebuno.kernel.domain.records import Event
from rebuno.kernel.store.postgres.connection import Executor

# A payload over the limit (the first `%s`) is left out; `octet_length` reads its size from
# the stored value's header, so it is never fetched or decompressed.
_LIST = """
    SELECT execution_id, event_seq, type,
        CASE WHEN octet_length(payload) > %s THEN 'null' ELSE payload END,
        occurred_at, octet_length(payload)
    FROM events
    WHERE execution_id = %s AND event_seq > %s ORDER BY event_seq LIMIT %s
"""
_DECISIONS = """
    SELECT execution_id, event_seq, type, payload, occurred_at FROM events
    WHERE execution_id = %s AND type = ANY(%s) ORDER BY event_seq
"""
_HAS_TYPE = "SELECT EXISTS (SELECT 1 FROM events WHERE execution_id = %s AND type = %s)"


async def list_after(
    conn: Executor, execution_id: str, after_seq: int, limit: int, payload_limit: int
) -> list[Event]:
    """A page of the log; a payload over `payload_limit` bytes is left out."""
    cur = await conn.execute(_LIST, (payload_limit, execution_id, after_seq, limit))
    return [
        Event(
            execution_id=r[0],
            event_seq=r[1],
            type=r[2],
            payload=r[3],
            occurred_at=r[4],
            omitted=(("payload", r[5]),) if r[5] > payload_limit else (),
        )
        for r in await cur.fetchall()
    ]


async def has_type(conn: Executor, execution_id: str, event_type: str) -> bool:
    cur = await conn.execute(_HAS_TYPE, (execution_id, str(event_type)))
    row = await cur.fetchone()
    return bool(row and row[0])


async def list_decisions(conn: Executor, execution_id: str, types: tuple[str, ...]) -> list[Event]:
    """The execution's events of these types, whole, in log order."""
    cur = await conn.execute(_DECISIONS, (execution_id, list(types)))
    return [
        Event(execution_id=r[0], event_seq=r[1], type=r[2], payload=r[3], occurred_at=r[4])
        for r in await cur.fetchall()
    ]
