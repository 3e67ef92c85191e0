"""Step use cases: submit (§8), complete and fail (§9), stream deltas (§16.1).

`submit_step` is split along its decisions: load under the lock, decide a recorded step
(R1-R6), or decide a new one (N0-N7: indeterminate retry, policy, rate limit, budget, record).
Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from functools import cache, partial

from rebuno.kernel import metrics
from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import (
    Carried,
    StepDecision,
    StepOutcome,
    StepRecord,
    StepRequest,
)
from rebuno.kernel.domain.errors import Conflict, NotFound, ValidationFailed
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import check_owner, transition
from rebuno.kernel.domain.identity import step_id as compute_step_id
from rebuno.kernel.domain.ratelimit import park_wait
from rebuno.kernel.domain.records import Execution, Lease, RawJson, Step
from rebuno.kernel.domain.usage import extract_usage
from rebuno.kernel.policy.engine import PERMISSIVE, PolicyResult, bundle_error
from rebuno.kernel.service.approvals import create_approval
from rebuno.kernel.service.base import ServiceBase, flush, log, mark_started, superseded
from rebuno.kernel.store.base import (
    NOTHING_WANTED,
    Outcomes,
    StepIdFn,
    StepKey,
    Submission,
    Transaction,
    Wanted,
)
from rebuno.kernel.stream.bus import Delta
from rebuno.protocol.enums import (
    COUNTED_DECISIONS,
    Decision,
    DispatchStatus,
    ExecutionStatus,
    Idempotency,
    PolicyAction,
    StepKind,
    StepStatus,
)
from rebuno.protocol.events import EventType

# Recorded outcomes a submission replays; no later write changes them.
_REPLAYED = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED})
_SHORTEST_OWN_LEASE = timedelta(seconds=10)

BUDGET_EXCEEDED = "execution_token_budget_exceeded"
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"


class StepUseCases(ServiceBase):
    async def submit_step(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        request: StepRequest,
        outcomes: Sequence[Carried] = (),
        occurrence: int | None = None,
    ) -> StepDecision:
        """`occurrence`: the agent's own number for this submission (`step-occurrences`),
        which replaces the dispatch's counter; None to count as §7.3 does."""
        key = _key(request)
        # Cached: a store that looks the step up by id and this use case ask for the same one.
        step_id_for = cache(
            partial(
                compute_step_id,
                execution_id,
                request.kind.value,
                request.target,
                request.args_hash,
            )
        )
        if occurrence is not None and not outcomes and lease not in self.past_history:
            replayed = await self._replay_unlocked(
                execution_id, agent_id, lease, step_id_for(occurrence)
            )
            if replayed is not None:
                metrics.step_decided(request.kind, Decision.REPLAY)
                return replayed
        woke = False
        async with self.transaction(execution_id) as tx:
            now = self.clock()
            carried = [o.step_id for o in outcomes if isinstance(o, StepOutcome)]
            sub = await tx.load_submission(execution_id, lease, key, step_id_for, now, carried)
            execution = sub.execution
            check_owner(execution, agent_id)
            if execution.status.is_terminal:
                metrics.step_decided(request.kind, Decision.EXECUTION_TERMINAL)
                return StepDecision(Decision.EXECUTION_TERMINAL)
            if not sub.lease_live:
                raise superseded(execution_id, lease)
            batch = EventBatch(execution, now)
            execution = mark_started(execution, batch)
            reported = await apply_outcomes(
                tx, execution_id, lease.dispatch_id, outcomes, batch, sub.completing
            )
            if occurrence is not None:
                sub = await _at_occurrence(tx, sub, execution, occurrence, step_id_for)
            elif key in reported:
                sub = await _at_occurrence(tx, sub, execution, reported[key] + 1, step_id_for)
            step_id = step_id_for(sub.occurrence)
            if sub.existing is not None:
                decision = await self._decide_recorded(tx, sub.existing, request, batch)
            else:
                decision, execution = await self._decide_new(
                    tx, execution, sub.policy_bundle, step_id, sub.occurrence, request, batch
                )
                if not sub.policy_bundle:
                    decision = replace(decision, policy_free=True)
            if decision.step_id is not None and (
                decision.decision in COUNTED_DECISIONS or decision.approval_id is not None
            ):
                await tx.set_occurrence(lease.dispatch_id, key, sub.occurrence)
            woke = any(e.type == EventType.DISPATCH_QUEUED for e in batch.events)
            await flush(tx, execution, batch)
        if woke:
            self.wake()
        metrics.step_decided(request.kind, decision.decision)
        return decision

    async def _replay_unlocked(
        self, execution_id: str, agent_id: str, lease: Lease, step_id: str
    ) -> StepDecision | None:
        """Rows R1 and R2 from one committed read, without the lock or a transaction: a step
        that succeeded or failed never changes again, and the answer writes nothing but the
        occurrence counter that `step-occurrences` makes unneeded. None when anything else
        could be the answer (the step is not finished, the execution is not running, the
        lease is not live) or the lease is due for renewal: the ordinary way decides those.
        A step not recorded at all ends the replay of this delivery attempt: its later
        submissions skip this read."""
        loaded = await self.store.load_completion(execution_id, step_id, lease.dispatch_id)
        execution, step, dispatch = loaded.execution, loaded.step, loaded.dispatch
        check_owner(execution, agent_id)
        if step is None:
            self.past_recorded_history(lease)
            return None
        if (
            step.status not in _REPLAYED
            or execution.status is not ExecutionStatus.RUNNING
            or dispatch is None
            or dispatch.status is not DispatchStatus.IN_FLIGHT
            or dispatch.attempt != lease.attempt
            or dispatch.locked_at is None
            or self.clock() - dispatch.locked_at >= self._renewal_due
        ):
            return None
        if step.status is StepStatus.SUCCEEDED:
            return StepDecision(Decision.REPLAY, step.step_id, result=step.result or "null")
        return StepDecision(Decision.REPLAY, step.step_id, error=step.error or "{}")

    @property
    def _renewal_due(self) -> timedelta:
        """A third of the shortest lease period (§12.3: an agent's own is at least 10 s)."""
        return min(self.settings.dispatch_lease_timeout, _SHORTEST_OWN_LEASE) / 3

    async def _decide_recorded(
        self, tx: Transaction, step: Step, request: StepRequest, batch: EventBatch
    ) -> StepDecision:
        """Rows R1-R6: policy is never consulted for a recorded step."""
        match step.status:
            case StepStatus.SUCCEEDED:
                return StepDecision(Decision.REPLAY, step.step_id, result=step.result or "null")
            case StepStatus.FAILED | StepStatus.CANCELLED:
                return StepDecision(Decision.REPLAY, step.step_id, error=step.error or "{}")
            case StepStatus.AWAITING_APPROVAL:
                approval = await tx.pending_approval_for_step(step.step_id)
                return StepDecision(
                    Decision.BLOCKED, step.step_id, approval_id=approval.id if approval else None
                )
            case StepStatus.ALLOWED | StepStatus.PROPOSED:
                started = steps.start(step, batch.now)
                await tx.update_step(started)
                batch.step(EventType.STEP_EXECUTING, started)
                return StepDecision(Decision.PROCEED, step.step_id)
            case StepStatus.EXECUTING:
                return await self._decide_orphan(tx, step, request, batch)
            case _:
                reason, rule_id = steps.error_reason(step.error)
                return StepDecision(
                    Decision.DENIED,
                    step.step_id,
                    reason=reason or "policy_denied",
                    rule_id=rule_id or None,
                )

    async def _decide_orphan(
        self, tx: Transaction, step: Step, request: StepRequest, batch: EventBatch
    ) -> StepDecision:
        """An effect that started and never finished (§13): the idempotency submitted now
        decides whether it may run again."""
        if request.idempotency is Idempotency.SAFE_TO_RETRY:
            return StepDecision(Decision.PROCEED, step.step_id)
        failed = steps.finish(step, StepStatus.FAILED, batch.now, error=steps.INDETERMINATE_ERROR)
        await tx.update_step(failed)
        batch.step(EventType.STEP_FAILED, failed, error=failed.error)
        return StepDecision(Decision.REPLAY, step.step_id, error=steps.INDETERMINATE_ERROR)

    async def _decide_new(
        self,
        tx: Transaction,
        execution: Execution,
        policy_bundle: str | None,
        step_id: str,
        occurrence: int,
        request: StepRequest,
        batch: EventBatch,
    ) -> tuple[StepDecision, Execution]:
        if execution.status is ExecutionStatus.BLOCKED:
            return StepDecision(Decision.EXECUTION_BLOCKED), execution
        step = _new_step(execution.id, step_id, occurrence, request, batch)
        key = _key(request)
        if request.idempotency is Idempotency.AT_MOST_ONCE and await tx.has_indeterminate_step(
            execution.id, key
        ):
            result = PolicyResult(
                PolicyAction.DENY, steps.INDETERMINATE_RETRY_REASON, steps.INDETERMINATE_RETRY_RULE
            )
            return await self._record_denied(tx, step, result, batch), execution
        result = self._evaluate_policy(execution, policy_bundle, request)
        if result.rate_limit is not None and result.rate_limit.max_calls > 0:
            limited = await self._check_rate_limit(tx, execution, step, result, batch)
            if limited is not None:
                return limited, execution
        result = await self._apply_budget(tx, execution, result)
        match result.action:
            case PolicyAction.ALLOW:
                return await self._record_allowed(tx, step, result, batch), execution
            case PolicyAction.DENY:
                return await self._record_denied(tx, step, result, batch), execution
            case PolicyAction.REQUIRE_APPROVAL:
                return await self._record_approval(tx, execution, step, result, batch)

    def _evaluate_policy(
        self, execution: Execution, policy_bundle: str | None, request: StepRequest
    ) -> PolicyResult:
        """Fail closed: a stored bundle that no longer compiles denies rather than allows."""
        if not policy_bundle:
            return PERMISSIVE
        try:
            bundle = self.bundles.get(policy_bundle)
        except ValidationFailed:
            log.exception("stored policy bundle of agent %s no longer compiles", execution.agent_id)
            return bundle_error("policy_bundle_invalid")
        return metrics.evaluate_policy(
            bundle, execution.agent_id, request.kind, request.target, request.args
        )

    async def _check_rate_limit(
        self,
        tx: Transaction,
        execution: Execution,
        step: Step,
        result: PolicyResult,
        batch: EventBatch,
    ) -> StepDecision | None:
        """§14.7: None when a token was taken; otherwise the refusal or the park."""
        limit = result.rate_limit
        assert limit is not None
        key = _bucket_key(result.rule_id, limit.per_what, execution)
        wait = await tx.take_rate_token(
            key, limit.max_calls, limit.window.total_seconds(), batch.now
        )
        if wait is None:
            return None
        error = steps.reason_error(RATE_LIMIT_EXCEEDED, result.rule_id)
        max_wait = limit.max_wait.total_seconds() if limit.max_wait else 0.0
        may_park = 0 < wait <= max_wait and not await tx.has_event_of_type(
            execution.id, EventType.STEP_RATE_LIMITED
        )
        batch.step(EventType.STEP_RATE_LIMITED, step, rule_id=result.rule_id, error=error)
        if not may_park:
            return StepDecision(
                Decision.RATE_LIMITED, reason=RATE_LIMIT_EXCEEDED, rule_id=result.rule_id
            )
        delay = park_wait(wait, max_wait, random.randint)
        await tx.retire_dispatches(execution.id, batch.now)
        await self.enqueue(tx, batch, self.new_dispatch(execution.id, batch.now, delay))
        return StepDecision(Decision.BLOCKED, reason=RATE_LIMIT_EXCEEDED)

    async def _apply_budget(
        self, tx: Transaction, execution: Execution, result: PolicyResult
    ) -> PolicyResult:
        """§14.9: checked before the call, so the call that crosses the limit still runs."""
        budget = result.budget
        if budget is None or budget.max_tokens <= 0 or result.action is not PolicyAction.ALLOW:
            return result
        if await tx.spent_tokens(execution.id) < budget.max_tokens:
            return result
        return PolicyResult(
            budget.on_exceed, BUDGET_EXCEEDED, result.rule_id, approval=result.approval
        )

    async def _record_allowed(
        self, tx: Transaction, step: Step, result: PolicyResult, batch: EventBatch
    ) -> StepDecision:
        batch.step(EventType.STEP_PROPOSED, step)
        batch.step(EventType.STEP_ALLOWED, step, rule_id=result.rule_id)
        executing = steps.start(step, batch.now)
        await tx.insert_step(executing)
        batch.step(EventType.STEP_EXECUTING, executing)
        return StepDecision(Decision.PROCEED, step.step_id)

    async def _record_denied(
        self, tx: Transaction, step: Step, result: PolicyResult, batch: EventBatch
    ) -> StepDecision:
        reason = result.reason or "policy_denied"
        denied = steps.finish(
            step, StepStatus.DENIED, batch.now, error=steps.reason_error(reason, result.rule_id)
        )
        await tx.insert_step(denied)
        batch.step(EventType.STEP_PROPOSED, step)
        batch.step(EventType.STEP_DENIED, denied, rule_id=result.rule_id, error=denied.error)
        return StepDecision(
            Decision.DENIED, step.step_id, reason=reason, rule_id=result.rule_id or None
        )

    async def _record_approval(
        self,
        tx: Transaction,
        execution: Execution,
        step: Step,
        result: PolicyResult,
        batch: EventBatch,
    ) -> tuple[StepDecision, Execution]:
        """N3: the execution blocks and its dispatches retire until a person decides."""
        waiting = _replace_status(step, StepStatus.AWAITING_APPROVAL)
        await tx.insert_step(waiting)
        batch.step(EventType.STEP_PROPOSED, step)
        batch.step(EventType.STEP_AWAITING_APPROVAL, waiting, rule_id=result.rule_id)
        approval = await create_approval(
            tx, waiting, result.approval, self.settings.approval_timeout, batch
        )
        blocked = transition(execution, ExecutionStatus.BLOCKED, batch.now)
        batch.execution(EventType.EXECUTION_BLOCKED, blocked)
        await tx.retire_dispatches(execution.id, batch.now)
        return StepDecision(Decision.BLOCKED, step.step_id, approval_id=approval.id), blocked

    async def complete_step(
        self, execution_id: str, agent_id: str, step_id: str, lease: Lease, result: RawJson
    ) -> StepDecision:
        return await self._finish_step(execution_id, agent_id, step_id, lease, result, None)

    async def fail_step(
        self, execution_id: str, agent_id: str, step_id: str, lease: Lease, error: RawJson
    ) -> StepDecision:
        return await self._finish_step(execution_id, agent_id, step_id, lease, None, error)

    async def _finish_step(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease,
        result: RawJson | None,
        error: RawJson | None,
    ) -> StepDecision:
        """§9 in its order: step, terminal execution, weak lease, terminal step, status."""
        async with self.transaction(execution_id) as tx:
            loaded = await tx.load_completion(execution_id, step_id, lease.dispatch_id)
            step, execution = loaded.step, loaded.execution
            if step is None:
                raise NotFound(f"step {step_id} not found in execution {execution_id}")
            check_owner(execution, agent_id)
            if execution.status.is_terminal:
                return StepDecision(Decision.EXECUTION_TERMINAL)
            # The weak check (§9): the attempt must not have moved; its status may have.
            if loaded.dispatch is None or loaded.dispatch.attempt != lease.attempt:
                raise superseded(execution_id, lease)
            if step.status.is_terminal:
                if result is not None:
                    return StepDecision(Decision.REPLAY, result=step.result or "null")
                return StepDecision(Decision.REPLAY, error=step.error or "{}")
            if step.status is not StepStatus.EXECUTING:
                raise Conflict(f"step {step_id} is {step.status}, not executing")
            batch = EventBatch(execution, self.clock())
            await tx.update_step(_record_outcome(step, result, error, batch))
            await flush(tx, execution, batch)
        return StepDecision(Decision.RECORDED)

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
        if lease is not None and (
            loaded.dispatch is None or loaded.dispatch.attempt != lease.attempt
        ):
            raise superseded(execution_id, lease)
        if step.status is not StepStatus.EXECUTING:
            raise Conflict(f"step {step_id} is {step.status}, not executing")
        self.bus.publish(execution_id, Delta(step_id=step_id, seq=seq, data=data))


