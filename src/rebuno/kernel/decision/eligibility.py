"""When a fast way may be taken: the unlocked replay read and the followed run (docs/protocol.md
§8.1, docs/extensions.md).

A fast way decides with the same functions as the locked script, on what it knows without the
lock, and writes (if at all) in one statement that applies only while that knowledge holds.
These predicates say when it may try; each is conservative: False sends the caller the locked
way, which is always correct.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from rebuno.kernel.decision.submission import has_budget, has_rate_limit
from rebuno.kernel.domain.decision import Carried, StepOutcome, StepRecord, StepRequest
from rebuno.kernel.domain.records import Execution, Step
from rebuno.kernel.policy.engine import PolicyResult
from rebuno.protocol.enums import ExecutionStatus, Idempotency, PolicyAction, StepStatus


def unlocked(occurrence: int | None, request: StepRequest) -> bool:
    """A submission may skip the lock at all only at the agent's own occurrence
    (`step-occurrences`: its step id is known before anything is read) and when it declares
    no resources (a live step touches them, §33.5)."""
    return occurrence is not None and not request.resources


def may_replay(outcomes: Sequence[Carried]) -> bool:
    """The unlocked replay read answers a submission that carries nothing to record."""
    return not outcomes


def replayable(execution: Execution, step: Step | None) -> bool:
    """What the unlocked read found may be answered from it: a recorded step whose answer
    reads nothing more (not one awaiting approval, whose pending approval is not part of the
    read), in an execution without resources (a re-run touches them)."""
    return (
        step is not None
        and not execution.has_resources
        and step.status is not StepStatus.AWAITING_APPROVAL
    )


def may_follow(
    execution: Execution,
    recorded: Collection[str],
    agent_id: str,
    request: StepRequest,
    outcomes: Sequence[Carried],
    step_id: str,
) -> bool:
    """A followed run decides a submission on the record this process last wrote when it is
    a new step (`step_id` not among those `recorded`) of the agent's own running execution
    without resources, not `at_most_once` (its indeterminate rule reads), carrying only
    completions (a reported step takes an occurrence counter)."""
    return (
        step_id not in recorded
        and execution.agent_id == agent_id
        and execution.status is ExecutionStatus.RUNNING
        and not execution.has_resources
        and request.idempotency is not Idempotency.AT_MOST_ONCE
        and not any(isinstance(o, StepRecord) for o in outcomes)
    )


def plainly_allowed(verdict: PolicyResult) -> bool:
    """A verdict a followed run may act on: an allow with no rate limit or token budget, so
    deciding it reads nothing more (§14.7, §14.9)."""
    return (
        verdict.action is PolicyAction.ALLOW
        and not has_rate_limit(verdict)
        and not has_budget(verdict)
    )


def followed_completions(
    outcomes: Sequence[Carried], recorded: Collection[str], executing: Mapping[str, Step]
) -> list[Step] | None:
    """The steps a followed run's end completes, when it may end on what it knows: every
    completion names a step the run knows executing, and reported steps come only on a run
    with no step recorded yet (they take its first occurrences). None otherwise."""
    completing: list[Step] = []
    for outcome in outcomes:
        if isinstance(outcome, StepRecord):
            if recorded:
                return None
        elif isinstance(outcome, StepOutcome) and outcome.step_id in executing:
            completing.append(executing[outcome.step_id])
        else:
            return None
    return completing


def acknowledged_optimistically(execution: Execution) -> bool:
    """A delivery's answer is first recorded on the record its claim read, unless that record
    is terminal already."""
    return not execution.status.is_terminal
