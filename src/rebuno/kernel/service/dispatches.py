"""Delivering dispatches (§12): claim due work, POST the signed webhook, record the outcome.

`DispatchLoop` claims only as many dispatches as it has idle delivery workers, so it never
holds work another replica could start sooner. It sleeps until woken (a dispatch enqueued in
this process, a NOTIFY from another replica, a worker finishing) or until the idle poll.
Must not import a concrete store backend, the API, or httpx: the deliverer is a protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime

from rebuno.kernel import metrics
from rebuno.kernel.domain.dispatch import (
    Deliverer,
    backoff,
    effective_lease,
    webhook_body,
)
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import mark_started
from rebuno.kernel.domain.records import Dispatch, Execution, Lease, replace
from rebuno.kernel.service.base import ServiceBase, flush, log
from rebuno.kernel.service.executions import DISPATCH_EXHAUSTED, finish_execution
from rebuno.kernel.store.base import ClaimedDispatch, Stale, Transaction, Unchanged
from rebuno.protocol.enums import DispatchStatus, ExecutionStatus
from rebuno.protocol.events import LEASE_EXPIRED, EventType
from rebuno.protocol.extensions import (
    EXECUTION_INPUT,
    MAX_CARRIED_INPUT,
    OFFERED,
    STEP_OCCURRENCES,
    STEP_RECORDS,
    carried,
)


def offered(
    claimed: ClaimedDispatch, step_records: bool, step_occurrences: bool = True
) -> tuple[str, ...]:
    """Our extensions this delivery may use. `step-records` lets the agent run steps before
    reporting them, so it is offered only where no step can have been recorded yet (the
    execution never started: §10.1 starts it with its first acknowledged delivery or step) and
    no policy has to decide any step. `step-occurrences` (when enabled) is offered with every
    delivery: an agent uses at most one of the two on a delivery (its own numbering of its
    submissions only stays in step with the kernel's when no step runs before it is
    submitted), so a durable agent numbers its steps on a first delivery too, and a batched
    one lets the kernel count."""
    offers: tuple[str, ...] = OFFERED
    if (
        step_records
        and claimed.execution_status is ExecutionStatus.PENDING
        and not claimed.agent.policy_bundle
        # A fork starts with recorded steps, and may carry a policy of its own (§26).
        and claimed.execution.forked_from is None
    ):
        offers = (*offers, STEP_RECORDS)
    if step_occurrences:
        offers = (*offers, STEP_OCCURRENCES)
    return offers


MAX_FAILURE_REASON = 500
"""Characters of a delivery failure's reason kept in its event."""


