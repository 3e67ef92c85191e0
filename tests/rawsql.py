"""Rows as an older version might have left them: one plain SQL statement run on the test's
own database behind the store's back, for the tests of what the kernel does with such rows.

Statements use `%s` placeholders (psycopg's); on SQLite each becomes `?`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing

import pytest

from rebuno.kernel.store.base import Store
from rebuno.kernel.store.sqlite import SqliteStore

RawSql = Callable[..., Awaitable[None]]


def raw_sql_for(store: Store, request: pytest.FixtureRequest) -> RawSql:
    """A runner of single statements on the database `store` was opened on."""
    if isinstance(store, SqliteStore):
        path = store.path

        async def on_sqlite(statement: str, *params: object) -> None:
            with closing(sqlite3.connect(path)) as conn, conn:
                conn.execute(statement.replace("%s", "?"), params)

        return on_sqlite
    import psycopg

    url: str = request.getfixturevalue("postgres_url")

    async def on_postgres(statement: str, *params: object) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(statement.encode(), params)

    return on_postgres
