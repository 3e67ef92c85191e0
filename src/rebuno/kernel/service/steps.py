"""Step use cases: submit (§8), complete and fail (§9), stream deltas (§16.1).

A submission is decided by `decision.submission.decide` whichever way it takes: a fast way
first (the unlocked replay read, `replay.py`; the followed run, `followed.py`), else the
locked script here, which reads under the execution's lock, records what the request
carries, chooses the occurrence (§7.3), reads what the verdict needs, decides and records.
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rebuno.kernel import metrics
from rebuno.kernel.decision.outcome import Reported, complete
from rebuno.kernel.decision.submission import (
    NO_FACTS,
    Facts,
    LeaseView,
    Plan,
    Slot,
    StepIds,
    StepSubmission,
    Submitted,
    admit,
    decide,
    has_budget,
    has_rate_limit,
    may_park,
    needs_verdict,
)
from rebuno.kernel.domain.decision import Carried, StepDecision, StepOutcome, StepRequest
from rebuno.kernel.domain.dispatch import same_attempt
from rebuno.kernel.domain.errors import Conflict, NotFound, lease_superseded
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import check_owner, mark_started
from rebuno.kernel.domain.records import Execution, Lease, RawJson, replace
from rebuno.kernel.domain.resource import NO_CAPTURES, Captures
from rebuno.kernel.policy.engine import PolicyResult
from rebuno.kernel.service import followed
from rebuno.kernel.service.context import Context, flush
from rebuno.kernel.service.recording import (
    Carrying,
    apply_plan,
    read_carried,
    record_carried,
    settle,
    step_key,
)
from rebuno.kernel.service.replay import replay_unlocked
from rebuno.kernel.store.base import StepKey, Submission, Transaction
from rebuno.kernel.stream.bus import Delta
from rebuno.protocol.enums import Idempotency, StepStatus
from rebuno.protocol.events import EventType


class StepUseCases(Context):
    async def submit_step(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        request: StepRequest,
        outcomes: Sequence[Carried] = (),
        occurrence: int | None = None,
    ) -> StepDecision:
        """§8: a fast way, else the locked script. `occurrence`: the agent's own number for
        this submission (`step-occurrences`), which replaces the dispatch's counter; None to
        count as §7.3 does."""
        ids = StepIds(execution_id, request)
        submission = StepSubmission(
            execution_id, agent_id, lease, request, outcomes, occurrence, ids
        )
        decided = await replay_unlocked(self, submission)
        if decided is None:
            decided = await followed.submit_followed(self, submission)
        if decided is None:
            decided = await self._submit_locked(submission)
        return decided

    async def _submit_locked(self, submission: StepSubmission) -> StepDecision:
        """The locked script: everything read under the execution's lock, in one
        transaction with its writes."""
        lease, request = submission.lease, submission.request
        async with self.transaction(submission.execution_id) as tx:
            now = self.clock()
            loaded = await _load(tx, submission, now)
            refused = admit(
                loaded.execution, submission.agent_id, LeaseView(lease, loaded.lease_live)
            )
            if refused is not None:
                metrics.step_decided(request.kind, refused.decision, recorded=False)
                return refused
            batch = EventBatch(loaded.execution, now)
            submitted = await self._read(tx, submission, loaded, batch)
            plan = decide(submitted, batch, self.rules)
            key = step_key(request)
            await apply_plan(self, tx, plan, batch, lease, submitted.slot, key)
            woke = any(e.type == EventType.DISPATCH_QUEUED for e in batch.events)
            written = await flush(tx, plan.execution, batch)
        if woke:
            self.wake()
        followed.after_locked(
            self, submission, loaded.execution, plan, written, loaded.policy_bundle
        )
        return _answered(submitted, plan, policy_free=not loaded.policy_bundle)

    async def _read(
        self, tx: Transaction, submission: StepSubmission, loaded: Submission, batch: EventBatch
    ) -> Submitted:
        """What deciding reads under the lock, once the gate admitted the submission: the
        execution started (it is agent contact), the outcomes the request carries recorded,
        the occurrence chosen, and for a new step the verdict and its facts."""
        execution = mark_started(loaded.execution, batch)
        lease, request = submission.lease, submission.request
        read = await read_carried(
            tx, execution.id, lease.dispatch_id, submission.outcomes, loaded.completing
        )
        carrying = Carrying(lease.dispatch_id, submission.outcomes, read)
        reported = await record_carried(tx, execution, carrying, batch)
        slot = await _resolve_slot(tx, loaded, submission, reported)
        submitted = Submitted(execution, submission.agent_id, request, slot, LeaseView(lease, True))
        if execution.has_resources:
            resources = tuple(await tx.list_resources(execution.id))
            submitted = replace(submitted, resources=resources)
        if not needs_verdict(execution, slot):
            return submitted
        verdict = self.verdict(execution, loaded.policy_bundle, request)
        facts = await _facts(tx, execution, step_key(request), request, verdict, batch.now)
        return replace(submitted, verdict=verdict, facts=facts)

    async def complete_step(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease,
        result: RawJson,
        captures: Captures = NO_CAPTURES,
    ) -> StepDecision:
        reported = Reported(agent_id, step_id, lease, result=result)
        return await self._report(execution_id, reported, captures)

    async def fail_step(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease,
        error: RawJson,
        captures: Captures = NO_CAPTURES,
    ) -> StepDecision:
        reported = Reported(agent_id, step_id, lease, error=error)
        return await self._report(execution_id, reported, captures)

    async def _report(
        self, execution_id: str, reported: Reported, captures: Captures
    ) -> StepDecision:
        """§9, decided by `outcome.complete`. An outcome recorded settles the step and takes
        the captures it carries (§33.6), which cover the boundary of its own event; a refused
        capture never changes the answer."""
        async with self.transaction(execution_id) as tx:
            loaded = await tx.load_completion(
                execution_id, reported.step_id, reported.lease.dispatch_id
            )
            batch = EventBatch(loaded.execution, self.clock())
            answer, done = complete(loaded.execution, loaded.step, loaded.dispatch, reported, batch)
            if done is None:
                return answer
            await tx.update_step(done)
            await settle(tx, loaded.execution, [done], captures, batch.last_seq, batch)
            await flush(tx, loaded.execution, batch)
        return answer

    async def publish_delta(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease | None,
        seq: int,
        data: str,
    ) -> None:
        """Ephemeral: checked against recorded state, published best-effort, never stored.
        The execution, the step and the lease's dispatch come from one read."""
        async with self.transaction(execution_id) as tx:
            loaded = await tx.load_completion(
                execution_id, step_id, lease.dispatch_id if lease else ""
            )
        check_owner(loaded.execution, agent_id)
        step = loaded.step
        if step is None:
            raise NotFound(f"step {step_id} not found in execution {execution_id}")
        # The weak check (§16.1), and only when the agent sent a lease.
        if lease is not None and not same_attempt(loaded.dispatch, lease):
            raise lease_superseded(execution_id, lease)
        if step.status is not StepStatus.EXECUTING:
            raise Conflict(f"step {step_id} is {step.status}, not executing")
        self.bus.publish(execution_id, Delta(step_id=step_id, seq=seq, data=data))


