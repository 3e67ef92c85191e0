"""SQL for the `seen_requests` table: digests of accepted `v1=` agent requests, kept until a
copy of the request could no longer verify (docs/protocol.md §2.3).

Must import only sqlite3, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from rebuno.kernel.store.columns import names
from rebuno.kernel.store.sqlite.timestamps import from_micros, to_micros

COLUMNS = names("digest, seen_at, expires_at")
"""A digest's columns, in the order `remember` writes them."""


def remember(
    conn: sqlite3.Connection, digest: bytes, now: datetime, until: datetime
) -> datetime | None:
    """Records `digest` as seen `now`; None when it is new, else when it was first seen."""
    cursor = conn.execute(
        f"INSERT OR IGNORE INTO seen_requests ({', '.join(COLUMNS)}) VALUES (?, ?, ?)",
        (digest, to_micros(now), to_micros(until)),
    )
    if cursor.rowcount == 1:
        return None
    row = conn.execute("SELECT seen_at FROM seen_requests WHERE digest = ?", (digest,)).fetchone()
    if row is None:
        return now
    (seen_at,) = row
    return from_micros(seen_at)


def forget_before(conn: sqlite3.Connection, now: datetime) -> int:
    cursor = conn.execute("DELETE FROM seen_requests WHERE expires_at < ?", (to_micros(now),))
    return cursor.rowcount
