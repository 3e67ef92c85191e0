"""Approval use cases (§15): list and read, grant, deny, and the expiry sweep's expire.

A resolution is decided by `decision.approval.resolve` on the approval and its step as read
under the execution's lock, so a grant racing the expiry loop loses or wins cleanly; the
execution then resumes unless another step still waits (§25.5).
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

from rebuno.kernel import metrics
from rebuno.kernel.decision.approval import EXPIRY, Resolution, resolve
from rebuno.kernel.domain.errors import Conflict
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.principal import Principal
from rebuno.kernel.domain.records import Approval
from rebuno.kernel.service.blocking import resume_if_idle
from rebuno.kernel.service.context import Context, flush
from rebuno.protocol.enums import ApprovalStatus


class ApprovalUseCases(Context):
    async def list_approvals(
        self, status: ApprovalStatus | None, execution_id: str | None
    ) -> list[Approval]:
        return await self.store.list_approvals(status, execution_id)

    async def get_approval(self, approval_id: str) -> Approval:
        return await self.store.get_approval(approval_id)

    async def grant_approval(
        self, approval_id: str, decided_by: str, rationale: str, principal: Principal
    ) -> None:
        """`principal`: who made the request (§34.5). A scoped key decides as its own name
        only; the bootstrap token and anonymous dev callers name the person themselves."""
        await self._decide(approval_id, ApprovalStatus.GRANTED, decided_by, rationale, principal)

    async def deny_approval(
        self, approval_id: str, decided_by: str, rationale: str, principal: Principal
    ) -> None:
        await self._decide(approval_id, ApprovalStatus.DENIED, decided_by, rationale, principal)

    async def _decide(
        self,
        approval_id: str,
        status: ApprovalStatus,
        named: str,
        rationale: str,
        principal: Principal,
    ) -> None:
        # Refused before anything is read, so another name costs the caller nothing to find.
        decided_by = principal.decider(named)
        await self._resolve(approval_id, Resolution(status, decided_by, rationale, principal))

    async def expire_approval(self, approval_id: str) -> bool:
        """Background expiry; False when the approval was already resolved."""
        try:
            await self._resolve(approval_id, EXPIRY)
        except Conflict:
            return False
        return True

    async def _resolve(self, approval_id: str, asked: Resolution) -> None:
        """`asked`, decided under the execution's lock; a person's decision that came too
        late is recorded as the expiry it became, then refused with `Conflict`."""
        execution_id = (await self.store.get_approval(approval_id)).execution_id
        async with self.transaction(execution_id) as tx:
            approval = await tx.get_approval(approval_id)
            step = await tx.get_step(approval.step_id)
            execution = await tx.get_execution(execution_id)
            batch = EventBatch(execution, self.clock())
            resolved = resolve(approval, step, asked, batch.now, batch)
            await tx.update_approval(resolved.approval)
            await tx.update_step(resolved.step)
            metrics.approval_resolved(resolved.approval.status, approval.created_at, batch.now)
            # §25.5: it resumes unless another step still waits (an approval, a sub-agent).
            resumed = await resume_if_idle(self, tx, execution, batch)
            await flush(tx, resumed, batch)
        self.wake()
        if resolved.late:
            raise Conflict(f"approval {approval_id} expired at {approval.timeout_at.isoformat()}")
