"""`PostgresStore`: the production backend of the `Store` protocol (psycopg 3, async pool).

Every replica of the kernel opens one against the same database. Mutations of one execution
serialise on a transaction-scoped advisory lock; the dispatch queue uses `SKIP LOCKED`;
singleton work uses a session-level try-lock. Pooled connections run in autocommit, so a
committed read is one statement and one round trip; a transaction sends its statements in
as few messages as its reads allow (see `transaction.py`).
Must import only psycopg and psycopg_pool, `rebuno.kernel.store.base`, the domain,
`rebuno.kernel.pgserver` and this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.domain.records import (
    Agent,
    Approval,
    Checkpoint,
    Dispatch,
    Event,
    Execution,
    RawJson,
    Resource,
    Step,
)
from rebuno.kernel.pgserver import Server
from rebuno.kernel.store.base import (
    DECISION_TYPES,
    LISTED_PAYLOAD_BYTES,
    ClaimedDispatch,
    Completion,
    ExecutionFilter,
    LineageRepairs,
    Page,
    StepHistory,
    Unchanged,
)
from rebuno.kernel.store.postgres import (
    agents,
    api_keys,
    approvals,
    checkpoints,
    dispatches,
    events,
    executions,
    migrations,
    rate_buckets,
    resources,
    seen_requests,
    steps,
    submissions,
)
from rebuno.kernel.store.postgres.connection import Connection, lock_key, translated
from rebuno.kernel.store.postgres.group import GroupCommit
from rebuno.kernel.store.postgres.listener import DispatchListener
from rebuno.kernel.store.postgres.pool import MostRecentFirstPool
from rebuno.kernel.store.postgres.transaction import (
    PostgresTransaction,
    batched,
    optimistic,
)
from rebuno.protocol.enums import ApprovalStatus
from rebuno.protocol.extensions import AgentInstance

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger(__name__)

_DEFAULT_MIN_SIZE = 2
_DEFAULT_MAX_SIZE = 10
_ACQUIRE_TIMEOUT_SECONDS = 10.0
"""How long a use case waits for a pooled connection before it fails as `Unavailable`."""
_USE_SECONDS = 10.0
"""How long one use of a pooled connection (a read, a transaction) may wait for the server. A
statement past it is cancelled, which takes up to 10 s more when nothing gets through; without
it, a request whose statement was sent into a partition would wait until the network heals."""
_OPEN_TIMEOUT_SECONDS = 10.0
_LEADER_KEEPALIVE_SECONDS = 1.0
"""How often a leader's lock session proves it is alive while its job runs."""
_LEADER_ANSWER_SECONDS = 2.0
"""How long a leader waits for its lock session to answer before it stops its job."""
_LEADER_IDLE_LIMIT_MS = 6000
"""`idle_session_timeout` of a lock session: the server ends it (releasing the lock) once it
has been idle this long, well after its replica stopped the job (keepalive + answer)."""
_RETENTION_PAGE = 500
"""Executions deleted per statement, so retention never holds many row locks for long."""


