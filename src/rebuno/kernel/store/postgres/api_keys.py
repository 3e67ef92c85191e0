"""SQL for the `api_keys` table (§34.4): names, scopes and token hashes, never tokens.

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import Scope

COLUMNS = names("id, name, scopes, secret_hash, created_at, revoked_at, created_by")
"""The columns of an `ApiKey`, in the order `to_record` takes them."""
_SELECTED = ", ".join(COLUMNS)

_FIND = f"SELECT {_SELECTED} FROM api_keys WHERE id = %s"
_LIST = f"SELECT {_SELECTED} FROM api_keys ORDER BY id"
_INSERT = f"INSERT INTO api_keys ({_SELECTED}) VALUES (%s, %s, %s, %s, %s, NULL, %s)"
# A compare-and-swap: a rotation that lost a race, or one of a revoked key, changes nothing.
_ROTATE = """
    UPDATE api_keys SET secret_hash = %(new)s
    WHERE id = %(id)s AND secret_hash = %(old)s AND revoked_at IS NULL
    RETURNING 1
"""
_REVOKE = """
    UPDATE api_keys SET revoked_at = coalesce(revoked_at, %s) WHERE id = %s RETURNING 1
"""


def to_record(row: Sequence[Any]) -> ApiKey:
    id, name, scopes, secret_hash, created_at, revoked_at, created_by = row
    return ApiKey(
        id=id,
        name=name,
        scopes=tuple(Scope(scope) for scope in scopes),
        secret_hash=bytes(secret_hash),
        created_at=created_at,
        revoked_at=revoked_at,
        created_by=created_by,
    )


async def find(conn: Executor, key_id: str) -> ApiKey | None:
    cur = await conn.execute(_FIND, (key_id,))
    row = await cur.fetchone()
    return None if row is None else to_record(row)


async def list_all(conn: Executor) -> list[ApiKey]:
    cur = await conn.execute(_LIST)
    return [to_record(row) for row in await cur.fetchall()]


async def insert(conn: Executor, key: ApiKey) -> None:
    scopes = Jsonb([scope.value for scope in key.scopes])
    await conn.execute(
        _INSERT,
        (key.id, key.name, scopes, key.secret_hash, key.created_at, key.created_by),
    )


async def rotate(conn: Executor, key_id: str, old_hash: bytes, new_hash: bytes) -> bool:
    cur = await conn.execute(_ROTATE, {"id": key_id, "old": old_hash, "new": new_hash})
    return await cur.fetchone() is not None


async def revoke(conn: Executor, key_id: str, now: datetime) -> None:
    cur = await conn.execute(_REVOKE, (now, key_id))
    if await cur.fetchone() is None:
        raise NotFound(f"api key {key_id} not found")
