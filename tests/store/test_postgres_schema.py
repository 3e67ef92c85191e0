"""The schema a PostgreSQL database gets: the migrations (tables, columns, indexes) and then
`functions.sql` (every function, and the triggers that run the guards).

The migrations define no function and `functions.sql` all of them; applying either part
again, or booting several replicas at once, changes nothing; every function the store's SQL
calls exists with the arguments it passes (and returns the columns it selects); and a database
migrated by a kernel before the first release is refused, saying what to do. That the tables
have the columns the store names is `test_schema_columns.py`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from types import ModuleType

import psycopg
import pytest

from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.store.postgres import (
    PostgresStore,
    agents,
    approvals,
    dispatches,
    events,
    executions,
    migrations,
    rate_buckets,
    steps,
    submissions,
    transaction,
    writes,
)
from rebuno.kernel.store.postgres.connection import Connection
from rebuno.kernel.store.postgres.migrations import Migration

pytestmark = pytest.mark.postgres

_SQL_MODULES: tuple[ModuleType, ...] = (
    agents,
    approvals,
    dispatches,
    events,
    executions,
    rate_buckets,
    steps,
    submissions,
    transaction,
    writes,
)

Snapshot = dict[str, list[tuple[object, ...]]]

_CATALOG = {
    "columns": """
        SELECT table_name, column_name, ordinal_position, data_type, is_nullable,
            column_default
        FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2""",
    "storage": """
        SELECT c.relname, c.relkind, c.reloptions::text, a.attname, a.attcompression
        FROM pg_class c LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
        WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1, 4""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' ORDER BY 1, 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid)
        FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2""",
    "functions": """
        SELECT proname, pg_get_function_identity_arguments(oid), pg_get_function_result(oid),
            provolatile, md5(prosrc)
        FROM pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY 1, 2""",
    "types": """
        SELECT typname, typtype FROM pg_type t
        WHERE typnamespace = 'public'::regnamespace AND typtype <> 'b'
            AND NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
        ORDER BY 1""",
}


async def _connect(url: str) -> Connection:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def _snapshot(conn: Connection) -> Snapshot:
    found: Snapshot = {}
    for part, query in _CATALOG.items():
        cur = await conn.execute(query)
        found[part] = await cur.fetchall()
    return found


async def _empty(conn: Connection) -> None:
    await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")


async def _migrate_only(conn: Connection, shipped: list[Migration]) -> None:
    """The migrations as the runner applies them, each in its own transaction with its row in
    the ledger, and nothing after them."""
    await conn.execute(
        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for migration in shipped:
        async with conn.transaction():
            await conn.execute(migration.sql.encode(), prepare=False)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )


async def _open_and_close(url: str) -> None:
    store = PostgresStore(url, min_size=1, max_size=1)
    await store.open()
    await store.close()


async def test_a_database_migrated_by_a_pre_release_kernel_is_refused_saying_what_to_do(
    postgres_url: str,
) -> None:
    # Kernels before the first release recorded their own history, from `1 initial` on.
    pre_release = [Migration(1, "initial", "SELECT 1"), Migration(2, "steps_listing_index", "")]
    async with await _connect(postgres_url) as conn:
        await _empty(conn)
        await _migrate_only(conn, pre_release)

    with pytest.raises(Unavailable, match=r"pre-release kernel.*'initial'.*recreate the database"):
        await _open_and_close(postgres_url)


async def test_migrations_define_no_function_and_functions_sql_defines_them_all(
    postgres_url: str,
) -> None:
    async with await _connect(postgres_url) as conn:
        complete = await _snapshot(conn)
        await _empty(conn)
        await _migrate_only(conn, migrations.available())

        schema_only = await _snapshot(conn)
        async with conn.transaction():
            await conn.execute(migrations.functions().encode(), prepare=False)

        assert (schema_only["functions"], schema_only["triggers"]) == ([], [])
        assert await _snapshot(conn) == complete


async def test_applying_the_migrations_and_the_functions_again_changes_nothing(
    postgres_url: str,
) -> None:
    async with await _connect(postgres_url) as conn:
        before = await _snapshot(conn)

        applied = [await migrations.apply(conn), await migrations.apply(conn)]

        assert applied == [[], []]
        assert await _snapshot(conn) == before


def _calls() -> list[str]:
    """Every statement of the store's modules that calls a function of `functions.sql`."""
    found = []
    for module in _SQL_MODULES:
        for name, value in vars(module).items():
            if name.startswith("__") or not isinstance(value, str):
                continue
            if re.search(r"\brebuno_\w+\(", value):
                found.append(value)
    return found


def _numbered(statement: str) -> str:
    """`%s` and `%(name)s` placeholders as `$n`, as PREPARE takes them."""
    numbers: dict[str, int] = {}
    counter = itertools.count(1)

    def number(match: re.Match[str]) -> str:
        name = match.group(1) or f"#{len(numbers)}"
        if name not in numbers:
            numbers[name] = next(counter)
        return f"${numbers[name]}"

    return re.sub(r"%(?:\((\w+)\))?s", number, statement)


async def test_every_function_the_store_calls_exists_with_the_arguments_it_passes(
    postgres_url: str,
) -> None:
    calls = _calls()
    assert len(calls) >= 6  # the writes' four entry points and the two locked reads
    async with await _connect(postgres_url) as conn:
        for index, statement in enumerate(calls):
            # PREPARE resolves every function by its name and argument types, runs nothing.
            await conn.execute(f"PREPARE call_{index} AS {_numbered(statement)}".encode())


async def test_replicas_booting_together_on_a_migrated_database_apply_the_functions_in_turn(
    postgres_url: str,
) -> None:
    # Unserialised, two transactions replacing the same function fail with "tuple
    # concurrently updated"; the migrations' advisory lock puts them one after the other.
    async with await _connect(postgres_url) as conn:
        before = await _snapshot(conn)

        await asyncio.gather(*(_open_and_close(postgres_url) for _ in range(4)))

        assert await _snapshot(conn) == before