class PostgresStore:
    """A PostgreSQL database, given as a `postgres://` or `postgresql://` URL."""

    def __init__(
        self, url: str, *, min_size: int | None = None, max_size: int | None = None
    ) -> None:
        self._server = Server(url)
        self._max_size = max_size if max_size is not None else max(_DEFAULT_MAX_SIZE, min_size or 0)
        self._min_size = (
            min_size if min_size is not None else min(_DEFAULT_MIN_SIZE, self._max_size)
        )
        if not 0 <= self._min_size <= self._max_size or self._max_size < 1:
            raise ValueError(f"invalid pool size: min {min_size}, max {max_size}")
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._pool_check: asyncio.Task[None] | None = None
        self._tag = secrets.token_hex(8)
        """Names this store in its notifications, so its own listener can skip them."""
        self._group = GroupCommit(self._connection, self._server)
        """Sends the optimistic transactions, together when several are ready at once."""

    # -- lifecycle -----------------------------------------------------------------------
    async def open(self) -> None:
        if self._pool is not None:
            return
        await self._migrate()
        pool: AsyncConnectionPool[Connection] = MostRecentFirstPool(
            self._server.conninfo,
            min_size=self._min_size,
            max_size=self._max_size,
            kwargs={"autocommit": True, "prepare_threshold": 0},
            timeout=_ACQUIRE_TIMEOUT_SECONDS,
            name="rebuno",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=_OPEN_TIMEOUT_SECONDS)
        except psycopg.OperationalError as exc:
            await pool.close()
            raise self._server.unavailable(exc) from exc
        self._pool = pool

    async def _migrate(self) -> None:
        conn = await self._connect()
        async with conn:
            with translated(self._server):
                applied = await migrations.apply(conn)
        if applied:
            log.info("PostgreSQL %s: applied migrations %s", self._server.name, applied)

    async def _connect(self) -> Connection:
        """A dedicated connection, outside the pool."""
        try:
            return await psycopg.AsyncConnection.connect(self._server.conninfo, autocommit=True)
        except psycopg.OperationalError as exc:
            raise self._server.unavailable(exc) from exc

    async def close(self) -> None:
        await self._group.close()
        pool, self._pool = self._pool, None
        if self._pool_check is not None:
            self._pool_check.cancel()
            self._pool_check = None
        if pool is not None:
            await pool.close()

    async def ping(self) -> None:
        async with self._connection() as conn:
            with translated(self._server):
                await conn.execute("SELECT 1", prepare=False)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        pool = self._pool
        if pool is None:
            raise Unavailable(f"PostgreSQL {self._server.name}: the store is not open")
        bound = asyncio.timeout(_USE_SECONDS)
        try:
            async with pool.connection() as conn, bound:
                yield conn
        except TimeoutError:
            if not bound.expired():
                raise
            # Nothing came back: the server or the network is gone without a word (a
            # partition that resets nothing), or a statement ran far longer than any should.
            self._check_pool_soon(pool)
            raise Unavailable(
                f"PostgreSQL {self._server.name} is unavailable: "
                f"no answer within {_USE_SECONDS:g} s"
            ) from None
        except Unavailable:
            self._check_pool_soon(pool)
            raise
        except psycopg.OperationalError as exc:  # no connection within the timeout
            self._check_pool_soon(pool)
            raise self._server.unavailable(exc) from exc

    def _check_pool_soon(self, pool: AsyncConnectionPool[Connection]) -> None:
        # One connection turned out dead, so its idle siblings probably are too (a server
        # restart kills them all): test them now rather than fail one request per corpse.
        if self._pool_check is None or self._pool_check.done():
            self._pool_check = asyncio.create_task(_check(pool), name="rebuno-pool-check")

    # -- transactions --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def transaction(
        self, execution_id: str | None = None, unchanged: Unchanged | None = None
    ) -> AsyncIterator[PostgresTransaction]:
        if unchanged is not None and execution_id is not None:
            group = self._group
            async with optimistic(group, self._server, execution_id, unchanged, self._tag) as tx:
                yield tx
            return
        async with (
            self._connection() as conn,
            batched(conn, self._server, execution_id, self._tag) as tx,
        ):
            yield tx

    @contextlib.asynccontextmanager
    async def leader(self, key: str) -> AsyncIterator[bool]:
        # A dedicated connection, not a pooled one: the lock lives as long as the session,
        # and the block's own transactions must not compete with it for a pool slot.
        conn = await self._connect()
        async with conn:
            if not await self._try_lock(conn, key):
                yield False
                return
            # While the block runs, the lock's session answers a keepalive every second, and
            # the server ends it once idle for `_LEADER_IDLE_LIMIT_MS`: a replica cut off
            # from the database by a partition that resets nothing loses the lock then,
            # instead of keeping it (and every replica's singleton work with it) until the
            # network recovers. The block is stopped first, as soon as a keepalive goes
            # unanswered, so no two replicas run it at once each believing it leads.
            done = asyncio.Event()
            try:
                async with asyncio.timeout(None) as scope:
                    keeper = asyncio.create_task(self._keep_leading(conn, key, scope, done))
                    try:
                        yield True
                    finally:
                        done.set()
                        await keeper
            except TimeoutError:
                if not scope.expired():
                    raise  # the job's own
                raise Unavailable(
                    f"PostgreSQL {self._server.name}: leader lock {key!r} lost (its session "
                    "stopped answering); the job was stopped"
                ) from None
            await self._unlock(conn, key)

    async def _try_lock(self, conn: Connection, key: str) -> bool:
        try:
            async with asyncio.timeout(_LEADER_ANSWER_SECONDS):
                with translated(self._server):
                    with contextlib.suppress(psycopg.errors.UndefinedObject):  # before PG 14
                        await conn.execute(f"SET idle_session_timeout = {_LEADER_IDLE_LIMIT_MS}")
                    cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(key),))
                    row = await cur.fetchone()
        except TimeoutError:
            raise Unavailable(
                f"PostgreSQL {self._server.name}: no answer to leader lock {key!r} "
                f"within {_LEADER_ANSWER_SECONDS:g} s"
            ) from None
        if row is None:
            return False
        (locked,) = row
        return bool(locked)

    async def _keep_leading(
        self, conn: Connection, key: str, scope: asyncio.Timeout, done: asyncio.Event
    ) -> None:
        """Until `done`, a keepalive on the lock's session every `_LEADER_KEEPALIVE_SECONDS`;
        the first that fails or goes unanswered stops the block at once, through `scope`."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_LEADER_KEEPALIVE_SECONDS):
                    await done.wait()
                return
            keepalive = asyncio.ensure_future(conn.execute("SELECT 1", prepare=False))
            answered, _ = await asyncio.wait({keepalive}, timeout=_LEADER_ANSWER_SECONDS)
            if answered and keepalive.exception() is None:
                continue
            failure = keepalive.exception() if answered else None
            log.warning(
                "leader lock %r: keepalive failed (%s); stopping the job",
                key,
                self._server.reason(failure) if failure else "no answer",
            )
            # The block is stopped before the statement is: psycopg cancels a statement
            # through the server, which takes up to seconds when nothing gets through.
            scope.reschedule(asyncio.get_running_loop().time())
            keepalive.cancel()
            await asyncio.gather(keepalive, return_exceptions=True)
            return

    async def _unlock(self, conn: Connection, key: str) -> None:
        # Closing the session would release the lock too, but only once the server has
        # processed the close; unlocking first hands it over before `leader` returns.
        try:
            async with asyncio.timeout(_LEADER_ANSWER_SECONDS):
                await conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(key),))
        except (psycopg.Error, TimeoutError) as exc:
            log.warning(
                "leader lock %r: unlock failed (%s); closing the session releases it",
                key,
                self._server.reason(exc) if isinstance(exc, psycopg.Error) else "no answer",
            )

    # -- committed reads -----------------------------------------------------------------
    async def _read(
        self,
        query: Callable[Concatenate[Connection, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        async with self._connection() as conn:
            with translated(self._server):
                return await query(conn, *args, **kwargs)

    async def get_execution(self, execution_id: str) -> Execution:
        return await self._read(executions.get, execution_id)

    async def find_execution(self, agent_id: str, idempotency_key: str) -> Execution | None:
        return await self._read(executions.find, agent_id, idempotency_key)

    async def get_own_policy(self, execution_id: str) -> str | None:
        return await self._read(executions.get_own_policy, execution_id)

    async def get_state(self, execution_id: str) -> RawJson | None:
        return await self._read(executions.get_state, execution_id)

    async def list_resources(self, execution_id: str) -> list[Resource]:
        return await self._read(resources.list_resources, execution_id)

    async def list_checkpoints(self, execution_id: str) -> list[Checkpoint]:
        return await self._read(checkpoints.list_for, execution_id)

    async def get_restoration(self, execution_id: str) -> RawJson | None:
        return await self._read(executions.get_restoration, execution_id)

    async def list_executions(self, flt: ExecutionFilter) -> Page[Execution]:
        return await self._read(executions.list_page, flt)

    async def list_events(
        self,
        execution_id: str,
        after_seq: int,
        limit: int,
        payload_limit: int = LISTED_PAYLOAD_BYTES,
    ) -> list[Event]:
        return await self._read(events.list_after, execution_id, after_seq, limit, payload_limit)

    async def list_steps(
        self, execution_id: str, status: str | None, payload_limit: int = LISTED_PAYLOAD_BYTES
    ) -> list[Step]:
        return await self._read(steps.list_for, execution_id, status, payload_limit)

    async def get_step(self, step_id: str) -> Step | None:
        return await self._read(steps.get, step_id)

    async def load_completion(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> Completion:
        return await self._read(submissions.load_completion, execution_id, step_id, dispatch_id)

    async def load_step_history(self, execution_id: str) -> StepHistory:
        async with self._connection() as conn:
            with translated(self._server):
                # One snapshot for the three reads: a step and its decision agree.
                async with conn.transaction():
                    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    return StepHistory(
                        execution=await executions.get(conn, execution_id),
                        steps=await steps.list_for(conn, execution_id, None),
                        decisions=await events.list_decisions(conn, execution_id, DECISION_TYPES),
                    )

    async def get_agent(self, agent_id: str, *, metadata: bool = True) -> Agent:
        return await self._read(agents.get, agent_id, metadata)

    async def list_agents(self) -> list[Agent]:
        return await self._read(agents.list_all)

    async def find_api_key(self, key_id: str) -> ApiKey | None:
        return await self._read(api_keys.find, key_id)

    async def list_api_keys(self) -> list[ApiKey]:
        return await self._read(api_keys.list_all)

    async def get_approval(self, approval_id: str) -> Approval:
        return await self._read(approvals.get, approval_id)

    async def list_approvals(
        self, status: ApprovalStatus | None, execution_id: str | None
    ) -> list[Approval]:
        return await self._read(approvals.list_where, status, execution_id)

    # -- dispatch queue ------------------------------------------------------------------
    async def claim_dispatches(
        self, replica_id: str, limit: int, now: datetime
    ) -> list[ClaimedDispatch]:
        return await self._read(dispatches.claim, replica_id, limit, now)

    async def dispatch_queue(self, now: datetime) -> tuple[int, datetime | None]:
        return await self._read(dispatches.queue, now)

    async def watch_dispatches(
        self,
        wake: Callable[[], None],
        ended: Callable[[str], None] | None = None,
        touched: Callable[[str], None] | None = None,
    ) -> None:
        await DispatchListener(self._server, self._tag, wake, ended, touched).run()

    async def reclaim_expired(self, now: datetime, default_lease: timedelta) -> int:
        total = 0
        while True:
            count = await self._read(dispatches.reclaim_page, now, default_lease)
            total += count
            if count < dispatches.RECLAIM_PAGE:
                return total

    async def set_dispatch_instance(
        self, dispatch_id: str, attempt: int, instance: AgentInstance
    ) -> None:
        await self._read(dispatches.set_instance, dispatch_id, attempt, instance)

    async def list_superseded_dispatches(
        self, agent_id: str, instance: AgentInstance, limit: int
    ) -> list[Dispatch]:
        return await self._read(dispatches.list_superseded, agent_id, instance, limit)

    # -- background sweeps ---------------------------------------------------------------
    async def list_expired_approvals(self, now: datetime, limit: int, after: str = "") -> list[str]:
        return await self._read(approvals.list_expired, now, limit, after)

    async def list_overdue_executions(
        self, now: datetime, limit: int, after: str = ""
    ) -> list[str]:
        return await self._read(executions.list_overdue, now, limit, after)

    async def list_sessions_to_admit(self, limit: int) -> list[str]:
        return await self._read(executions.sessions_to_admit, limit)

    async def list_expired_sessions(self, cutoff: datetime, limit: int) -> list[str]:
        return await self._read(executions.expired_sessions, cutoff, limit)

    async def list_children(self, execution_id: str) -> list[Execution]:
        return await self._read(executions.children, execution_id)

    async def list_lineage_repairs(self, limit: int) -> LineageRepairs:
        return LineageRepairs(
            unsettled=await self._read(executions.unsettled_children, limit),
            orphans=await self._read(executions.orphans, limit),
            stalled=await self._read(executions.stalled, limit),
        )

    async def delete_terminal_before(self, cutoff: datetime) -> int:
        total = 0
        while True:
            count = await self._read(executions.delete_terminal_before, cutoff, _RETENTION_PAGE)
            total += count
            if count < _RETENTION_PAGE:
                break
        await self._read(rate_buckets.delete_before, cutoff)
        return total

    async def remember_request(
        self, digest: bytes, now: datetime, until: datetime
    ) -> datetime | None:
        return await self._read(seen_requests.remember, digest, now, until)

    async def forget_requests(self, now: datetime) -> int:
        return await self._read(seen_requests.forget_before, now)


async def _check(pool: AsyncConnectionPool[Connection]) -> None:
    try:
        await pool.check()
    except psycopg.Error as exc:  # closed meanwhile; nothing left to check
        log.debug("pool check skipped: %s", type(exc).__name__)
