"""`PostgresTransaction` (the `Transaction` protocol over one pooled connection in pipeline
mode) and `pipelined`, which begins, commits or rolls it back.

Writes are queued, not awaited: they travel with the next read or with the COMMIT, so a use
case costs one round trip per read it makes plus one for the commit. A trigger refusal or a
unique violation in a queued write therefore surfaces at that next read or at the commit; both
places translate it into the domain error it stands for.
Must import only psycopg, the domain, `store.base`, `rebuno.kernel.pgserver` and this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from rebuno.kernel.domain.records import Agent, Approval, Dispatch, Event, Execution, Lease, Step
from rebuno.kernel.pgserver import Server
from rebuno.kernel.store.base import Completion, StepIdFn, StepKey, Submission
from rebuno.kernel.store.postgres import (
    agents,
    approvals,
    dispatches,
    events,
    executions,
    rate_buckets,
    steps,
    submissions,
    writes,
)
from rebuno.kernel.store.postgres.connection import (
    Connection,
    domain_error,
    execution_lock_key,
    translated,
)
from rebuno.protocol.enums import StepStatus

T = TypeVar("T")

_BEGIN = b"BEGIN"
_COMMIT = b"COMMIT"
_ROLLBACK = b"ROLLBACK"
_PING = b"SELECT 1"
_LOCK = "SELECT pg_advisory_xact_lock(%s)"


class PostgresTransaction:
    """One unit of work; `PostgresStore.transaction` begins, commits or rolls it back."""

    __slots__ = ("_conn", "_lock", "_server", "_tag", "_writes")

    def __init__(self, conn: Connection, server: Server, lock: int | None, tag: str) -> None:
        self._conn = conn
        self._server = server
        self._tag = tag
        self._lock = lock
        """The execution's advisory-lock key until the lock is queued: the submission's read
        takes it itself, anything else queues it first."""
        self._writes = writes.Writes()

    async def _run(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Runs `call(conn, *args)` (a read, or a write `rebuno_apply` does not do) after the
        lock and the collected writes: a read sees the transaction's own writes, and writes
        keep their order."""
        with translated(self._server):
            await self._send_queued()
            return await call(self._conn, *args)

    async def _send_queued(self) -> None:
        if self._lock is not None:
            await self._conn.execute(_LOCK, (self._lock,))
            self._lock = None
        if self._writes:
            await self._conn.execute(writes.APPLY, (self._writes.take(),))

    async def flush(self) -> None:
        """Queues the lock, when no statement took it yet, and the collected writes, as one
        statement."""
        with translated(self._server):
            await self._send_queued()

    def discard(self) -> None:
        """Forgets the collected writes (the transaction is being rolled back)."""
        self._writes.clear()

    # -- reads under the lock ------------------------------------------------------------
    async def get_execution(self, execution_id: str) -> Execution:
        return await self._run(executions.get, execution_id)

    async def load_submission(
        self,
        execution_id: str,
        lease: Lease,
        key: StepKey,
        step_id_for: StepIdFn,
        now: datetime,
        completing: Sequence[str] = (),
    ) -> Submission:
        # `step_id_for` is not needed: the statement finds the step by its unique key.
        lock = None
        if not self._writes:  # writes go after the lock: with some queued, it goes first
            lock, self._lock = self._lock, None
        load = submissions.load
        return await self._run(load, lock, execution_id, lease, key, now, completing)

    async def load_completion(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> Completion:
        return await self._run(submissions.load_completion, execution_id, step_id, dispatch_id)

    async def get_step(self, step_id: str) -> Step | None:
        return await self._run(steps.get, step_id)

    async def get_steps(self, execution_id: str, step_ids: Sequence[str]) -> list[Step]:
        if not step_ids:
            return []
        return await self._run(steps.get_many, execution_id, step_ids)

    async def counters(self, dispatch_id: str, keys: Sequence[StepKey]) -> dict[StepKey, int]:
        return await self._run(dispatches.counters, dispatch_id, keys) if keys else {}

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        return await self._run(dispatches.get, dispatch_id)

    async def get_agent(self, agent_id: str) -> Agent:
        return await self._run(agents.get, agent_id)

    async def get_approval(self, approval_id: str) -> Approval:
        return await self._run(approvals.get, approval_id)

    async def pending_approval_for_step(self, step_id: str) -> Approval | None:
        return await self._run(approvals.pending_for_step, step_id)

    async def list_pending_approvals(self, execution_id: str) -> list[Approval]:
        return await self._run(approvals.pending_for_execution, execution_id)

    async def list_steps_with_status(self, execution_id: str, status: StepStatus) -> list[Step]:
        return await self._run(steps.list_for, execution_id, status.value)

    async def has_indeterminate_step(self, execution_id: str, key: StepKey) -> bool:
        return await self._run(steps.has_indeterminate, execution_id, key)

    async def has_event_of_type(self, execution_id: str, event_type: str) -> bool:
        return await self._run(events.has_type, execution_id, event_type)

    async def spent_tokens(self, execution_id: str) -> int:
        return await self._run(steps.spent_tokens, execution_id)

    async def renew_lease(self, execution_id: str, lease: Lease, now: datetime) -> bool:
        return await self._run(dispatches.renew_lease, execution_id, lease, now)

    async def take_rate_token(
        self, key: str, max_calls: int, window_seconds: float, now: datetime
    ) -> float | None:
        return await self._run(rate_buckets.take, key, max_calls, window_seconds, now)

    # -- writes (collected, or queued in order) ------------------------------------------
    async def insert_execution(self, execution: Execution) -> None:
        self._writes.add(writes.insert_execution(execution))

    async def update_execution(self, execution: Execution) -> None:
        self._writes.add(writes.update_execution(execution))

    async def append_events(self, events_: Sequence[Event]) -> None:
        if events_:
            self._writes.add(writes.append_events(events_))

    async def insert_step(self, step: Step) -> None:
        self._writes.add(writes.insert_step(step))

    async def update_step(self, step: Step) -> None:
        self._writes.add(writes.update_step(step))

    async def set_occurrence(self, dispatch_id: str, key: StepKey, consumed: int) -> None:
        self._writes.add(writes.set_occurrence(dispatch_id, key, consumed))

    async def insert_dispatch(self, dispatch: Dispatch) -> None:
        self._writes.add(writes.insert_dispatch(dispatch, self._tag))

    async def retire_dispatches(self, execution_id: str, now: datetime) -> None:
        self._writes.add(writes.retire_dispatches(execution_id, now))

    async def update_dispatch(self, dispatch: Dispatch) -> None:
        self._writes.add(writes.update_dispatch(dispatch))

    async def insert_approval(self, approval: Approval) -> None:
        await self._run(approvals.insert, approval)

    async def update_approval(self, approval: Approval) -> None:
        await self._run(approvals.update, approval)

    async def upsert_agent(self, agent: Agent, keep_bundle: bool) -> Agent:
        return await self._run(agents.upsert, agent, keep_bundle)

    async def delete_agent(self, agent_id: str) -> None:
        await self._run(agents.delete, agent_id)

    async def set_policy_bundle(self, agent_id: str, bundle: str | None) -> None:
        await self._run(agents.set_policy_bundle, agent_id, bundle)


@contextlib.asynccontextmanager
async def pipelined(
    conn: Connection, server: Server, execution_id: str | None, tag: str
) -> AsyncIterator[PostgresTransaction]:
    """Begins a transaction on `conn` (taking the execution's lock when an id is given),
    commits it when the block exits normally and rolls it back when it raises. `tag` names
    the store in the notifications the transaction sends."""
    rolled_back = False
    try:
        try:
            async with conn.pipeline() as pipeline:
                # Queued, not awaited: it goes out with the block's first read (or with the
                # COMMIT). The execution's lock is taken by that first read, or just before it,
                # so it is granted before the read's snapshot is taken.
                await conn.execute(_BEGIN, prepare=False)
                lock = None if execution_id is None else execution_lock_key(execution_id)
                tx = PostgresTransaction(conn, server, lock, tag)
                try:
                    yield tx
                except BaseException:
                    rolled_back = True
                    tx.discard()
                    await _abandon(conn, pipeline)
                    raise
                await tx.flush()
                await conn.execute(_COMMIT, prepare=False)
            # Leaving the pipeline sends what is queued and waits: the commit's round trip.
        finally:
            if rolled_back:
                await _forget_prepared(conn)
    except psycopg.Error as exc:
        await _end_failed(conn)
        error = domain_error(exc, server)
        if error is exc:
            raise
        raise error from exc


async def _forget_prepared(conn: Connection) -> None:
    """A ROLLBACK makes psycopg drop its prepared statements and queue a `DEALLOCATE ALL`
    for the next statement. Inside the next pipeline that would run after statements were
    prepared again, and their next use would fail; so let it run now, outside any pipeline."""
    if conn.broken:
        return
    with contextlib.suppress(psycopg.Error):
        await conn.execute(_PING, prepare=False)


async def _abandon(conn: Connection, pipeline: psycopg.AsyncPipeline) -> None:
    """Rolls back a block that raised. Never raises: the block's own exception is the one to
    report, and a broken session is discarded by the pool anyway."""
    if conn.broken:
        return
    with contextlib.suppress(psycopg.Error):
        try:
            await conn.execute(_ROLLBACK, prepare=False)
            await pipeline.sync()
        except psycopg.Error:
            # A queued statement had failed, and the server skipped everything after it up
            # to the sync, this ROLLBACK included: the transaction is still open (aborted).
            await conn.execute(_ROLLBACK, prepare=False)
            await pipeline.sync()


async def _end_failed(conn: Connection) -> None:
    """After a failed commit the session is in an aborted transaction: end it, so the pool
    gets the connection back clean (or, when that fails too, drops it)."""
    if conn.broken or conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        await conn.execute(_ROLLBACK, prepare=False)
    except psycopg.Error:
        await conn.close()
