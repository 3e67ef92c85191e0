"""What only the PostgreSQL store does: several replicas (each a `PostgresStore` with its own
pool) on one database, migrations racing at boot, LISTEN/NOTIFY, session try-locks, and a
server that goes away and comes back.

The outage tests put a small TCP relay between the store and the server and stop it: the
store sees exactly what it would see if the database went down, with no mock involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from urllib.parse import urlsplit

import orjson
import psycopg
import pytest

from harness.polling import wait_until
from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.store.base import Stale, Unchanged
from rebuno.kernel.store.postgres import PostgresStore, group, writes
from rebuno.kernel.store.postgres.migrations import available
from rebuno.kernel.store.postgres.pool import MostRecentFirstPool
from rebuno.protocol.enums import ExecutionStatus
from tests.store.builders import (
    KEY,
    append_optimistically,
    dispatch,
    event,
    seed_dispatch,
    seed_execution,
    seed_in_flight,
    step_id_for,
)
from tests.support import START

pytestmark = pytest.mark.postgres

NOW = START + timedelta(minutes=10)


@pytest.fixture
async def replicas(postgres_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one database, like two kernel replicas."""
    first, second = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await first.open()
    await second.open()
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def _query(url: str, statement: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(statement.encode())
        return await cur.fetchall() if cur.description else []


# -- the pool ------------------------------------------------------------------------------
async def test_the_pool_hands_out_the_connection_returned_last(postgres_url: str) -> None:
    """Sequential use stays on one warm backend while the others idle (a queue would take
    each in turn)."""
    pool = MostRecentFirstPool(postgres_url, min_size=3, max_size=3, open=False)
    await pool.open(wait=True)
    try:
        async with pool.connection() as first, pool.connection() as second:
            pids = {first.info.backend_pid, second.info.backend_pid}
        async with pool.connection() as held:
            last = held.info.backend_pid
        assert last in pids
        for _ in range(4):
            async with pool.connection() as again:
                assert again.info.backend_pid == last
        async with pool.connection() as busy, pool.connection() as other:
            assert busy.info.backend_pid == last
            assert other.info.backend_pid != last
    finally:
        await pool.close()


# -- migrations ----------------------------------------------------------------------------
async def test_two_stores_migrating_an_empty_database_at_once_apply_each_version_once(
    postgres_url: str,
) -> None:
    await _query(postgres_url, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    first, second = PostgresStore(postgres_url), PostgresStore(postgres_url)

    await asyncio.gather(first.open(), second.open())

    try:
        rows = await _query(postgres_url, "SELECT version FROM schema_migrations ORDER BY 1")
        assert [row[0] for row in rows] == [m.version for m in available()]
        created = await seed_execution(first)
        assert await second.get_execution(created.id) == created
    finally:
        await first.close()
        await second.close()


async def test_large_json_columns_are_lz4_compressed_when_the_server_supports_it(
    postgres_url: str,
) -> None:
    supported = await _server_has_lz4(postgres_url)

    [(method,)] = await _query(
        postgres_url,
        "SELECT attcompression FROM pg_attribute"
        " WHERE attrelid = 'events'::regclass AND attname = 'payload'",
    )

    assert method == ("l" if supported else "")


async def test_steps_have_no_index_a_cached_plan_could_take_for_an_identity_lookup(
    postgres_url: str,
) -> None:
    # A generic plan cached while `steps` was small chose an (execution_id, proposed_seq) index
    # for the submission's lookup by identity, and then scanned the execution's whole history
    # on every step. Only the id and the identity may index steps.
    rows = await _query(
        postgres_url, "SELECT indexdef FROM pg_indexes WHERE tablename = 'steps' ORDER BY 1"
    )

    assert [str(row[0]).split(" USING ")[1] for row in rows] == [
        "btree (execution_id, kind, target, args_hash, occurrence)",
        "btree (step_id)",
    ]


async def test_apply_refuses_an_unknown_operation_and_writes_nothing_of_the_batch(
    postgres_url: str,
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    created = await seed_execution(store)
    ops = orjson.dumps(
        [writes.append_events([event(created.id, 1)]), {"op": "drop_everything"}]
    ).decode()

    with pytest.raises(psycopg.errors.RaiseException, match="unknown operation drop_everything"):
        async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
            await conn.execute("SELECT rebuno_apply(%s::jsonb)", (ops,))

    try:
        assert await store.list_events(created.id, 0, 10) == []
    finally:
        await store.close()


async def _server_has_lz4(url: str) -> bool:
    try:
        await _query(url, "CREATE TEMP TABLE probe (t text COMPRESSION lz4)")
    except psycopg.Error:
        return False
    return True


# -- serialisation across replicas --------------------------------------------------------
async def test_advisory_lock_keeps_event_seq_contiguous_under_appends_from_two_replicas(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    created = await seed_execution(replicas[0])

    async def append_one(store: PostgresStore) -> None:
        # Read-modify-write of `last_event_seq`: without the lock two writers would read
        # the same value and one commit would fail on the (execution_id, event_seq) key.
        async with store.transaction(created.id) as tx:
            current = await tx.get_execution(created.id)
            seq = current.last_event_seq + 1
            await tx.append_events([event(created.id, seq, type="step.proposed")])
            await tx.update_execution(replace(current, last_event_seq=seq))

    await asyncio.gather(*(append_one(replicas[i % 2]) for i in range(20)))

    logged = await replicas[1].list_events(created.id, 0, 100)
    assert [e.event_seq for e in logged] == list(range(1, 21))
    assert (await replicas[0].get_execution(created.id)).last_event_seq == 20


async def test_optimistic_writes_from_two_replicas_on_one_record_apply_once(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    created = await seed_execution(replicas[0])
    seen = await replicas[0].get_execution(created.id)

    applied = await asyncio.gather(
        *(append_optimistically(replicas[i % 2], seen) for i in range(20))
    )

    assert applied.count(True) == 1
    assert [e.event_seq for e in await replicas[1].list_events(created.id, 0, 100)] == [1]


async def test_optimistic_transactions_ready_at_once_all_commit(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    """More than the lanes at once: the rest wait and go as one group commit."""
    store = replicas[0]
    seeded = [await seed_execution(store) for _ in range(3 * group.LANES + 5)]

    applied = await asyncio.gather(*(append_optimistically(store, seen) for seen in seeded))

    assert applied == [True] * len(seeded)
    for seen in seeded:
        assert [e.event_seq for e in await store.list_events(seen.id, 0, 10)] == [1]
        assert (await store.get_execution(seen.id)).last_event_seq == 1


async def test_a_group_member_that_fails_fails_alone(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    """A member whose writes break a key sinks its group's statement; each member then goes
    alone, so only that one raises and the others commit."""
    store = replicas[0]
    seeded = [await seed_execution(store) for _ in range(group.LANES + 4)]
    broken = seeded[-1]
    await append_optimistically(store, broken)  # event 1 exists: a second event 1 breaks the key
    broken = await store.get_execution(broken.id)

    outcomes = await asyncio.gather(
        *(append_optimistically(store, seen) for seen in seeded[:-1]),
        append_optimistically(store, broken, seq=1),
        return_exceptions=True,
    )

    assert outcomes[:-1] == [True] * (len(seeded) - 1)
    assert isinstance(outcomes[-1], Exception) and not isinstance(outcomes[-1], Stale)
    assert [e.event_seq for e in await store.list_events(broken.id, 0, 10)] == [1]


async def test_a_group_member_whose_execution_is_locked_does_not_wait(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    """A grouped member only tries its lock: held elsewhere, it answers stale at once (its
    use case goes the ordinary way) and the group commits without waiting."""
    store, other = replicas
    seeded = [await seed_execution(store) for _ in range(group.LANES + 3)]
    locked = seeded[-1]
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with other.transaction(locked.id) as tx:
            await tx.get_execution(locked.id)
            holding.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await holding.wait()
    try:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(append_optimistically(store, seen) for seen in seeded)), 30
        )
    finally:
        release.set()
        await holder

    assert outcomes == [True] * (len(seeded) - 1) + [False]
    assert await store.list_events(locked.id, 0, 10) == []


async def test_a_transaction_that_only_writes_still_waits_for_the_lock(
    replicas: tuple[PostgresStore, PostgresStore], postgres_url: str
) -> None:
    created = await seed_execution(replicas[0])
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold_the_lock() -> None:
        async with replicas[0].transaction(created.id) as tx:
            current = await tx.get_execution(created.id)
            holding.set()
            await release.wait()
            await tx.append_events([event(created.id, 1, type="step.proposed")])
            await tx.update_execution(replace(current, last_event_seq=1))

    async def write_only() -> None:
        async with replicas[1].transaction(created.id) as tx:
            await tx.append_events([event(created.id, 2, type="step.proposed")])

    holder = asyncio.create_task(hold_the_lock())
    await holding.wait()
    writer = asyncio.create_task(write_only())

    async def waiting_for_the_lock() -> bool:
        rows = await _query(
            postgres_url,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        return rows[0][0] == 1

    await wait_until(waiting_for_the_lock, message="the write-only transaction to wait")
    assert not writer.done()
    release.set()
    await asyncio.gather(holder, writer)
    assert [e.event_seq for e in await replicas[1].list_events(created.id, 0, 100)] == [1, 2]


async def test_claims_from_two_replicas_never_return_the_same_dispatch(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    created = await seed_execution(replicas[0])
    queued = {(await seed_dispatch(replicas[0], created.id)).id for _ in range(30)}

    async def claim_all(store: PostgresStore, replica_id: str) -> list[str]:
        taken: list[str] = []
        while batch := await store.claim_dispatches(replica_id, 3, NOW):
            taken += [c.dispatch.id for c in batch]
        return taken

    first, second = await asyncio.gather(claim_all(replicas[0], "r1"), claim_all(replicas[1], "r2"))

    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(queued)


async def test_leader_lock_is_held_by_one_replica_at_a_time(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    async with replicas[0].leader("sweeper") as first, replicas[1].leader("sweeper") as second:
        assert (first, second) == (True, False)

    async with replicas[1].leader("sweeper") as after_release:
        assert after_release is True


# -- LISTEN / NOTIFY -----------------------------------------------------------------------
class _Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


async def test_watch_dispatches_wakes_another_replica_once_the_insert_commits(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    created = await seed_execution(replicas[0])
    wakes = _Wakes()
    watcher = asyncio.create_task(replicas[1].watch_dispatches(wakes))
    try:
        await wait_until(lambda: wakes.count == 1, message="the listener is ready")

        async with replicas[0].transaction(created.id) as tx:
            await tx.insert_dispatch(dispatch(created.id))

        await wait_until(lambda: wakes.count == 2, message="woken by the insert")
    finally:
        watcher.cancel()


async def test_watch_dispatches_skips_the_enqueues_of_its_own_store(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    created = await seed_execution(replicas[0])
    first, second = _Wakes(), _Wakes()
    watchers = [
        asyncio.create_task(replicas[0].watch_dispatches(first)),
        asyncio.create_task(replicas[1].watch_dispatches(second)),
    ]
    try:
        await wait_until(lambda: first.count == second.count == 1, message="both listening")

        async with replicas[0].transaction(created.id) as tx:
            await tx.insert_dispatch(dispatch(created.id))
        async with replicas[1].transaction(created.id) as tx:
            await tx.insert_dispatch(dispatch(created.id))

        # Notifications arrive in commit order: once each listener has seen the other
        # store's insert, it has seen (and skipped) its own store's as well.
        await wait_until(lambda: first.count == second.count == 2, message="woken by the other")
        assert (first.count, second.count) == (2, 2)
    finally:
        for watcher in watchers:
            watcher.cancel()


async def test_watch_dispatches_reports_an_execution_another_replica_ended(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    created = await seed_execution(replicas[0], status=ExecutionStatus.PENDING)
    wakes, ended = _Wakes(), list[str]()
    watcher = asyncio.create_task(replicas[1].watch_dispatches(wakes, ended.append))
    try:
        await wait_until(lambda: wakes.count == 1, message="the listener is ready")

        running = replace(created, status=ExecutionStatus.RUNNING, last_event_seq=1)
        done = replace(running, status=ExecutionStatus.COMPLETED, output="1", last_event_seq=2)
        for changed in (running, done):
            async with replicas[0].transaction(created.id) as tx:
                await tx.update_execution(changed)

        await wait_until(lambda: ended == [created.id], message="told of the end")
        # The start was not reported: only the end is, once.
        async with replicas[0].transaction(created.id) as tx:
            await tx.insert_dispatch(dispatch(created.id))
        await wait_until(lambda: wakes.count == 2, message="a later notification")
        assert ended == [created.id]
    finally:
        watcher.cancel()


async def test_watch_dispatches_reports_creations_and_status_changes_of_another_replica(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    wakes, ended, touched = _Wakes(), list[str](), list[str]()
    watcher = asyncio.create_task(replicas[1].watch_dispatches(wakes, ended.append, touched.append))
    try:
        await wait_until(lambda: wakes.count == 1, message="the listener is ready")
        created = await seed_execution(replicas[0], status=ExecutionStatus.PENDING)
        await seed_execution(replicas[1], agent_id="agent-2")  # its own store's: not reported
        live = await seed_in_flight(replicas[0], created.id)
        lease = Lease(dispatch_id=live.id, attempt=live.attempt)

        async def moved(status: ExecutionStatus, step: bool = False) -> None:
            async with replicas[0].transaction(created.id) as tx:
                if step:  # what a step reads, and writes back with its status kept
                    at = step_id_for(created.id, KEY)
                    read = (await tx.load_submission(created.id, lease, KEY, at, NOW)).execution
                else:
                    read = await tx.get_execution(created.id)
                seq = read.last_event_seq + 1
                await tx.append_events([event(created.id, seq, type="step.proposed")])
                await tx.update_execution(replace(read, status=status, last_event_seq=seq))

        async def moved_optimistically(status: ExecutionStatus) -> None:
            # What a followed run writes: nothing read in the transaction, the status of the
            # record it was built from given with its condition.
            read = await replicas[0].get_execution(created.id)
            assert await append_optimistically(replicas[0], read, Unchanged.on(read), status=status)

        await moved(ExecutionStatus.RUNNING)
        await moved(ExecutionStatus.RUNNING, step=True)
        await moved_optimistically(ExecutionStatus.RUNNING)
        await moved(ExecutionStatus.BLOCKED)
        await moved(ExecutionStatus.BLOCKED)
        await moved_optimistically(ExecutionStatus.RUNNING)
        await moved(ExecutionStatus.COMPLETED)
        async with replicas[0].transaction(created.id) as tx:
            await tx.insert_dispatch(dispatch(created.id))

        # In commit order: once the last insert woke the listener, everything before it
        # was routed. A status kept is not reported, nor is the end (it is `ended`'s).
        await wait_until(lambda: wakes.count == 3, message="the last insert")
        assert touched == [created.id] * 4  # created, running, blocked, running again
        assert ended == [created.id]
    finally:
        watcher.cancel()


async def test_watch_dispatches_reconnects_after_losing_its_connection(
    replicas: tuple[PostgresStore, PostgresStore],
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    created = await seed_execution(replicas[0])
    wakes = _Wakes()
    watcher = asyncio.create_task(replicas[1].watch_dispatches(wakes))
    try:
        await wait_until(lambda: wakes.count == 1, message="the listener is ready")

        with caplog.at_level(logging.WARNING):
            await _query(
                postgres_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query = 'LISTEN rebuno_dispatch' AND pid <> pg_backend_pid()",
            )
            await wait_until(lambda: wakes.count == 2, message="listening again")
        async with replicas[0].transaction(created.id) as tx:
            await tx.insert_dispatch(dispatch(created.id))

        await wait_until(lambda: wakes.count == 3, message="woken by the insert")
        assert "dispatch listener lost PostgreSQL" in caplog.text
    finally:
        watcher.cancel()


# -- an unreachable server -----------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_open_names_the_host_and_database_but_never_the_password() -> None:
    url = f"postgresql://rebuno:hunter2@127.0.0.1:{_closed_port()}/rebuno_db"

    with pytest.raises(Unavailable) as raised:
        await PostgresStore(url).open()

    assert "127.0.0.1" in raised.value.message
    assert "rebuno_db" in raised.value.message
    assert "hunter2" not in str(raised.value)


class _Relay:
    """A TCP relay to the real server that can be cut and restored on the same port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()
        self.port = _closed_port()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._streams):
            writer.transport.abort()
        self._streams.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._streams |= {writer, up_writer}
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    sink.transport.abort()


@pytest.fixture
async def relay(postgres_url: str) -> AsyncIterator[tuple[_Relay, str]]:
    """A running relay and the URL of the test database through it."""
    parts = urlsplit(postgres_url)
    relay = _Relay(parts.hostname or "127.0.0.1", parts.port or 5432)
    await relay.start()
    userinfo, at, _ = parts.netloc.rpartition("@")
    try:
        yield relay, parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{relay.port}").geturl()
    finally:
        await relay.cut()


async def test_store_fails_as_unavailable_while_the_server_is_gone_and_recovers_after(
    relay: tuple[_Relay, str],
) -> None:
    cutter, url = relay
    store = PostgresStore(url, min_size=2, max_size=4)
    await store.open()
    try:
        created = await seed_execution(store)

        await cutter.cut()
        with pytest.raises(Unavailable):
            await store.ping()
        with pytest.raises(Unavailable):
            async with store.transaction(created.id) as tx:
                await tx.get_execution(created.id)

        await cutter.start()
        await wait_until(_answers(store), timeout=20, message="the store answers again")
        assert await store.get_execution(created.id) == created
    finally:
        await store.close()


def _answers(store: PostgresStore) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            await store.ping()
        except Unavailable:
            return False
        return True

    return check
