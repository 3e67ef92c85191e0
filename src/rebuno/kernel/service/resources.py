"""Resource use cases (docs/protocol.md §33): register, bind and publish checkpoints, and the
coverage read; and what the step use cases do to resources (a live step's touch, settling a
step that left `executing`, the captures an outcome carries), so every way a step changes
them goes through one place.

Each writes under the execution's lock, in one transaction with its events; an execution
without resources (`has_resources` false) reads nothing here unless its request names some.
Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rebuno.kernel.domain import resource as rules
from rebuno.kernel.domain.errors import (
    Conflict,
    ExecutionTerminal,
    NotFound,
    lease_superseded,
)
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.execution import check_owner, mark_started
from rebuno.kernel.domain.records import (
    Checkpoint,
    Execution,
    Lease,
    RawJson,
    Resource,
    Step,
)
from rebuno.kernel.domain.resource import (
    NO_CAPTURES,
    Captures,
    Registration,
    Touch,
    checkpoint_payload,
    registered_payload,
)
from rebuno.kernel.service.base import ServiceBase, flush
from rebuno.kernel.store.base import Transaction
from rebuno.protocol.events import EventType


@dataclass(frozen=True, slots=True)
class ResourceView:
    """A resource as its routes answer it (§33.2)."""

    resource: Resource
    covered: bool


@dataclass(frozen=True, slots=True)
class Coverage:
    """The fork-points read (§33.7)."""

    latest_seq: int
    resources: tuple[Resource, ...]
    checkpoints: tuple[Checkpoint, ...]


class ResourceUseCases(ServiceBase):
    async def register_resource(
        self, execution_id: str, agent_id: str, lease: Lease, request: Registration
    ) -> ResourceView:
        """§33.2: stores a new key, or checks a known one against what is stored (and
        enables its checkpointing once); answers the resource as it now is."""
        async with self.transaction(execution_id) as tx:
            execution, batch = await self._locked(tx, execution_id, agent_id, lease)
            stored = await tx.list_resources(execution_id) if execution.has_resources else []
            existing = next((r for r in stored if r.key == request.key), None)
            seq = existing.registered_seq if existing else batch.next_seq
            changed = rules.register(existing, request, execution_id, seq, len(stored))
            if changed is not None:
                await tx.put_resource(changed)
                batch.add(EventType.RESOURCE_REGISTERED, registered_payload(changed))
                if not execution.has_resources:
                    await tx.mark_resources(execution_id)
            view = changed or existing
            assert view is not None
            checkpoints = await tx.list_checkpoints(execution_id) if existing else []
            await flush(tx, execution, batch)
        return ResourceView(view, rules.is_covered(view, checkpoints))

    async def bind_resource(
        self, execution_id: str, agent_id: str, lease: Lease, key: str, binding: RawJson
    ) -> None:
        """§33.3: a binding is written once; the same one again changes nothing."""
        async with self.transaction(execution_id) as tx:
            execution, batch = await self._locked(tx, execution_id, agent_id, lease)
            stored = await tx.list_resources(execution_id) if execution.has_resources else []
            found = next((r for r in stored if r.key == key), None)
            if found is None:
                raise NotFound(f"resource {key} not found in execution {execution_id}")
            if found.binding is None:
                await tx.put_resource(replace(found, binding=binding))
                batch.add(EventType.RESOURCE_BOUND, {"key": key, "binding": Raw(binding)})
            elif found.binding != binding:
                raise Conflict(f"resource {key} is bound already, to another binding")
            await flush(tx, execution, batch)

    async def publish_checkpoints(
        self, execution_id: str, agent_id: str, lease: Lease, captures: Captures
    ) -> None:
        """§33.4: the captures, each accepted or refused with an event; they cover the
        boundary before this request's events."""
        async with self.transaction(execution_id) as tx:
            execution, batch = await self._locked(tx, execution_id, agent_id, lease)
            # The boundary before this request's events: `execution.started` included.
            await record_captures(tx, execution, captures, batch, execution.last_event_seq)
            await flush(tx, execution, batch)

    async def coverage(self, execution_id: str) -> Coverage:
        """§33.7, read under the execution's lock, so the checkpoints match `latest_seq`."""
        async with self.transaction(execution_id) as tx:
            execution = await tx.get_execution(execution_id)
            if not execution.has_resources:
                return Coverage(execution.last_event_seq, (), ())
            stored = await tx.list_resources(execution_id)
            checkpoints = await tx.list_checkpoints(execution_id)
        return Coverage(execution.last_event_seq, tuple(stored), tuple(checkpoints))

    async def _locked(
        self, tx: Transaction, execution_id: str, agent_id: str, lease: Lease
    ) -> tuple[Execution, EventBatch]:
        """The checks of an agent route with a strong lease (§33.2), the lease renewed, and
        the execution started if it was pending (it is agent contact)."""
        now = self.clock()
        locked = await tx.lock_execution(execution_id, lease, now)
        execution = locked.execution
        check_owner(execution, agent_id)
        if execution.status.is_terminal:
            raise ExecutionTerminal(f"execution {execution_id} is {execution.status}")
        if not locked.lease_live:
            raise lease_superseded(execution_id, lease)
        batch = EventBatch(execution, now)
        return mark_started(execution, batch), batch


