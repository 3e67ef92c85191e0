"""The records the kernel stores: frozen dataclasses, one per table.

JSON values (`input`, `args`, `result`, ...) are kept as JSON *text* (`RawJson`) exactly as
received, so number literals survive untouched and responses embed them without re-parsing.
Must not import anything outside `rebuno.protocol`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from rebuno.protocol.enums import (
    ApprovalStatus,
    DispatchStatus,
    ExecutionStatus,
    Idempotency,
    StepKind,
    StepStatus,
)

RawJson = str
"""JSON text. `"null"` stands for JSON null; Python `None` means "absent"."""

R = TypeVar("R")

if TYPE_CHECKING:
    # Type-checked exactly as `dataclasses.replace` is: the same names, the same field types.
    from dataclasses import replace as replace
else:

    def replace(record: R, /, **changes: Any) -> R:
        """`dataclasses.replace` for the frozen, slotted records of the kernel, at about half
        its cost: it reads every field in one call and fills the copy's slots directly,
        without introspecting the class and running its `__init__` each time. A submission
        copies records some six to eight times; `python -m bench.record_copy` measures the
        two (1.5 to 2 times faster for an execution, a step and a plan). Any other dataclass
        goes to `dataclasses.replace`."""
        plan = _COPY_PLANS.get(type(record))
        if plan is None:
            plan = _COPY_PLANS[type(record)] = _copy_plan(type(record))
        if not plan:
            return dataclasses.replace(record, **changes)  # type: ignore[type-var]
        read, slots, index = plan
        values = list(read(record))
        for name, value in changes.items():
            if name not in index:
                raise TypeError(f"{type(record).__name__} has no field {name!r}")
            values[index[name]] = value
        copy = object.__new__(type(record))
        for fill, value in zip(slots, values, strict=True):
            fill(copy, value)
        return copy


_COPY_PLANS: dict[type, tuple[Any, tuple[Any, ...], dict[str, int]] | tuple[()]] = {}


def _copy_plan(cls: type) -> tuple[Any, tuple[Any, ...], dict[str, int]] | tuple[()]:
    """How `replace` copies a `cls`: a getter of all its fields, the setter of each slot and
    the index of each name; empty when the class needs `dataclasses.replace` (no slots, a
    field outside `__init__`, a `__post_init__`)."""
    fields = dataclasses.fields(cls)
    if "__slots__" not in cls.__dict__ or len(fields) < 2 or hasattr(cls, "__post_init__"):
        return ()
    if any(not f.init for f in fields):
        return ()
    names = tuple(f.name for f in fields)
    slots = tuple(cls.__dict__[name].__set__ for name in names)
    return attrgetter(*names), slots, {name: i for i, name in enumerate(names)}


@dataclass(frozen=True, slots=True)
class AgentMetadata:
    """What an agent publishes about itself (§36): a description and the JSON Schemas of its
    input and output, as canonical JSON text. None is "not published"."""

    description: str | None = None
    input_schema: RawJson | None = None
    output_schema: RawJson | None = None


NO_METADATA = AgentMetadata()


@dataclass(frozen=True, slots=True)
class Agent:
    id: str
    webhook_url: str
    secret: str
    policy_bundle: str | None
    lease_timeout_seconds: float | None
    registered_at: datetime
    metadata: AgentMetadata = NO_METADATA
    metadata_updated_at: datetime | None = None
    """When the agent last published its metadata; None while it never has."""


@dataclass(frozen=True, slots=True)
class Origin:
    """What an execution is created with (§5.1, §24-§28): fixed at its create, never written
    again, and shared by reference by every record of it the kernel copies."""

    agent_version: str | None
    input: RawJson
    created_at: datetime
    deadline_at: datetime | None
    idempotency_key: str | None = None
    created_by: str = "unknown"
    """The principal of the create request; rows older than the field read `unknown`."""
    on_behalf_of: str | None = None
    session: str | None = None
    """The conversation it is a turn of (§24): one execution of a session runs at a time."""
    spawned_by_execution_id: str | None = None
    """A sub-agent's parent (§25): the execution whose step started it, and that step."""
    spawned_by_step_id: str | None = None
    forked_from: str | None = None
    """A fork's source (§26), and the source's `event_seq` it was forked at."""
    fork_seq: int | None = None


