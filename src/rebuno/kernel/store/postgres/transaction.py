"""`PostgresTransaction` (the `Transaction` protocol over one pooled connection) and
`batched`, which begins, commits or rolls it back.

A transaction's statements travel as few messages as its reads allow: what a round trip needs
(BEGIN, the execution's lock, the writes collected so far, then the read or reads) goes out
as one simple-protocol message, its parameters bound on the client, and only a fetch awaits
it. So a use case costs one round trip per read it makes plus one for the commit; what costs
is each round trip (a wake-up of the backend, a result to wait for), far more than the
statements in it. psycopg's pipeline mode sends the same statements in one round trip too,
but waits on the socket once per statement: it cost the kernel 0.2-0.3 ms of CPU more per
transaction. Writes are collected as operations of `rebuno_apply` and sent as one statement:
a trigger refusal or a unique violation in them therefore surfaces at the next read or at
the commit; both places translate it into the domain error it stands for. A use case that
reads nothing and takes no lock (creating an execution) is its writes' one statement, in
autocommit, prepared.
Must import only psycopg, the domain, `store.base`, `rebuno.kernel.pgserver` and this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import TupleRow

from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.records import (
    Agent,
    AgentMetadata,
    Approval,
    Checkpoint,
    Dispatch,
    Event,
    Execution,
    Lease,
    RawJson,
    Resource,
    Step,
)
from rebuno.kernel.pgserver import Server
from rebuno.kernel.store.base import (
    NOTHING_WANTED,
    Completion,
    Locked,
    Outcomes,
    Stale,
    StepIdFn,
    StepKey,
    Submission,
    Unchanged,
    Wanted,
)
from rebuno.kernel.store.postgres import (
    agents,
    api_keys,
    approvals,
    checkpoints,
    dispatches,
    events,
    executions,
    rate_buckets,
    resources,
    seen_requests,
    steps,
    submissions,
    writes,
)
from rebuno.kernel.store.postgres.connection import (
    Connection,
    Params,
    Result,
    execution_lock_key,
    lock_key,
    translated,
)
from rebuno.kernel.store.postgres.group import GroupCommit, Member
from rebuno.protocol.enums import ExecutionStatus, StepStatus

T = TypeVar("T")
Statement = tuple[str, Params | None]

_BEGIN = "BEGIN"
_COMMIT = "COMMIT"
_ROLLBACK = b"ROLLBACK"
_PING = b"SELECT 1"
_LOCK = "SELECT pg_advisory_xact_lock(%s)"
_WRITES_ONLY = "an optimistic transaction only writes"


class Rows:
    """What one statement of a transaction returned, once its message was answered: the
    `Result` the query functions fetch from. A fetch before then sends what is queued."""

    __slots__ = ("_rowcount", "_rows", "_tx")

    def __init__(self, tx: PostgresTransaction) -> None:
        self._tx = tx
        self._rows: list[TupleRow] | None = None
        self._rowcount = -1

    def _set(self, rows: list[TupleRow], rowcount: int) -> None:
        self._rows, self._rowcount = rows, rowcount

    async def _answered(self) -> list[TupleRow]:
        if self._rows is None:
            await self._tx.flush()
        if self._rows is None:  # the message did not get this far
            raise RuntimeError("a statement of the transaction was not answered")
        return self._rows

    @property
    def rowcount(self) -> int:
        return self._rowcount

    async def fetchone(self) -> TupleRow | None:
        rows = await self._answered()
        return rows[0] if rows else None

    async def fetchall(self) -> list[TupleRow]:
        return list(await self._answered())


class PostgresTransaction:
    """One unit of work; `batched` commits or rolls it back."""

    __slots__ = (
        "_agent",
        "_begun",
        "_lock",
        "_queued",
        "_read",
        "_server",
        "_session",
        "_tag",
        "_writes",
    )

    def __init__(
        self,
        conn: Connection | None,
        server: Server,
        lock: int | None,
        tag: str,
    ) -> None:
        self._session = conn
        """The pooled connection; None for an optimistic transaction, which holds none and
        only collects writes: its statement takes the lock itself (`unchanged_member`)."""
        self._server = server
        self._tag = tag
        self._lock = lock
        """The execution's advisory-lock key until the lock is queued: the submission's read
        takes it itself, anything else queues it first."""
        self._writes = writes.Writes()
        self._agent: str | None = None
        """The agent a queued `insert_execution` requires, checked by the writes' statement."""
        self._queued: list[tuple[Statement, Rows | None]] = []
        """Statements not sent yet, in order, each with what receives its result (None for
        BEGIN, the lock and the writes, whose results nobody reads)."""
        self._begun = False
        """BEGIN is queued or sent: from the first statement that needs it until the end."""
        self._read: dict[str, ExecutionStatus] = {}
        """Each execution's status as this transaction last read or wrote it: an update that
        keeps it (a step) announces nothing (`update_execution`)."""

    @property
    def _conn(self) -> Connection:
        if self._session is None:
            raise RuntimeError(_WRITES_ONLY)
        return self._session

    def read_status(self, execution_id: str, status: ExecutionStatus) -> None:
        """The execution's status as read before this transaction (an optimistic one's
        condition holds it to that record): an update that keeps it announces nothing."""
        self._read[execution_id] = status

    def _seen(self, execution: Execution) -> Execution:
        self._read[execution.id] = execution.status
        return execution

    async def _run(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Runs `call(session, *args)` (a read, or a write `rebuno_apply` does not do): its
        statements go after BEGIN, the lock and the collected writes, so they see the
        transaction's own writes, and writes keep their order."""
        if self._session is None:
            raise RuntimeError(_WRITES_ONLY)
        with translated(self._server):
            return await call(_Session(self), *args)

    def queue(self, statements: Sequence[Statement]) -> list[Rows]:
        """Queues what the transaction has collected and `statements`; each one's rows arrive
        when one of them is fetched, all in the same round trip."""
        self._queue_collected()
        queued = []
        for statement in statements:
            rows = Rows(self)
            self._queued.append((statement, rows))
            queued.append(rows)
        return queued

    def _queue_collected(self) -> None:
        """Queues BEGIN, the lock and the collected writes, as far as they are not yet."""
        if not self._begun:
            self._begun = True
            self._queued.append(((_BEGIN, None), None))
        if self._lock is not None:
            self._queued.append(((_LOCK, (self._lock,)), None))
            self._lock = None
        if self._writes:
            self._queued.append((self._apply(), None))

    async def flush(self) -> None:
        """Sends every queued statement as one message and hands each its rows. A statement
        that fails raises here, and the server skips the rest of the message."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        cur = psycopg.AsyncClientCursor(self._conn)
        text = "; ".join(cur.mogrify(query, params) for (query, params), _ in queued)
        await cur.execute(text)
        for index, (_, rows) in enumerate(queued):
            if index:
                cur.nextset()
            if rows is not None:
                rows._set(await cur.fetchall() if cur.description else [], cur.rowcount)

    def _apply(self) -> Statement:
        if self._agent is None:
            return writes.APPLY, (self._writes.take(),)
        agent, self._agent = self._agent, None
        return writes.APPLY_FOR_AGENT, (agent, self._writes.take())

    async def commit(self) -> None:
        """Sends what is queued and the COMMIT, and waits for them."""
        with translated(self._server):
            if not self._begun and (self._lock is None or not self._writes):
                # Nothing read and no lock to take first: the writes (if any) are one
                # statement, which commits itself.
                if self._writes:
                    await self._conn.execute(*self._apply())
                return
            self._queue_collected()
            self._queued.append(((_COMMIT, None), None))
            await self.flush()  # the commit's round trip

    def unchanged_member(self, execution_id: str, unchanged: Unchanged) -> Member:
        """The writes as one statement that applies them only while `unchanged` holds."""
        return Member(
            execution_lock_key(execution_id), execution_id, unchanged, self._writes.take()
        )

    async def roll_back(self) -> None:
        """Forgets the collected writes and ends the transaction, if it began. Never raises:
        the block's own exception is the one to report; a session that cannot roll back is
        closed, and the pool replaces it."""
        self._writes.clear()
        self._queued.clear()
        if self._begun:
            await _end(self._conn)

    def _lock_for_read(self) -> int | None:
        """The lock key, handed to a read whose statement takes the lock itself; None when it
        is queued already, or when writes are queued (they go after the lock, so it goes
        first)."""
        if self._writes:
            return None
        lock, self._lock = self._lock, None
        return lock

    # -- reads under the lock ------------------------------------------------------------
    async def get_execution(self, execution_id: str) -> Execution:
        if self._lock is not None and not self._writes:  # the lock and the read in one call
            return (await self.lock_execution(execution_id)).execution
        return self._seen(await self._run(executions.get, execution_id))

    async def find_execution(self, agent_id: str, idempotency_key: str) -> Execution | None:
        return await self._run(executions.find, agent_id, idempotency_key)

    async def hold_execution(self, execution_id: str) -> Execution:
        return self._seen(await self._run(executions.hold, execution_id))

    async def take_lock(self, key: str) -> None:
        await self._run(_take_lock, lock_key(key))

    async def session_held(self, session: str) -> bool:
        return await self._run(executions.session_held, session)

    async def session_used(self, session: str) -> bool:
        return await self._run(executions.session_used, session)

    async def first_waiter(self, session: str, now: datetime) -> Execution | None:
        return await self._run(executions.first_waiter, session, now)

    async def last_completed(self, agent_id: str, session: str) -> str | None:
        return await self._run(executions.last_completed, agent_id, session)

    async def admit(self, execution_id: str, now: datetime, parent: str | None) -> None:
        self._writes.add(writes.admit_execution(execution_id, now, parent))

    async def list_children(self, execution_id: str) -> list[Execution]:
        return await self._run(executions.children, execution_id)

    async def delete_expired_session(self, session: str, cutoff: datetime) -> int:
        return await self._run(executions.delete_session, session, cutoff)

    async def lock_execution(
        self,
        execution_id: str,
        lease: Lease | None = None,
        now: datetime | None = None,
        wanted: Wanted = NOTHING_WANTED,
    ) -> Locked:
        load = submissions.lock_execution
        locked = await self._run(load, self._lock_for_read(), execution_id, lease, now, wanted)
        self._seen(locked.execution)
        return locked

    async def load_submission(
        self,
        execution_id: str,
        lease: Lease,
        key: StepKey,
        step_id_for: StepIdFn,
        now: datetime,
        completing: Sequence[str] = (),
    ) -> Submission:
        load = submissions.load
        loaded: Submission = await self._run(
            load, self._lock_for_read(), execution_id, lease, key, step_id_for, now, completing
        )
        self._seen(loaded.execution)
        return loaded

    async def load_completion(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> Completion:
        completion: Completion = await self._run(
            submissions.load_completion, execution_id, step_id, dispatch_id
        )
        self._seen(completion.execution)
        return completion

    async def get_step(self, step_id: str) -> Step | None:
        return await self._run(steps.get, step_id)

    async def load_outcomes(self, execution_id: str, dispatch_id: str, wanted: Wanted) -> Outcomes:
        if not wanted:
            return Outcomes(consumed={}, steps=[])
        return await self._run(submissions.load_outcomes, execution_id, dispatch_id, wanted)

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

    async def take_rate_token(
        self, key: str, max_calls: int, window_seconds: float, now: datetime
    ) -> float | None:
        return await self._run(rate_buckets.take, key, max_calls, window_seconds, now)

    async def remember_request(
        self, digest: bytes, now: datetime, until: datetime
    ) -> datetime | None:
        return await self._run(seen_requests.remember, digest, now, until)

    async def list_resources(self, execution_id: str) -> list[Resource]:
        return await self._run(resources.list_resources, execution_id)

    async def list_checkpoints(self, execution_id: str) -> list[Checkpoint]:
        return await self._run(checkpoints.list_for, execution_id)

    async def affected_keys(self, step_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        return await self._run(resources.affected_keys, step_ids)

    async def writing_keys(self, execution_id: str) -> set[str]:
        return await self._run(resources.writing_keys, execution_id)

    # -- writes (collected, or queued in order) ------------------------------------------
    async def insert_execution(
        self, execution: Execution, policy_bundle: str | None = None
    ) -> None:
        self._writes.add(writes.insert_execution(execution, policy_bundle, self._tag))
        self._agent = execution.agent_id
        self._seen(execution)

    async def update_execution(self, execution: Execution) -> None:
        # A status this transaction did not read (an optimistic one reads nothing) is
        # announced: a needless look costs a replica one read, a missed one a stale badge.
        changed = self._read.get(execution.id) is not execution.status
        self._writes.add(writes.update_execution(execution, self._tag if changed else None))
        self._seen(execution)

    async def mark_parent(self, execution_id: str) -> None:
        self._writes.add(writes.mark_parent(execution_id))

    async def set_state(self, execution_id: str, state: RawJson) -> None:
        self._writes.add(writes.set_state(execution_id, state))

    async def mark_resources(self, execution_id: str) -> None:
        self._writes.add(writes.mark_resources(execution_id))

    async def set_restoration(self, execution_id: str, restoration: RawJson) -> None:
        self._writes.add(writes.set_restoration(execution_id, restoration))

    async def put_resource(self, resource: Resource) -> None:
        self._writes.add(writes.put_resource(resource))

    async def insert_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._writes.add(writes.insert_checkpoint(checkpoint))

    async def close_checkpoints(self, execution_id: str, key: str, seq: int) -> None:
        self._writes.add(writes.close_checkpoints(execution_id, key, seq))

    async def set_affected_keys(self, step_id: str, keys: Sequence[str]) -> None:
        self._writes.add(writes.set_affected_keys(step_id, keys))

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

    async def expire_lease(self, dispatch_id: str, attempt: int) -> None:
        await self._run(dispatches.expire_lease, dispatch_id, attempt)

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

    async def insert_api_key(self, key: ApiKey) -> None:
        await self._run(api_keys.insert, key)

    async def rotate_api_key(self, key_id: str, old_hash: bytes, new_hash: bytes) -> bool:
        return await self._run(api_keys.rotate, key_id, old_hash, new_hash)

    async def revoke_api_key(self, key_id: str, now: datetime) -> None:
        await self._run(api_keys.revoke, key_id, now)

    async def update_agent_metadata(
        self, agent_id: str, metadata: AgentMetadata, now: datetime
    ) -> None:
        await self._run(agents.update_metadata, agent_id, metadata, now)


class _Session:
    """What a query function runs on inside a transaction (`connection.Batch`)."""

    __slots__ = ("_tx",)

    def __init__(self, tx: PostgresTransaction) -> None:
        self._tx = tx

    async def execute(self, query: str, params: Params | None = None) -> Result:
        return self._tx.queue([(query, params)])[0]

    async def execute_many(self, statements: Sequence[Statement]) -> list[Result]:
        return list(self._tx.queue(statements))


@contextlib.asynccontextmanager
async def optimistic(
    group: GroupCommit, server: Server, execution_id: str, unchanged: Unchanged, tag: str
) -> AsyncIterator[PostgresTransaction]:
    """An optimistic transaction (`Store.transaction(unchanged=...)`): the block only
    collects writes, and leaving it sends them as one statement, through the group commit;
    raises `Stale` when its condition did not hold. No connection is held meanwhile."""
    tx = PostgresTransaction(None, server, None, tag)
    if unchanged.status is not None:
        tx.read_status(execution_id, unchanged.status)
    yield tx
    if not await group.apply(tx.unchanged_member(execution_id, unchanged)):
        raise Stale(f"execution {execution_id} changed since it was read")


@contextlib.asynccontextmanager
async def batched(
    conn: Connection, server: Server, execution_id: str | None, tag: str
) -> AsyncIterator[PostgresTransaction]:
    """A transaction on `conn` (taking the execution's lock when an id is given), committed
    when the block exits normally and rolled back when it raises. `tag` names the store in
    the notifications the transaction sends. Nothing is sent until the block's first read:
    the lock goes just before it, so it is granted before the read's snapshot is taken."""
    lock = None if execution_id is None else execution_lock_key(execution_id)
    tx = PostgresTransaction(conn, server, lock, tag)
    try:
        yield tx
        await tx.commit()
    except BaseException:
        await tx.roll_back()
        raise


async def _end(conn: Connection) -> None:
    """Leaves the session clean for the pool: an aborted or unfinished transaction rolled
    back (a session that cannot is closed), and, after a ROLLBACK, the `DEALLOCATE ALL`
    psycopg may queue then run now rather than in front of the next use's statements."""
    if conn.broken:
        return
    try:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            await conn.execute(_ROLLBACK, prepare=False)
        await conn.execute(_PING, prepare=False)
    except psycopg.Error:
        await conn.close()


async def _take_lock(conn: _Session, key: int) -> None:
    """Waits for the lock here, so what the transaction reads next is read under it."""
    cur = await conn.execute(_LOCK, (key,))
    await cur.fetchone()
