"""The decisions beside a submission's, one case per row and without a store: a step's outcome
on its complete and fail routes (§9), an approval's resolution (§15), an execution's end and
the gate of an agent's write that ends it (§10.1, §5.2), and when a fast way may be taken
(`decision.eligibility`). Each case builds the typed values a decision reads by hand and checks
its answer, the records it returns and the events it appends, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from rebuno.kernel.decision import eligibility
from rebuno.kernel.decision.approval import EXPIRY, Resolution, resolve
from rebuno.kernel.decision.ending import (
    EXHAUSTED,
    Ending,
    admit_write,
    begin,
    cancel,
    completed,
    failed,
    finish,
)
from rebuno.kernel.decision.outcome import Reported, complete
from rebuno.kernel.domain.decision import StepDecision, StepOutcome, StepRecord, StepRequest
from rebuno.kernel.domain.errors import (
    Conflict,
    ExecutionTerminal,
    Forbidden,
    KernelError,
    LeaseSuperseded,
    NotFound,
)
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.principal import ANONYMOUS, BOOTSTRAP, key_principal
from rebuno.kernel.domain.records import (
    Approval,
    Dispatch,
    Execution,
    Lease,
    Origin,
    Step,
    replace,
)
from rebuno.kernel.policy.engine import Budget, PolicyResult, RateLimit
from rebuno.protocol.enums import (
    ApprovalStatus,
    Decision,
    DispatchStatus,
    ExecutionStatus,
    Idempotency,
    PolicyAction,
    Scope,
    StepKind,
    StepStatus,
)
from tests.support import START

AGENT = "researcher"
LEASE = Lease("dispatch-1", 1)
LAST_SEQ = 6
TIMEOUT_AT = START + timedelta(minutes=5)


def execution(status: ExecutionStatus = ExecutionStatus.RUNNING, **extra: Any) -> Execution:
    record = Execution(
        id="execution-1",
        agent_id=AGENT,
        origin=Origin(agent_version=None, input="{}", created_at=START, deadline_at=None),
        status=status,
        output=None,
        failure_reason=None,
        updated_at=START,
        last_event_seq=LAST_SEQ,
    )
    return replace(record, **extra)


def step(
    status: StepStatus = StepStatus.EXECUTING,
    kind: StepKind = StepKind.TOOL_CALL,
    step_id: str = "step-1",
    **extra: Any,
) -> Step:
    record = Step(
        step_id=step_id,
        execution_id="execution-1",
        kind=kind,
        target="web_search",
        args_hash="args-hash",
        occurrence=0,
        status=status,
        idempotency=Idempotency.SAFE_TO_RETRY,
        args="{}",
        result=None,
        error=None,
        usage_input=None,
        usage_output=None,
        proposed_seq=2,
        started_at=START,
        completed_at=None,
    )
    return replace(record, **extra)


def dispatch(attempt: int = 1, status: DispatchStatus = DispatchStatus.IN_FLIGHT) -> Dispatch:
    return Dispatch(
        id="dispatch-1",
        execution_id="execution-1",
        status=status,
        attempt=attempt,
        max_attempts=5,
        next_attempt_at=START,
        locked_by="replica",
        locked_at=START,
        created_at=START,
        updated_at=START,
    )


def batch_on(record: Execution, later: timedelta = timedelta(0)) -> EventBatch:
    return EventBatch(record, START + later)


def types(batch: EventBatch) -> list[str]:
    return [event.type for event in batch.events]


# -- §9: a step's outcome on its complete and fail routes ------------------------------------


@dataclass(frozen=True)
class OutcomeRow:
    id: str
    result: str | None = '{"hits":3}'
    error: str | None = None
    execution: Execution = field(default_factory=execution)
    step: Step | None = field(default_factory=step)
    dispatch: Dispatch | None = field(default_factory=dispatch)
    agent_id: str = AGENT
    answer: StepDecision | None = None
    refusal: type[KernelError] | None = None
    written: StepStatus | None = None
    events: tuple[str, ...] = ()


OUTCOME_ROWS = [
    OutcomeRow("unknown-step", step=None, refusal=NotFound),
    OutcomeRow("another-agent", agent_id="someone-else", refusal=Forbidden),
    OutcomeRow(
        "terminal-execution",
        execution=execution(ExecutionStatus.COMPLETED),
        answer=StepDecision(Decision.EXECUTION_TERMINAL),
    ),
    OutcomeRow("attempt-moved", dispatch=dispatch(attempt=2), refusal=LeaseSuperseded),
    OutcomeRow("dispatch-gone", dispatch=None, refusal=LeaseSuperseded),
    OutcomeRow(
        "released-lease-still-records",
        dispatch=dispatch(status=DispatchStatus.EXHAUSTED),
        answer=StepDecision(Decision.RECORDED),
        written=StepStatus.SUCCEEDED,
        events=("step.succeeded",),
    ),
    OutcomeRow(
        "terminal-step-complete-replays-result",
        step=step(StepStatus.SUCCEEDED, result='{"hits":1}'),
        answer=StepDecision(Decision.REPLAY, result='{"hits":1}'),
    ),
    OutcomeRow(
        "terminal-step-fail-replays-error",
        result=None,
        error='{"message":"late"}',
        step=step(StepStatus.FAILED, error='{"message":"first"}'),
        answer=StepDecision(Decision.REPLAY, error='{"message":"first"}'),
    ),
    OutcomeRow("awaiting-approval", step=step(StepStatus.AWAITING_APPROVAL), refusal=Conflict),
    OutcomeRow("allowed-not-started", step=step(StepStatus.ALLOWED), refusal=Conflict),
    OutcomeRow(
        "complete",
        answer=StepDecision(Decision.RECORDED),
        written=StepStatus.SUCCEEDED,
        events=("step.succeeded",),
    ),
    OutcomeRow(
        "fail",
        result=None,
        error='{"message":"boom"}',
        answer=StepDecision(Decision.RECORDED),
        written=StepStatus.FAILED,
        events=("step.failed",),
    ),
]


@pytest.mark.parametrize("row", OUTCOME_ROWS, ids=lambda row: row.id)
def test_step_outcome_row(row: OutcomeRow) -> None:
    reported = Reported(row.agent_id, "step-1", LEASE, result=row.result, error=row.error)
    batch = batch_on(row.execution)
    if row.refusal is not None:
        with pytest.raises(row.refusal):
            complete(row.execution, row.step, row.dispatch, reported, batch)
        assert batch.events == []
        return
    answer, done = complete(row.execution, row.step, row.dispatch, reported, batch)
    assert answer == row.answer
    assert (done.status if done else None) is row.written
    assert tuple(types(batch)) == row.events


def test_an_llm_call_outcome_carries_its_usage_in_its_event() -> None:
    result = '{"usage":{"prompt_tokens":12,"completion_tokens":30}}'
    reported = Reported(AGENT, "step-1", LEASE, result=result)
    batch = batch_on(execution())
    _, done = complete(execution(), step(kind=StepKind.LLM_CALL), dispatch(), reported, batch)
    assert done is not None
    assert (done.usage_input, done.usage_output) == (12, 30)
    assert '"usage":{"input_tokens":12,"output_tokens":30}' in batch.events[0].payload


# -- §15: an approval's resolution -----------------------------------------------------------


def approval(
    status: ApprovalStatus = ApprovalStatus.PENDING, approvers: tuple[str, ...] | None = None
) -> Approval:
    return Approval(
        id="approval-1",
        step_id="step-1",
        execution_id="execution-1",
        status=status,
        approvers=approvers,
        message=None,
        timeout_at=TIMEOUT_AT,
        decided_by=None,
        decided_at=None,
        rationale=None,
        created_at=START,
    )


BOB_KEY = key_principal("key-9", "bob", frozenset(Scope))


@dataclass(frozen=True)
class ApprovalRow:
    id: str
    asked: Resolution
    at: timedelta = timedelta(minutes=1)
    approval: Approval = field(default_factory=approval)
    step: Step | None = field(default_factory=lambda: step(StepStatus.AWAITING_APPROVAL))
    refusal: type[KernelError] | None = None
    status: ApprovalStatus | None = None
    step_status: StepStatus | None = None
    step_error: str | None = None
    late: bool = False
    asserted_by: str | None = None
    events: tuple[str, ...] = ()


GRANT = Resolution(ApprovalStatus.GRANTED, "alice", "looks fine", BOOTSTRAP)
DENY = Resolution(ApprovalStatus.DENIED, "alice", "not today", BOOTSTRAP)

APPROVAL_ROWS = [
    ApprovalRow(
        "granted",
        GRANT,
        status=ApprovalStatus.GRANTED,
        step_status=StepStatus.ALLOWED,
        asserted_by="bootstrap",
        events=("approval.granted", "step.allowed"),
    ),
    ApprovalRow(
        "denied-with-its-rationale",
        DENY,
        status=ApprovalStatus.DENIED,
        step_status=StepStatus.DENIED,
        step_error='{"reason":"not today"}',
        asserted_by="bootstrap",
        events=("approval.denied", "step.denied"),
    ),
    ApprovalRow(
        "denied-without-a-rationale",
        Resolution(ApprovalStatus.DENIED, "alice", "", BOOTSTRAP),
        status=ApprovalStatus.DENIED,
        step_status=StepStatus.DENIED,
        step_error='{"reason":"approval_denied"}',
        asserted_by="bootstrap",
        events=("approval.denied", "step.denied"),
    ),
    ApprovalRow(
        "expired-by-the-sweep",
        EXPIRY,
        at=timedelta(minutes=5),
        status=ApprovalStatus.EXPIRED,
        step_status=StepStatus.DENIED,
        step_error='{"reason":"approval_timeout"}',
        events=("approval.expired", "step.denied"),
    ),
    ApprovalRow("sweep-before-the-timeout", EXPIRY, refusal=Conflict),
    ApprovalRow(
        "person-too-late-expires-it",
        GRANT,
        at=timedelta(minutes=5),
        status=ApprovalStatus.EXPIRED,
        step_status=StepStatus.DENIED,
        step_error='{"reason":"approval_timeout"}',
        late=True,
        events=("approval.expired", "step.denied"),
    ),
    ApprovalRow(
        "already-granted", GRANT, approval=approval(ApprovalStatus.GRANTED), refusal=Conflict
    ),
    ApprovalRow(
        "already-expired", EXPIRY, approval=approval(ApprovalStatus.EXPIRED), refusal=Conflict
    ),
    ApprovalRow(
        "not-an-approver", GRANT, approval=approval(approvers=("carol",)), refusal=Forbidden
    ),
    ApprovalRow(
        "an-approver-by-name",
        GRANT,
        approval=approval(approvers=("alice",)),
        status=ApprovalStatus.GRANTED,
        step_status=StepStatus.ALLOWED,
        asserted_by="bootstrap",
        events=("approval.granted", "step.allowed"),
    ),
    ApprovalRow(
        "an-approver-by-key",
        Resolution(ApprovalStatus.GRANTED, "bob", "", BOB_KEY),
        approval=approval(approvers=("key:key-9",)),
        status=ApprovalStatus.GRANTED,
        step_status=StepStatus.ALLOWED,
        asserted_by="key:key-9",
        events=("approval.granted", "step.allowed"),
    ),
    ApprovalRow(
        "anonymous-on-an-open-list",
        Resolution(ApprovalStatus.GRANTED, "", "", ANONYMOUS),
        status=ApprovalStatus.GRANTED,
        step_status=StepStatus.ALLOWED,
        asserted_by="anonymous",
        events=("approval.granted", "step.allowed"),
    ),
    ApprovalRow("its-step-gone", GRANT, step=None, refusal=Conflict),
]


@pytest.mark.parametrize("row", APPROVAL_ROWS, ids=lambda row: row.id)
def test_approval_resolution_row(row: ApprovalRow) -> None:
    record = execution(ExecutionStatus.BLOCKED)
    batch = batch_on(record, row.at)
    if row.refusal is not None:
        with pytest.raises(row.refusal):
            resolve(row.approval, row.step, row.asked, batch.now, batch)
        return
    resolved = resolve(row.approval, row.step, row.asked, batch.now, batch)
    assert resolved.approval.status is row.status
    assert resolved.approval.decided_at == batch.now
    assert resolved.approval.asserted_by == row.asserted_by
    assert resolved.step.status is row.step_status
    assert resolved.step.error == row.step_error
    assert resolved.late is row.late
    assert tuple(types(batch)) == row.events


# -- §10.1: an execution's end ---------------------------------------------------------------


@dataclass(frozen=True)
class EndRow:
    id: str
    ending: Ending
    start: ExecutionStatus
    status: ExecutionStatus | None = None
    events: tuple[str, ...] = ()
    refusal: type[KernelError] | None = None


END_ROWS = [
    EndRow(
        "complete-running",
        completed('{"answer":42}'),
        ExecutionStatus.RUNNING,
        ExecutionStatus.COMPLETED,
        ("execution.completed",),
    ),
    EndRow(
        "complete-pending-starts-it-first",
        completed('{"answer":42}'),
        ExecutionStatus.PENDING,
        ExecutionStatus.COMPLETED,
        ("execution.started", "execution.completed"),
    ),
    EndRow(
        "fail-running",
        failed("gave up"),
        ExecutionStatus.RUNNING,
        ExecutionStatus.FAILED,
        ("execution.failed",),
    ),
    EndRow(
        "exhausted-while-pending-never-started",
        EXHAUSTED,
        ExecutionStatus.PENDING,
        ExecutionStatus.FAILED,
        ("execution.failed",),
    ),
    EndRow(
        "exhausted-while-running",
        EXHAUSTED,
        ExecutionStatus.RUNNING,
        ExecutionStatus.FAILED,
        ("execution.failed",),
    ),
    EndRow(
        "terminal-is-never-overwritten",
        completed("1"),
        ExecutionStatus.FAILED,
        refusal=ExecutionTerminal,
    ),
]


@pytest.mark.parametrize("row", END_ROWS, ids=lambda row: row.id)
def test_execution_end_row(row: EndRow) -> None:
    ending = row.ending
    record = execution(row.start)
    batch = batch_on(record)
    if row.refusal is not None:
        with pytest.raises(row.refusal):
            finish(begin(record, ending, batch), ending, batch)
        return
    done = finish(begin(record, ending, batch), ending, batch)
    assert done.status is row.status
    assert tuple(types(batch)) == row.events


def test_a_completion_keeps_its_output_and_a_failure_its_reason() -> None:
    batch = batch_on(execution())
    done = finish(execution(), completed('{"answer":42}'), batch)
    assert done.output == '{"answer":42}'
    assert '"output":{"answer":42}' in batch.events[-1].payload
    failing = batch_on(execution())
    assert finish(execution(), failed("gave up"), failing).failure_reason == "gave up"
    assert finish(execution(), EXHAUSTED, batch_on(execution())).failure_reason == (
        "dispatch_exhausted"
    )


def test_a_null_state_is_none_kept() -> None:
    assert completed("1", "null").state is None
    assert completed("1", '{"turn":2}').state == '{"turn":2}'


@pytest.mark.parametrize(
    ("name", "record", "agent_id", "live", "refusal"),
    [
        ("admitted", execution(), AGENT, True, None),
        ("admitted-pending", execution(ExecutionStatus.PENDING), AGENT, True, None),
        ("another-agent", execution(), "someone-else", True, Forbidden),
        (
            "terminal-before-the-lease",
            execution(ExecutionStatus.COMPLETED),
            AGENT,
            False,
            ExecutionTerminal,
        ),
        ("lease-not-live", execution(), AGENT, False, LeaseSuperseded),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_gate_of_an_agent_write_that_ends_its_execution(
    name: str,
    record: Execution,
    agent_id: str,
    live: bool,
    refusal: type[KernelError] | None,
) -> None:
    if refusal is None:
        admit_write(record, agent_id, LEASE, live)
        return
    with pytest.raises(refusal):
        admit_write(record, agent_id, LEASE, live)


def test_a_cancel_expires_approvals_denies_their_steps_then_cancels_executing_steps() -> None:
    record = execution(ExecutionStatus.BLOCKED)
    held = [(approval(), step(StepStatus.AWAITING_APPROVAL, step_id="gated"))]
    running = [step(StepStatus.EXECUTING, step_id="running")]
    batch = batch_on(record)
    plan = cancel(record, "client_cancelled", held, running, batch)
    assert plan.execution.status is ExecutionStatus.CANCELLED
    assert plan.execution.failure_reason == "client_cancelled"
    assert types(batch) == [
        "execution.cancelled",
        "approval.expired",
        "step.denied",
        "step.cancelled",
    ]
    assert [a.status for a in plan.approvals] == [ApprovalStatus.EXPIRED]
    assert plan.approvals[0].rationale == "execution_cancelled"
    assert [(s.step_id, s.status) for s in plan.steps] == [
        ("gated", StepStatus.DENIED),
        ("running", StepStatus.CANCELLED),
    ]
    assert [s.step_id for s in plan.ended] == ["running"]


def test_a_cancel_leaves_a_settled_step_of_a_pending_approval_alone() -> None:
    held = [(approval(), step(StepStatus.DENIED)), (approval(), None)]
    batch = batch_on(execution())
    plan = cancel(execution(), "deadline_exceeded", held, [], batch)
    assert types(batch) == ["execution.cancelled", "approval.expired", "approval.expired"]
    assert plan.steps == []


def test_a_terminal_execution_is_not_cancelled() -> None:
    with pytest.raises(ExecutionTerminal):
        cancel(
            execution(ExecutionStatus.CANCELLED), "client_cancelled", [], [], batch_on(execution())
        )


# -- when a fast way may be taken -------------------------------------------------------------


def new_request(
    idempotency: Idempotency = Idempotency.SAFE_TO_RETRY, resources: tuple[str, ...] = ()
) -> StepRequest:
    return StepRequest(StepKind.TOOL_CALL, "web_search", "{}", "args-hash", idempotency, resources)


REPORT = StepRecord(new_request(), result="1")


@pytest.mark.parametrize(
    ("occurrence", "resources", "expected"),
    [(0, (), True), (None, (), False), (0, ("repo",), False)],
    ids=["own-occurrence", "kernel-counted", "declares-resources"],
)
def test_a_submission_may_skip_the_lock(
    occurrence: int | None, resources: tuple[str, ...], expected: bool
) -> None:
    assert eligibility.unlocked(occurrence, new_request(resources=resources)) is expected


def test_the_replay_read_answers_only_a_submission_that_carries_nothing() -> None:
    assert eligibility.may_replay(())
    assert not eligibility.may_replay((StepOutcome("step-0", result="1"),))


@pytest.mark.parametrize(
    ("record", "recorded", "expected"),
    [
        (execution(), step(StepStatus.SUCCEEDED), True),
        (execution(), step(StepStatus.FAILED), True),
        (execution(), None, False),
        (execution(), step(StepStatus.AWAITING_APPROVAL), False),
        (execution(has_resources=True), step(StepStatus.SUCCEEDED), False),
    ],
    ids=["succeeded", "failed", "not-recorded", "awaiting-approval", "with-resources"],
)
def test_what_the_replay_read_may_answer(
    record: Execution, recorded: Step | None, expected: bool
) -> None:
    assert eligibility.replayable(record, recorded) is expected


@dataclass(frozen=True)
class FollowRow:
    id: str
    expected: bool
    record: Execution = field(default_factory=execution)
    recorded: frozenset[str] = frozenset()
    agent_id: str = AGENT
    request: StepRequest = field(default_factory=new_request)
    outcomes: tuple[StepOutcome | StepRecord, ...] = ()


FOLLOW_ROWS = [
    FollowRow("a-new-step", True),
    FollowRow("carrying-a-completion", True, outcomes=(StepOutcome("step-0", result="1"),)),
    FollowRow("recorded-already", False, recorded=frozenset({"step-1"})),
    FollowRow("another-agent", False, agent_id="someone-else"),
    FollowRow("pending", False, record=execution(ExecutionStatus.PENDING)),
    FollowRow("blocked", False, record=execution(ExecutionStatus.BLOCKED)),
    FollowRow("with-resources", False, record=execution(has_resources=True)),
    FollowRow("at-most-once", False, request=new_request(Idempotency.AT_MOST_ONCE)),
    FollowRow("carrying-a-report", False, outcomes=(REPORT,)),
]


@pytest.mark.parametrize("row", FOLLOW_ROWS, ids=lambda row: row.id)
def test_when_a_followed_run_decides_a_submission(row: FollowRow) -> None:
    decided = eligibility.may_follow(
        row.record, row.recorded, row.agent_id, row.request, row.outcomes, "step-1"
    )
    assert decided is row.expected


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        (PolicyResult(PolicyAction.ALLOW, "", "ok"), True),
        (PolicyResult(PolicyAction.DENY, "no", "deny"), False),
        (PolicyResult(PolicyAction.REQUIRE_APPROVAL, "", "gate"), False),
        (
            PolicyResult(
                PolicyAction.ALLOW,
                "",
                "limit",
                rate_limit=RateLimit(3, timedelta(minutes=1), "execution", None, "deny"),
            ),
            False,
        ),
        (
            PolicyResult(PolicyAction.ALLOW, "", "budget", budget=Budget(100, PolicyAction.DENY)),
            False,
        ),
    ],
    ids=["allow", "deny", "approval", "rate-limited", "budgeted"],
)
def test_a_followed_run_acts_only_on_a_plain_allow(verdict: PolicyResult, expected: bool) -> None:
    assert eligibility.plainly_allowed(verdict) is expected


def test_a_followed_run_ends_on_what_it_knows_or_not_at_all() -> None:
    executing = {"step-0": step(step_id="step-0")}
    done = StepOutcome("step-0", result="1")
    unknown = StepOutcome("step-9", result="1")
    assert eligibility.followed_completions((), set(), executing) == []
    assert eligibility.followed_completions((done,), {"step-0"}, executing) == [executing["step-0"]]
    assert eligibility.followed_completions((unknown,), set(), executing) is None
    assert eligibility.followed_completions((REPORT,), set(), {}) == []
    assert eligibility.followed_completions((REPORT,), {"step-0"}, executing) is None


def test_an_acknowledgement_is_tried_on_the_claimed_record_unless_it_is_terminal() -> None:
    assert eligibility.acknowledged_optimistically(execution(ExecutionStatus.PENDING))
    assert not eligibility.acknowledged_optimistically(execution(ExecutionStatus.CANCELLED))
