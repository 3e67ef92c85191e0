"""Execution state machine (§10.1): legal transitions, each returning a new record.

Must not import anything outside `rebuno.protocol` and the domain.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rebuno.kernel.domain.errors import ExecutionTerminal, Forbidden
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Execution, Origin, RawJson, replace
from rebuno.protocol.enums import ExecutionStatus
from rebuno.protocol.events import EventType

_ALLOWED: dict[ExecutionStatus, frozenset[ExecutionStatus]] = {
    # A pending execution fails without starting when its agent was never reached (§10.1).
    ExecutionStatus.PENDING: frozenset(
        {ExecutionStatus.RUNNING, ExecutionStatus.CANCELLED, ExecutionStatus.FAILED}
    ),
    ExecutionStatus.RUNNING: frozenset(
        {
            ExecutionStatus.BLOCKED,
            ExecutionStatus.COMPLETED,
            ExecutionStatus.FAILED,
            ExecutionStatus.CANCELLED,
        }
    ),
    ExecutionStatus.BLOCKED: frozenset(
        {ExecutionStatus.RUNNING, ExecutionStatus.CANCELLED, ExecutionStatus.FAILED}
    ),
}


def transition(
    execution: Execution,
    status: ExecutionStatus,
    now: datetime,
    *,
    output: RawJson | None = None,
    failure_reason: str | None = None,
) -> Execution:
    """Moves to `status`; a terminal execution refuses with `ExecutionTerminal`."""
    if execution.status.is_terminal:
        raise ExecutionTerminal(f"execution {execution.id} is already {execution.status}")
    if status not in _ALLOWED[execution.status]:
        raise ExecutionTerminal(
            f"execution {execution.id} cannot go from {execution.status} to {status}"
        )
    return replace(
        execution,
        status=status,
        output=output if output is not None else execution.output,
        failure_reason=failure_reason if failure_reason is not None else execution.failure_reason,
        updated_at=now,
    )


def pending(
    execution_id: str,
    agent_id: str,
    origin: Origin,
    *,
    parent_execution_id: str | None = None,
    admitted_at: datetime | None = None,
) -> Execution:
    """A new execution, `pending`, as `origin` creates it (§5.1)."""
    return Execution(
        id=execution_id,
        agent_id=agent_id,
        origin=origin,
        status=ExecutionStatus.PENDING,
        output=None,
        failure_reason=None,
        updated_at=origin.created_at,
        last_event_seq=0,
        parent_execution_id=parent_execution_id,
        admitted_at=admitted_at,
    )


def deadline_after(now: datetime, deadline: timedelta | None) -> datetime | None:
    """When an execution created `now` is past its deadline (§17); None without one."""
    return now + deadline if deadline else None


def check_owner(execution: Execution, agent_id: str | None) -> None:
    """An agent (HMAC caller) may only touch its own executions."""
    if agent_id is not None and execution.agent_id != agent_id:
        raise Forbidden(f"execution {execution.id} belongs to another agent")


def mark_started(execution: Execution, batch: EventBatch) -> Execution:
    """The first time the agent is reached, `pending` becomes `running` (§10.1), once."""
    if execution.status is not ExecutionStatus.PENDING:
        return execution
    started = transition(execution, ExecutionStatus.RUNNING, batch.now)
    # §24.7: the execution it continues, when it has one.
    batch.execution(
        EventType.EXECUTION_STARTED, started, parent_execution_id=started.parent_execution_id
    )
    return started


def spawned_by(execution: Execution) -> dict[str, str] | None:
    """The `spawned_by` member of a sub-agent's representation and `execution.created`."""
    origin = execution.origin
    if origin.spawned_by_execution_id is None or origin.spawned_by_step_id is None:
        return None
    return {
        "execution_id": origin.spawned_by_execution_id,
        "step_id": origin.spawned_by_step_id,
    }