class DispatchUseCases(ServiceBase):
    async def claim(self, limit: int) -> list[ClaimedDispatch]:
        return metrics.claimed(
            await self.store.claim_dispatches(self.settings.replica_id, limit, self.clock())
        )

    async def deliver(self, claimed: ClaimedDispatch, deliverer: Deliverer) -> None:
        dispatch = claimed.dispatch
        if claimed.execution_status.is_terminal:
            metrics.dispatch_discarded()
            await self._discard(dispatch, _redelivery(claimed))
            return
        if dispatch.attempt > dispatch.max_attempts:
            metrics.dispatch_exhausted()
            await self._exhaust(dispatch)
            return
        # A pending execution has no step recorded yet, unless it is a fork: a fork starts
        # with the steps it copied (§26.2).
        if (
            claimed.execution_status is not ExecutionStatus.PENDING
            or claimed.execution.forked_from is not None
        ):
            await self._deliver(claimed, deliverer)
            return
        lease = Lease(dispatch.id, dispatch.attempt)
        self.shortcuts.past_history(lease)
        self.shortcuts.claimed_first(lease, claimed.execution, claimed.agent.policy_bundle)
        with self.shortcuts.acknowledging(dispatch.execution_id):
            await self._deliver(claimed, deliverer)

    async def _deliver(self, claimed: ClaimedDispatch, deliverer: Deliverer) -> None:
        dispatch = claimed.dispatch
        settings = self.settings
        lease = effective_lease(claimed.agent, settings.dispatch_lease_timeout)
        extensions = offered(claimed, settings.step_records, settings.step_occurrences)
        if claimed.reclaimed:
            log.info(
                "redelivering after an expired lease: execution_id=%s dispatch_id=%s attempt=%d",
                dispatch.execution_id,
                dispatch.id,
                dispatch.attempt,
            )
        carry = None
        text = claimed.execution.input
        # A character is at least a byte: a longer input is not encoded to find out.
        if len(text) <= MAX_CARRIED_INPUT and len(text.encode()) <= MAX_CARRIED_INPUT:
            # The status the agent would read: its acknowledgement starts a pending execution.
            status = claimed.execution_status
            if status is ExecutionStatus.PENDING:
                status = ExecutionStatus.RUNNING
            extensions = (*extensions, EXECUTION_INPUT)
            carry = carried(status.value, text)
        started = time.perf_counter()
        outcome = await deliverer.deliver(
            claimed.agent.webhook_url,
            claimed.agent.secret,
            dispatch.execution_id,
            webhook_body(dispatch, lease),
            settings.dispatch_timeout.total_seconds(),
            extensions=extensions,
            carried=carry,
        )
        metrics.delivery_attempted(outcome, time.perf_counter() - started)
        if outcome.ok:
            log.debug(
                "delivered: execution_id=%s dispatch_id=%s attempt=%d",
                dispatch.execution_id,
                dispatch.id,
                dispatch.attempt,
            )
            with self.shortcuts.recording_acknowledgement(dispatch.execution_id):
                if outcome.instance is None:
                    await self._record_ack(claimed)
                else:
                    # Side by side, not one after the other: on PostgreSQL the two statements
                    # overlap on two connections, on SQLite they share one commit. The
                    # instance stands for the attempt whether or not the acknowledgement's
                    # events commit.
                    record = self.store.set_dispatch_instance(
                        dispatch.id, dispatch.attempt, outcome.instance
                    )
                    await asyncio.gather(self._record_ack(claimed), record)
        else:
            log.warning(
                "delivery failed: execution_id=%s dispatch_id=%s attempt=%d: %s",
                dispatch.execution_id,
                dispatch.id,
                dispatch.attempt,
                outcome.detail,
            )
            await self._record_failure(dispatch, outcome.detail, _redelivery(claimed))

    async def _record_ack(self, claimed: ClaimedDispatch) -> None:
        """Tried first on the record the claim read, in one optimistic statement; when the
        execution changed since (the agent wrote first, say), the ordinary way."""
        dispatch, seen = claimed.dispatch, claimed.execution
        lease = Lease(dispatch.id, dispatch.attempt)
        if not seen.status.is_terminal:
            with contextlib.suppress(Stale):
                async with self.transaction(seen.id, Unchanged.on(seen)) as tx:
                    acked = await _acknowledge(tx, claimed, seen, self.clock())
                self.shortcuts.acknowledged(lease, seen.last_event_seq, acked)
                return
        async with self.transaction(dispatch.execution_id) as tx:
            execution = await tx.get_execution(dispatch.execution_id)
            if execution.status.is_terminal:
                return
            acked = await _acknowledge(tx, claimed, execution, self.clock())
        self.shortcuts.acknowledged(lease, execution.last_event_seq, acked)

    async def _record_failure(
        self, dispatch: Dispatch, reason: str, redelivery: str | None = None
    ) -> None:
        """`reason` goes into the `dispatch.failed` event (bounded), so the log says why."""
        async with self.transaction(dispatch.execution_id) as tx:
            execution = await tx.get_execution(dispatch.execution_id)
            if execution.status.is_terminal:
                return
            now = self.clock()
            batch = EventBatch(execution, now)
            batch.dispatch(
                EventType.DISPATCH_FAILED,
                dispatch,
                DispatchStatus.FAILED.value,
                reason=reason[:MAX_FAILURE_REASON] or "delivery failed",
                redelivery=redelivery,
            )
            execution = await flush(tx, execution, batch)
            if not await _still_owns(tx, dispatch):
                return
            if dispatch.attempt < dispatch.max_attempts:
                retry_at = now + backoff(
                    dispatch.attempt, self.settings.backoff_base, self.settings.backoff_max
                )
                await tx.update_dispatch(_requeued(dispatch, retry_at, now))
                return
            done = await _exhausted(tx, execution, now)
        self.ended(dispatch.execution_id)
        await self.after_end(done)

    async def _discard(self, dispatch: Dispatch, redelivery: str | None = None) -> None:
        async with self.transaction(dispatch.execution_id) as tx:
            if not await _still_owns(tx, dispatch):
                return
            execution = await tx.get_execution(dispatch.execution_id)
            now = self.clock()
            batch = EventBatch(execution, now)
            batch.dispatch(
                EventType.DISPATCH_DISCARDED,
                dispatch,
                DispatchStatus.EXHAUSTED.value,
                redelivery=redelivery,
            )
            await tx.update_dispatch(
                replace(
                    dispatch,
                    status=DispatchStatus.EXHAUSTED,
                    locked_by=None,
                    locked_at=None,
                    updated_at=now,
                )
            )
            await flush(tx, execution, batch)

    async def _exhaust(self, dispatch: Dispatch) -> None:
        """A re-claim past the attempt budget fails the run, but only with the dispatch's
        own lease: a run that parked or blocked meanwhile is left alone."""
        async with self.transaction(dispatch.execution_id) as tx:
            if not await _still_owns(tx, dispatch):
                return
            execution = await tx.get_execution(dispatch.execution_id)
            if execution.status.is_terminal:
                return
            done = await _exhausted(tx, execution, self.clock())
        self.ended(dispatch.execution_id)
        await self.after_end(done)


