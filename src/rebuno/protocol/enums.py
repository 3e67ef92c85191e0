"""Enumerations whose values are the wire strings. Standard library only."""

from __future__ import annotations

from enum import StrEnum


class ExecutionStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_EXECUTION


_TERMINAL_EXECUTION = frozenset(
    {ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED}
)


class StepKind(StrEnum):
    TOOL_CALL = "tool_call"
    LLM_CALL = "llm_call"
    LOCAL = "local"


class Idempotency(StrEnum):
    SAFE_TO_RETRY = "safe_to_retry"
    AT_MOST_ONCE = "at_most_once"


class StepStatus(StrEnum):
    PROPOSED = "proposed"
    ALLOWED = "allowed"
    DENIED = "denied"
    AWAITING_APPROVAL = "awaiting_approval"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_STEP


_TERMINAL_STEP = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.DENIED, StepStatus.CANCELLED}
)


class Decision(StrEnum):
    """What `POST .../steps` (and complete/fail) answers."""

    PROCEED = "proceed"
    REPLAY = "replay"
    DENIED = "denied"
    RATE_LIMITED = "rate_limited"
    BLOCKED = "blocked"
    EXECUTION_BLOCKED = "execution_blocked"
    EXECUTION_TERMINAL = "execution_terminal"
    RECORDED = "recorded"


COUNTED_DECISIONS = frozenset({Decision.PROCEED, Decision.REPLAY, Decision.DENIED})
"""Decisions about a recorded step that advance its key's occurrence count (§7.3), as does a
block on the step's approval."""


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"


class DispatchStatus(StrEnum):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    FAILED = "failed"
    EXHAUSTED = "exhausted"


class PolicyAction(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    REQUIRE_APPROVAL = "require_approval"


class Scope(StrEnum):
    """What a scoped API key may do (§34.2); write never implies read."""

    EXECUTIONS_READ = "executions:read"
    EXECUTIONS_WRITE = "executions:write"
    APPROVALS_READ = "approvals:read"
    APPROVALS_WRITE = "approvals:write"
    AGENTS_READ = "agents:read"
    AGENTS_WRITE = "agents:write"
    POLICIES_WRITE = "policies:write"
    API_KEYS_MANAGE = "api_keys:manage"
