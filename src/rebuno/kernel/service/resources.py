"""Resource use cases (docs/protocol.md §33): register, bind and publish checkpoints, and the
coverage read. What steps do to resources (a live step's touch, settling a step that left
`executing`, the captures an outcome carries) is recorded by `recording.py`, the one place
every way a step changes them goes through.

Each writes under the execution's lock, in one transaction with its events; an execution
without resources (`has_resources` false) reads nothing here unless its request names some.
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rebuno.kernel.domain import resource as rules
from rebuno.kernel.domain.errors import Conflict, NotFound
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.execution import mark_started
from rebuno.kernel.domain.records import Checkpoint, Execution, Lease, RawJson, Resource
from rebuno.kernel.domain.resource import Captures, Registration, registered_payload
from rebuno.kernel.service.context import Context, flush
from rebuno.kernel.service.ending import lock_live
from rebuno.kernel.service.recording import record_captures
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


class ResourceUseCases(Context):
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
        """The gate of an agent route with a strong lease (§33.2), the lease renewed, and the
        execution started if it was pending (it is agent contact)."""
        now = self.clock()
        execution = (await lock_live(tx, execution_id, agent_id, lease, now)).execution
        batch = EventBatch(execution, now)
        return mark_started(execution, batch), batch