async def _at_occurrence(
    tx: Transaction,
    sub: Submission,
    execution: Execution,
    occurrence: int,
    step_id_for: StepIdFn,
) -> Submission:
    """The submission re-read at another occurrence than the counter's: past the steps of its
    own key that the same request reported, or at the agent's own number."""
    if occurrence == sub.occurrence:
        return sub
    existing = await tx.get_step(step_id_for(occurrence))
    bundle = sub.policy_bundle
    if sub.existing is not None and existing is None:
        bundle = (await tx.get_agent(execution.agent_id)).policy_bundle
    return replace(sub, occurrence=occurrence, existing=existing, policy_bundle=bundle)


def _new_step(
    execution_id: str, step_id: str, occurrence: int, request: StepRequest, batch: EventBatch
) -> Step:
    return Step(
        step_id=step_id,
        execution_id=execution_id,
        kind=request.kind,
        target=request.target,
        args_hash=request.args_hash,
        occurrence=occurrence,
        status=StepStatus.PROPOSED,
        idempotency=request.idempotency,
        args=request.args,
        result=None,
        error=None,
        usage_input=None,
        usage_output=None,
        proposed_seq=batch.next_seq,
        started_at=None,
        completed_at=None,
    )


def _replace_status(step: Step, status: StepStatus) -> Step:
    return replace(step, status=status)


