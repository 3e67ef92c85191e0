"""Execution use cases: create, read, cancel, heartbeat, and the agent's complete / fail.

Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import Carried, StepRecord
from rebuno.kernel.domain.errors import (
    Conflict,
    ExecutionTerminal,
    NotFound,
    ValidationFailed,
    lease_superseded,
)
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.execution import (
    check_owner,
    mark_started,
    pending,
    spawned_by,
    transition,
)
from rebuno.kernel.domain.principal import ANONYMOUS, Principal
from rebuno.kernel.domain.records import (
    Event,
    Execution,
    Lease,
    RawJson,
    SeenRequest,
    Step,
    replace,
)
from rebuno.kernel.service.activity import Watcher
from rebuno.kernel.service.base import ServiceBase, Wake, flush, new_id
from rebuno.kernel.service.resources import settle
from rebuno.kernel.service.shortcuts import Run
from rebuno.kernel.service.steps import apply_outcomes, wanted_by
from rebuno.kernel.store.base import (
    NOTHING_WANTED,
    ExecutionFilter,
    Locked,
    Outcomes,
    Page,
    Stale,
    Store,
    Transaction,
    Unchanged,
    Wanted,
    execution_lock,
    session_lock,
)
from rebuno.protocol.enums import ApprovalStatus, ExecutionStatus, StepStatus
from rebuno.protocol.events import EventType
from rebuno.protocol.times import format_timestamp

T = TypeVar("T")
MAX_ANCESTORS = 64
"""How far up a sub-agent's session is compared with its ancestors' (§25.2)."""
CLIENT_CANCELLED = "client_cancelled"
REPLICA_POLL_SECONDS = 0.25
DEADLINE_EXCEEDED = "deadline_exceeded"
DISPATCH_EXHAUSTED = "dispatch_exhausted"
COPY_GRACE = timedelta(seconds=10)
"""How long after its first sighting a copy of a heartbeat still renews the lease (§2.3): the
timestamp is whole seconds, so an agent beating faster than once a second sends copies, and a
busy kernel may serve the last of them some seconds after the first. A replay gains at most
this much lease."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a new execution comes from (§27): the labels its creator gave and who that is."""

    principal: Principal = ANONYMOUS
    """Who asked for it (§34.5): its id is the execution's `created_by`."""
    idempotency_key: str | None = None
    parent_execution_id: str | None = None
    on_behalf_of: str | None = None
    session: str | None = None
    spawned_by: tuple[str, str] | None = None
    """`(execution_id, step_id)`: the executing step this sub-agent runs for (§25.2)."""


@dataclass(frozen=True, slots=True)
class Created:
    execution: Execution
    repeat: bool
    """An earlier create under the same idempotency key made it; nothing was written now."""


