"""`Submitter` (docs/protocol.md §8): a step that proceeds runs its body once, inside the step, and
its outcome is recorded as its idempotency asks; a body unwinding the dispatch is no failure;
under `step-records` a safe step runs first and is reported; every other decision raises."""

from __future__ import annotations

from typing import Any

import pytest

from rebuno.sdk._carried import Carrier
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import Completion, Report, encode_json
from rebuno.sdk._resources import Resources
from rebuno.sdk._submission import Submitter, current_step
from rebuno.sdk._suspension import Suspension
from rebuno.sdk.errors import (
    Blocked,
    PolicyError,
    RateLimited,
    RebunoError,
    Terminated,
    ToolError,
)
from rebuno.types import StepDecision
from tests.sdk.conftest import Harness
from tests.sdk.context.conftest import idle, statuses

ARGS = encode_json({"a": 1, "b": 2})


def submitter(
    dispatch: Dispatch, *, carry: bool = True, report: bool = False
) -> tuple[Submitter, Carrier]:
    """A submitter of `dispatch`'s steps that numbers none, and what it carries."""
    carrier = Carrier(dispatch, carry=carry, report=report)
    resources = Resources(dispatch, carrier)
    return Submitter(dispatch, carrier, None, resources, Suspension(dispatch)), carrier


async def test_a_proceeding_body_runs_once_inside_its_step_and_its_result_waits(
    harness: Harness, dispatch: Dispatch
) -> None:
    steps, carrier = submitter(dispatch)
    seen: list[str | None] = []

    def add() -> int:
        seen.append(current_step())
        return 3

    result = await steps.invoke("local", "add", ARGS, "safe_to_retry", add)

    [recorded] = await harness.client.list_steps(dispatch.execution_id)
    assert result == 3
    assert seen == [recorded.step_id]
    assert current_step() is None
    assert recorded.status == "executing"
    assert carrier.take() == [Completion(recorded.step_id, b"3")]


async def test_an_at_most_once_result_is_recorded_before_invoke_returns(
    harness: Harness, dispatch: Dispatch
) -> None:
    steps, carrier = submitter(dispatch)

    await steps.invoke("tool_call", "charge", ARGS, "at_most_once", lambda: "charged")

    [recorded] = await harness.client.list_steps(dispatch.execution_id)
    assert (recorded.status, recorded.result) == ("succeeded", "charged")
    assert carrier.take() == []


async def test_a_failing_body_is_recorded_at_once_and_raised_as_a_tool_error(
    harness: Harness, dispatch: Dispatch
) -> None:
    steps, _ = submitter(dispatch)

    def broken() -> None:
        raise ValueError("upstream said no")

    with pytest.raises(ToolError) as raised:
        await steps.invoke("tool_call", "fetch", ARGS, "safe_to_retry", broken)

    [recorded] = await harness.client.list_steps(dispatch.execution_id)
    assert raised.value.step_id == recorded.step_id
    assert recorded.status == "failed"
    assert recorded.error == {"message": "upstream said no", "type": "ValueError"}


async def test_a_body_unwinding_the_dispatch_leaves_its_step_open(
    harness: Harness, dispatch: Dispatch
) -> None:
    steps, _ = submitter(dispatch)

    def unwinds() -> None:
        raise Blocked()

    with pytest.raises(Blocked):
        await steps.invoke("tool_call", "ask", ARGS, "safe_to_retry", unwinds)

    assert list((await statuses(harness, dispatch.execution_id)).values()) == ["executing"]


async def test_under_step_records_a_safe_step_runs_first_and_waits_to_be_reported(
    harness: Harness, dispatch: Dispatch
) -> None:
    steps, carrier = submitter(dispatch, report=True)

    result = await steps.run_unsubmitted("local", "add", ARGS, lambda: 3)

    assert result == 3
    assert await harness.client.list_steps(dispatch.execution_id) == []
    assert carrier.take() == [Report("local", "add", ARGS, result=b"3")]


def decided(decision: str, **fields: Any) -> StepDecision:
    return StepDecision(decision=decision, step_id="s" * 64, **fields)


@pytest.mark.parametrize(
    ("decision", "raised", "remembered"),
    [
        (decided("denied", reason="no shell", rule_id="r1"), PolicyError, False),
        (decided("rate_limited", rule_id="r2"), RateLimited, False),
        (decided("blocked"), Blocked, True),
        (decided("execution_blocked"), Blocked, True),
        (decided("execution_terminal"), Terminated, True),
        (decided("proceed"), RebunoError, False),
    ],
    ids=lambda value: value.decision if isinstance(value, StepDecision) else "",
)
def test_a_refusal_is_the_exception_its_decision_names(
    decision: StepDecision, raised: type[RebunoError], remembered: bool
) -> None:
    dispatch = idle()
    steps, _ = submitter(dispatch)

    error = steps.refusal(decision)

    assert type(error) is raised
    assert error.step_id == decision.step_id
    assert (dispatch.signal is error) is remembered


@pytest.mark.parametrize(
    ("decision", "expected"),
    [
        (decided("denied", reason="no shell", rule_id="r1"), ("no shell", "r1")),
        (decided("denied"), ("policy_denied", "")),
        (decided("rate_limited"), ("rate_limit_exceeded", "")),
    ],
)
def test_a_policy_refusal_says_why_and_names_its_rule(
    decision: StepDecision, expected: tuple[str, str]
) -> None:
    steps, _ = submitter(idle())

    error = steps.refusal(decision)

    assert isinstance(error, PolicyError | RateLimited)
    assert (error.reason, error.rule_id) == expected


def test_an_unknown_decision_is_an_error_not_a_guess() -> None:
    steps, _ = submitter(idle())

    with pytest.raises(RebunoError, match="unknown step decision 'maybe'"):
        steps.refusal(decided("maybe"))