async def reclaim_expired_leases(kernel: ServiceBase) -> int:
    """Returns every expired lease to the queue and wakes the dispatch loop: the reaper's
    tick, and the second half of reclaiming the deliveries of a restarted agent instance."""
    count = await kernel.store.reclaim_expired(
        kernel.clock(), kernel.settings.dispatch_lease_timeout
    )
    metrics.leases_reclaimed(count)
    if count:
        log.info("returned %d expired dispatch leases to the queue", count)
        kernel.wake()
    return count


async def _still_owns(tx: Transaction, dispatch: Dispatch) -> bool:
    current = await tx.get_dispatch(dispatch.id)
    return (
        current is not None
        and current.status is DispatchStatus.IN_FLIGHT
        and current.attempt == dispatch.attempt
    )


async def _exhausted(tx: Transaction, execution: Execution, now: datetime) -> Execution:
    return await finish_execution(
        tx, execution, ExecutionStatus.FAILED, None, DISPATCH_EXHAUSTED, now, reached=False
    )


def _redelivery(claimed: ClaimedDispatch) -> str | None:
    """The `redelivery` member of the claim's dispatch event: set when the claim delivers the
    execution again because the previous attempt's lease was reclaimed."""
    return LEASE_EXPIRED if claimed.reclaimed else None


async def _acknowledge(
    tx: Transaction, claimed: ClaimedDispatch, execution: Execution, now: datetime
) -> Execution:
    """Records a delivery's 2xx answer; the first reached the agent, so a `pending`
    execution starts. Returns the record as written."""
    batch = EventBatch(execution, now)
    batch.dispatch(
        EventType.DISPATCH_ACKED, claimed.dispatch, "acked", redelivery=_redelivery(claimed)
    )
    started = mark_started(execution, batch)
    return await flush(tx, started, batch)


def _requeued(dispatch: Dispatch, retry_at: datetime, now: datetime) -> Dispatch:
    return replace(
        dispatch,
        status=DispatchStatus.FAILED,
        next_attempt_at=retry_at,
        locked_by=None,
        locked_at=None,
        updated_at=now,
    )


class DispatchLoop:
    """Claims and delivers with at most `concurrency` deliveries in flight."""

    def __init__(self, kernel: DispatchUseCases, deliverer: Deliverer) -> None:
        self._kernel = kernel
        self._deliverer = deliverer
        self._idle = kernel.settings.dispatch_concurrency
        self._poll = kernel.settings.dispatch_poll_interval.total_seconds()
        self._wakeup = asyncio.Event()
        self._workers: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        try:
            while True:
                # Cleared before the claim: a wake-up that arrives during it is not lost. A claim
                # takes every due dispatch it has room for, so without one there is nothing to
                # claim again until a wake-up (an enqueue, a worker freed at full capacity) or
                # the poll interval (a retry coming due).
                self._wakeup.clear()
                await self._claim()
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races the wake-up, and the loop would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll):
                        await self._wakeup.wait()
        finally:
            workers = list(self._workers)
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _claim(self) -> None:
        if self._idle <= 0:
            return
        try:
            batch = await self._kernel.claim(self._idle)
        except Exception:
            metrics.worker_failed("dispatch")
            log.exception("claiming dispatches failed; retrying after the idle poll")
            return
        for claimed in batch:
            self._idle -= 1
            metrics.delivery_started()
            worker = asyncio.create_task(
                self._deliver(claimed), name=f"deliver-{claimed.dispatch.id}"
            )
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)

    async def _deliver(self, claimed: ClaimedDispatch) -> None:
        try:
            await self._kernel.deliver(claimed, self._deliverer)
        except Exception:
            metrics.worker_failed("dispatch")
            # The claim stays in flight and the reaper returns it after the lease.
            log.exception(
                "recording delivery failed: execution_id=%s dispatch_id=%s",
                claimed.dispatch.execution_id,
                claimed.dispatch.id,
            )
        finally:
            metrics.delivery_finished()
            self._idle += 1
            if self._idle == 1:  # a claim may have found no room: look again now
                self._wakeup.set()
