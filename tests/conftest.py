"""Shared fixtures: the `store` fixture over both backends and a controllable `clock`.

Every test that takes `store` runs on SQLite and on PostgreSQL. The PostgreSQL side needs
the `postgres_url` fixture of the `tests.pgfixtures` plugin; until that plugin exists the
postgres runs are skipped with a message (and fail when `CI` is set).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rebuno.kernel.store.base import Store
from rebuno.kernel.store.sqlite import SqliteStore
from tests.rawsql import RawSql, raw_sql_for
from tests.support import ManualClock

_PG_PLUGIN = Path(__file__).with_name("pgfixtures.py")
pytest_plugins = ["tests.pgfixtures"] if _PG_PLUGIN.exists() else []

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def unopened_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A store on a fresh, empty database, not yet opened."""
    if request.param == "sqlite":
        return SqliteStore(str(tmp_path / "kernel.db"))
    return _postgres_store(request)


@pytest.fixture
async def store(unopened_store: Store) -> AsyncIterator[Store]:
    """An opened store on a fresh database; closed after the test."""
    await unopened_store.open()
    try:
        yield unopened_store
    finally:
        await unopened_store.close()


@pytest.fixture
def raw_sql(store: Store, request: pytest.FixtureRequest) -> RawSql:
    """Runs one SQL statement on the `store`'s database behind its back (`tests.rawsql`)."""
    return raw_sql_for(store, request)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=[True, False], ids=["shortcuts", "no-shortcuts"])
def shortcuts(request: pytest.FixtureRequest) -> bool:
    """Whether the kernel uses what a replica remembers to skip work (`Settings.shortcuts`):
    the behavioural suites (kernel, sdk) run both ways, with the same outcomes."""
    enabled: bool = request.param
    return enabled


def _postgres_store(request: pytest.FixtureRequest) -> Store:
    if not _PG_PLUGIN.exists():
        message = "PostgreSQL store fixtures (tests/pgfixtures.py) are not available yet"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from rebuno.kernel.store.postgres import PostgresStore

    url: str = request.getfixturevalue("postgres_url")
    store: Store = PostgresStore(url)
    return store