async def _load(tx: Transaction, submission: StepSubmission, now: datetime) -> Submission:
    """The submission's one read under the lock; the carried completions' steps with it."""
    carried = [o.step_id for o in submission.outcomes if isinstance(o, StepOutcome)]
    key = step_key(submission.request)
    return await tx.load_submission(
        submission.execution_id, submission.lease, key, submission.step_ids, now, carried
    )


def _answered(submitted: Submitted, plan: Plan, *, policy_free: bool) -> StepDecision:
    """The answer, counted; an agent without a policy keeps its `step-records` grant."""
    request = submitted.request
    metrics.step_decided(request.kind, plan.decision.decision, submitted.slot.recorded is not None)
    if submitted.verdict is not None:
        metrics.new_step_decided(plan.decision)
    if policy_free and submitted.verdict is not None:
        return replace(plan.decision, policy_free=True)
    return plan.decision


async def _resolve_slot(
    tx: Transaction,
    loaded: Submission,
    submission: StepSubmission,
    reported: dict[StepKey, int],
) -> Slot:
    """The one place a submission's occurrence is chosen (§7.3): the agent's own number
    (`step-occurrences`), else past the steps of its key the same request reported, else the
    dispatch's counter as loaded. The step recorded there is read again only when the
    occurrence is not the loaded one; a step awaiting approval comes with its approval."""
    key = step_key(submission.request)
    if submission.occurrence is not None:
        chosen, counted = submission.occurrence, False
    elif key in reported:
        chosen, counted = reported[key] + 1, True
    else:
        chosen, counted = loaded.occurrence, True
    step_id = submission.step_ids(chosen)
    recorded = loaded.existing if chosen == loaded.occurrence else await tx.get_step(step_id)
    approval_id = None
    if recorded is not None and recorded.status is StepStatus.AWAITING_APPROVAL:
        approval = await tx.pending_approval_for_step(step_id)
        approval_id = approval.id if approval else None
    return Slot(chosen, step_id, recorded, counted, approval_id)


async def _facts(
    tx: Transaction,
    execution: Execution,
    key: StepKey,
    request: StepRequest,
    verdict: PolicyResult,
    now: datetime,
) -> Facts:
    """What deciding a new step reads, and only what its request and verdict need: an
    indeterminate earlier attempt (`at_most_once`), a rate token (taken here when one is
    free, §14.7), the tokens spent (§14.9)."""
    if request.idempotency is Idempotency.AT_MOST_ONCE and await tx.has_indeterminate_step(
        execution.id, key
    ):
        return Facts(indeterminate=True)
    limit = verdict.rate_limit
    if limit is not None and has_rate_limit(verdict):
        bucket = _bucket_key(verdict.rule_id, limit.per_what, execution)
        wait = await tx.take_rate_token(bucket, limit.max_calls, limit.window.total_seconds(), now)
        if wait is not None:
            before = may_park(verdict, wait) and await tx.has_event_of_type(
                execution.id, EventType.STEP_RATE_LIMITED
            )
            return Facts(rate_wait=wait, rate_limited_before=before)
    if has_budget(verdict):
        return Facts(spent_tokens=await tx.spent_tokens(execution.id))
    return NO_FACTS


def _bucket_key(rule_id: str, per_what: str, execution: Execution) -> str:
    if per_what == "agent":
        return f"{rule_id}:agent:{execution.agent_id}"
    if per_what == "global":
        return f"{rule_id}:global"
    return f"{rule_id}:exec:{execution.id}"
