"""The decision table of a step submission (§8.2), one case per row, without a store: each
case builds the typed values `decide` reads by hand and checks its answer, the writes of its
plan and the events it appends, in order, as the table's columns say. The gate before the
table (§8.1, steps 2 to 4) has its cases too, and the table's row names are read from
docs/protocol.md so the document and these cases cannot drift apart.

The occurrence count (§8.1, step 8) is checked with the writes: it advances for every answer
that names a step as a counted decision, or that blocks on a step's approval (§7.3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

# Every name of the decision core, in one place.
from rebuno.kernel.decision.submission import (
    Facts,
    LeaseView,
    Plan,
    Rules,
    Slot,
    Submitted,
    admit,
    decide,
)
from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import StepDecision, StepRequest
from rebuno.kernel.domain.errors import Forbidden, LeaseSuperseded
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Execution, Lease, Origin, RawJson, Step
from rebuno.kernel.policy.engine import ApprovalConfig, Budget, PolicyResult, RateLimit
from rebuno.protocol.enums import (
    Decision,
    ExecutionStatus,
    Idempotency,
    PolicyAction,
    StepKind,
    StepStatus,
)
from tests.support import START

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
AGENT = "researcher"
EXECUTION_ID = "execution-1"
STEP_ID = "step-1"
APPROVAL_ID = "approval-1"
LAST_SEQ = 6
"""The execution's log before the submission; its events continue from here."""
LEASE = Lease("dispatch-1", 1)
SAFE = Idempotency.SAFE_TO_RETRY
ONCE = Idempotency.AT_MOST_ONCE
RULES = Rules(approval_timeout=timedelta(hours=1), new_id=lambda: APPROVAL_ID)

DENIED_ERROR = '{"reason":"no shell here","rule_id":"deny-shell"}'
FAILED_ERROR = '{"message":"boom"}'
ALLOW = PolicyResult(PolicyAction.ALLOW, "searching is fine", "allow-search", policy_hash="p1")
DENY = PolicyResult(PolicyAction.DENY, "no shell here", "deny-shell", policy_hash="p1")
DENY_SILENTLY = PolicyResult(PolicyAction.DENY, "", "deny-shell")
GATE = PolicyResult(
    PolicyAction.REQUIRE_APPROVAL,
    "a person decides",
    "gate-shell",
    approval=ApprovalConfig(("alice",), timedelta(minutes=5), "run it?"),
    policy_hash="p1",
)


def limited(max_wait: timedelta | None) -> PolicyResult:
    limit = RateLimit(3, timedelta(minutes=1), "execution", max_wait, "deny")
    return PolicyResult(PolicyAction.ALLOW, "", "limit-search", rate_limit=limit)


def budgeted(on_exceed: PolicyAction) -> PolicyResult:
    return PolicyResult(PolicyAction.ALLOW, "", "budget-tokens", budget=Budget(100, on_exceed))


def execution(status: ExecutionStatus = ExecutionStatus.RUNNING) -> Execution:
    return Execution(
        id=EXECUTION_ID,
        agent_id=AGENT,
        origin=Origin(agent_version=None, input="{}", created_at=START, deadline_at=None),
        status=status,
        output=None,
        failure_reason=None,
        updated_at=START,
        last_event_seq=LAST_SEQ,
    )


def recorded(
    status: StepStatus,
    *,
    idempotency: Idempotency = SAFE,
    result: RawJson | None = None,
    error: RawJson | None = None,
) -> Step:
    return Step(
        step_id=STEP_ID,
        execution_id=EXECUTION_ID,
        kind=StepKind.TOOL_CALL,
        target="web_search",
        args_hash="args-hash",
        occurrence=0,
        status=status,
        idempotency=idempotency,
        args='{"query":"durable agents"}',
        result=result,
        error=error,
        usage_input=None,
        usage_output=None,
        proposed_seq=2,
        started_at=START if status is StepStatus.EXECUTING else None,
        completed_at=None,
    )


def request(idempotency: Idempotency = SAFE) -> StepRequest:
    return StepRequest(
        StepKind.TOOL_CALL, "web_search", '{"query":"durable agents"}', "args-hash", idempotency
    )


