"""Records for the store contract tests, with sensible defaults, and helpers that put them
in a store through its public API.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import fields, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from rebuno.kernel.domain import identity
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Agent, Approval, Dispatch, Event, Execution, Origin, Step
from rebuno.kernel.store.base import Stale, StepKey, Store, Unchanged
from rebuno.protocol.enums import (
    ApprovalStatus,
    DispatchStatus,
    ExecutionStatus,
    Idempotency,
    StepKind,
    StepStatus,
)
from tests.support import START

_serial = itertools.count(1)


def new_id() -> str:
    """A UUID-shaped id; later calls sort after earlier ones, like UUIDv7."""
    return f"01900000-0000-7000-8000-{next(_serial):012x}"


def hex_id(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def agent(agent_id: str = "agent-1", **changes: Any) -> Agent:
    base = Agent(
        id=agent_id,
        webhook_url=f"http://127.0.0.1:9/{agent_id}",
        secret="s3cret",
        policy_bundle=None,
        lease_timeout_seconds=None,
        registered_at=START,
    )
    return replace(base, **changes)


ORIGIN_FIELDS = frozenset(f.name for f in fields(Origin))


def execution(agent_id: str = "agent-1", **changes: Any) -> Execution:
    """A running execution; `changes` may name fields of its record or of its origin."""
    origin = Origin(agent_version=None, input='{"q":"hello"}', created_at=START, deadline_at=None)
    base = Execution(
        id=new_id(),
        agent_id=agent_id,
        origin=replace(origin, **{k: v for k, v in changes.items() if k in ORIGIN_FIELDS}),
        status=ExecutionStatus.RUNNING,
        output=None,
        failure_reason=None,
        updated_at=START,
        last_event_seq=0,
    )
    return replace(base, **{k: v for k, v in changes.items() if k not in ORIGIN_FIELDS})


def event(execution_id: str, seq: int, **changes: Any) -> Event:
    base = Event(
        execution_id=execution_id,
        event_seq=seq,
        type="execution.created",
        payload='{"status":"pending"}',
        occurred_at=START,
    )
    return replace(base, **changes)


KEY = StepKey(kind=StepKind.TOOL_CALL, target="search", args_hash=hex_id("args"))


def step(execution_id: str, occurrence: int = 0, key: StepKey = KEY, **changes: Any) -> Step:
    base = Step(
        step_id=identity.step_id(execution_id, key.kind, key.target, key.args_hash, occurrence),
        execution_id=execution_id,
        kind=key.kind,
        target=key.target,
        args_hash=key.args_hash,
        occurrence=occurrence,
        status=StepStatus.EXECUTING,
        idempotency=Idempotency.SAFE_TO_RETRY,
        args='{"query":"x"}',
        result=None,
        error=None,
        usage_input=None,
        usage_output=None,
        proposed_seq=1,
        started_at=START,
        completed_at=None,
    )
    return replace(base, **changes)


def step_id_for(execution_id: str, key: StepKey = KEY) -> Any:
    """The `StepIdFn` of the kernel, which the builders' step ids follow."""
    return partial(identity.step_id, execution_id, key.kind, key.target, key.args_hash)


def dispatch(execution_id: str, **changes: Any) -> Dispatch:
    base = Dispatch(
        id=new_id(),
        execution_id=execution_id,
        status=DispatchStatus.PENDING,
        attempt=0,
        max_attempts=5,
        next_attempt_at=START,
        locked_by=None,
        locked_at=None,
        created_at=START,
        updated_at=START,
    )
    return replace(base, **changes)


def approval(execution_id: str, step_id: str, **changes: Any) -> Approval:
    base = Approval(
        id=new_id(),
        step_id=step_id,
        execution_id=execution_id,
        status=ApprovalStatus.PENDING,
        approvers=("alice", "bob"),
        message="please check",
        timeout_at=START + timedelta(minutes=15),
        decided_by=None,
        decided_at=None,
        rationale=None,
        created_at=START,
    )
    return replace(base, **changes)


async def seed_agent(store: Store, agent_id: str = "agent-1", **changes: Any) -> Agent:
    async with store.transaction() as tx:
        return await tx.upsert_agent(agent(agent_id, **changes), keep_bundle=False)


async def seed_execution(store: Store, agent_id: str = "agent-1", **changes: Any) -> Execution:
    """An execution of `agent_id` (registering the agent first when needed)."""
    record = execution(agent_id, **changes)
    async with store.transaction(record.id) as tx:
        try:
            await tx.get_agent(agent_id)
        except NotFound:
            await tx.upsert_agent(agent(agent_id), keep_bundle=False)
        await tx.insert_execution(record)
    return record


async def seed_step(store: Store, execution_id: str, occurrence: int = 0, **changes: Any) -> Step:
    record = step(execution_id, occurrence, **changes)
    async with store.transaction(execution_id) as tx:
        await tx.insert_step(record)
    return record


async def seed_dispatch(store: Store, execution_id: str, **changes: Any) -> Dispatch:
    record = dispatch(execution_id, **changes)
    async with store.transaction(execution_id) as tx:
        await tx.insert_dispatch(record)
    return record


async def seed_in_flight(
    store: Store, execution_id: str, locked_at: datetime = START, attempt: int = 1
) -> Dispatch:
    """A dispatch already claimed by replica `r1` (a live lease)."""
    return await seed_dispatch(
        store,
        execution_id,
        status=DispatchStatus.IN_FLIGHT,
        attempt=attempt,
        locked_by="r1",
        locked_at=locked_at,
    )


async def append_optimistically(
    store: Store,
    seen: Execution,
    unchanged: Unchanged | None = None,
    seq: int | None = None,
    status: ExecutionStatus | None = None,
) -> bool:
    """One optimistic transaction on the record `seen` (by default its own `last_event_seq` is
    the condition) appending an event at `seq` (the next one by default) and writing the
    record back with `status` (its own by default); whether it applied."""
    at = seen.last_event_seq + 1 if seq is None else seq
    condition = Unchanged(seen.last_event_seq) if unchanged is None else unchanged
    written = replace(seen, last_event_seq=at, status=status or seen.status)
    try:
        async with store.transaction(seen.id, condition) as tx:
            await tx.append_events([event(seen.id, at, type="step.proposed")])
            await tx.update_execution(written)
    except Stale:
        return False
    return True
