"""The decisions of an execution's end (§10.1): its agent completes or fails it, its deliveries
are exhausted, or a client, the deadline or its parent's end cancels it; and the gate of an
agent's write that ends or blocks it (§5.2).

Each returns the execution as the end leaves it, with its events appended to the batch; what
else the caller writes (steps, approvals, dispatches retired) is in the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import Carried
from rebuno.kernel.domain.errors import ExecutionTerminal, lease_superseded
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.execution import check_owner, mark_started, transition
from rebuno.kernel.domain.records import Approval, Execution, Lease, RawJson, Step, replace
from rebuno.protocol.enums import ApprovalStatus, ExecutionStatus, StepStatus
from rebuno.protocol.events import EventType

CLIENT_CANCELLED = "client_cancelled"
DEADLINE_EXCEEDED = "deadline_exceeded"
DISPATCH_EXHAUSTED = "dispatch_exhausted"
PARENT_AGENT_TERMINAL = "parent_agent_terminal"
APPROVAL_CANCELLED = "execution_cancelled"


@dataclass(frozen=True, slots=True)
class Ending:
    """How an execution ends without a cancel: `completed` with its output, or `failed` with
    its reason."""

    status: ExecutionStatus
    output: RawJson | None = None
    reason: str = ""
    state: RawJson | None = None
    """What a completion keeps for the executions that continue this one (§24.5)."""
    reached: bool = True
    """The agent asked for this end, so a `pending` execution starts first; otherwise (every
    delivery failed) it fails without ever having started."""


EXHAUSTED = Ending(ExecutionStatus.FAILED, reason=DISPATCH_EXHAUSTED, reached=False)


@dataclass(frozen=True, slots=True)
class EndRequest:
    """An agent's complete or fail of its execution (§5.2), as its request makes it: the
    input of every way of deciding it."""

    execution_id: str
    agent_id: str | None
    lease: Lease
    ending: Ending
    outcomes: Sequence[Carried] = ()
    """What the request carries, recorded before the end."""


def completed(output: RawJson, state: RawJson | None = None) -> Ending:
    """The agent's complete; a `null` state is none."""
    return Ending(ExecutionStatus.COMPLETED, output, state=None if state == "null" else state)


def failed(reason: str) -> Ending:
    """The agent's fail."""
    return Ending(ExecutionStatus.FAILED, reason=reason)


def admit_write(execution: Execution, agent_id: str | None, lease: Lease, live: bool) -> None:
    """The gate of an agent's write that ends or blocks its execution (§5.2): its own
    (`Forbidden`), not terminal (`ExecutionTerminal`, checked before the lease), and the
    strong lease check (`LeaseSuperseded`); `live` is that check as the read made it."""
    check_owner(execution, agent_id)
    if execution.status.is_terminal:
        raise ExecutionTerminal(f"execution {execution.id} is already {execution.status}")
    if not live:
        raise lease_superseded(execution.id, lease)


def begin(execution: Execution, ending: Ending, batch: EventBatch) -> Execution:
    """Before the outcomes an ending request carries are recorded: a `pending` execution its
    agent reached starts (§10.1)."""
    return mark_started(execution, batch) if ending.reached else execution


def finish(execution: Execution, ending: Ending, batch: EventBatch) -> Execution:
    """The execution `completed` or `failed` as `ending` says, its event appended."""
    if ending.status is ExecutionStatus.COMPLETED:
        done = transition(execution, ending.status, batch.now, output=ending.output or "null")
        batch.execution(EventType.EXECUTION_COMPLETED, done, output=Raw(done.output or "null"))
        return done
    done = transition(execution, ending.status, batch.now, failure_reason=ending.reason)
    batch.execution(EventType.EXECUTION_FAILED, done, reason=ending.reason)
    return done


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A cancel's writes besides its events and the dispatches it retires."""

    execution: Execution
    approvals: list[Approval]
    """The pending approvals, expired."""
    steps: list[Step]
    """The steps those approvals held, denied; then the executing steps, cancelled."""
    ended: list[Step]
    """The executing steps it cancelled: they count toward their resources (§33.6)."""


def cancel(
    execution: Execution,
    reason: str,
    held: Sequence[tuple[Approval, Step | None]],
    executing: Sequence[Step],
    batch: EventBatch,
) -> Cancelled:
    """§10.1: cancelled with `reason`, then each pending approval (`held`, with its step)
    expired and its step denied, then each executing step cancelled; in that order in the
    log."""
    cancelled = transition(execution, ExecutionStatus.CANCELLED, batch.now, failure_reason=reason)
    batch.execution(EventType.EXECUTION_CANCELLED, cancelled, reason=reason)
    approvals: list[Approval] = []
    denied: list[Step] = []
    for approval, step in held:
        approvals.append(_expired(approval, batch))
        if step is not None and not step.status.is_terminal:
            done = steps.finish(step, StepStatus.DENIED, batch.now, error=steps.CANCELLED_ERROR)
            batch.step(EventType.STEP_DENIED, done, error=steps.CANCELLED_ERROR)
            denied.append(done)
    ended: list[Step] = []
    for step in executing:
        done = steps.finish(step, StepStatus.CANCELLED, batch.now, error=steps.CANCELLED_ERROR)
        batch.step(EventType.STEP_CANCELLED, done, error=steps.CANCELLED_ERROR)
        ended.append(done)
    return Cancelled(cancelled, approvals, denied + ended, ended)


def _expired(approval: Approval, batch: EventBatch) -> Approval:
    batch.approval(
        EventType.APPROVAL_EXPIRED,
        approval.id,
        approval.step_id,
        ApprovalStatus.EXPIRED,
        rationale=APPROVAL_CANCELLED,
    )
    return replace(
        approval,
        status=ApprovalStatus.EXPIRED,
        decided_at=batch.now,
        rationale=APPROVAL_CANCELLED,
    )