class ExecutionUseCases(ServiceBase):
    async def create_execution(
        self, agent_id: str, input: RawJson, agent_version: str | None, origin: Origin = Origin()
    ) -> Execution:
        """`create`'s execution, whether this call made it or an earlier one."""
        return (await self.create(agent_id, input, agent_version, origin)).execution

    async def create(
        self, agent_id: str, input: RawJson, agent_version: str | None, origin: Origin = Origin()
    ) -> Created:
        """§5.1, with §27.1: a create under an idempotency key the agent used before answers
        that execution as it is now, whatever else the request says; of racing creates under
        one key, the unique index lets one insert and the others answer it."""
        if origin.spawned_by is not None and origin.idempotency_key is None:
            # A rerun of the step finds its child, even after the step settled.
            origin = replace(origin, idempotency_key=origin.spawned_by[1])
        key = origin.idempotency_key
        if key is not None:
            earlier = await self.store.find_execution(agent_id, key)
            if earlier is not None:
                return Created(_same_spawn(earlier, origin), repeat=True)
        try:
            execution = await self._insert_execution(agent_id, input, agent_version, origin)
        except Conflict:
            if key is None:
                raise
            # Read in a transaction: the winner may be committing in the same group as this
            # attempt (the embedded store), and a transaction sees it, then waits for it.
            async with self.transaction() as tx:
                earlier = await tx.find_execution(agent_id, key)
            if earlier is None:
                raise
            return Created(_same_spawn(earlier, origin), repeat=True)
        self.shortcuts.created(execution.id)
        self.activity.touched(execution.id)
        self.wake()
        return Created(execution, repeat=False)

    async def _insert_execution(
        self, agent_id: str, input: RawJson, agent_version: str | None, origin: Origin
    ) -> Execution:
        session = origin.session
        async with self.transaction() as tx:
            if session is not None:
                await tx.take_lock(session_lock(session))  # first: §24.3 lock order
                if origin.parent_execution_id is not None and await tx.session_used(session):
                    raise Conflict(
                        f"session {session!r} has executions already: a branch from a "
                        "parent starts a new session"
                    )
            on_behalf_of = origin.on_behalf_of
            if origin.spawned_by is not None:
                spawner = await check_spawn(tx, *origin.spawned_by, session)
                on_behalf_of = on_behalf_of or spawner.on_behalf_of
                if not spawner.has_children:
                    await tx.mark_parent(spawner.id)
            if origin.parent_execution_id is not None:
                await _check_parent(tx, agent_id, origin.parent_execution_id)
            now = self.clock()
            execution = pending(
                new_id(),
                agent_id,
                agent_version,
                input,
                now,
                self.settings.deadline_timeout,
                idempotency_key=origin.idempotency_key,
                parent_execution_id=origin.parent_execution_id,
                created_by=origin.principal.id,
                on_behalf_of=on_behalf_of,
                session=session,
                admitted_at=None if session is not None else now,
                spawned_by_execution_id=origin.spawned_by[0] if origin.spawned_by else None,
                spawned_by_step_id=origin.spawned_by[1] if origin.spawned_by else None,
            )
            batch = EventBatch(execution, now)
            batch.execution(
                EventType.EXECUTION_CREATED,
                execution,
                deadline_at=_deadline(execution),
                created_by=execution.created_by,
                on_behalf_of=execution.on_behalf_of,
                spawned_by=spawned_by(execution),
            )
            await tx.insert_execution(execution)
            if session is None:
                await self.enqueue(tx, batch, self.new_dispatch(execution.id, now))
            execution = await flush(tx, execution, batch)
            if session is not None:
                # FIFO: the new one is let run only when nothing older waits (§24.3).
                admitted = await self._admit_next(tx, session, now)
                if admitted is not None and admitted.id == execution.id:
                    execution = admitted
        return execution

    async def admit_waiting(self, limit: int) -> int:
        """The lineage sweep: releases the sessions a lost follow-up left with waiters and no
        holder; how many it looked at."""
        sessions = await self.store.list_sessions_to_admit(limit)
        for session in sessions:
            await self.release_session(session)
        return len(sessions)

    async def delete_expired_sessions(self, cutoff: datetime, limit: int) -> int:
        """Retention of sessions (§24.6): each whole, in a transaction of its own under its
        lock; how many executions went."""
        deleted = 0
        for session in await self.store.list_expired_sessions(cutoff, limit):
            async with self.transaction() as tx:
                await tx.take_lock(session_lock(session))
                deleted += await tx.delete_expired_session(session, cutoff)
        return deleted

    async def previous_state(self, execution_id: str, agent_id: str | None = None) -> RawJson:
        """§24.5: what the execution continues from: its parent's stored `state`, else the
        parent's output (`null` when it had none), else `null` when it has no parent. A
        parent whose row is gone answers `NotFound`, loud rather than an empty conversation."""
        execution = await self.store.get_execution(execution_id)
        check_owner(execution, agent_id)
        parent_id = execution.parent_execution_id
        if parent_id is None:
            return "null"
        state = await self.store.get_state(parent_id)
        if state is not None:
            return state
        return (await self.store.get_execution(parent_id)).output or "null"

    async def get_execution(
        self, execution_id: str, agent_id: str | None = None, wait: float = 0.0
    ) -> Execution:
        """The execution. With `wait` (our long poll), a live one is held up to that many
        seconds for it to become terminal."""

        async def read(ended: Execution | None) -> tuple[Execution, bool]:
            execution = ended or await self.store.get_execution(execution_id)
            check_owner(execution, agent_id)
            return execution, execution.status.is_terminal

        # Woken only by the use cases that can end an execution, not by every step. One
        # created here and not seen ending is live: waiting comes first. Should it have
        # ended on another replica and the news been lost, the look every
        # REPLICA_POLL_SECONDS finds it.
        live = wait > 0 and self.shortcuts.known_live(execution_id)
        return await _hold(wait, lambda: self.on_end(execution_id), read, live=live)

    async def list_executions(self, flt: ExecutionFilter) -> Page[Execution]:
        return await self.store.list_executions(flt)

    async def watch_executions(
        self, watcher: Watcher, quiet: float
    ) -> AsyncGenerator[list[Execution] | None, None]:
        """The activity feed (§40.5): batches of executions as they are now, one per
        wake-up; an empty batch after `quiet` seconds without one, `None` when the watcher lost
        count. Each is read from the store, so the feed is never a second record."""
        while True:
            ids = await watcher.changed(quiet)
            if ids is None:
                yield None
                continue
            found = [await _maybe_current(self.store, one) for one in ids]
            yield [one for one in found if one is not None]

    async def list_events(
        self, execution_id: str, after_seq: int, limit: int, wait: float = 0.0
    ) -> list[Event]:
        """Events after `after_seq`. With `wait` (our long poll), an empty answer is held up
        to that many seconds for the next commit on the execution, unless it is terminal."""

        async def read(_: Execution | None) -> tuple[list[Event], bool]:
            events = await self.store.list_events(execution_id, after_seq, limit)
            if events:
                return events, True
            # Also answers NotFound for an unknown execution; a terminal one has no more.
            execution = await self.store.get_execution(execution_id)
            return events, execution.status.is_terminal

        return await _hold(wait, lambda: self.on_append(execution_id), read)

    async def list_steps(
        self, execution_id: str, status: str | None, agent_id: str | None = None
    ) -> list[Step]:
        await self.get_execution(execution_id, agent_id)
        return await self.store.list_steps(execution_id, status)

    async def get_step(self, execution_id: str, step_id: str, agent_id: str | None = None) -> Step:
        await self.get_execution(execution_id, agent_id)
        step = await self.store.get_step(step_id)
        if step is None or step.execution_id != execution_id:
            raise NotFound(f"step {step_id} not found in execution {execution_id}")
        return step

    async def cancel_execution(self, execution_id: str) -> None:
        await self.cancel(execution_id, CLIENT_CANCELLED)

    async def cancel(self, execution_id: str, reason: str) -> None:
        """§10.1: cancelled, pending approvals expired, gated steps denied, running steps
        cancelled, dispatches retired; all in one transaction."""
        async with self.transaction(execution_id) as tx:
            execution = await tx.get_execution(execution_id)
            batch = EventBatch(execution, self.clock())
            cancelled = transition(
                execution, ExecutionStatus.CANCELLED, batch.now, failure_reason=reason
            )
            batch.execution(EventType.EXECUTION_CANCELLED, cancelled, reason=reason)
            await _expire_pending_approvals(tx, execution_id, batch)
            ended: list[Step] = []
            for step in await tx.list_steps_with_status(execution_id, StepStatus.EXECUTING):
                done = steps.finish(
                    step, StepStatus.CANCELLED, batch.now, error=steps.CANCELLED_ERROR
                )
                await tx.update_step(done)
                batch.step(EventType.STEP_CANCELLED, done, error=steps.CANCELLED_ERROR)
                ended.append(done)
            if ended and execution.has_resources:
                await settle(tx, execution, ended)  # §33.6: a cancelled step counts
            await tx.retire_dispatches(execution_id, batch.now)
            await flush(tx, cancelled, batch)
        self.ended(execution_id)
        await self.after_end(cancelled)

    async def heartbeat(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        outcomes: Sequence[Carried] = (),
        *,
        policy: bool = False,
        seen: SeenRequest | None = None,
    ) -> bool:
        """Renews the lease and records what the heartbeat carries. With `policy`, also
        answers whether the agent is still without a policy (`step-records`).

        A copy of a heartbeat already accepted (`seen`, §2.3) more than `COPY_GRACE` ago
        gets the same answer and changes nothing: the lease is not renewed again, so
        replaying a captured heartbeat cannot keep a dead run's lease alive. An agent that
        beats more than once a second sends identical heartbeats within that grace, and each
        renews as it should."""
        async with self.transaction(execution_id) as tx:
            now = self.clock()
            if seen is not None and await _stale_copy(tx, seen, now):
                locked = await tx.lock_execution(execution_id)
                check_owner(locked.execution, agent_id)
                return policy and not locked.policy_bundle
            locked = await tx.lock_execution(execution_id, lease, now, wanted_by(outcomes))
            execution = locked.execution
            check_owner(execution, agent_id)
            if not locked.lease_live:
                raise lease_superseded(execution_id, lease)
            batch = EventBatch(execution, now)
            execution = mark_started(execution, batch)
            recorded = locked.outcomes
            await apply_outcomes(
                tx,
                execution_id,
                lease.dispatch_id,
                outcomes,
                batch,
                recorded=recorded,
                execution=execution,
            )
            await flush(tx, execution, batch)
            return policy and not locked.policy_bundle

    async def complete_execution(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        output: RawJson,
        outcomes: Sequence[Carried] = (),
        state: RawJson | None = None,
    ) -> None:
        """`state` (§24.5) is kept for the executions that continue this one; `null` is none."""
        await self._finish(
            execution_id,
            agent_id,
            lease,
            ExecutionStatus.COMPLETED,
            output,
            "",
            outcomes,
            None if state == "null" else state,
        )

    async def fail_execution(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        reason: str,
        outcomes: Sequence[Carried] = (),
    ) -> None:
        await self._finish(
            execution_id, agent_id, lease, ExecutionStatus.FAILED, None, reason, outcomes, None
        )

    async def _finish(
        self,
        execution_id: str,
        agent_id: str | None,
        lease: Lease,
        status: ExecutionStatus,
        output: RawJson | None,
        reason: str,
        outcomes: Sequence[Carried],
        state: RawJson | None,
    ) -> None:
        """Terminal is checked before the lease (§5.2), then the strong lease check. A
        refusal rolls the transaction back, the lease's renewal with it. The end of a first
        run followed here is tried optimistically first (see `_finish_on_run`)."""
        await self.shortcuts.wait_acknowledged(execution_id)
        run = self.shortcuts.take_run(execution_id, lease)
        if run is not None:
            done = await self._finish_on_run(
                run, agent_id, lease, status, output, reason, outcomes, state
            )
            if done is not None:
                self.ended(execution_id, done)
                await self.after_end(done)
                return
        async with self.transaction(execution_id) as tx:
            now = self.clock()
            locked = await lock_live(tx, execution_id, agent_id, lease, now, wanted_by(outcomes))
            done = await finish_execution(
                tx,
                locked.execution,
                status,
                output,
                reason,
                now,
                outcomes,
                lease.dispatch_id,
                locked.outcomes,
                state=state,
            )
        self.ended(execution_id, done)
        await self.after_end(done)

    async def _finish_on_run(
        self,
        run: Run,
        agent_id: str | None,
        lease: Lease,
        status: ExecutionStatus,
        output: RawJson | None,
        reason: str,
        outcomes: Sequence[Carried],
        state: RawJson | None,
    ) -> Execution | None:
        """Ends a followed run (`shortcuts.Run`) on the record this process last wrote, in
        one statement that applies only while nothing changed since: the record is the
        execution's, the lease is live, no occurrence counter was used and no sub-agent was
        started from it. The completions it carries are of steps the run knows executing;
        reports (`step-records`) only on a run with no step yet, where they take their first
        occurrences. Returns the record written, or None when something changed (or the
        request carries anything else), for the ordinary way."""
        execution = run.execution
        completing: list[Step] = []
        for outcome in outcomes:
            if isinstance(outcome, StepRecord):
                if run.recorded:
                    return None
            elif outcome.step_id in run.executing:
                completing.append(run.executing[outcome.step_id])
            else:
                return None
        check_owner(execution, agent_id)
        now = self.clock()
        unchanged = Unchanged.on(execution, lease, now, childless=True)
        try:
            async with self.transaction(execution.id, unchanged) as tx:
                done = await finish_execution(
                    tx,
                    execution,
                    status,
                    output,
                    reason,
                    now,
                    outcomes,
                    lease.dispatch_id,
                    Outcomes(consumed={}, steps=completing),
                    state=state,
                )
        except Stale:
            return None
        return done


