"""The decision of an approval's resolution (§15): a person's grant or deny, or the expiry
sweep's, and what it does to the step it holds.

An approval is resolved exactly once: `resolve` refuses one that is no longer pending, and its
caller reads the approval under the execution's lock, so a grant racing the expiry sweep wins
or loses cleanly. A person's decision that arrives at or after `timeout_at` resolves it as
expired, whenever the sweep runs, and the caller refuses the request after that commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.errors import Conflict, Forbidden
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.principal import Principal
from rebuno.kernel.domain.records import Approval, Step, replace
from rebuno.protocol.enums import ApprovalStatus, StepStatus
from rebuno.protocol.events import EventType

TIMEOUT_RATIONALE = "timeout"

_EVENTS = {
    ApprovalStatus.GRANTED: EventType.APPROVAL_GRANTED,
    ApprovalStatus.DENIED: EventType.APPROVAL_DENIED,
    ApprovalStatus.EXPIRED: EventType.APPROVAL_EXPIRED,
}


@dataclass(frozen=True, slots=True)
class Resolution:
    """How an approval is asked to end: granted or denied by a person, with the name decided
    as, why, and the principal of the request (§34.5); or expired by the sweep."""

    status: ApprovalStatus
    decided_by: str = ""
    rationale: str = ""
    principal: Principal | None = None
    """Who made the request; None for the expiry sweep."""


EXPIRY = Resolution(ApprovalStatus.EXPIRED, rationale=TIMEOUT_RATIONALE)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The approval and its step as the resolution leaves them."""

    approval: Approval
    step: Step
    late: bool
    """A person decided at or after `timeout_at`: it was resolved as expired instead, and
    the request is refused once that is recorded."""


def resolve(
    approval: Approval, step: Step | None, asked: Resolution, now: datetime, batch: EventBatch
) -> Resolved:
    """`asked` applied to the pending `approval` at `now`, its events appended: refused
    (`Conflict`) unless pending, turned into an expiry when a person is late, refused
    (`Forbidden`) to a person the approver list does not admit, and refused (`Conflict`) to
    the sweep before the timeout. The step it holds is allowed on a grant, denied otherwise."""
    if approval.status is not ApprovalStatus.PENDING:
        raise Conflict(f"approval {approval.id} is already {approval.status}")
    late = asked.status is not ApprovalStatus.EXPIRED and now >= approval.timeout_at
    if late:
        asked = EXPIRY
    asserted_by = None  # only a person's decision names who asserted it
    if asked.status is not ApprovalStatus.EXPIRED and asked.principal is not None:
        asserted_by = asked.principal.id
        _check_approver(approval, asked.decided_by, asked.principal)
    if asked.status is ApprovalStatus.EXPIRED and now < approval.timeout_at:
        raise Conflict(f"approval {approval.id} has not timed out")
    resolved = replace(
        approval,
        status=asked.status,
        decided_by=asked.decided_by or None,
        decided_at=now,
        rationale=asked.rationale or None,
        asserted_by=asserted_by,
    )
    batch.approval(
        _EVENTS[asked.status],
        approval.id,
        approval.step_id,
        asked.status,
        decided_by=asked.decided_by,
        rationale=asked.rationale,
        asserted_by=asserted_by,
    )
    return Resolved(resolved, _settle(approval, step, asked, batch), late)


def _settle(approval: Approval, step: Step | None, asked: Resolution, batch: EventBatch) -> Step:
    """The held step: allowed on a grant (it runs when submitted again, R4), else denied with
    the reason a resubmission answers (R6)."""
    if step is None:
        raise Conflict(f"step {approval.step_id} of the approval is gone")
    if asked.status is ApprovalStatus.GRANTED:
        allowed = steps.allow(step)
        batch.step(EventType.STEP_ALLOWED, allowed)
        return allowed
    expired = asked.status is ApprovalStatus.EXPIRED
    reason = "approval_timeout" if expired else asked.rationale
    error = steps.reason_error(reason or "approval_denied")
    denied = steps.finish(step, StepStatus.DENIED, batch.now, error=error)
    batch.step(EventType.STEP_DENIED, denied, error=error)
    return denied


def _check_approver(approval: Approval, decided_by: str, principal: Principal) -> None:
    """A non-empty approver list admits the name decided as, or `key:<id>` of the very key
    deciding (§34.5); with a scoped key, the name is the key's own."""
    if not principal.may_approve(approval.approvers, decided_by):
        raise Forbidden(f"{decided_by or 'an anonymous caller'} may not decide {approval.id}")
