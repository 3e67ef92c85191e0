"""SQL for the `api_keys` table (§34.4): names, scopes and token hashes, never tokens.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.sqlite.timestamps import from_micros, from_micros_or_none, to_micros
from rebuno.protocol.enums import Scope

COLUMNS = names("id, name, scopes, secret_hash, created_at, revoked_at, created_by")
"""The columns of an `ApiKey`, in the order `to_record` takes them."""
_SELECTED = ", ".join(COLUMNS)


def to_record(row: Sequence[Any]) -> ApiKey:
    id, name, scopes, secret_hash, created_at, revoked_at, created_by = row
    return ApiKey(
        id=id,
        name=name,
        scopes=tuple(Scope(scope) for scope in json.loads(scopes)),
        secret_hash=bytes(secret_hash),
        created_at=from_micros(created_at),
        revoked_at=from_micros_or_none(revoked_at),
        created_by=created_by,
    )


def find(conn: sqlite3.Connection, key_id: str) -> ApiKey | None:
    row = conn.execute(f"SELECT {_SELECTED} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    return None if row is None else to_record(row)


def list_all(conn: sqlite3.Connection) -> list[ApiKey]:
    rows = conn.execute(f"SELECT {_SELECTED} FROM api_keys ORDER BY id").fetchall()
    return [to_record(row) for row in rows]


def insert(conn: sqlite3.Connection, key: ApiKey) -> None:
    conn.execute(
        f"INSERT INTO api_keys ({_SELECTED}) VALUES (?, ?, ?, ?, ?, NULL, ?)",
        (
            key.id,
            key.name,
            json.dumps([scope.value for scope in key.scopes]),
            key.secret_hash,
            to_micros(key.created_at),
            key.created_by,
        ),
    )


def rotate(conn: sqlite3.Connection, key_id: str, old_hash: bytes, new_hash: bytes) -> bool:
    cursor = conn.execute(
        """UPDATE api_keys SET secret_hash = ?
            WHERE id = ? AND secret_hash = ? AND revoked_at IS NULL""",
        (new_hash, key_id, old_hash),
    )
    return cursor.rowcount == 1


def revoke(conn: sqlite3.Connection, key_id: str, now: datetime) -> None:
    cursor = conn.execute(
        "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?",
        (to_micros(now), key_id),
    )
    if cursor.rowcount == 0:
        raise NotFound(f"api key {key_id} not found")
