"""Dispatch use cases (§12): claim due work, deliver the signed webhook through the deliverer,
and record the outcome: the acknowledgement (a fast way first, `followed.py`, else the locked
script), a failure and its retry, a discard, an exhaustion.

The loop that claims and delivers lives with the replica's other background loops
(`kernel/background.py`). Must not import a concrete store backend, the API, httpx or another
use-case module: the deliverer is a protocol.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import datetime

from rebuno.kernel import metrics
from rebuno.kernel.decision.ending import EXHAUSTED
from rebuno.kernel.domain.dispatch import (
    Deliverer,
    DeliveryOutcome,
    Webhook,
    backoff,
    effective_lease,
    webhook_body,
)
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Dispatch, Lease, replace
from rebuno.kernel.service import follow_ups
from rebuno.kernel.service.context import Context, flush, log
from rebuno.kernel.service.ending import finish_execution
from rebuno.kernel.service.followed import acknowledge_followed, acknowledged
from rebuno.kernel.service.starting import acknowledge, redelivery
from rebuno.kernel.store.base import ClaimedDispatch, Transaction
from rebuno.protocol.enums import DispatchStatus, ExecutionStatus
from rebuno.protocol.events import EventType
from rebuno.protocol.extensions import (
    EXECUTION_INPUT,
    MAX_CARRIED_INPUT,
    OFFERED,
    STEP_OCCURRENCES,
    STEP_RECORDS,
    carried,
)

MAX_FAILURE_REASON = 500
"""Characters of a delivery failure's reason kept in its event."""


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
        and claimed.execution.origin.forked_from is None
    ):
        offers = (*offers, STEP_RECORDS)
    if step_occurrences:
        offers = (*offers, STEP_OCCURRENCES)
    return offers


def _carried(claimed: ClaimedDispatch) -> str | None:
    """The `Rebuno-Execution` value (`execution-input`) of this delivery, when its input is
    short enough to carry, with the status the agent would read: its acknowledgement starts a
    pending execution."""
    text = claimed.execution.origin.input
    # A character is at least a byte: a longer input is not encoded to find out.
    if len(text) > MAX_CARRIED_INPUT or len(text.encode()) > MAX_CARRIED_INPUT:
        return None
    status = claimed.execution_status
    if status is ExecutionStatus.PENDING:
        status = ExecutionStatus.RUNNING
    return carried(status.value, text)


