"""The schema runner: applies `migrations/NNN_name.sql` in version order, once each, and then
`functions.sql`, every time.

Migrations change the schema (tables, indexes, columns); `functions.sql` holds every function
of the store and replaces them all on each boot, so a function is written in one place and a
database migrated long ago gets the same functions as a new one. Replicas booting together all
call `apply`; a session advisory lock lets one of them migrate while the others wait, after
which they find every version recorded in `schema_migrations` and apply nothing. Each
migration runs in its own transaction together with its record; the functions run in one.
The history starts with `001_baseline.sql`; a database whose ledger names its versions
otherwise was migrated by a pre-release kernel, and is refused with what to do about it.
Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.store.postgres.connection import Connection, lock_key

_LOCK_KEY = lock_key("rebuno:migrations")
_CREATE_LEDGER = """
    CREATE TABLE IF NOT EXISTS schema_migrations (
        version integer PRIMARY KEY,
        name text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    )
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def functions() -> str:
    """The text of `functions.sql`, as shipped with this package."""
    return (resources.files(__package__) / "functions.sql").read_text(encoding="utf-8")


def available() -> list[Migration]:
    """The migrations shipped with this package, in version order."""
    folder = resources.files(__package__) / "migrations"
    found = []
    for entry in folder.iterdir():
        stem, dot, suffix = entry.name.partition(".")
        number, _, name = stem.partition("_")
        if suffix == "sql" and dot and number.isdigit():
            found.append(Migration(int(number), name, entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


async def apply(conn: Connection) -> list[int]:
    """Brings the database up to date on an autocommit connection: the pending migrations,
    then the functions. Returns the versions it applied."""
    await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        await conn.execute(_CREATE_LEDGER)
        cur = await conn.execute("SELECT version, name FROM schema_migrations")
        done: dict[int, str] = {version: name for version, name in await cur.fetchall()}
        shipped = available()
        _refuse_foreign(done, shipped, conn.info.dbname)
        _refuse_unknown(set(done), {m.version for m in shipped})
        pending = [m for m in shipped if m.version not in done]
        for migration in pending:
            await _apply_one(conn, migration)
        async with conn.transaction():
            await conn.execute(functions().encode(), prepare=False)
        return [m.version for m in pending]
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))


async def _apply_one(conn: Connection, migration: Migration) -> None:
    async with conn.transaction():
        # No parameters and no preparation: sent as a simple query, so one file may hold
        # many statements (the functions' file too).
        await conn.execute(migration.sql.encode(), prepare=False)
        await conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
            (migration.version, migration.name),
        )


def _refuse_foreign(done: dict[int, str], shipped: list[Migration], database: str) -> None:
    """Refuses a ledger that records one of this kernel's versions under another name: its
    schema came from another history, which only kernels before the first release wrote (their
    version 1 was `initial`). Nothing upgrades it; the database is created anew."""
    foreign = sorted(m.version for m in shipped if done.get(m.version, m.name) != m.name)
    if foreign:
        raise Unavailable(
            f"PostgreSQL database {database} was migrated by a pre-release kernel (its"
            f" schema_migrations names version {foreign[0]} {done[foreign[0]]!r}); this kernel"
            " cannot upgrade it: drop and recreate the database (or point --db-url at an empty"
            " one) and start again"
        )


def _refuse_unknown(done: set[int], shipped: set[int]) -> None:
    newer = sorted(done - shipped)
    if newer:
        raise Unavailable(
            f"the database has schema versions {newer} that this kernel does not know; "
            "run a kernel at least as new as the one that migrated it"
        )
