"""The decision of a step's outcome (§9): completing or failing an executing step, whether the
agent reports it on its own route, carries it on its next request, or a sub-agent's end
settles it (§25.4).

`outcome` is the one way a step leaves `executing` with a result or an error; `complete`
decides the agent's own complete and fail routes in §9's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import StepDecision
from rebuno.kernel.domain.dispatch import same_attempt
from rebuno.kernel.domain.errors import Conflict, NotFound, lease_superseded
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import check_owner
from rebuno.kernel.domain.records import Dispatch, Execution, Lease, RawJson, Step
from rebuno.kernel.domain.usage import extract_usage
from rebuno.protocol.enums import Decision, StepKind, StepStatus
from rebuno.protocol.events import EventType


def outcome(step: Step, result: RawJson | None, error: RawJson | None, batch: EventBatch) -> Step:
    """The step `succeeded` with `result` (with the token usage an `llm_call`'s result
    reports, §14.9), else `failed` with `error`; its event appended."""
    if result is not None:
        usage = extract_usage(result) if step.kind is StepKind.LLM_CALL else None
        done = steps.finish(step, StepStatus.SUCCEEDED, batch.now, result=result, usage=usage)
        usage_fields = {"input_tokens": usage[0], "output_tokens": usage[1]} if usage else None
        batch.step(EventType.STEP_SUCCEEDED, done, usage=usage_fields)
        return done
    done = steps.finish(step, StepStatus.FAILED, batch.now, error=error)
    batch.step(EventType.STEP_FAILED, done, error=error)
    return done


def usage_missing(step: Step) -> bool:
    """An `llm_call` that succeeded without reporting its usage: its tokens count for no
    budget (counted by the caller, which may do I/O)."""
    return (
        step.kind is StepKind.LLM_CALL
        and step.status is StepStatus.SUCCEEDED
        and step.usage_input is None
    )


@dataclass(frozen=True, slots=True)
class Reported:
    """What an agent reports on a step's complete or fail route (§9): `result` for complete,
    `error` for fail."""

    agent_id: str
    step_id: str
    lease: Lease
    result: RawJson | None = None
    error: RawJson | None = None


def complete(
    execution: Execution,
    step: Step | None,
    dispatch: Dispatch | None,
    reported: Reported,
    batch: EventBatch,
) -> tuple[StepDecision, Step | None]:
    """§9 in its order: the step exists (`NotFound`), the owner (`Forbidden`), a terminal
    execution (answered), the weak lease check (`LeaseSuperseded`), a terminal step (its
    recorded outcome replayed, never rewritten), a step not executing (`Conflict`), then the
    outcome. Returns the answer and the step to write, if any."""
    if step is None:
        raise NotFound(f"step {reported.step_id} not found in execution {execution.id}")
    check_owner(execution, reported.agent_id)
    if execution.status.is_terminal:
        return StepDecision(Decision.EXECUTION_TERMINAL), None
    if not same_attempt(dispatch, reported.lease):
        raise lease_superseded(execution.id, reported.lease)
    if step.status.is_terminal:
        if reported.result is not None:
            return StepDecision(Decision.REPLAY, result=step.result or "null"), None
        return StepDecision(Decision.REPLAY, error=step.error or "{}"), None
    if step.status is not StepStatus.EXECUTING:
        raise Conflict(f"step {step.step_id} is {step.status}, not executing")
    done = outcome(step, reported.result, reported.error, batch)
    return StepDecision(Decision.RECORDED), done
