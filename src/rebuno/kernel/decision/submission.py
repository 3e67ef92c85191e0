"""The decision of a step submission (§8): `decide`, one pure function that every way of
answering a submission calls (the locked script, the unlocked replay read and a followed run),
so they cannot drift.

`decide` answers from what was read (the execution, the step recorded at the submission's
occurrence, the lease, the policy's verdict and the facts a new step's limits need) and the
time, and returns a `Plan`: the answer and the writes it implies. Its events go into the
`EventBatch` it is given, every other write is a field of the plan, and the caller applies
them in its transaction. A caller that may not write (the unlocked read) answers only a plan
that writes nothing.

Rows R1-R6 decide a recorded step, rows N0-N7 a new one (docs/protocol.md, §8.2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import Carried, StepDecision, StepRequest
from rebuno.kernel.domain.errors import lease_superseded
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import check_owner, mark_started, transition
from rebuno.kernel.domain.identity import step_id as compute_step_id
from rebuno.kernel.domain.records import Approval, Execution, Lease, Resource, Step, replace
from rebuno.kernel.domain.resource import NO_TOUCH, Touch, affected_keys, touch
from rebuno.kernel.policy.engine import PolicyResult
from rebuno.protocol.enums import (
    COUNTED_DECISIONS,
    ApprovalStatus,
    Decision,
    ExecutionStatus,
    Idempotency,
    PolicyAction,
    StepStatus,
)
from rebuno.protocol.events import EventType

BUDGET_EXCEEDED = steps.BUDGET_EXCEEDED_REASON
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"


class StepIds:
    """The step id of each occurrence of one request, each computed once: a store that looks
    the step up by id and every way of deciding the submission ask for the same one (a plain
    dict, cheaper than a `functools.cache` wrapper built per submission)."""

    __slots__ = ("_execution_id", "_ids", "_request")

    def __init__(self, execution_id: str, request: StepRequest) -> None:
        self._execution_id = execution_id
        self._request = request
        self._ids: dict[int, str] = {}

    def __call__(self, occurrence: int) -> str:
        found = self._ids.get(occurrence)
        if found is None:
            request = self._request
            found = self._ids[occurrence] = compute_step_id(
                self._execution_id,
                request.kind.value,
                request.target,
                request.args_hash,
                occurrence,
            )
        return found


@dataclass(frozen=True, slots=True)
class StepSubmission:
    """A step submission as the agent's request makes it (§8), before anything is read: the
    input of every way of deciding it."""

    execution_id: str
    agent_id: str
    lease: Lease
    request: StepRequest
    outcomes: Sequence[Carried]
    """What the request carries before the submission, recorded first."""
    occurrence: int | None
    """The agent's own number for this submission (`step-occurrences`), which replaces the
    dispatch's counter; None to count as §7.3 does."""
    step_ids: StepIds

    def own_slot(self, occurrence: int) -> Slot:
        """The slot at the agent's own `occurrence`, as it is before anything is read."""
        return Slot(occurrence, self.step_ids(occurrence), None, kernel_counted=False)


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a submission lands: its occurrence (§7.3), the step id that yields, and what is
    recorded under that id. `kernel_counted`: the occurrence is the kernel's own count for
    the delivery attempt (not the agent's number), so a counted answer advances it."""

    occurrence: int
    step_id: str
    recorded: Step | None
    kernel_counted: bool = True
    approval_id: str | None = None
    """The pending approval of a recorded step that awaits one."""


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The lease as the read found it. `live`: it owns the live dispatch (the strong check).
    `renewed`: this read renewed it, or it was renewed recently enough not to need it now."""

    lease: Lease
    live: bool
    renewed: bool = True


@dataclass(frozen=True, slots=True)
class Facts:
    """What a new step's checks read, and only when its verdict needs them (`needs`)."""

    indeterminate: bool = False
    """An `at_most_once` step of this key was left indeterminate by an earlier attempt."""
    rate_wait: float | None = None
    """The verdict's rate limit had no token: the estimated wait, in seconds. None when a
    token was taken or no limit applies."""
    rate_limited_before: bool = False
    """The execution was parked by a rate limit once already (it may park only once)."""
    spent_tokens: int = 0


NO_FACTS = Facts()


@dataclass(frozen=True, slots=True)
class Submitted:
    """One submission with everything read for it."""

    execution: Execution
    agent_id: str
    request: StepRequest
    slot: Slot
    lease: LeaseView
    verdict: PolicyResult | None = None
    """The policy's verdict on a new step; None for a recorded one (never consulted, R*)."""
    facts: Facts = NO_FACTS
    resources: tuple[Resource, ...] = ()
    """The execution's resources in registration order, read when it has any (§33)."""


@dataclass(frozen=True, slots=True)
class Rules:
    """What deciding needs besides the submission: how long an approval waits by default,
    and where new ids come from (so tests can make them predictable)."""

    approval_timeout: timedelta
    new_id: Callable[[], str]


@dataclass(frozen=True, slots=True)
class Plan:
    """The answer to a submission and the writes it implies, besides the batch's events."""

    decision: StepDecision
    execution: Execution
    """The execution as the answer leaves it (started, blocked, or as it was)."""
    insert_step: Step | None = None
    update_step: Step | None = None
    approval: Approval | None = None
    retire_dispatches: bool = False
    park: tuple[float, float] | None = None
    """Parked by a rate limit: (estimated wait, the rule's max wait), in seconds. The caller
    retires the execution's dispatches and queues one after a jittered delay."""
    advance_occurrence: bool = False
    renew_lease: bool = False
    touch: Touch = NO_TOUCH
    """A live step's effect on the resources (§33.5): stored with the step, and each touched
    resource's new generation, its open checkpoints closed at `touch_seq`."""
    touch_seq: int = 0
    """The `event_seq` of the `step.executing` that touched them."""

    def writes_nothing(self, batch: EventBatch) -> bool:
        return not (
            batch.events
            or self.touch.touched
            or self.touch.affected
            or self.insert_step
            or self.update_step
            or self.approval
            or self.retire_dispatches
            or self.park
            or self.advance_occurrence
            or self.renew_lease
        )


def needs_verdict(execution: Execution, slot: Slot) -> bool:
    """Whether deciding this submission consults policy (and its facts): a new step of an
    execution that can take one."""
    return (
        slot.recorded is None
        and not execution.status.is_terminal
        and execution.status is not ExecutionStatus.BLOCKED
    )


def admit(execution: Execution, agent_id: str, lease: LeaseView) -> StepDecision | None:
    """The gate of every submission (§8), before anything it carries is recorded: the owner,
    then a terminal execution (answered), then the strong lease check. None when admitted.
    Raises `Forbidden` for another agent's execution and `LeaseSuperseded` for a lease that
    no longer owns it."""
    check_owner(execution, agent_id)
    if execution.status.is_terminal:
        return StepDecision(Decision.EXECUTION_TERMINAL)
    if not lease.live:
        raise lease_superseded(execution.id, lease.lease)
    return None


def decide(submitted: Submitted, batch: EventBatch, rules: Rules) -> Plan:
    """The answer to `submitted` (§8): the gate (`admit`), then the recorded step's row or
    the new step's."""
    execution = submitted.execution
    refused = admit(execution, submitted.agent_id, submitted.lease)
    if refused is not None:
        return Plan(refused, execution)
    execution = mark_started(execution, batch)
    slot = submitted.slot
    live = _touch(submitted)
    if slot.recorded is not None:
        plan = _decide_recorded(execution, slot, slot.recorded, submitted.request, batch, live)
    else:
        plan = _decide_new(submitted, execution, batch, rules, live)
    counted = plan.decision.step_id is not None and (
        plan.decision.decision in COUNTED_DECISIONS or plan.decision.approval_id is not None
    )
    return replace(
        plan,
        advance_occurrence=counted and slot.kernel_counted,
        renew_lease=not submitted.lease.renewed,
    )


def _touch(submitted: Submitted) -> Touch:
    """What the submission does to the resources if it proceeds (§33.5); the affected keys
    come from this submission's declaration. Raises `ValidationFailed` for a declared key
    that is not registered, whatever the answer would be."""
    declared = submitted.request.resources
    if not submitted.resources:
        if declared:
            affected_keys((), declared, submitted.request.kind)  # raises: none is registered
        return NO_TOUCH
    affected = affected_keys(submitted.resources, declared, submitted.request.kind)
    return touch(submitted.resources, affected)


def _executing(step: Step, live: Touch, batch: EventBatch) -> int:
    """Appends the `step.executing` of a live step, with what it touched; its seq."""
    touched: dict[str, object] | None = None
    if live.touched:
        touched = {"generations": live.generations()}
        if live.affected:
            touched["resources"] = list(live.affected)
    batch.step(EventType.STEP_EXECUTING, step, touched=touched)
    return batch.last_seq


def _proceed(plan: Plan, live: Touch, seq: int) -> Plan:
    if live is NO_TOUCH:
        return plan
    decision = replace(plan.decision, resources=live.entries)
    return replace(plan, decision=decision, touch=live, touch_seq=seq)


def _decide_recorded(
    execution: Execution,
    slot: Slot,
    step: Step,
    request: StepRequest,
    batch: EventBatch,
    live: Touch = NO_TOUCH,
) -> Plan:
    """Rows R1-R6: policy is never consulted for a recorded step."""
    match step.status:
        case StepStatus.SUCCEEDED:
            answer = StepDecision(Decision.REPLAY, step.step_id, result=step.result or "null")
            return Plan(answer, execution)
        case StepStatus.FAILED | StepStatus.CANCELLED:
            answer = StepDecision(Decision.REPLAY, step.step_id, error=step.error or "{}")
            return Plan(answer, execution)
        case StepStatus.AWAITING_APPROVAL:
            answer = StepDecision(Decision.BLOCKED, step.step_id, approval_id=slot.approval_id)
            return Plan(answer, execution)
        case StepStatus.ALLOWED | StepStatus.PROPOSED:
            started = steps.start(step, batch.now)
            seq = _executing(started, live, batch)
            plan = Plan(
                StepDecision(Decision.PROCEED, step.step_id), execution, update_step=started
            )
            return _proceed(plan, live, seq)
        case StepStatus.EXECUTING:
            return _decide_orphan(execution, step, request, batch, live)
        case _:
            reason, rule_id = steps.error_reason(step.error)
            answer = StepDecision(
                Decision.DENIED,
                step.step_id,
                reason=reason or "policy_denied",
                rule_id=rule_id or None,
            )
            return Plan(answer, execution)


def _decide_orphan(
    execution: Execution, step: Step, request: StepRequest, batch: EventBatch, live: Touch
) -> Plan:
    """An effect that started and never finished (§13): the idempotency submitted now
    decides whether it may run again. A re-run that touches resources is logged with a
    `step.executing` of its own, which moves their generations (§33.5)."""
    if request.idempotency is Idempotency.SAFE_TO_RETRY:
        plan = Plan(StepDecision(Decision.PROCEED, step.step_id), execution)
        if not live.touched:
            return plan
        return _proceed(plan, live, _executing(step, live, batch))
    failed = steps.finish(step, StepStatus.FAILED, batch.now, error=steps.INDETERMINATE_ERROR)
    batch.step(EventType.STEP_FAILED, failed, error=failed.error)
    answer = StepDecision(Decision.REPLAY, step.step_id, error=steps.INDETERMINATE_ERROR)
    return Plan(answer, execution, update_step=failed)


def _decide_new(
    submitted: Submitted, execution: Execution, batch: EventBatch, rules: Rules, live: Touch
) -> Plan:
    """Rows N0-N7: a blocked execution takes no new step; an indeterminate retry is denied;
    then the verdict, its rate limit and its token budget decide."""
    if execution.status is ExecutionStatus.BLOCKED:
        return Plan(StepDecision(Decision.EXECUTION_BLOCKED), execution)
    verdict, facts = submitted.verdict, submitted.facts
    if verdict is None:
        raise ValueError("a new step is decided with the policy's verdict")
    step = new_step(execution.id, submitted.slot, submitted.request, batch)
    if submitted.request.idempotency is Idempotency.AT_MOST_ONCE and facts.indeterminate:
        verdict = PolicyResult(
            PolicyAction.DENY, steps.INDETERMINATE_RETRY_REASON, steps.INDETERMINATE_RETRY_RULE
        )
        return _denied(execution, step, verdict, batch)
    if facts.rate_wait is not None:
        return _rate_limited(execution, step, verdict, facts, batch)
    verdict = _within_budget(verdict, facts)
    match verdict.action:
        case PolicyAction.ALLOW:
            return _allowed(execution, step, verdict, batch, live)
        case PolicyAction.DENY:
            return _denied(execution, step, verdict, batch)
        case PolicyAction.REQUIRE_APPROVAL:
            return _held(execution, step, verdict, batch, rules)


def _rate_limited(
    execution: Execution, step: Step, verdict: PolicyResult, facts: Facts, batch: EventBatch
) -> Plan:
    """§14.7: refused, or parked once when the wait is within the rule's `max_wait`."""
    limit = verdict.rate_limit
    wait = facts.rate_wait
    assert limit is not None and wait is not None
    error = steps.reason_error(RATE_LIMIT_EXCEEDED, verdict.rule_id)
    max_wait = limit.max_wait.total_seconds() if limit.max_wait else 0.0
    batch.step(
        EventType.STEP_RATE_LIMITED,
        step,
        rule_id=verdict.rule_id,
        error=error,
        policy_hash=verdict.policy_hash,
    )
    if not may_park(verdict, wait) or facts.rate_limited_before:
        answer = StepDecision(
            Decision.RATE_LIMITED, reason=RATE_LIMIT_EXCEEDED, rule_id=verdict.rule_id
        )
        return Plan(answer, execution)
    answer = StepDecision(Decision.BLOCKED, reason=RATE_LIMIT_EXCEEDED)
    return Plan(answer, execution, retire_dispatches=True, park=(wait, max_wait))


def may_park(verdict: PolicyResult, wait: float) -> bool:
    """Whether a rate-limited step could park (so whether it matters that it parked once)."""
    limit = verdict.rate_limit
    max_wait = limit.max_wait.total_seconds() if limit and limit.max_wait else 0.0
    return 0 < wait <= max_wait


def has_rate_limit(verdict: PolicyResult) -> bool:
    return verdict.rate_limit is not None and verdict.rate_limit.max_calls > 0


def has_budget(verdict: PolicyResult) -> bool:
    """§14.9: a budget is checked before an allowed call, so the call that crosses the limit
    still runs."""
    budget = verdict.budget
    return budget is not None and budget.max_tokens > 0 and verdict.action is PolicyAction.ALLOW


def _within_budget(verdict: PolicyResult, facts: Facts) -> PolicyResult:
    budget = verdict.budget
    if budget is None or not has_budget(verdict) or facts.spent_tokens < budget.max_tokens:
        return verdict
    return PolicyResult(
        budget.on_exceed,
        BUDGET_EXCEEDED,
        verdict.rule_id,
        approval=verdict.approval,
        policy_hash=verdict.policy_hash,
    )


def _allowed(
    execution: Execution, step: Step, verdict: PolicyResult, batch: EventBatch, live: Touch
) -> Plan:
    batch.step(EventType.STEP_PROPOSED, step)
    batch.step(
        EventType.STEP_ALLOWED, step, rule_id=verdict.rule_id, policy_hash=verdict.policy_hash
    )
    executing = steps.start(step, batch.now)
    seq = _executing(executing, live, batch)
    plan = Plan(StepDecision(Decision.PROCEED, step.step_id), execution, insert_step=executing)
    return _proceed(plan, live, seq)


def _denied(execution: Execution, step: Step, verdict: PolicyResult, batch: EventBatch) -> Plan:
    reason = verdict.reason or "policy_denied"
    denied = steps.finish(
        step, StepStatus.DENIED, batch.now, error=steps.reason_error(reason, verdict.rule_id)
    )
    batch.step(EventType.STEP_PROPOSED, step)
    batch.step(
        EventType.STEP_DENIED,
        denied,
        rule_id=verdict.rule_id,
        error=denied.error,
        policy_hash=verdict.policy_hash,
    )
    answer = StepDecision(
        Decision.DENIED, step.step_id, reason=reason, rule_id=verdict.rule_id or None
    )
    return Plan(answer, execution, insert_step=denied)


def _held(
    execution: Execution, step: Step, verdict: PolicyResult, batch: EventBatch, rules: Rules
) -> Plan:
    """N3: the execution blocks and its dispatches retire until a person decides."""
    waiting = replace(step, status=StepStatus.AWAITING_APPROVAL)
    batch.step(EventType.STEP_PROPOSED, step)
    batch.step(
        EventType.STEP_AWAITING_APPROVAL,
        waiting,
        rule_id=verdict.rule_id,
        policy_hash=verdict.policy_hash,
    )
    approval = _approval(waiting, verdict, batch, rules)
    batch.approval(EventType.APPROVAL_REQUESTED, approval.id, step.step_id, approval.status)
    blocked = transition(execution, ExecutionStatus.BLOCKED, batch.now)
    batch.execution(EventType.EXECUTION_BLOCKED, blocked)
    answer = StepDecision(Decision.BLOCKED, step.step_id, approval_id=approval.id)
    return Plan(answer, blocked, insert_step=waiting, approval=approval, retire_dispatches=True)


def _approval(step: Step, verdict: PolicyResult, batch: EventBatch, rules: Rules) -> Approval:
    config = verdict.approval
    timeout = config.timeout if config and config.timeout else rules.approval_timeout
    return Approval(
        id=rules.new_id(),
        step_id=step.step_id,
        execution_id=step.execution_id,
        status=ApprovalStatus.PENDING,
        approvers=config.approvers if config else None,
        message=config.message if config else None,
        timeout_at=batch.now + timeout,
        decided_by=None,
        decided_at=None,
        rationale=None,
        created_at=batch.now,
    )


def new_step(execution_id: str, slot: Slot, request: StepRequest, batch: EventBatch) -> Step:
    """The record of a step first proposed now, at `slot`."""
    return Step(
        step_id=slot.step_id,
        execution_id=execution_id,
        kind=request.kind,
        target=request.target,
        args_hash=request.args_hash,
        occurrence=slot.occurrence,
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
