"""pytest plugin: a fresh PostgreSQL database per test, cloned from a migrated template.

The server is `REBUNO_TEST_DATABASE_URL`, or `postgresql://postgres@127.0.0.1:5432/postgres`.
Once per session (per pytest-xdist worker and process) a template database is created and migrated;
each test then gets `CREATE DATABASE rebuno_t_<uuid> TEMPLATE <template>` (a file copy, far
cheaper than migrating) and the database is dropped afterwards. When no server answers, the
tests that need one are skipped with a message, or fail when `CI` is set.

Loaded by `tests/conftest.py` through `pytest_plugins`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from rebuno.kernel.store.postgres import PostgresStore
from tests.support import poll_until

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
_CONNECT_TIMEOUT_SECONDS = 3
_TEMPLATE_BUSY_RETRY_SECONDS = 10.0


def server_url() -> str:
    """The maintenance database of the test server."""
    return os.environ.get("REBUNO_TEST_DATABASE_URL") or DEFAULT_URL


def database_url(name: str) -> str:
    """The test server's URL with its database replaced by `name`."""
    return urlsplit(server_url())._replace(path=f"/{name}").geturl()


def _admin() -> psycopg.Connection[TupleRow]:
    return psycopg.connect(server_url(), autocommit=True, connect_timeout=_CONNECT_TIMEOUT_SECONDS)


def _unreachable(exc: Exception) -> None:
    params = conninfo_to_dict(server_url())
    where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
    message = (
        f"PostgreSQL is not reachable at {where} ({str(exc).strip().splitlines()[0]}); "
        "set REBUNO_TEST_DATABASE_URL or start one with scripts/pg"
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _drop(conn: psycopg.Connection[TupleRow], name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def _migrate(url: str) -> None:
    store = PostgresStore(url, min_size=1, max_size=1)
    await store.open()
    await store.close()


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """The name of this worker's migrated template database."""
    # Unique per xdist worker and per process: sessions running side by side on one server
    # (two checkouts, two terminals) must not drop each other's template.
    name = f"rebuno_tpl_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"
    try:
        admin = _admin()
    except psycopg.OperationalError as exc:
        _unreachable(exc)
    with admin:
        # Rebuilt every session, so a template left by an older schema is never reused.
        _drop(admin, name)
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        asyncio.run(_migrate(database_url(name)))
        yield name
        _drop(admin, name)


@pytest.fixture
def postgres_url(postgres_template: str) -> Iterator[str]:
    """The URL of a fresh, migrated database of its own, dropped after the test."""
    name = f"rebuno_t_{uuid.uuid4().hex}"
    with _admin() as admin:
        _create_from(admin, name, postgres_template)
        try:
            yield database_url(name)
        finally:
            _drop(admin, name)


def _create_from(conn: psycopg.Connection[TupleRow], name: str, template: str) -> None:
    statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template)
    )

    def created() -> bool:
        try:
            conn.execute(statement)
        except psycopg.errors.ObjectInUse:
            # The migrating store's sessions end asynchronously after it closed; the copy
            # needs the template to have none.
            return False
        return True

    poll_until(created, _TEMPLATE_BUSY_RETRY_SECONDS, f"template {template} to have no sessions")