def submitted(
    step: Step | None = None,
    *,
    status: ExecutionStatus = ExecutionStatus.RUNNING,
    idempotency: Idempotency = SAFE,
    verdict: PolicyResult | None = None,
    facts: Facts | None = None,
    agent_id: str = AGENT,
    live: bool = True,
    kernel_counted: bool = True,
) -> Submitted:
    """A submission at occurrence 0 of the one step key; `step` is what is recorded there."""
    approval_id = APPROVAL_ID if step and step.status is StepStatus.AWAITING_APPROVAL else None
    slot = Slot(0, STEP_ID, step, kernel_counted=kernel_counted, approval_id=approval_id)
    return Submitted(
        execution(status),
        agent_id,
        request(idempotency),
        slot,
        LeaseView(LEASE, live),
        verdict=verdict,
        facts=facts or Facts(),
    )


@dataclass(frozen=True)
class Writes:
    """What a plan writes besides its events, in the table's terms."""

    insert_step: StepStatus | None = None
    update_step: StepStatus | None = None
    step_error: RawJson | None = None
    """The error of the step written, when it has one."""
    approval: str | None = None
    retire_dispatches: bool = False
    park: tuple[float, float] | None = None
    execution: ExecutionStatus = ExecutionStatus.RUNNING
    advance_occurrence: bool = False


COUNTED = Writes(advance_occurrence=True)


def writes_of(plan: Plan) -> Writes:
    written = plan.insert_step or plan.update_step
    return Writes(
        insert_step=plan.insert_step.status if plan.insert_step else None,
        update_step=plan.update_step.status if plan.update_step else None,
        step_error=written.error if written else None,
        approval=plan.approval.id if plan.approval else None,
        retire_dispatches=plan.retire_dispatches,
        park=plan.park,
        execution=plan.execution.status,
        advance_occurrence=plan.advance_occurrence,
    )


Event = tuple[str, dict[str, object]]


def event(event_type: str, **fields: object) -> Event:
    """An expected event: its type and the payload members the table names. A member given
    as None must be absent."""
    return event_type, fields


def matches(expected: Event, event_type: str, payload: dict[str, object]) -> bool:
    wanted_type, fields = expected
    return wanted_type == event_type and all(
        name not in payload if value is None else payload.get(name) == value
        for name, value in fields.items()
    )


@dataclass(frozen=True)
class Row:
    """One row of §8.2: the situation, and the answer, writes and events it must give."""

    id: str
    given: Submitted
    answer: StepDecision
    writes: Writes = field(default_factory=Writes)
    events: tuple[Event, ...] = ()


def error(text: RawJson) -> object:
    parsed: object = orjson.loads(text)
    return parsed


PROPOSED = event("step.proposed")
DENIED_EVENTS = (
    PROPOSED,
    event("step.denied", rule_id="deny-shell", error=error(DENIED_ERROR)),
)
BLOCKED_EVENTS = (
    PROPOSED,
    event("step.awaiting_approval", rule_id="gate-shell"),
    event("approval.requested", approval_id=APPROVAL_ID, status="pending"),
    event("execution.blocked", status="blocked"),
)
HELD = Writes(
    insert_step=StepStatus.AWAITING_APPROVAL,
    approval=APPROVAL_ID,
    retire_dispatches=True,
    execution=ExecutionStatus.BLOCKED,
    advance_occurrence=True,
)
BUDGET = steps.BUDGET_EXCEEDED_REASON
RATE_LIMITED_ERROR = {"reason": "rate_limit_exceeded", "rule_id": "limit-search"}
SPENT = Facts(spent_tokens=100)