async def lock_live(
    tx: Transaction,
    execution_id: str,
    agent_id: str | None,
    lease: Lease,
    now: datetime,
    wanted: Wanted = NOTHING_WANTED,
) -> Locked:
    """The execution under its lock for an agent's write that ends or blocks it (§5.2):
    its own (`Forbidden`), not terminal (checked before the lease), and the strong lease
    check, which renews it."""
    locked = await tx.lock_execution(execution_id, lease, now, wanted)
    execution = locked.execution
    check_owner(execution, agent_id)
    if execution.status.is_terminal:
        raise ExecutionTerminal(f"execution {execution_id} is already {execution.status}")
    if not locked.lease_live:
        raise lease_superseded(execution_id, lease)
    return locked


async def finish_execution(
    tx: Transaction,
    execution: Execution,
    status: ExecutionStatus,
    output: RawJson | None,
    reason: str,
    now: datetime,
    outcomes: Sequence[Carried] = (),
    dispatch_id: str = "",
    recorded: Outcomes | None = None,
    *,
    reached: bool = True,
    state: RawJson | None = None,
) -> Execution:
    """Completes or fails an execution the caller has locked and checked the lease of;
    `outcomes` were carried by the lease of `dispatch_id` (`recorded`: what they need read,
    when the caller read it). Returns the record as written. `reached`: the agent asked for
    this end, so a `pending` execution starts first; otherwise (every delivery failed) it
    fails without ever having started (§10.1). `state`: what a completion keeps for the
    executions that continue this one (§24.5)."""
    batch = EventBatch(execution, now)
    if reached:
        execution = mark_started(execution, batch)
    await apply_outcomes(
        tx,
        execution.id,
        dispatch_id,
        outcomes,
        batch,
        recorded=recorded,
        counting=False,
        execution=execution,
    )
    if status is ExecutionStatus.COMPLETED:
        done = transition(execution, status, now, output=output or "null")
        batch.execution(EventType.EXECUTION_COMPLETED, done, output=Raw(done.output or "null"))
        if state is not None:
            await tx.set_state(execution.id, state)
    else:
        done = transition(execution, status, now, failure_reason=reason)
        batch.execution(EventType.EXECUTION_FAILED, done, reason=reason)
    await tx.retire_dispatches(execution.id, now)
    return await flush(tx, done, batch)


