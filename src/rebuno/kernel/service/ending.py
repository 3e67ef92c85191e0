"""Ending an execution inside a transaction (§10.1): the read that gates an agent's write that
ends or blocks it, the agent's complete or fail (and the failure of exhausted deliveries), and
a cancel, each writing what `decision.ending` decided.

The follow-ups of an end run after its commit, in transactions of their own
(`follow_ups.py`). A transaction fragment: it imports no use case. Must not import a concrete
store backend, the API, or httpx.
"""

from __future__ import annotations

from datetime import datetime

from rebuno.kernel.decision import ending as rules
from rebuno.kernel.decision.ending import Ending
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Execution, Lease, replace
from rebuno.kernel.service.context import Context, flush
from rebuno.kernel.service.recording import Carrying, record_carried, settle
from rebuno.kernel.store.base import NOTHING_WANTED, Locked, Transaction, Wanted
from rebuno.protocol.enums import ExecutionStatus, StepStatus


async def lock_live(
    tx: Transaction,
    execution_id: str,
    agent_id: str | None,
    lease: Lease,
    now: datetime,
    wanted: Wanted = NOTHING_WANTED,
) -> Locked:
    """The execution under its lock for an agent's write that ends or blocks it, admitted by
    `ending.admit_write`; the lease renewed by the read. With `wanted`, what recording the
    outcomes the request carries reads, read with it."""
    locked = await tx.lock_execution(execution_id, lease, now, wanted)
    rules.admit_write(locked.execution, agent_id, lease, locked.lease_live)
    return locked


async def finish_execution(
    tx: Transaction,
    execution: Execution,
    ending: Ending,
    now: datetime,
    carrying: Carrying | None = None,
) -> Execution:
    """Completes or fails an execution the caller has locked and admitted, first recording
    what the request carries (`carrying`); its dispatches retire. Returns the record as
    written. The occurrences reported steps reach are not stored: the dispatch retires with
    the run."""
    batch = EventBatch(execution, now)
    execution = rules.begin(execution, ending, batch)
    if carrying is not None:
        await record_carried(tx, execution, replace(carrying, counted=False), batch)
    done = rules.finish(execution, ending, batch)
    if ending.state is not None and done.status is ExecutionStatus.COMPLETED:
        await tx.set_state(execution.id, ending.state)
    await tx.retire_dispatches(execution.id, now)
    return await flush(tx, done, batch)


async def cancelled(context: Context, execution_id: str, reason: str) -> Execution:
    """§10.1's cancel, in one transaction under the execution's lock: cancelled, pending
    approvals expired and their steps denied, executing steps cancelled (they count toward
    their resources, §33.6), dispatches retired. Returns the record as written; refuses a
    terminal execution with `ExecutionTerminal`."""
    async with context.transaction(execution_id) as tx:
        execution = await tx.get_execution(execution_id)
        batch = EventBatch(execution, context.clock())
        pending = await tx.list_pending_approvals(execution_id)
        held = [(approval, await tx.get_step(approval.step_id)) for approval in pending]
        executing = await tx.list_steps_with_status(execution_id, StepStatus.EXECUTING)
        plan = rules.cancel(execution, reason, held, executing, batch)
        for approval in plan.approvals:
            await tx.update_approval(approval)
        for step in plan.steps:
            await tx.update_step(step)
        if plan.ended and execution.has_resources:
            await settle(tx, execution, plan.ended)
        await tx.retire_dispatches(execution_id, batch.now)
        return await flush(tx, plan.execution, batch)
