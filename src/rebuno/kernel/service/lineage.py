"""Sub-agents (docs/protocol.md §25): the checks of a child's create, suspend, the settlement
of a parent's step by its child's end, the cancellation cascade, the resume rule, and the
sweep that repairs what a crash between an end and its follow-ups left.

Every end of an execution is followed, after its commit and each in a transaction of its own,
by: its session's release (§24.3), its parent step's settlement, then the cascade to its
children. The lock order (§12.8) is why these are follow-ups: the ending transaction holds
the execution's lock, and the follow-ups take a session's lock or another execution's.
Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import orjson

from rebuno.kernel.domain.errors import ExecutionTerminal, NotFound
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import mark_started, transition
from rebuno.kernel.domain.records import Execution, Lease
from rebuno.kernel.service.base import ServiceBase, flush, log
from rebuno.kernel.service.executions import ExecutionUseCases, lock_live
from rebuno.kernel.service.resources import settle as settle_resources
from rebuno.kernel.service.steps import record_outcome
from rebuno.kernel.store.base import Transaction
from rebuno.protocol.enums import ExecutionStatus, StepStatus
from rebuno.protocol.events import EventType

PARENT_AGENT_TERMINAL = "parent_agent_terminal"
AWAITING_STEPS = "awaiting_steps"


class LineageUseCases(ExecutionUseCases):
    async def after_end(self, record: Execution) -> None:
        """§24.3 and §25: the follow-ups of an end, in order. Each is idempotent, and a
        failure loses nothing: the lineage sweep repeats them."""
        follow_ups = []
        if record.session is not None:
            follow_ups.append(("release", self._release_of(record.session)))
        if record.spawned_by_execution_id is not None:
            follow_ups.append(("settlement", self.settle(record.id)))
        if record.has_children:
            follow_ups.append(("cascade", self.cascade(record.id)))
        for name, follow_up in follow_ups:
            try:
                await follow_up
            except Exception:
                log.warning(
                    "the %s after execution %s ended failed; the sweep will repeat it",
                    name,
                    record.id,
                    exc_info=True,
                )

    async def _release_of(self, session: str) -> None:
        await self.release_session(session)

    async def suspend(self, execution_id: str, agent_id: str, lease: Lease) -> bool:
        """§25.3: blocks the execution while any of its steps waits (for an approval, or for
        a live sub-agent), retiring its dispatches; answers whether it did. Settles first the
        steps whose sub-agent has already ended."""
        async with self.transaction(execution_id) as tx:
            now = self.clock()
            execution = (await lock_live(tx, execution_id, agent_id, lease, now)).execution
            batch = EventBatch(execution, now)
            execution = mark_started(execution, batch)
            children = await tx.list_children(execution_id)
            for child in children:
                if child.status.is_terminal:
                    await _settle_step(tx, child, batch, execution)
            waiting = await _waiting(tx, execution_id, children)
            if waiting:
                execution = transition(execution, ExecutionStatus.BLOCKED, now)
                batch.execution(EventType.EXECUTION_BLOCKED, execution, reason=AWAITING_STEPS)
                await tx.retire_dispatches(execution_id, now)
            await flush(tx, execution, batch)
        return waiting

    async def settle(self, child_id: str) -> None:
        """§25.4: an ended sub-agent's outcome becomes its step's, under the parent's lock;
        then the parent resumes if nothing else holds it up. Nothing happens when the parent
        ended or is gone, or the step was settled some other way meanwhile."""
        child = await self.store.get_execution(child_id)
        parent_id = child.spawned_by_execution_id
        if parent_id is None or not child.status.is_terminal:
            return
        async with self.transaction(parent_id) as tx:
            try:
                parent = await tx.get_execution(parent_id)
            except NotFound:
                return
            if parent.status.is_terminal:
                return
            batch = EventBatch(parent, self.clock())
            if not await _settle_step(tx, child, batch, parent):
                return
            parent = await resume_if_idle(self, tx, parent, batch)
            await flush(tx, parent, batch)
        self.wake()

    async def cascade(self, execution_id: str) -> None:
        """§25.6: every live child of an ended execution is cancelled as a client cancel
        would, with `parent_agent_terminal`; each cancel runs its own follow-ups, so the
        cascade walks the whole tree."""
        for child in await self.store.list_children(execution_id):
            if child.status.is_terminal:
                continue
            try:
                await self.cancel(child.id, PARENT_AGENT_TERMINAL)
            except (ExecutionTerminal, NotFound):
                continue  # ended or deleted since it was listed

    async def repair_lineage(self, limit: int) -> int:
        """§25.7, the lineage sweep: settles what a lost settlement left, cancels the live
        children of ended parents, resumes blocked executions nothing holds up, and admits
        the next turn of sessions left without a holder. How many it repaired."""
        repairs = await self.store.list_lineage_repairs(limit)
        for child_id in repairs.unsettled:
            await self.settle(child_id)
        for orphan_id in repairs.orphans:
            try:
                await self.cancel(orphan_id, PARENT_AGENT_TERMINAL)
            except (ExecutionTerminal, NotFound):
                continue
        for execution_id in repairs.stalled:
            await self._resume_stalled(execution_id)
        admitted = await self.admit_waiting(limit)
        return len(repairs.unsettled) + len(repairs.orphans) + len(repairs.stalled) + admitted

    async def _resume_stalled(self, execution_id: str) -> None:
        async with self.transaction(execution_id) as tx:
            execution = await tx.get_execution(execution_id)
            if await tx.list_pending_approvals(execution_id):
                return
            batch = EventBatch(execution, self.clock())
            execution = await resume_if_idle(self, tx, execution, batch)
            await flush(tx, execution, batch)
        self.wake()


async def resume_if_idle(
    base: ServiceBase, tx: Transaction, execution: Execution, batch: EventBatch
) -> Execution:
    """§25.5: a blocked execution resumes (a new dispatch) only when none of its steps waits
    any more; called by whatever ended a wait (a settlement, an approval's resolution), in
    its transaction."""
    if execution.status is not ExecutionStatus.BLOCKED:
        return execution
    if await _waiting(tx, execution.id, await tx.list_children(execution.id)):
        return execution
    resumed = transition(execution, ExecutionStatus.RUNNING, batch.now)
    batch.execution(EventType.EXECUTION_RESUMED, resumed)
    await base.enqueue(tx, batch, base.new_dispatch(execution.id, batch.now))
    return resumed


async def _waiting(tx: Transaction, execution_id: str, children: list[Execution]) -> bool:
    """§25.3: a step awaits an approval, or an executing step awaits a live sub-agent."""
    if await tx.list_steps_with_status(execution_id, StepStatus.AWAITING_APPROVAL):
        return True
    live = {c.spawned_by_step_id for c in children if not c.status.is_terminal}
    if not live:
        return False
    executing = await tx.list_steps_with_status(execution_id, StepStatus.EXECUTING)
    return any(step.step_id in live for step in executing)


async def _settle_step(
    tx: Transaction, child: Execution, batch: EventBatch, parent: Execution
) -> bool:
    """The parent's step takes the ended child's outcome, through the one way a step's
    outcome is recorded, and counts toward the parent's resources it affects (§33.6); False
    when the step no longer executes (settled already)."""
    step = None if child.spawned_by_step_id is None else await tx.get_step(child.spawned_by_step_id)
    if step is None or step.status is not StepStatus.EXECUTING:
        return False
    if child.status is ExecutionStatus.COMPLETED:
        done = record_outcome(step, child.output or "null", None, batch)
    else:
        reason = (
            "subagent_cancelled" if child.status is ExecutionStatus.CANCELLED else "subagent_failed"
        )
        error = {"reason": reason, "execution_id": child.id}
        if child.failure_reason:
            error["failure_reason"] = child.failure_reason
        done = record_outcome(step, None, orjson.dumps(error).decode(), batch)
    await tx.update_step(done)
    if parent.has_resources:
        await settle_resources(tx, parent, [done])
    return True
