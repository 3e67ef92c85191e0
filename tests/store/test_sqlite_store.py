"""Behaviour of the SQLite backend only: files, `:memory:`, schema version, single process."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.store.sqlite import SqliteStore
from rebuno.kernel.store.sqlite.schema import BASELINE, LATEST
from rebuno.kernel.store.sqlite.store import CHECKPOINT_EVERY
from tests.store.builders import event, seed_execution


async def test_open_creates_the_parent_directory(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "deeper" / "kernel.db"
    store = SqliteStore(str(path))

    await store.open()
    await store.close()

    assert path.is_file()


async def test_a_new_database_and_its_journal_are_readable_by_their_owner_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kernel.db"
    store = SqliteStore(str(path))
    await store.open()
    try:
        await seed_execution(store)
        created = [p for p in tmp_path.iterdir() if p.name.startswith("kernel.db")]
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in created}
    finally:
        await store.close()

    assert {"kernel.db", "kernel.db-wal"} <= set(modes)
    assert set(modes.values()) == {0o600}


async def test_a_second_store_on_a_file_in_use_is_refused_naming_the_holder(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "kernel.db")
    first = SqliteStore(path)
    await first.open()
    try:
        with pytest.raises(Unavailable, match=rf"in use by process {os.getpid()}"):
            await SqliteStore(path).open()
    finally:
        await first.close()

    second = SqliteStore(path)  # free again once the first one closed
    await second.open()
    await second.close()


async def test_data_survives_closing_and_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "kernel.db")
    first = SqliteStore(path)
    await first.open()
    created = await seed_execution(first)
    await first.close()

    second = SqliteStore(path)
    await second.open()
    try:
        assert await second.get_execution(created.id) == created
    finally:
        await second.close()


async def test_memory_store_is_a_private_file_removed_on_close() -> None:
    store = SqliteStore(":memory:")
    await store.open()
    created = await seed_execution(store)
    assert await store.get_execution(created.id) == created
    path = Path(store.path)
    assert path.is_file()

    await store.close()

    assert not path.parent.exists()


async def test_a_corrupt_file_is_unavailable_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database, not even close" * 200)

    with pytest.raises(Unavailable, match=str(path)):
        await SqliteStore(str(path)).open()


async def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST + 1}")

    with pytest.raises(Unavailable, match="schema version"):
        await SqliteStore(str(path)).open()


async def test_the_schema_is_versioned_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "kernel.db"
    store = SqliteStore(str(path))
    await store.open()
    await store.close()

    conn = sqlite3.connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    assert (version, mode) == (LATEST, "wal")


async def test_a_closed_store_is_unavailable(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "kernel.db"))
    await store.open()
    await store.close()

    with pytest.raises(Unavailable):
        await store.ping()
    with pytest.raises(Unavailable):
        async with store.transaction():
            pass


async def test_sqlite_watch_dispatches_returns_at_once(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "kernel.db"))
    woken: list[None] = []

    await store.watch_dispatches(lambda: woken.append(None))

    assert woken == []


async def test_wal_is_checkpointed_and_reused_under_continuous_writes(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "kernel.db"))
    await store.open()
    wal = Path(store.path + "-wal")
    try:
        created = await seed_execution(store)
        sizes = []
        for _ in range(3):
            # Writes never stop, as under load: the checkpoint must catch up with them.
            for _ in range(CHECKPOINT_EVERY):
                await _bump(store, created.id)
                await asyncio.sleep(0)  # a turn of the loop between writes, for the checkpoint
            sizes.append(wal.stat().st_size)
    finally:
        await store.close()
    # A WAL that checkpoints restart is reused at the size it reached once; one that is never
    # restarted grows with every commit.
    assert sizes[2] < 1.5 * sizes[0], sizes


async def _bump(store: SqliteStore, execution_id: str) -> None:
    async with store.transaction(execution_id) as tx:
        execution = await tx.get_execution(execution_id)
        await tx.update_execution(replace(execution, last_event_seq=execution.last_event_seq + 1))


# -- group commit ----------------------------------------------------------------------------
class Boom(Exception):
    pass


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(str(tmp_path / "kernel.db"))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def _append(store: SqliteStore, execution_id: str, seq: int, fail: bool = False) -> int:
    """One writer: appends event `seq`; returns how many commits the store had made when the
    writer's transaction returned."""
    async with store.transaction(execution_id) as tx:
        await tx.append_events([event(execution_id, seq)])
        await asyncio.sleep(0)  # let the other writers queue up behind the lock
        if fail:
            raise Boom(seq)
    return store.commits


