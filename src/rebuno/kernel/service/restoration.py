"""What a fork restores of its source's resources (docs/protocol.md §33.8), and what a session
turn inherits from its parent (§33.8.4).

A fork's set-up is derived from the source's events up to `at_seq` and its checkpoints
covering from no later than that, so it is fixed by the history and needs no source lock.
Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rebuno.kernel.domain import resource as rules
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.records import Checkpoint, Event, Resource, Step
from rebuno.kernel.domain.resource import Selection, checkpoint_payload, registered_payload
from rebuno.kernel.store.base import Transaction
from rebuno.protocol.canonical import dumps, loads
from rebuno.protocol.enums import StepStatus
from rebuno.protocol.events import EventType


@dataclass
class History:
    """The source's resources as its events up to `at_seq` tell them."""

    registered: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each key's last `resource.registered` payload, keys in first-registration order."""
    first_seq: dict[str, int] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    affected: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """By source step id: the keys its last `step.executing` declared."""


def read_history(events: Sequence[Event]) -> History:
    history = History()
    for event in events:
        if event.type == EventType.RESOURCE_REGISTERED:
            payload = loads(event.payload)  # the configuration's numbers kept as written
            history.registered[payload["key"]] = payload
            history.first_seq.setdefault(payload["key"], event.event_seq)
        elif event.type == EventType.RESOURCE_INITIALIZED:
            payload = json.loads(event.payload)
            history.generations[payload["key"]] = int(payload["generation"])
        elif event.type == EventType.STEP_EXECUTING and '"generations"' in event.payload:
            payload = json.loads(event.payload)
            history.generations.update({k: int(v) for k, v in payload["generations"].items()})
            history.affected[payload["step_id"]] = tuple(payload.get("resources", ()))
    return history


def select_all(
    history: History, checkpoints: Sequence[Checkpoint], at_seq: int
) -> dict[str, Selection]:
    """§33.8.1 for each resource registered by `at_seq`."""
    return {
        key: rules.select([c for c in checkpoints if c.key == key], at_seq)
        for key in history.registered
    }


def restoration_text(selections: dict[str, Selection]) -> str:
    return dumps({key: s.render() for key, s in selections.items()})


class SeqMap:
    """A source seq `s` in the fork's numbering: `base` plus the copied events up to `s`."""

    def __init__(self, base: int, copied: Sequence[int]) -> None:
        self._base = base
        self._copied = sorted(copied)

    def __call__(self, seq: int) -> int:
        return self._base + bisect.bisect_right(self._copied, seq)


async def set_up(
    tx: Transaction,
    fork_id: str,
    history: History,
    selections: dict[str, Selection],
    checkpoints: Sequence[Checkpoint],
    copied_steps: dict[str, Step],
    mapped: SeqMap,
    at_seq: int,
    batch: EventBatch,
) -> None:
    """§33.8.3, after the copied events: each selected resource, unbound, at the source's
    generation (one more when its selection is not covered), with its count and the
    checkpoints the fork keeps of it."""
    for key, selection in selections.items():
        resource = _restored(fork_id, key, history, selection, copied_steps, mapped)
        await tx.put_resource(resource)
        initialized: dict[str, object] = {"key": key, "generation": resource.generation}
        if resource.checkpoint_ref is not None:
            initialized["checkpoint_ref"] = resource.checkpoint_ref
        batch.add(EventType.RESOURCE_INITIALIZED, initialized)
        for copy in _copies(fork_id, [c for c in checkpoints if c.key == key], mapped, at_seq):
            await tx.insert_checkpoint(copy)
            batch.add(EventType.RESOURCE_CHECKPOINTED, checkpoint_payload(copy))


def _restored(
    fork_id: str,
    key: str,
    history: History,
    selection: Selection,
    copied_steps: dict[str, Step],
    mapped: SeqMap,
) -> Resource:
    registered = history.registered[key]
    configuration = registered.get("configuration")
    counted = sum(
        1
        for old, step in copied_steps.items()
        if step.status in (StepStatus.SUCCEEDED, StepStatus.FAILED)
        and key in history.affected.get(old, ())
    )
    generation = history.generations.get(key, 0) + (0 if selection.covered else 1)
    return Resource(
        execution_id=fork_id,
        key=key,
        driver_id=registered["driver_id"],
        configuration=None if configuration is None else dumps(configuration),
        coverage_reuse=bool(registered["coverage_reuse"]),
        every_steps=int(registered["every_steps"]),
        on_completion=bool(registered["on_completion"]),
        registered_seq=mapped(history.first_seq[key]),
        generation=generation,
        count=counted,
        checkpoint_ref=None
        if selection.checkpoint is None
        else selection.checkpoint.checkpoint_ref,
    )


def _copies(
    fork_id: str, checkpoints: Sequence[Checkpoint], mapped: SeqMap, at_seq: int
) -> list[Checkpoint]:
    """The source's checkpoints in the fork's numbering: an invalidation after `at_seq` is
    not part of the history (the copy is open); of several at one fork seq the newest stays;
    one whose interval maps to nothing is dropped (§33.9 item 3)."""
    by_seq: dict[int, Checkpoint] = {}
    for c in checkpoints:
        covered = mapped(c.covered_seq)
        invalidated = None
        if c.invalidated_seq is not None and c.invalidated_seq <= at_seq:
            invalidated = mapped(c.invalidated_seq)
            if invalidated <= covered:
                continue
        by_seq[covered] = replace(
            c, execution_id=fork_id, covered_seq=covered, invalidated_seq=invalidated
        )
    return [by_seq[seq] for seq in sorted(by_seq)]


async def inherit(
    tx: Transaction, execution_id: str, parent: Sequence[Resource], batch: EventBatch
) -> None:
    """§33.8.4: a session turn re-registers its parent's resources, bindings included, at
    generation 0 with no checkpoints."""
    for r in parent:
        inherited = replace(
            r,
            execution_id=execution_id,
            registered_seq=batch.next_seq,
            generation=0,
            count=0,
            checkpoint_ref=None,
        )
        await tx.put_resource(inherited)
        batch.add(EventType.RESOURCE_REGISTERED, registered_payload(inherited))
        if inherited.binding is not None:
            batch.add(EventType.RESOURCE_BOUND, {"key": r.key, "binding": Raw(inherited.binding)})
    if parent:
        await tx.mark_resources(execution_id)