async def apply_touch(
    tx: Transaction, execution_id: str, step_id: str, live: Touch, seq: int
) -> None:
    """A live step's writes (§33.5): its affected keys, each touched resource's new
    generation, and its open checkpoints closed at the `step.executing` (`seq`)."""
    await tx.set_affected_keys(step_id, live.affected)
    for touched in live.touched:
        await tx.put_resource(touched)
        await tx.close_checkpoints(execution_id, touched.key, seq)


async def settle(
    tx: Transaction,
    execution: Execution,
    settled: Sequence[Step],
    captures: Captures = NO_CAPTURES,
    covered_seq: int = 0,
    batch: EventBatch | None = None,
) -> None:
    """Steps that left `executing` in this transaction count toward the resources they
    affect (§33.6); then the captures that came with an outcome, covering `covered_seq`.
    Reads nothing for an execution without resources and no captures."""
    if not execution.has_resources:
        if captures and batch is not None:
            await record_captures(tx, execution, captures, batch, covered_seq)
        return
    affected = await tx.affected_keys([s.step_id for s in settled]) if settled else {}
    stored = {r.key: r for r in await tx.list_resources(execution.id)}
    by_key = dict(stored)
    for step in settled:
        for counted in rules.settle(list(by_key.values()), affected.get(step.step_id, ())):
            by_key[counted.key] = counted
    for key, counted in by_key.items():
        if counted is not stored[key]:
            await tx.put_resource(counted)
    if captures and batch is not None:
        await _judge(tx, execution, by_key, captures, batch, covered_seq)


async def record_captures(
    tx: Transaction, execution: Execution, captures: Captures, batch: EventBatch, seq: int
) -> None:
    """§33.4's processing, for a publish: failures first, then each capture in order."""
    if not captures:
        return
    stored = await tx.list_resources(execution.id) if execution.has_resources else []
    await _judge(tx, execution, {r.key: r for r in stored}, captures, batch, seq)


async def _judge(
    tx: Transaction,
    execution: Execution,
    resources: dict[str, Resource],
    captures: Captures,
    batch: EventBatch,
    covered_seq: int,
) -> None:
    for failure in captures.failures:
        _failed(batch, failure.key, failure.generation, failure.error)
    if not captures.captures:
        return
    writing = await tx.writing_keys(execution.id) if resources else set()
    for capture, reason in rules.judge(resources, writing, captures.captures):
        if reason is not None:
            _failed(batch, capture.key, capture.generation, reason)
            continue
        checkpoint = Checkpoint(
            execution.id, capture.key, capture.generation, capture.checkpoint_ref, covered_seq
        )
        await tx.insert_checkpoint(checkpoint)
        batch.add(EventType.RESOURCE_CHECKPOINTED, checkpoint_payload(checkpoint))


def _failed(batch: EventBatch, key: str, generation: int, error: str) -> None:
    batch.add(
        EventType.RESOURCE_CHECKPOINT_FAILED,
        {"key": key, "generation": generation, "error": error[: rules.MAX_ERROR_CHARS]},
    )