async def apply_outcomes(
    tx: Transaction,
    execution_id: str,
    dispatch_id: str,
    outcomes: Sequence[Carried],
    batch: EventBatch,
    loaded: Sequence[Step] | None = None,
    recorded: Outcomes | None = None,
    *,
    counting: bool = True,
) -> dict[StepKey, int]:
    """Records what an agent's request carries before its own business, in order: completions
    (`step-completions`) and steps that ran before they were submitted (`step-records`).

    A completion for a step that is no longer executing changes nothing: a terminal outcome is
    never overwritten, and the agent learns nothing new from a refusal here. A reported step
    takes the next occurrence of its key in this attempt and gets the events a submission and
    a completion would have written; one already recorded under that id is kept as it is.
    Returns the occurrence each reported key reached, which a submission in the same request
    continues from. `loaded`: the carried completions' steps, read already; `recorded`: what
    `wanted_by(outcomes)` loaded, read already. Without `counting`, the occurrences reached are
    not stored: for a request that ends the run, whose dispatch retires with it, they would
    be written for nothing: most of the writes of a long run's end."""
    if not outcomes:
        return {}
    if recorded is None:
        recorded = await tx.load_outcomes(execution_id, dispatch_id, wanted_by(outcomes, loaded))
    reported = _reported(execution_id, outcomes, recorded.consumed)
    found = {step.step_id: step for step in (*(loaded or ()), *recorded.steps)}
    consumed: dict[StepKey, int] = {}
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, StepRecord):
            step_id, key, occurrence = reported[index]
            consumed[key] = occurrence
            if step_id in found:
                log.info(
                    "ignored a reported step: execution_id=%s step_id=%s is recorded already",
                    execution_id,
                    step_id,
                )
                continue
            found[step_id] = await _record_reported(tx, outcome, step_id, occurrence, batch)
            continue
        step = found.get(outcome.step_id)
        if step is None or step.status is not StepStatus.EXECUTING:
            log.info(
                "ignored a carried completion: execution_id=%s step_id=%s is %s",
                execution_id,
                outcome.step_id,
                "unknown" if step is None else step.status,
            )
            continue
        done = _record_outcome(step, outcome.result, outcome.error, batch)
        await tx.update_step(done)
        found[step.step_id] = done
    if counting:
        for key, occurrence in consumed.items():
            await tx.set_occurrence(dispatch_id, key, occurrence)
    return consumed


