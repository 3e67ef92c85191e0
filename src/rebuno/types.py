"""The resource models `Client` and the agent runtime read from the kernel.

Every model ignores fields it does not know, so a newer kernel never breaks an older SDK, and
treats an explicit `null` like an absent field. Imports only pydantic and `rebuno.protocol`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from rebuno.protocol.enums import ExecutionStatus

__all__ = [
    "Approval",
    "Event",
    "Execution",
    "ExecutionPage",
    "ExecutionStatus",
    "Resource",
    "Step",
    "StepDecision",
    "StepResource",
    "StreamDelta",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_absent(cls, data: Any) -> Any:
        # The kernel omits empty fields, older ones sent null: both must land on the default.
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class SpawnedBy(_Model):
    """The step of another execution that started this one as its sub-agent."""

    execution_id: str
    step_id: str


class Execution(_Model):
    """One run of one agent on one input.

    `status` is an `ExecutionStatus`; `output` is set once it completed, `failure_reason` once it
    failed or was cancelled. On a page of `Client.list`, `omitted` names the payloads (`input`,
    `output`) left out for their size, in bytes: `Client.get` has them.
    """

    id: str
    agent_id: str = ""
    input: Any = None
    status: ExecutionStatus = ExecutionStatus.PENDING
    output: Any = None
    failure_reason: str = ""
    agent_version: str = ""
    created_at: str = ""
    updated_at: str = ""
    deadline_at: str = ""
    idempotency_key: str = ""
    parent_execution_id: str = ""
    created_by: str = ""
    on_behalf_of: str = ""
    subject_groups: list[str] = []
    session: str = ""
    admitted_at: str = ""
    """Empty while the execution waits for its session's earlier turns to end."""
    forked_from: str = ""
    fork_seq: int = 0
    spawned_by: SpawnedBy | None = None
    restoration: dict[str, dict[str, Any]] = {}
    """A fork's: for each resource, the checkpoint it starts from (`checkpoint_ref`,
    `checkpoint_seq`) and whether that checkpoint covers the fork point (`covered`)."""
    omitted: dict[str, int] = {}


class ExecutionPage(_Model):
    """One page of `Client.list`: pass `next_cursor` back as `cursor` for the next one."""

    executions: list[Execution] = []
    next_cursor: str = ""


class Step(_Model):
    """One recorded effect of an execution: a `tool_call`, an `llm_call` or a `local` step."""

    step_id: str
    execution_id: str = ""
    kind: str = ""
    target: str = ""
    args_hash: str = ""
    occurrence: int = 0
    status: str = ""
    idempotency: str = ""
    args: Any = None
    result: Any = None
    error: Any = None
    usage: dict[str, int] | None = None
    started_at: str = ""
    completed_at: str = ""
    omitted: dict[str, int] = {}
    """In `Client.list_steps`: the payloads (`args`, `result`, `error`) left out for their size,
    in bytes; `Client.get_step` has them."""


class StepResource(_Model):
    """A resource a proceeding step touches, at its new generation; `due`: capture it after
    the step's body (its checkpoint policy says so)."""

    key: str = ""
    generation: int = 0
    due: bool = False


class StepDecision(_Model):
    """The kernel's answer to a step submission: proceed, replay, or a refusal."""

    decision: str
    step_id: str = ""
    result: Any = None
    error: Any = None
    approval_id: str | None = None
    reason: str = ""
    rule_id: str = ""
    resources: list[StepResource] = []


class Resource(_Model):
    """An external resource as the kernel knows it in one execution (§33.2)."""

    key: str = ""
    generation: int = 0
    binding: Any = None
    checkpoint_ref: str = ""
    covered: bool = False
    every_steps: int = 0
    on_completion: bool = False


class Event(_Model):
    """One entry of an execution's append-only event log, ordered by `event_seq`. `omitted`
    is `{"payload": size}` when a page left a payload of more than 64 KiB out: the execution
    (`Client.get`) or the step (`Client.get_step`) carries what it held."""

    execution_id: str = ""
    event_seq: int = 0
    type: str = ""
    payload: Any = None
    occurred_at: str = ""
    omitted: dict[str, int] = {}


class Approval(_Model):
    """A human decision that gates one step: `pending`, `granted`, `denied` or `expired`."""

    id: str
    step_id: str = ""
    execution_id: str = ""
    status: str = ""
    message: str = ""
    decided_by: str = ""
    asserted_by: str = ""
    """Who granted or denied it, as the kernel authenticated the request."""
    rationale: str = ""
    approvers: list[str] | None = None
    timeout_at: str = ""
    decided_at: str = ""
    created_at: str = ""


class StreamDelta(_Model):
    """A live chunk of a step's output, from `Client.stream`; `seq` counts per step from 0."""

    step_id: str
    seq: int = 0
    data: str = ""