RECORDED_ROWS = [
    Row(
        "R1",
        submitted(recorded(StepStatus.SUCCEEDED, result='{"hits":3}')),
        StepDecision(Decision.REPLAY, STEP_ID, result='{"hits":3}'),
        COUNTED,
    ),
    Row(
        "R1-null-result",
        submitted(recorded(StepStatus.SUCCEEDED)),
        StepDecision(Decision.REPLAY, STEP_ID, result="null"),
        COUNTED,
    ),
    Row(
        "R2-failed",
        submitted(recorded(StepStatus.FAILED, error=FAILED_ERROR)),
        StepDecision(Decision.REPLAY, STEP_ID, error=FAILED_ERROR),
        COUNTED,
    ),
    Row(
        "R2-cancelled",
        submitted(recorded(StepStatus.CANCELLED, error=steps.CANCELLED_ERROR)),
        StepDecision(Decision.REPLAY, STEP_ID, error=steps.CANCELLED_ERROR),
        COUNTED,
    ),
    Row(
        "R3",
        submitted(recorded(StepStatus.AWAITING_APPROVAL)),
        StepDecision(Decision.BLOCKED, STEP_ID, approval_id=APPROVAL_ID),
        COUNTED,
    ),
    Row(
        "R4-allowed",
        submitted(recorded(StepStatus.ALLOWED)),
        StepDecision(Decision.PROCEED, STEP_ID),
        Writes(update_step=StepStatus.EXECUTING, advance_occurrence=True),
        (event("step.executing", rule_id=None),),
    ),
    Row(
        "R4-proposed",
        submitted(recorded(StepStatus.PROPOSED)),
        StepDecision(Decision.PROCEED, STEP_ID),
        Writes(update_step=StepStatus.EXECUTING, advance_occurrence=True),
        (event("step.executing"),),
    ),
    Row(
        "R4-at-most-once",
        submitted(recorded(StepStatus.ALLOWED, idempotency=ONCE), idempotency=ONCE),
        StepDecision(Decision.PROCEED, STEP_ID),
        Writes(update_step=StepStatus.EXECUTING, advance_occurrence=True),
        (event("step.executing"),),
    ),
    # R5 goes by the idempotency submitted now, so the recorded one is the other (§13).
    Row(
        "R5a",
        submitted(recorded(StepStatus.EXECUTING, idempotency=ONCE), idempotency=SAFE),
        StepDecision(Decision.PROCEED, STEP_ID),
        COUNTED,
    ),
    Row(
        "R5b",
        submitted(recorded(StepStatus.EXECUTING, idempotency=SAFE), idempotency=ONCE),
        StepDecision(Decision.REPLAY, STEP_ID, error=steps.INDETERMINATE_ERROR),
        Writes(
            update_step=StepStatus.FAILED,
            step_error=steps.INDETERMINATE_ERROR,
            advance_occurrence=True,
        ),
        (event("step.failed", error=error(steps.INDETERMINATE_ERROR)),),
    ),
    Row(
        "R6",
        submitted(recorded(StepStatus.DENIED, error=DENIED_ERROR)),
        StepDecision(Decision.DENIED, STEP_ID, reason="no shell here", rule_id="deny-shell"),
        COUNTED,
    ),
    Row(
        "R6-nothing-recorded",
        submitted(recorded(StepStatus.DENIED)),
        StepDecision(Decision.DENIED, STEP_ID, reason="policy_denied"),
        COUNTED,
    ),
]