@dataclass(frozen=True, slots=True)
class Execution:
    """An execution as it is now: its `origin`, and the state its use cases move."""

    id: str
    agent_id: str
    origin: Origin
    status: ExecutionStatus
    output: RawJson | None
    failure_reason: str | None
    updated_at: datetime
    last_event_seq: int
    """Highest `event_seq` written; the next event of this execution gets this + 1."""
    parent_execution_id: str | None = None
    """The execution it continues (§24.2): named at its create, or its session's last completed
    turn, set when it is admitted (§24.4)."""
    admitted_at: datetime | None = None
    """When it was let run: at create without a session, when its session had room with
    one. None while it waits its turn (and for rows older than the field)."""
    has_children: bool = False
    """A step of it started a sub-agent: its end must cascade (§25.6). Set by the child's
    create, under this execution's lock, so an end that has no children asks nothing."""
    has_resources: bool = False
    """A resource is registered in it (§33). Set with the first one, under this execution's
    lock, so a step of an execution without resources reads nothing more."""


@dataclass(frozen=True, slots=True)
class Step:
    step_id: str
    execution_id: str
    kind: StepKind
    target: str
    args_hash: str
    occurrence: int
    status: StepStatus
    idempotency: Idempotency
    args: RawJson | None
    result: RawJson | None
    error: RawJson | None
    usage_input: int | None
    usage_output: int | None
    proposed_seq: int
    """`event_seq` of the step's `step.proposed`: the order steps are listed in."""
    started_at: datetime | None
    completed_at: datetime | None
    omitted: tuple[tuple[str, int], ...] = ()
    """In a step list only: the payloads left out (`args`, `result`, `error`), each with its
    size in bytes; the record then holds None in their place (§5.2)."""


@dataclass(frozen=True, slots=True)
class Resource:
    """External state an execution uses (§33.1): the kernel keeps its metadata only."""

    execution_id: str
    key: str
    driver_id: str
    configuration: RawJson | None
    """Canonical JSON text, None when absent (JSON null)."""
    coverage_reuse: bool
    every_steps: int
    on_completion: bool
    registered_seq: int
    generation: int
    count: int
    """Settled steps that affected it (§33.1)."""
    binding: RawJson | None = None
    checkpoint_ref: str | None = None
    """The checkpoint a fork starts it from (§33.8.3); None elsewhere."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """An accepted capture of a resource (§33.1): it covers the event boundaries from
    `covered_seq` up to, not including, `invalidated_seq` (no end while that is None)."""

    execution_id: str
    key: str
    generation: int
    checkpoint_ref: str
    covered_seq: int
    invalidated_seq: int | None = None


@dataclass(frozen=True, slots=True)
class Event:
    execution_id: str
    event_seq: int
    type: str
    payload: RawJson
    occurred_at: datetime
    omitted: tuple[tuple[str, int], ...] = ()
    """On an events page only: `(("payload", size in bytes),)` when the payload was left out;
    the record then holds `null` in its place (§5.1)."""


@dataclass(frozen=True, slots=True)
class Approval:
    id: str
    step_id: str
    execution_id: str
    status: ApprovalStatus
    approvers: tuple[str, ...] | None
    message: str | None
    timeout_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    rationale: str | None
    created_at: datetime
    asserted_by: str | None = None
    """The principal of the grant or deny request (§27.2), beside the `decided_by` it named."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    id: str
    execution_id: str
    status: DispatchStatus
    attempt: int
    max_attempts: int
    next_attempt_at: datetime
    locked_by: str | None
    locked_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Lease:
    """The `(dispatch_id, dispatch_attempt)` pair an agent's write is made under."""

    dispatch_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """An accepted `v1=` agent request as the kernel remembers it against a copy (§2.3): a
    digest of its signature, and the time after which no copy of it verifies any more."""

    digest: bytes
    until: datetime
