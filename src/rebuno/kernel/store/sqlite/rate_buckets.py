"""SQL for the `rate_buckets` table: the token buckets of §14.7, shared by key.

The bucket arithmetic is the domain's (`ratelimit.take`); this module only reads and writes
the row, inside the caller's write transaction, so the read-modify-write is atomic.
Must import only sqlite3, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from rebuno.kernel.domain import ratelimit
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.sqlite.timestamps import from_micros, to_micros

COLUMNS = names("key, tokens, max_tokens, window_seconds, updated_at")
"""A bucket's columns, in the order `take` writes them."""


def take(
    conn: sqlite3.Connection, key: str, max_calls: int, window_seconds: float, now: datetime
) -> float | None:
    """Consumes a token and returns None, or returns the estimated wait in seconds."""
    row = conn.execute(
        "SELECT tokens, updated_at FROM rate_buckets WHERE key = ?", (key,)
    ).fetchone()
    tokens: float | None = None
    updated_at: datetime | None = None
    if row is not None:
        stored_tokens, stored_at = row
        tokens, updated_at = float(stored_tokens), from_micros(stored_at)
    # No row: `take` starts the bucket full.
    left, wait = ratelimit.take(tokens, updated_at, max_calls, window_seconds, now)
    conn.execute(
        f"""INSERT INTO rate_buckets ({", ".join(COLUMNS)})
           VALUES (?, ?, ?, ?, ?)
           ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens,
               max_tokens = excluded.max_tokens, window_seconds = excluded.window_seconds,
               updated_at = excluded.updated_at""",
        (key, left, float(max_calls), float(window_seconds), to_micros(now)),
    )
    return wait


def delete_before(conn: sqlite3.Connection, cutoff: datetime) -> None:
    conn.execute("DELETE FROM rate_buckets WHERE updated_at < ?", (to_micros(cutoff),))
