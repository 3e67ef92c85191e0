"""SQL for the `rate_buckets` table: the token buckets of §14.7, one row per key, shared by
every replica.

The arithmetic is the domain's (`ratelimit.take`); this module reads the row under a row lock
and writes the result back in the caller's transaction, so concurrent takes on one key queue
up instead of both spending the same token.
Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from datetime import datetime

from rebuno.kernel.domain import ratelimit
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.postgres.connection import Executor

COLUMNS = names("key, tokens, max_tokens, window_seconds, updated_at")
"""A bucket's columns, in the order `_ENSURE` writes them."""

# A new bucket starts full. Inserting it before the locking read (and doing nothing when it
# exists) means two first takes on one key still serialise on one row instead of colliding on
# the primary key at commit.
_ENSURE = f"""
    INSERT INTO rate_buckets ({", ".join(COLUMNS)})
    VALUES (%s, %s, %s, %s, %s)
    ON CONFLICT (key) DO NOTHING
"""
_LOCK = "SELECT tokens, updated_at FROM rate_buckets WHERE key = %s FOR UPDATE"
_STORE = """
    UPDATE rate_buckets SET tokens = %s, max_tokens = %s, window_seconds = %s, updated_at = %s
    WHERE key = %s
"""
_DELETE_BEFORE = "DELETE FROM rate_buckets WHERE updated_at < %s"


async def take(
    conn: Executor, key: str, max_calls: int, window_seconds: float, now: datetime
) -> float | None:
    """Consumes a token and returns None, or returns the estimated wait in seconds."""
    capacity = float(max_calls)
    await conn.execute(_ENSURE, (key, capacity, capacity, float(window_seconds), now))
    cur = await conn.execute(_LOCK, (key,))
    row = await cur.fetchone()
    tokens, updated_at = (capacity, now) if row is None else row
    left, wait = ratelimit.take(float(tokens), updated_at, max_calls, window_seconds, now)
    await conn.execute(_STORE, (left, capacity, float(window_seconds), now, key))
    return wait


async def delete_before(conn: Executor, cutoff: datetime) -> int:
    cur = await conn.execute(_DELETE_BEFORE, (cutoff,))
    return cur.rowcount