async def test_concurrent_writers_share_commits_and_each_returns_after_its_commit(
    sqlite_store: SqliteStore,
) -> None:
    store = sqlite_store
    created = await seed_execution(store)
    before = store.commits

    async def writer(seq: int) -> None:
        await _append(store, created.id, seq)
        # Acknowledged means committed: a fresh connection sees the row at once.
        with sqlite3.connect(store.path) as other:
            found = other.execute(
                "SELECT count(*) FROM events WHERE execution_id = ? AND event_seq = ?",
                (created.id, seq),
            ).fetchone()[0]
        assert found == 1, seq

    await asyncio.gather(*(writer(seq) for seq in range(1, 21)))

    assert [e.event_seq for e in await store.list_events(created.id, 0, 100)] == list(range(1, 21))
    assert store.commits - before < 20


async def test_a_failing_writer_in_a_group_loses_only_its_own_writes(
    sqlite_store: SqliteStore,
) -> None:
    store = sqlite_store
    created = await seed_execution(store)
    outcomes = await asyncio.gather(
        *(_append(store, created.id, seq, fail=seq % 3 == 0) for seq in range(1, 10)),
        return_exceptions=True,
    )

    failed = [seq for seq, outcome in enumerate(outcomes, 1) if isinstance(outcome, Boom)]
    assert failed == [3, 6, 9]
    logged = [e.event_seq for e in await store.list_events(created.id, 0, 100)]
    assert logged == [1, 2, 4, 5, 7, 8]


async def test_a_failed_group_commit_fails_every_member_and_keeps_none_of_them(
    sqlite_store: SqliteStore,
) -> None:
    store = sqlite_store
    created = await seed_execution(store)

    async def orphan() -> None:
        # A foreign key checked only at COMMIT: the whole group's commit fails.
        async with store.transaction(created.id) as tx:
            tx._conn.execute("PRAGMA defer_foreign_keys = ON")
            await tx.append_events([event("no-such-execution", 1)])
            await asyncio.sleep(0)  # let the other writers queue up behind the lock

    outcomes = await asyncio.gather(
        _append(store, created.id, 1),
        orphan(),
        _append(store, created.id, 2),
        return_exceptions=True,
    )

    assert all(isinstance(outcome, Exception) for outcome in outcomes), outcomes
    assert await store.list_events(created.id, 0, 100) == []
    # The store goes on: the next writer commits on its own.
    await _append(store, created.id, 3)
    assert [e.event_seq for e in await store.list_events(created.id, 0, 100)] == [3]


async def test_a_group_left_open_for_a_writer_that_was_cancelled_still_commits(
    sqlite_store: SqliteStore,
) -> None:
    store = sqlite_store
    created = await seed_execution(store)
    queued: asyncio.Task[int] | None = None

    async def first() -> None:
        nonlocal queued
        async with store.transaction(created.id) as tx:
            await tx.append_events([event(created.id, 1)])
            queued = asyncio.create_task(_append(store, created.id, 2))
            await asyncio.sleep(0)  # `queued` now waits for the lock
            # It is cancelled before it ever takes the lock: the group this writer leaves
            # open must be committed without it.
            queued.cancel()

    await asyncio.wait_for(first(), timeout=5)

    assert queued is not None and queued.cancelled()
    assert [e.event_seq for e in await store.list_events(created.id, 0, 100)] == [1]


@pytest.mark.parametrize("version", range(1, BASELINE))
async def test_a_file_of_a_pre_release_schema_version_is_refused_saying_what_to_do(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {version}")

    with pytest.raises(Unavailable, match=f"{path}.*version {version}.*pre-release.*new path"):
        await SqliteStore(str(path)).open()
