"""Execution use cases: create, read, cancel, heartbeat, and the agent's complete / fail.

Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import Carried, StepRecord
from rebuno.kernel.domain.errors import ExecutionTerminal, NotFound, lease_superseded
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.execution import check_owner, mark_started, transition
from rebuno.kernel.domain.records import Event, Execution, Lease, RawJson, SeenRequest, Step
from rebuno.kernel.service.base import ServiceBase, Wake, flush, new_id
from rebuno.kernel.service.steps import apply_outcomes, wanted_by
from rebuno.kernel.store.base import (
    ExecutionFilter,
    Outcomes,
    Page,
    Stale,
    Transaction,
    Unchanged,
)
from rebuno.protocol.enums import ApprovalStatus, ExecutionStatus, StepStatus
from rebuno.protocol.events import EventType
from rebuno.protocol.times import format_timestamp

T = TypeVar("T")
CLIENT_CANCELLED = "client_cancelled"
REPLICA_POLL_SECONDS = 0.25
DEADLINE_EXCEEDED = "deadline_exceeded"
DISPATCH_EXHAUSTED = "dispatch_exhausted"
COPY_GRACE = timedelta(seconds=10)
"""How long after its first sighting a copy of a heartbeat still renews the lease (§2.3): the
timestamp is whole seconds, so an agent beating faster than once a second sends copies, and a
busy kernel may serve the last of them some seconds after the first. A replay gains at most
this much lease."""


class ExecutionUseCases(ServiceBase):
    async def create_execution(
        self, agent_id: str, input: RawJson, agent_version: str | None
    ) -> Execution:
        async with self.transaction() as tx:
            now = self.clock()
            deadline = self.settings.deadline_timeout
            execution = Execution(
                id=new_id(),
                agent_id=agent_id,
                agent_version=agent_version or None,
                input=input,
                status=ExecutionStatus.PENDING,
                output=None,
                failure_reason=None,
                created_at=now,
                updated_at=now,
                deadline_at=now + deadline if deadline else None,
                last_event_seq=0,
            )
            batch = EventBatch(execution, now)
            batch.execution(
                EventType.EXECUTION_CREATED, execution, deadline_at=_deadline(execution)
            )
            await tx.insert_execution(execution)
            await self.enqueue(tx, batch, self.new_dispatch(execution.id, now))
            await flush(tx, execution, batch)
        self.shortcuts.created(execution.id)
        self.wake()
        return replace(execution, last_event_seq=batch.last_seq)

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
            for step in await tx.list_steps_with_status(execution_id, StepStatus.EXECUTING):
                done = steps.finish(
                    step, StepStatus.CANCELLED, batch.now, error=steps.CANCELLED_ERROR
                )
                await tx.update_step(done)
                batch.step(EventType.STEP_CANCELLED, done, error=steps.CANCELLED_ERROR)
            await tx.retire_dispatches(execution_id, batch.now)
            await flush(tx, cancelled, batch)
        self.ended(execution_id)

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
                tx, execution_id, lease.dispatch_id, outcomes, batch, recorded=recorded
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
    ) -> None:
        await self._finish(
            execution_id, agent_id, lease, ExecutionStatus.COMPLETED, output, "", outcomes
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
            execution_id, agent_id, lease, ExecutionStatus.FAILED, None, reason, outcomes
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
    ) -> None:
        """Terminal is checked before the lease (§5.2), then the strong lease check. A
        refusal rolls the transaction back, the lease's renewal with it. The end of a first
        run acknowledged here is tried optimistically first (see `_finish_first_run`)."""
        await self.shortcuts.wait_acknowledged(execution_id)
        acked = self.shortcuts.take_first_run(execution_id, lease)
        if acked is not None:
            done = await self._finish_first_run(
                acked, agent_id, lease, status, output, reason, outcomes
            )
            if done is not None:
                self.ended(execution_id, done)
                return
        async with self.transaction(execution_id) as tx:
            now = self.clock()
            locked = await tx.lock_execution(execution_id, lease, now, wanted_by(outcomes))
            execution = locked.execution
            check_owner(execution, agent_id)
            if execution.status.is_terminal:
                raise ExecutionTerminal(f"execution {execution_id} is already {execution.status}")
            if not locked.lease_live:
                raise lease_superseded(execution_id, lease)
            done = await finish_execution(
                tx,
                execution,
                status,
                output,
                reason,
                now,
                outcomes,
                lease.dispatch_id,
                locked.outcomes,
            )
        self.ended(execution_id, done)

    async def _finish_first_run(
        self,
        acked: Execution,
        agent_id: str | None,
        lease: Lease,
        status: ExecutionStatus,
        output: RawJson | None,
        reason: str,
        outcomes: Sequence[Carried],
    ) -> Execution | None:
        """Ends a first run on the record its acknowledgement wrote, in one statement that
        applies only while nothing changed since: the record is the execution's, the lease
        is live, and no step exists yet (none before a first run; any since would have moved
        the record or used an occurrence counter), so the reports it carries take their
        first occurrences. Returns the record written, or None when something changed (or
        the request carries completions of submitted steps), for the ordinary way."""
        if any(not isinstance(outcome, StepRecord) for outcome in outcomes):
            return None
        check_owner(acked, agent_id)
        now = self.clock()
        none_yet = Outcomes(consumed={}, steps=[])
        try:
            async with self.transaction(
                acked.id, Unchanged(acked.last_event_seq, lease, now)
            ) as tx:
                done = await finish_execution(
                    tx, acked, status, output, reason, now, outcomes, lease.dispatch_id, none_yet
                )
        except Stale:
            return None
        return done


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
) -> Execution:
    """Completes or fails an execution the caller has locked and checked the lease of;
    `outcomes` were carried by the lease of `dispatch_id` (`recorded`: what they need read,
    when the caller read it). Returns the record as written. `reached`: the agent asked for
    this end, so a `pending` execution starts first; otherwise (every delivery failed) it
    fails without ever having started (§10.1)."""
    batch = EventBatch(execution, now)
    if reached:
        execution = mark_started(execution, batch)
    await apply_outcomes(
        tx, execution.id, dispatch_id, outcomes, batch, recorded=recorded, counting=False
    )
    if status is ExecutionStatus.COMPLETED:
        done = transition(execution, status, now, output=output or "null")
        batch.execution(EventType.EXECUTION_COMPLETED, done, output=Raw(done.output or "null"))
    else:
        done = transition(execution, status, now, failure_reason=reason)
        batch.execution(EventType.EXECUTION_FAILED, done, reason=reason)
    await tx.retire_dispatches(execution.id, now)
    await flush(tx, done, batch)
    return replace(done, last_event_seq=batch.last_seq)


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
