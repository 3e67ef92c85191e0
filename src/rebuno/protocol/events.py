"""Event type names (`aggregate.past_tense`), exactly as the event log carries them."""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    EXECUTION_CREATED = "execution.created"
    EXECUTION_STARTED = "execution.started"
    EXECUTION_BLOCKED = "execution.blocked"
    EXECUTION_RESUMED = "execution.resumed"
    EXECUTION_COMPLETED = "execution.completed"
    EXECUTION_FAILED = "execution.failed"
    EXECUTION_CANCELLED = "execution.cancelled"
    EXECUTION_FORKED = "execution.forked"
    STEP_PROPOSED = "step.proposed"
    STEP_ALLOWED = "step.allowed"
    STEP_DENIED = "step.denied"
    STEP_AWAITING_APPROVAL = "step.awaiting_approval"
    STEP_RATE_LIMITED = "step.rate_limited"
    STEP_EXECUTING = "step.executing"
    STEP_SUCCEEDED = "step.succeeded"
    STEP_FAILED = "step.failed"
    STEP_CANCELLED = "step.cancelled"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_GRANTED = "approval.granted"
    APPROVAL_DENIED = "approval.denied"
    APPROVAL_EXPIRED = "approval.expired"
    DISPATCH_QUEUED = "dispatch.queued"
    DISPATCH_ACKED = "dispatch.acked"
    DISPATCH_FAILED = "dispatch.failed"
    DISPATCH_DISCARDED = "dispatch.discarded"
    RESOURCE_REGISTERED = "resource.registered"
    RESOURCE_BOUND = "resource.bound"
    RESOURCE_INITIALIZED = "resource.initialized"
    RESOURCE_CHECKPOINTED = "resource.checkpointed"
    RESOURCE_CHECKPOINT_FAILED = "resource.checkpoint_failed"


LEASE_EXPIRED = "lease_expired"
"""The `redelivery` member of a dispatch event whose attempt redelivers an execution because
the previous attempt's lease was reclaimed: it expired, or a restarted agent instance ended it
(docs/protocol.md §11.2)."""
