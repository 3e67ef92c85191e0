"""The schema the stores build equals the schema their code expects.

Each table module names its table's columns once (`COLUMNS`, and the columns it reads apart);
its SELECT lists are built from those lists and its mapper, `to_record`, unpacks a row into
variables of those names, in that order. Here: a new database of each backend has exactly
those tables and columns, the two backends name the same ones, and each mapper takes its
list's names in the list's order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

from rebuno.kernel.store import postgres, sqlite
from rebuno.kernel.store.columns import Columns
from rebuno.kernel.store.postgres import PostgresStore
from rebuno.kernel.store.sqlite import SqliteStore

Tables = dict[str, Columns]


def _tables(backend: ModuleType) -> Tables:
    """Every table the backend's code names, with all its columns."""
    return {
        "agents": backend.agents.COLUMNS + backend.agents.METADATA_COLUMNS,
        "executions": backend.executions.COLUMNS + backend.executions.APART,
        "events": backend.events.COLUMNS,
        "steps": backend.steps.COLUMNS + backend.steps.APART,
        "approvals": backend.approvals.COLUMNS,
        "dispatches": backend.dispatches.COLUMNS + backend.dispatches.APART,
        "dispatch_step_counters": backend.dispatches.COUNTER_COLUMNS,
        "rate_buckets": backend.rate_buckets.COLUMNS,
        "seen_requests": backend.seen_requests.COLUMNS,
        "api_keys": backend.api_keys.COLUMNS,
        "resources": backend.resources.COLUMNS,
        "resource_checkpoints": backend.checkpoints.COLUMNS + backend.checkpoints.APART,
    }


def test_both_stores_name_the_same_tables_and_columns() -> None:
    assert _sets(_tables(postgres)) == _sets(_tables(sqlite))


def test_no_column_is_named_twice() -> None:
    for backend in (postgres, sqlite):
        for table, columns in _tables(backend).items():
            assert len(set(columns)) == len(columns), (backend.__name__, table)


_MAPPED = [
    (backend, name)
    for backend in (postgres, sqlite)
    for name in (
        "agents",
        "api_keys",
        "approvals",
        "checkpoints",
        "dispatches",
        "events",
        "executions",
        "resources",
        "steps",
    )
]


@pytest.mark.parametrize(
    ("backend", "name"), _MAPPED, ids=[f"{b.__name__.rsplit('.', 1)[1]}-{n}" for b, n in _MAPPED]
)
def test_each_mapper_takes_its_columns_by_their_names_in_order(
    backend: ModuleType, name: str
) -> None:
    module = getattr(backend, name)
    taken = _unpacked(module.to_record)

    assert taken[: len(module.COLUMNS)] == module.COLUMNS
    # The agents' metadata, when the row has it, after them.
    assert _holds(taken, getattr(module, "METADATA_COLUMNS", ()))


def _unpacked(mapper: Callable[..., object]) -> Columns:
    """The variables the mapper's row is unpacked into, in order: its locals after the row."""
    return tuple(mapper.__code__.co_varnames[1:])


def _holds(names: Columns, run: Columns) -> bool:
    return any(names[start : start + len(run)] == run for start in range(len(names) + 1))


async def test_a_new_sqlite_file_has_exactly_the_tables_and_columns_the_store_names(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kernel.db"
    store = SqliteStore(str(path))
    await store.open()
    await store.close()

    with closing(sqlite3.connect(path)) as conn:
        tables = [name for (name,) in conn.execute(_SQLITE_TABLES)]
        found = {
            table: [column for _, column, *_ in conn.execute(f"PRAGMA table_info({table})")]
            for table in tables
        }

    assert _sets(found) == _sets(_tables(sqlite))


_SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"


@pytest.mark.postgres
async def test_a_new_postgres_database_has_exactly_the_tables_and_columns_the_store_names(
    postgres_url: str,
) -> None:
    store = PostgresStore(postgres_url, min_size=1, max_size=1)
    await store.open()
    await store.close()

    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cur = await conn.execute(_POSTGRES_COLUMNS)
        found: dict[str, list[str]] = {}
        for table, column in await cur.fetchall():
            found.setdefault(table, []).append(column)

    # The ledger is the migration runner's own, created by its own statement.
    assert found.pop("schema_migrations") == ["version", "name", "applied_at"]
    assert _sets(found) == _sets(_tables(postgres))


_POSTGRES_COLUMNS = """
    SELECT table_name, column_name FROM information_schema.columns
    WHERE table_schema = 'public' ORDER BY table_name, ordinal_position
"""


def _sets(tables: dict[str, list[str]] | Tables) -> dict[str, set[str]]:
    return {table: set(columns) for table, columns in tables.items()}