def _same_spawn(earlier: Execution, origin: Origin) -> Execution:
    """A repeat that names a step must find that step's child: a key shared with an
    execution another step (or no step) started would leave it waiting on nothing."""
    if origin.spawned_by is not None and (
        (earlier.spawned_by_execution_id, earlier.spawned_by_step_id) != origin.spawned_by
    ):
        raise Conflict(
            f"idempotency key {origin.idempotency_key!r} names execution {earlier.id}, "
            "which is not a sub-agent of that step"
        )
    return earlier


async def check_spawn(
    tx: Transaction, parent_id: str, step_id: str, session: str | None
) -> Execution:
    """§25.2, under the parent's lock (taken here, after any session lock): the parent
    exists (`NotFound`) and is live (`Conflict`); the step is one of its own (else
    `ValidationFailed`) and is executing (`Conflict`); and the child's session is neither
    the parent's nor an ancestor's (`ValidationFailed`: a child waiting for its own
    ancestor's turn would wait for ever). Returns the parent."""
    await tx.take_lock(execution_lock(parent_id))
    parent = await tx.get_execution(parent_id)
    if parent.status.is_terminal:
        raise Conflict(f"parent execution {parent_id} is already {parent.status}")
    step = await tx.get_step(step_id)
    if step is None or step.execution_id != parent_id:
        raise ValidationFailed(
            f"validation error: spawned_by: step {step_id} is not a step of {parent_id}"
        )
    if step.status is not StepStatus.EXECUTING:
        raise Conflict(f"step {step_id} is {step.status}, not executing")
    if session is not None:
        ancestor: Execution | None = parent
        for _ in range(MAX_ANCESTORS):
            if ancestor is None:
                break
            if ancestor.session == session:
                raise ValidationFailed(
                    f"validation error: session {session!r} is an ancestor's: a sub-agent "
                    "cannot wait for its own parent's turn"
                )
            above = ancestor.spawned_by_execution_id
            ancestor = None if above is None else await _maybe(tx, above)
    return parent


