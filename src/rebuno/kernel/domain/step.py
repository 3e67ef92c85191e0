"""Step state machine (§10.2) and the error shapes steps record.

Must not import anything outside `rebuno.protocol` and the domain.
"""

from __future__ import annotations

from datetime import datetime

import orjson

from rebuno.kernel.domain.errors import Conflict
from rebuno.kernel.domain.records import RawJson, Step, replace
from rebuno.protocol.enums import StepStatus

INDETERMINATE_MESSAGE = (
    "outcome unknown: this may already have taken effect. Check the state before continuing."
)
INDETERMINATE_ERROR: RawJson = orjson.dumps(
    {"reason": "indeterminate", "message": INDETERMINATE_MESSAGE}
).decode()
INDETERMINATE_RETRY_RULE = "__indeterminate_retry"
INDETERMINATE_RETRY_REASON = "prior attempt outcome unknown; retry refused"
BUDGET_EXCEEDED_REASON = "execution_token_budget_exceeded"
CANCELLED_ERROR: RawJson = '{"reason":"execution_cancelled"}'


def reason_error(reason: str, rule_id: str = "") -> RawJson:
    fields = {"reason": reason, "rule_id": rule_id} if rule_id else {"reason": reason}
    return orjson.dumps(fields).decode()


def error_reason(error: RawJson | None) -> tuple[str, str]:
    """`(reason, rule_id)` recorded in a step error, empty strings when absent."""
    if not error:
        return "", ""
    try:
        value = orjson.loads(error)
    except orjson.JSONDecodeError:
        return "", ""
    if not isinstance(value, dict):
        return "", ""
    reason, rule_id = value.get("reason"), value.get("rule_id")
    return (
        reason if isinstance(reason, str) else "",
        rule_id if isinstance(rule_id, str) else "",
    )


def finish(
    step: Step,
    status: StepStatus,
    now: datetime,
    *,
    result: RawJson | None = None,
    error: RawJson | None = None,
    usage: tuple[int, int] | None = None,
) -> Step:
    """Moves a live step to a terminal status; a terminal step is never rewritten."""
    if step.status.is_terminal:
        raise Conflict(f"step {step.step_id} is already {step.status}")
    return replace(
        step,
        status=status,
        result=result,
        error=error,
        usage_input=usage[0] if usage else step.usage_input,
        usage_output=usage[1] if usage else step.usage_output,
        completed_at=now,
    )


def start(step: Step, now: datetime) -> Step:
    if step.status not in (StepStatus.PROPOSED, StepStatus.ALLOWED):
        raise Conflict(f"step {step.step_id} is {step.status}, not startable")
    return replace(step, status=StepStatus.EXECUTING, started_at=now)


def allow(step: Step) -> Step:
    if step.status is not StepStatus.AWAITING_APPROVAL:
        raise Conflict(f"step {step.step_id} is {step.status}, not awaiting approval")
    return replace(step, status=StepStatus.ALLOWED)