class DispatchUseCases(Context):
    async def claim(self, limit: int) -> list[ClaimedDispatch]:
        return metrics.claimed(
            await self.store.claim_dispatches(self.settings.replica_id, limit, self.clock())
        )

    async def deliver(self, claimed: ClaimedDispatch, deliverer: Deliverer) -> None:
        dispatch = claimed.dispatch
        if claimed.execution_status.is_terminal:
            metrics.dispatch_discarded()
            await self._discard(claimed)
            return
        if dispatch.attempt > dispatch.max_attempts:
            metrics.dispatch_exhausted()
            await self._exhaust(dispatch)
            return
        # A pending execution has no step recorded yet, unless it is a fork: a fork starts
        # with the steps it copied (§26.2).
        if (
            claimed.execution_status is not ExecutionStatus.PENDING
            or claimed.execution.origin.forked_from is not None
        ):
            await self._deliver(claimed, deliverer)
            return
        lease = Lease(dispatch.id, dispatch.attempt)
        self.shortcuts.past_history(lease)
        self.shortcuts.claimed_first(lease, claimed.execution, claimed.agent.policy_bundle)
        with self.shortcuts.acknowledging(dispatch.execution_id):
            await self._deliver(claimed, deliverer)

    async def _deliver(self, claimed: ClaimedDispatch, deliverer: Deliverer) -> None:
        if claimed.reclaimed:
            log.info(
                "redelivering after an expired lease: execution_id=%s dispatch_id=%s attempt=%d",
                claimed.dispatch.execution_id,
                claimed.dispatch.id,
                claimed.dispatch.attempt,
            )
        started = time.perf_counter()
        outcome = await self._post(claimed, deliverer)
        metrics.delivery_attempted(outcome, time.perf_counter() - started)
        if outcome.ok:
            await self._acknowledged(claimed, outcome)
            return
        dispatch = claimed.dispatch
        log.warning(
            "delivery failed: execution_id=%s dispatch_id=%s attempt=%d: %s",
            dispatch.execution_id,
            dispatch.id,
            dispatch.attempt,
            outcome.detail,
        )
        await self._record_failure(claimed, outcome.detail)

    async def _post(self, claimed: ClaimedDispatch, deliverer: Deliverer) -> DeliveryOutcome:
        """The signed webhook POST (§6), with the extensions this delivery offers."""
        settings = self.settings
        dispatch = claimed.dispatch
        extensions = offered(claimed, settings.step_records, settings.step_occurrences)
        carry = _carried(claimed)
        if carry is not None:
            extensions = (*extensions, EXECUTION_INPUT)
        lease = effective_lease(claimed.agent, settings.dispatch_lease_timeout)
        webhook = Webhook(
            url=claimed.agent.webhook_url,
            secret=claimed.agent.secret,
            execution_id=dispatch.execution_id,
            body=webhook_body(dispatch, lease),
            timeout_seconds=settings.dispatch_timeout.total_seconds(),
            extensions=extensions,
            carried=carry,
        )
        return await deliverer.deliver(webhook)

    async def _acknowledged(self, claimed: ClaimedDispatch, outcome: DeliveryOutcome) -> None:
        dispatch = claimed.dispatch
        log.debug(
            "delivered: execution_id=%s dispatch_id=%s attempt=%d",
            dispatch.execution_id,
            dispatch.id,
            dispatch.attempt,
        )
        with self.shortcuts.recording_acknowledgement(dispatch.execution_id):
            if outcome.instance is None:
                await self._record_ack(claimed)
                return
            # Side by side, not one after the other: on PostgreSQL the two statements
            # overlap on two connections, on SQLite they share one commit. The instance
            # stands for the attempt whether or not the acknowledgement's events commit.
            record = self.store.set_dispatch_instance(
                dispatch.id, dispatch.attempt, outcome.instance
            )
            await asyncio.gather(self._record_ack(claimed), record)

    async def _record_ack(self, claimed: ClaimedDispatch) -> None:
        """The fast way first, on the record the claim read; else the locked script."""
        if await acknowledge_followed(self, claimed):
            return
        execution_id = claimed.dispatch.execution_id
        async with self.transaction(execution_id) as tx:
            execution = await tx.get_execution(execution_id)
            if execution.status.is_terminal:
                return
            acked = await acknowledge(tx, claimed, execution, self.clock())
        acknowledged(self, claimed, execution.last_event_seq, acked)

    async def _record_failure(self, claimed: ClaimedDispatch, reason: str) -> None:
        """`reason` goes into the `dispatch.failed` event (bounded), so the log says why; the
        dispatch is tried again after its backoff, or the run fails once its attempts are
        spent."""
        dispatch = claimed.dispatch
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
                redelivery=redelivery(claimed),
            )
            execution = await flush(tx, execution, batch)
            if not await _still_owns(tx, dispatch):
                return
            if dispatch.attempt < dispatch.max_attempts:
                await tx.update_dispatch(self._requeued(dispatch, now))
                return
            done = await finish_execution(tx, execution, EXHAUSTED, now)
        await follow_ups.ended(self, done)

    def _requeued(self, dispatch: Dispatch, now: datetime) -> Dispatch:
        settings = self.settings
        delay = backoff(
            dispatch.attempt, settings.backoff_base, settings.backoff_max, random.uniform
        )
        retry_at = now + delay
        return replace(
            dispatch,
            status=DispatchStatus.FAILED,
            next_attempt_at=retry_at,
            locked_by=None,
            locked_at=None,
            updated_at=now,
        )

    async def _discard(self, claimed: ClaimedDispatch) -> None:
        dispatch = claimed.dispatch
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
                redelivery=redelivery(claimed),
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
            done = await finish_execution(tx, execution, EXHAUSTED, self.clock())
        await follow_ups.ended(self, done)


async def _still_owns(tx: Transaction, dispatch: Dispatch) -> bool:
    current = await tx.get_dispatch(dispatch.id)
    return (
        current is not None
        and current.status is DispatchStatus.IN_FLIGHT
        and current.attempt == dispatch.attempt
    )