async def _maybe_current(store: Store, execution_id: str) -> Execution | None:
    try:
        return await store.get_execution(execution_id)
    except NotFound:  # deleted by retention since it changed: nothing to show
        return None


async def _maybe(tx: Transaction, execution_id: str) -> Execution | None:
    try:
        return await tx.get_execution(execution_id)
    except NotFound:
        return None


async def _check_parent(tx: Transaction, agent_id: str, parent_id: str) -> None:
    """§24.2: an explicit parent exists (`NotFound`), is the same agent's and completed
    (`Conflict`). It is held until the transaction ends, so retention cannot delete it while
    its child is being recorded (the store's `hold_execution`)."""
    parent = await tx.hold_execution(parent_id)
    if parent.agent_id != agent_id:
        raise Conflict(f"parent execution {parent_id} belongs to another agent")
    if parent.status is not ExecutionStatus.COMPLETED:
        raise Conflict(f"parent execution {parent_id} is {parent.status}, not completed")


async def _expire_pending_approvals(tx: Transaction, execution_id: str, batch: EventBatch) -> None:
    for approval in await tx.list_pending_approvals(execution_id):
        await tx.update_approval(
            replace(
                approval,
                status=ApprovalStatus.EXPIRED,
                decided_at=batch.now,
                rationale="execution_cancelled",
            )
        )
        batch.approval(
            EventType.APPROVAL_EXPIRED,
            approval.id,
            approval.step_id,
            ApprovalStatus.EXPIRED,
            rationale="execution_cancelled",
        )
        step = await tx.get_step(approval.step_id)
        if step is not None and not step.status.is_terminal:
            denied = steps.finish(step, StepStatus.DENIED, batch.now, error=steps.CANCELLED_ERROR)
            await tx.update_step(denied)
            batch.step(EventType.STEP_DENIED, denied, error=steps.CANCELLED_ERROR)


