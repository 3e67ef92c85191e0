"""pytest plugin: a fresh PostgreSQL database per test, cloned from a migrated template.

The server is `REBUNO_TEST_DATABASE_URL`, or `postgresql://postgres@127.0.0.1:5432/postgres`.
Once per session (per pytest-xdist worker and process) a template database is created and migrated;
a test then gets `CREATE DATABASE rebuno_t_<uuid> TEMPLATE <template>` (a file copy, far
cheaper than migrating). After the test its database is emptied and kept for the worker's
next test when its schema is still the template's (every table truncated but the migrations'
record, its other sessions ended): that costs a fraction of a copy and a drop. A test that
changed the schema, a database that cannot be emptied, and the database of a test that failed
are dropped instead: a process such a test left behind (a kernel still claiming dispatches)
finds its database gone rather than the next test's rows. When no server
answers, the tests that need one are skipped with a message, or fail when `CI` is set.

Loaded by `tests/conftest.py` through `pytest_plugins`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from harness.polling import poll_until
from rebuno.kernel.store.postgres import PostgresStore

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
    return _connect(server_url())


def _connect(url: str) -> psycopg.Connection[TupleRow]:
    return psycopg.connect(url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_SECONDS)


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


@dataclass
class _Spares:
    """This worker's emptied databases, and the schema they must still have to be reused."""

    schema: str | None = None
    names: list[str] = field(default_factory=list)


@pytest.fixture(scope="session")
def _spares(postgres_template: str) -> Iterator[_Spares]:
    spares = _Spares()
    yield spares
    with _admin() as admin:
        for name in spares.names:
            _drop(admin, name)


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Marks a test whose setup or call failed, for the teardown of its `postgres_url`."""
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.fixture
def postgres_url(
    postgres_template: str, _spares: _Spares, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The URL of a migrated database of its own, with no rows but the migrations' record."""
    with _admin() as admin:
        if _spares.names:
            name = _spares.names.pop()
        else:
            name = f"rebuno_t_{uuid.uuid4().hex}"
            _create_from(admin, name, postgres_template)
            if _spares.schema is None:
                _spares.schema = _schema(database_url(name))
        try:
            yield database_url(name)
        finally:
            failed = request.node.stash.get(_FAILED, False)
            if (
                not failed
                and len(_spares.names) < _SPARES_KEPT
                and _emptied(admin, name, _spares.schema)
            ):
                _spares.names.append(name)
            else:
                _drop(admin, name)


def _schema(url: str) -> str:
    """A digest of the database's tables, columns, indexes, functions and triggers."""
    with _connect(url) as conn:
        row = conn.execute(_SCHEMA).fetchone()
    return str(row[0]) if row else ""


def _emptied(admin: psycopg.Connection[TupleRow], name: str, schema: str | None) -> bool:
    """Ends the database's other sessions and empties it, when its schema is the template's;
    False when it is not, or when anything fails (the caller drops it)."""
    try:
        admin.execute(_TERMINATE, (name,))
        url = database_url(name)
        if schema is None or _schema(url) != schema:
            return False
        with psycopg.connect(
            url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_SECONDS
        ) as conn:
            conn.execute("SET lock_timeout = '2s'")
            tables = [r[0] for r in conn.execute(_TABLES).fetchall()]
            if tables:
                names = sql.SQL(", ").join(sql.Identifier(t) for t in tables)
                conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(names))
    except psycopg.Error:
        return False
    return True


_SPARES_KEPT = 4
_TERMINATE = """
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE datname = %s AND pid <> pg_backend_pid()
"""
_TABLES = """
    SELECT tablename FROM pg_tables
    WHERE schemaname = 'public' AND tablename <> 'schema_migrations'
"""
_SCHEMA = """
    SELECT md5(string_agg(part, ',' ORDER BY part)) FROM (
        SELECT 'r ' || c.relname || ' ' || c.relkind::text || ' ' || COALESCE((
            SELECT string_agg(a.attname || ':' || a.atttypid::text, ';' ORDER BY a.attnum)
            FROM pg_attribute a
            WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '')
        FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'f ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc)
        FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
        UNION ALL
        SELECT 't ' || t.tgname || ' ' || t.tgrelid::regclass::text
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'k ' || conname || ' ' || pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'm ' || version::text FROM schema_migrations
    ) AS parts(part)
"""


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
