"""SQL for the `seen_requests` table: digests of accepted `v1=` agent requests, kept until a
copy of the request could no longer verify (docs/protocol.md §2.3). Shared by every replica,
so a copy sent to another one is known there too.

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from datetime import datetime

from rebuno.kernel.store.postgres.connection import Executor

# A concurrent copy waits on the first one's uncommitted row and then finds it, so exactly one
# of two copies is fresh; a first one that rolled back leaves nothing behind.
_REMEMBER = """
    INSERT INTO seen_requests (digest, expires_at) VALUES (%s, %s)
    ON CONFLICT (digest) DO NOTHING RETURNING true
"""
_FORGET = "DELETE FROM seen_requests WHERE expires_at < %s"


async def remember(conn: Executor, digest: bytes, until: datetime) -> bool:
    """Records `digest`; False when it is recorded already (the request is a copy)."""
    # A row back, not `rowcount`: in a transaction's pipeline that is known only once fetched.
    cur = await conn.execute(_REMEMBER, (digest, until))
    return await cur.fetchone() is not None


async def forget_before(conn: Executor, now: datetime) -> int:
    cur = await conn.execute(_FORGET, (now,))
    return cur.rowcount
