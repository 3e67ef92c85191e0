"""Approval use cases (§15): create on `require_approval`, grant, deny, expire.

An approval is resolved exactly once: every resolution re-reads it under the execution's
lock and refuses unless it is still pending, so a grant racing the expiry loop loses or wins
cleanly. Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

from dataclasses import replace

from rebuno.kernel import metrics
from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.errors import Conflict, Forbidden
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.principal import Principal
from rebuno.kernel.domain.records import Approval
from rebuno.kernel.service.base import ServiceBase, flush
from rebuno.kernel.service.lineage import resume_if_idle
from rebuno.kernel.store.base import Transaction
from rebuno.protocol.enums import ApprovalStatus, StepStatus
from rebuno.protocol.events import EventType

_RESOLUTION_EVENT = {
    ApprovalStatus.GRANTED: EventType.APPROVAL_GRANTED,
    ApprovalStatus.DENIED: EventType.APPROVAL_DENIED,
    ApprovalStatus.EXPIRED: EventType.APPROVAL_EXPIRED,
}


class ApprovalUseCases(ServiceBase):
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
        await self._resolve(approval_id, status, decided_by, rationale, principal)

    async def expire_approval(self, approval_id: str) -> bool:
        """Background expiry; False when the approval was already resolved."""
        try:
            await self._resolve(approval_id, ApprovalStatus.EXPIRED, "", "timeout")
        except Conflict:
            return False
        return True

    async def _resolve(
        self,
        approval_id: str,
        status: ApprovalStatus,
        decided_by: str,
        rationale: str,
        principal: Principal | None = None,
    ) -> None:
        """A person's decision that arrives at or after `timeout_at` resolves the approval as
        expired, whenever the expiry sweep runs (§15), and is then refused with `Conflict`.
        `principal` is who decided; None for the expiry sweep."""
        execution_id = (await self.store.get_approval(approval_id)).execution_id
        late = False
        async with self.transaction(execution_id) as tx:
            approval = await tx.get_approval(approval_id)
            if approval.status is not ApprovalStatus.PENDING:
                raise Conflict(f"approval {approval_id} is already {approval.status}")
            now = self.clock()
            late = status is not ApprovalStatus.EXPIRED and now >= approval.timeout_at
            if late:
                status, decided_by, rationale = ApprovalStatus.EXPIRED, "", "timeout"
            asserted_by = None  # only a person's decision names who asserted it
            if status is not ApprovalStatus.EXPIRED and principal is not None:
                asserted_by = principal.id
                _check_approver(approval, decided_by, principal)
            execution = await tx.get_execution(execution_id)
            if status is ApprovalStatus.EXPIRED and now < approval.timeout_at:
                raise Conflict(f"approval {approval_id} has not timed out")
            batch = EventBatch(execution, now)
            resolved = replace(
                approval,
                status=status,
                decided_by=decided_by or None,
                decided_at=now,
                rationale=rationale or None,
                asserted_by=asserted_by,
            )
            await tx.update_approval(resolved)
            metrics.approval_resolved(status, approval.created_at, now)
            batch.approval(
                _RESOLUTION_EVENT[status],
                approval.id,
                approval.step_id,
                status,
                decided_by=decided_by,
                rationale=rationale,
                asserted_by=asserted_by,
            )
            await self._settle_step(tx, approval.step_id, status, rationale, batch)
            # §25.5: it resumes unless another step still waits (an approval, a sub-agent).
            resumed = await resume_if_idle(self, tx, execution, batch)
            await flush(tx, resumed, batch)
        self.wake()
        if late:
            raise Conflict(f"approval {approval_id} expired at {approval.timeout_at.isoformat()}")

    async def _settle_step(
        self,
        tx: Transaction,
        step_id: str,
        status: ApprovalStatus,
        rationale: str,
        batch: EventBatch,
    ) -> None:
        step = await tx.get_step(step_id)
        if step is None:
            raise Conflict(f"step {step_id} of the approval is gone")
        if status is ApprovalStatus.GRANTED:
            allowed = steps.allow(step)
            await tx.update_step(allowed)
            batch.step(EventType.STEP_ALLOWED, allowed)
            return
        reason = "approval_timeout" if status is ApprovalStatus.EXPIRED else rationale
        error = steps.reason_error(reason or "approval_denied")
        denied = steps.finish(step, StepStatus.DENIED, batch.now, error=error)
        await tx.update_step(denied)
        batch.step(EventType.STEP_DENIED, denied, error=error)


def _check_approver(approval: Approval, decided_by: str, principal: Principal) -> None:
    """A non-empty approver list admits the name decided as, or `key:<id>` of the very key
    deciding (§34.5); with a scoped key, the name is the key's own."""
    if not principal.may_approve(approval.approvers, decided_by):
        raise Forbidden(f"{decided_by or 'an anonymous caller'} may not decide {approval.id}")