async def _hold(
    wait: float,
    register: Callable[[], Wake],
    read: Callable[[Execution | None], Awaitable[tuple[T, bool]]],
    *,
    live: bool = False,
) -> T:
    """Our long poll: `read()` until it says it is done or `wait` seconds passed, looking
    again whenever the registered wake-up fires. The wake-up is registered before each read, so
    a commit landing in between is not missed; another replica's commits wake no one here, so
    it also looks again every `REPLICA_POLL_SECONDS`. A wake-up that carries the terminal
    record is handed to `read`, which need not read it again. `live`: the first read is
    known to find nothing done, so it is skipped."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    ended: Execution | None = None
    if wait <= 0:
        return (await read(None))[0]
    while True:
        woken = register()
        if live:
            live = False
        else:
            value, done = await read(ended)
            if done or deadline - loop.time() <= 0:
                return value
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(deadline - loop.time(), REPLICA_POLL_SECONDS)):
                await woken.wait()
        ended = woken.record if woken.is_set() else None


def _deadline(execution: Execution) -> str | None:
    return format_timestamp(execution.deadline_at) if execution.deadline_at else None


async def _stale_copy(tx: Transaction, seen: SeenRequest, now: datetime) -> bool:
    """Whether the request is a copy of one first accepted more than `COPY_GRACE` ago."""
    first = await tx.remember_request(seen.digest, now, seen.until)
    return first is not None and now - first > COPY_GRACE
