"""Lineage use cases (§24, §25): a parent's suspend while its steps wait for sub-agents, the
lineage sweep that repairs what a crash between an end and its follow-ups left, and the
retention of whole sessions (§24.6).

The settlement, the cascade and a session's release are follow-ups of an end
(`follow_ups.py`), run by every use case that ends an execution and repeated here by the sweep.
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

from datetime import datetime

from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import mark_started, transition
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.blocking import AWAITING_STEPS, resume_if_idle, waiting
from rebuno.kernel.service.context import Context, flush
from rebuno.kernel.service.ending import lock_live
from rebuno.kernel.service.follow_ups import cancel_orphan, settle_child, settle_step
from rebuno.kernel.service.starting import release_session
from rebuno.kernel.store.base import session_lock
from rebuno.protocol.enums import ExecutionStatus
from rebuno.protocol.events import EventType


class LineageUseCases(Context):
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
                    await settle_step(tx, child, batch, execution)
            blocked = await waiting(tx, execution_id, children)
            if blocked:
                execution = transition(execution, ExecutionStatus.BLOCKED, now)
                batch.execution(EventType.EXECUTION_BLOCKED, execution, reason=AWAITING_STEPS)
                await tx.retire_dispatches(execution_id, now)
            await flush(tx, execution, batch)
        return blocked

    async def repair_lineage(self, limit: int) -> int:
        """§25.7, the lineage sweep: settles what a lost settlement left, cancels the live
        children of ended parents, resumes blocked executions nothing holds up, and admits
        the next turn of sessions left without a holder. How many it repaired."""
        repairs = await self.store.list_lineage_repairs(limit)
        for child_id in repairs.unsettled:
            await settle_child(self, child_id)
        for orphan_id in repairs.orphans:
            await cancel_orphan(self, orphan_id)
        for execution_id in repairs.stalled:
            await self._resume_stalled(execution_id)
        admitted = await self.admit_waiting(limit)
        return len(repairs.unsettled) + len(repairs.orphans) + len(repairs.stalled) + admitted

    async def admit_waiting(self, limit: int) -> int:
        """The lineage sweep: releases the sessions a lost follow-up left with waiters and no
        holder; how many it looked at."""
        sessions = await self.store.list_sessions_to_admit(limit)
        for session in sessions:
            await release_session(self, session)
        return len(sessions)

    async def delete_expired_sessions(self, cutoff: datetime, limit: int) -> int:
        """Retention of sessions (§24.6): each whole, in a transaction of its own under its
        lock; how many executions went."""
        deleted = 0
        for session in await self.store.list_expired_sessions(cutoff, limit):
            async with self.transaction() as tx:
                await tx.take_lock(session_lock(session))
                deleted += await tx.delete_expired_session(session, cutoff)
        return deleted

    async def _resume_stalled(self, execution_id: str) -> None:
        async with self.transaction(execution_id) as tx:
            execution = await tx.get_execution(execution_id)
            if await tx.list_pending_approvals(execution_id):
                return
            batch = EventBatch(execution, self.clock())
            execution = await resume_if_idle(self, tx, execution, batch)
            await flush(tx, execution, batch)
        self.wake()
