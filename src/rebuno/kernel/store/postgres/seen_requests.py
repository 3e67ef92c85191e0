"""SQL for the `seen_requests` table: digests of accepted `v1=` agent requests, kept until a
copy of the request could no longer verify (docs/protocol.md §2.3). Shared by every replica,
so a copy sent to another one is known there too.

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from datetime import datetime

from rebuno.kernel.store.columns import names
from rebuno.kernel.store.postgres.connection import Executor

COLUMNS = names("digest, seen_at, expires_at")
"""A digest's columns, in the order `_REMEMBER` writes them."""

# One round trip: the insert, or else the first sighting. A concurrent copy waits on the
# first one's uncommitted row and then inserts nothing; the row it waited for committed after
# this statement's snapshot, so it reads nothing either and counts as seen now.
_REMEMBER = f"""
    WITH new AS (
        INSERT INTO seen_requests ({", ".join(COLUMNS)})
        VALUES (%(digest)s, %(now)s, %(until)s)
        ON CONFLICT (digest) DO NOTHING RETURNING true AS fresh
    )
    SELECT (SELECT fresh FROM new),
        (SELECT seen_at FROM seen_requests WHERE digest = %(digest)s)
"""
_FORGET = "DELETE FROM seen_requests WHERE expires_at < %s"


async def remember(
    conn: Executor, digest: bytes, now: datetime, until: datetime
) -> datetime | None:
    """Records `digest` as seen `now`; None when it is new, else when it was first seen."""
    cur = await conn.execute(_REMEMBER, {"digest": digest, "now": now, "until": until})
    row = await cur.fetchone()
    if row is None:
        return None
    fresh, seen_at = row
    if fresh:
        return None
    first: datetime | None = seen_at
    return first or now


async def forget_before(conn: Executor, now: datetime) -> int:
    cur = await conn.execute(_FORGET, (now,))
    return cur.rowcount