NEW_ROWS = [
    Row(
        "N0",
        submitted(status=ExecutionStatus.BLOCKED),
        StepDecision(Decision.EXECUTION_BLOCKED),
        Writes(execution=ExecutionStatus.BLOCKED),
    ),
    Row(
        "N1",
        submitted(verdict=ALLOW),
        StepDecision(Decision.PROCEED, STEP_ID),
        Writes(insert_step=StepStatus.EXECUTING, advance_occurrence=True),
        (
            PROPOSED,
            event("step.allowed", rule_id="allow-search", policy_hash="p1"),
            event("step.executing"),
        ),
    ),
    Row(
        "N1-budget-left",
        submitted(verdict=budgeted(PolicyAction.DENY), facts=Facts(spent_tokens=99)),
        StepDecision(Decision.PROCEED, STEP_ID),
        Writes(insert_step=StepStatus.EXECUTING, advance_occurrence=True),
        (PROPOSED, event("step.allowed", rule_id="budget-tokens"), event("step.executing")),
    ),
    Row(
        "N2",
        submitted(verdict=DENY),
        StepDecision(Decision.DENIED, STEP_ID, reason="no shell here", rule_id="deny-shell"),
        Writes(insert_step=StepStatus.DENIED, step_error=DENIED_ERROR, advance_occurrence=True),
        DENIED_EVENTS,
    ),
    Row(
        "N2-no-reason",
        submitted(verdict=DENY_SILENTLY),
        StepDecision(Decision.DENIED, STEP_ID, reason="policy_denied", rule_id="deny-shell"),
        Writes(
            insert_step=StepStatus.DENIED,
            step_error='{"reason":"policy_denied","rule_id":"deny-shell"}',
            advance_occurrence=True,
        ),
        (PROPOSED, event("step.denied", rule_id="deny-shell")),
    ),
    Row(
        "N3",
        submitted(verdict=GATE),
        StepDecision(Decision.BLOCKED, STEP_ID, approval_id=APPROVAL_ID),
        HELD,
        BLOCKED_EVENTS,
    ),
    Row(
        "N4-deny",
        submitted(verdict=budgeted(PolicyAction.DENY), facts=SPENT),
        StepDecision(Decision.DENIED, STEP_ID, reason=BUDGET, rule_id="budget-tokens"),
        Writes(
            insert_step=StepStatus.DENIED,
            step_error=steps.reason_error(BUDGET, "budget-tokens"),
            advance_occurrence=True,
        ),
        (PROPOSED, event("step.denied", rule_id="budget-tokens")),
    ),
    Row(
        "N4-require-approval",
        submitted(verdict=budgeted(PolicyAction.REQUIRE_APPROVAL), facts=SPENT),
        StepDecision(Decision.BLOCKED, STEP_ID, approval_id=APPROVAL_ID),
        HELD,
        (PROPOSED, event("step.awaiting_approval", rule_id="budget-tokens"), *BLOCKED_EVENTS[2:]),
    ),
    Row(
        "N5",
        submitted(idempotency=ONCE, verdict=ALLOW, facts=Facts(indeterminate=True)),
        StepDecision(
            Decision.DENIED,
            STEP_ID,
            reason=steps.INDETERMINATE_RETRY_REASON,
            rule_id=steps.INDETERMINATE_RETRY_RULE,
        ),
        Writes(
            insert_step=StepStatus.DENIED,
            step_error=steps.reason_error(
                steps.INDETERMINATE_RETRY_REASON, steps.INDETERMINATE_RETRY_RULE
            ),
            advance_occurrence=True,
        ),
        (PROPOSED, event("step.denied", rule_id=steps.INDETERMINATE_RETRY_RULE)),
    ),
    Row(
        "N1-safe-to-retry-after-indeterminate",
        submitted(idempotency=SAFE, verdict=ALLOW, facts=Facts(indeterminate=True)),
        StepDecision(Decision.PROCEED, STEP_ID),
        Writes(insert_step=StepStatus.EXECUTING, advance_occurrence=True),
        (PROPOSED, event("step.allowed"), event("step.executing")),
    ),
    Row(
        "N6",
        submitted(verdict=limited(None), facts=Facts(rate_wait=2.0)),
        StepDecision(Decision.RATE_LIMITED, reason="rate_limit_exceeded", rule_id="limit-search"),
        Writes(),
        (event("step.rate_limited", rule_id="limit-search", error=RATE_LIMITED_ERROR),),
    ),
    Row(
        "N6-wait-too-long",
        submitted(verdict=limited(timedelta(seconds=30)), facts=Facts(rate_wait=31.0)),
        StepDecision(Decision.RATE_LIMITED, reason="rate_limit_exceeded", rule_id="limit-search"),
        Writes(),
        (event("step.rate_limited", rule_id="limit-search"),),
    ),
    Row(
        "N6-parked-once-already",
        submitted(
            verdict=limited(timedelta(seconds=30)),
            facts=Facts(rate_wait=2.0, rate_limited_before=True),
        ),
        StepDecision(Decision.RATE_LIMITED, reason="rate_limit_exceeded", rule_id="limit-search"),
        Writes(),
        (event("step.rate_limited", rule_id="limit-search"),),
    ),
    # The `dispatch.queued` of N7 is the caller's: the plan's `park` asks for it.
    Row(
        "N7",
        submitted(verdict=limited(timedelta(seconds=30)), facts=Facts(rate_wait=2.0)),
        StepDecision(Decision.BLOCKED, reason="rate_limit_exceeded"),
        Writes(retire_dispatches=True, park=(2.0, 30.0)),
        (event("step.rate_limited", rule_id="limit-search", error=RATE_LIMITED_ERROR),),
    ),
]

ROWS = RECORDED_ROWS + NEW_ROWS


def decided(given: Submitted) -> tuple[Plan, EventBatch]:
    batch = EventBatch(given.execution, START)
    return decide(given, batch, RULES), batch


def appended(batch: EventBatch) -> list[tuple[str, dict[str, object]]]:
    return [(e.type, orjson.loads(e.payload)) for e in batch.events]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_each_row_answers_writes_and_logs_as_the_table_says(row: Row) -> None:
    plan, batch = decided(row.given)

    assert plan.decision == row.answer
    assert writes_of(plan) == row.writes
    events = appended(batch)
    assert [t for t, _ in events] == [t for t, _ in row.events]
    for expected, (event_type, payload) in zip(row.events, events, strict=True):
        assert matches(expected, event_type, payload), (expected, payload)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_every_event_a_row_appends_is_of_its_step_and_continues_the_log(row: Row) -> None:
    _, batch = decided(row.given)

    assert [e.event_seq for e in batch.events] == list(
        range(LAST_SEQ + 1, LAST_SEQ + 1 + len(batch.events))
    )
    assert all(
        payload["step_id"] == STEP_ID
        for event_type, payload in appended(batch)
        if event_type.startswith(("step.", "approval."))
    )


