"""Whether an execution waits, and its resume (§25.3, §25.5): a blocked execution resumes only
when none of its steps waits any more, for an approval or for a live sub-agent.

A transaction fragment: it imports no use case. Must not import a concrete store backend, the
API, or httpx.
"""

from __future__ import annotations

from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import transition
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.context import Context
from rebuno.kernel.store.base import Transaction
from rebuno.protocol.enums import ExecutionStatus, StepStatus
from rebuno.protocol.events import EventType

AWAITING_STEPS = "awaiting_steps"
"""The reason of an `execution.blocked` a suspend writes (§25.3)."""


async def waiting(tx: Transaction, execution_id: str, children: list[Execution]) -> bool:
    """§25.3: a step awaits an approval, or an executing step awaits a live sub-agent."""
    if await tx.list_steps_with_status(execution_id, StepStatus.AWAITING_APPROVAL):
        return True
    live = {c.origin.spawned_by_step_id for c in children if not c.status.is_terminal}
    if not live:
        return False
    executing = await tx.list_steps_with_status(execution_id, StepStatus.EXECUTING)
    return any(step.step_id in live for step in executing)


async def resume_if_idle(
    context: Context, tx: Transaction, execution: Execution, batch: EventBatch
) -> Execution:
    """§25.5: a blocked execution resumes (a new dispatch) only when none of its steps waits
    any more; called by whatever ended a wait (a settlement, an approval's resolution), in
    its transaction."""
    if execution.status is not ExecutionStatus.BLOCKED:
        return execution
    if await waiting(tx, execution.id, await tx.list_children(execution.id)):
        return execution
    resumed = transition(execution, ExecutionStatus.RUNNING, batch.now)
    batch.execution(EventType.EXECUTION_RESUMED, resumed)
    await context.enqueue(tx, batch, context.new_dispatch(execution.id, batch.now))
    return resumed