def wanted_by(outcomes: Sequence[Carried], loaded: Sequence[Step] | None = None) -> Wanted:
    """What recording `outcomes` reads: the counters and steps of the reported keys, and the
    steps of the carried completions unless they are `loaded` already."""
    if not outcomes:
        return NOTHING_WANTED
    reports = Counter(_key(o.request) for o in outcomes if isinstance(o, StepRecord))
    completing = () if loaded is not None else outcomes
    step_ids = [o.step_id for o in completing if isinstance(o, StepOutcome)]
    return Wanted(reports=reports, step_ids=step_ids)


def _reported(
    execution_id: str, outcomes: Sequence[Carried], consumed: dict[StepKey, int]
) -> dict[int, tuple[str, StepKey, int]]:
    """The id, key and occurrence of each reported step, by its index among `outcomes`."""
    counted = dict(consumed)
    reported: dict[int, tuple[str, StepKey, int]] = {}
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, StepRecord):
            key = _key(outcome.request)
            occurrence = counted.get(key, -1) + 1
            counted[key] = occurrence
            step_id = compute_step_id(
                execution_id, key.kind.value, key.target, key.args_hash, occurrence
            )
            reported[index] = (step_id, key, occurrence)
    return reported


async def _record_reported(
    tx: Transaction, report: StepRecord, step_id: str, occurrence: int, batch: EventBatch
) -> Step:
    """A step that ran before it was submitted, with the events of both in turn."""
    step = _new_step(batch.execution_id, step_id, occurrence, report.request, batch)
    batch.step(EventType.STEP_PROPOSED, step)
    # The grant stands for the permissive policy it was given under.
    batch.step(EventType.STEP_ALLOWED, step, rule_id=PERMISSIVE.rule_id)
    executing = steps.start(step, batch.now)
    batch.step(EventType.STEP_EXECUTING, executing)
    done = _record_outcome(executing, report.result, report.error, batch)
    await tx.insert_step(done)
    return done


def _key(request: StepRequest) -> StepKey:
    return StepKey(request.kind, request.target, request.args_hash)


def _record_outcome(
    step: Step, result: RawJson | None, error: RawJson | None, batch: EventBatch
) -> Step:
    if result is not None:
        usage = extract_usage(result) if step.kind is StepKind.LLM_CALL else None
        done = steps.finish(step, StepStatus.SUCCEEDED, batch.now, result=result, usage=usage)
        usage_fields = {"input_tokens": usage[0], "output_tokens": usage[1]} if usage else None
        batch.step(EventType.STEP_SUCCEEDED, done, usage=usage_fields)
    else:
        done = steps.finish(step, StepStatus.FAILED, batch.now, error=error)
        batch.step(EventType.STEP_FAILED, done, error=error)
    return done


def _bucket_key(rule_id: str, per_what: str, execution: Execution) -> str:
    if per_what == "agent":
        return f"{rule_id}:agent:{execution.agent_id}"
    if per_what == "global":
        return f"{rule_id}:global"
    return f"{rule_id}:exec:{execution.id}"
