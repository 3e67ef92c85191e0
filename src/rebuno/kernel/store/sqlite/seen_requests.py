"""SQL for the `seen_requests` table: digests of accepted `v1=` agent requests, kept until a
copy of the request could no longer verify (docs/protocol.md §2.3).

Must import only sqlite3, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from rebuno.kernel.store.sqlite.timestamps import to_micros


def remember(conn: sqlite3.Connection, digest: bytes, until: datetime) -> bool:
    """Records `digest`; False when it is recorded already (the request is a copy)."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO seen_requests (digest, expires_at) VALUES (?, ?)",
        (digest, to_micros(until)),
    )
    return cursor.rowcount == 1


def forget_before(conn: sqlite3.Connection, now: datetime) -> int:
    cursor = conn.execute("DELETE FROM seen_requests WHERE expires_at < ?", (to_micros(now),))
    return cursor.rowcount