def test_every_row_of_the_document_has_a_case_and_every_case_a_row() -> None:
    section = PROTOCOL.read_text(encoding="utf-8").split("### §8.2 Decision table")[1]
    section = section.split("\n## ")[0]
    documented = set(re.findall(r"^\| ([RN][0-9]+[a-z]?) \|", section, re.MULTILINE))

    assert documented >= {"R1", "R5b", "N0", "N7"}  # the scan itself works
    assert {row.id.split("-")[0] for row in ROWS} == documented


def test_a_blocked_rows_approval_waits_the_rules_timeout_or_else_the_default() -> None:
    unconfigured = PolicyResult(PolicyAction.REQUIRE_APPROVAL, "", "gate-shell")
    configured, _ = decided(submitted(verdict=GATE))
    default, _ = decided(submitted(verdict=unconfigured))

    assert configured.approval is not None and default.approval is not None
    assert configured.approval.timeout_at == START + timedelta(minutes=5)
    assert configured.approval.approvers == ("alice",)
    assert default.approval.timeout_at == START + RULES.approval_timeout
    assert default.approval.approvers is None


# The gate (§8.1, steps 2 to 4): the owner, then an execution that ended, then the lease.


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        pytest.param(submitted(verdict=ALLOW, agent_id="mallory"), Forbidden, id="another-agent"),
        pytest.param(
            submitted(status=ExecutionStatus.COMPLETED, agent_id="mallory"),
            Forbidden,
            id="another-agent-before-terminal",
        ),
        pytest.param(submitted(verdict=ALLOW, live=False), LeaseSuperseded, id="lease-not-live"),
        pytest.param(
            submitted(recorded(StepStatus.SUCCEEDED), live=False),
            LeaseSuperseded,
            id="lease-not-live-before-replay",
        ),
    ],
)
def test_the_gate_refuses_before_anything_is_written(
    given: Submitted, refusal: type[Exception]
) -> None:
    batch = EventBatch(given.execution, START)

    with pytest.raises(refusal):
        decide(given, batch, RULES)
    with pytest.raises(refusal):
        admit(given.execution, given.agent_id, given.lease)
    assert batch.events == []


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(submitted(status=status, verdict=ALLOW), id=f"new-step-{status}")
        for status in (ExecutionStatus.COMPLETED, ExecutionStatus.FAILED)
    ]
    + [
        pytest.param(
            submitted(recorded(StepStatus.SUCCEEDED), status=ExecutionStatus.CANCELLED),
            id="recorded-step-cancelled",
        ),
        pytest.param(submitted(status=ExecutionStatus.COMPLETED, live=False), id="lease-not-live"),
    ],
)
def test_an_execution_that_ended_answers_execution_terminal_and_writes_nothing(
    given: Submitted,
) -> None:
    plan, batch = decided(given)

    assert plan.decision == StepDecision(Decision.EXECUTION_TERMINAL)
    assert plan.writes_nothing(batch)
    assert admit(given.execution, given.agent_id, given.lease) == plan.decision


def test_a_pending_execution_starts_before_its_first_step_is_logged() -> None:
    plan, batch = decided(submitted(status=ExecutionStatus.PENDING, verdict=ALLOW))

    assert plan.execution.status is ExecutionStatus.RUNNING
    assert [e.type for e in batch.events] == [
        "execution.started",
        "step.proposed",
        "step.allowed",
        "step.executing",
    ]


def test_the_agents_own_occurrence_number_is_not_counted_by_the_kernel() -> None:
    plan, _ = decided(submitted(recorded(StepStatus.SUCCEEDED), kernel_counted=False))

    assert plan.decision.decision is Decision.REPLAY
    assert not plan.advance_occurrence


def test_a_lease_not_renewed_recently_is_renewed_by_the_submission() -> None:
    given = submitted(recorded(StepStatus.SUCCEEDED))
    stale = Submitted(
        given.execution, AGENT, given.request, given.slot, LeaseView(LEASE, True, renewed=False)
    )

    assert decided(stale)[0].renew_lease
    assert not decided(given)[0].renew_lease
