"""Forks (docs/protocol.md §26): a new execution of the same agent and input that replays what
its source recorded up to one event and runs the rest live.

The copy needs no lock on the source: what it copies (events; steps that ended by then) never
changes once written. Copied steps get the ids the fork's own rerun computes (§7.1), so the
agent replays them through the ordinary decision of a submission.
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from rebuno.kernel.domain.errors import Conflict, KernelError, ValidationFailed
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.execution import deadline_after, pending
from rebuno.kernel.domain.identity import step_id
from rebuno.kernel.domain.principal import ANONYMOUS, Principal
from rebuno.kernel.domain.records import Checkpoint, Event, Execution, Origin, RawJson, Step
from rebuno.kernel.domain.resource import Selection
from rebuno.kernel.service import restoration
from rebuno.kernel.service.context import Context, new_id
from rebuno.kernel.service.starting import announce, let_run, record_new
from rebuno.kernel.store.base import Transaction, session_lock
from rebuno.protocol.enums import StepStatus
from rebuno.protocol.events import EventType

COPIED_STATUSES = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.DENIED})
ENDING_EVENTS = frozenset({EventType.STEP_SUCCEEDED, EventType.STEP_FAILED, EventType.STEP_DENIED})
EVENTS_PAGE = 1000


@dataclass(frozen=True, slots=True)
class ForkRequest:
    at_seq: int
    session: str | None = None
    policy_bundle: str | None = None
    """An override of the source's policy for the fork's live steps (§26.4)."""
    principal: Principal = ANONYMOUS
    """Who asked for the fork (§34.5): its id is the fork's `created_by`."""


class ForkUseCases(Context):
    async def fork(self, source_id: str, request: ForkRequest) -> Execution:
        """§26.2: the fork, with the source's steps that had ended by `at_seq` and their
        events copied, admitted at once (it has no session, or a new one)."""
        source = await self.store.get_execution(source_id)
        if not 1 <= request.at_seq <= source.last_event_seq:
            raise ValidationFailed(
                f"validation error: at_seq must be between 1 and {source.last_event_seq}"
            )
        override = request.policy_bundle
        if override is not None:
            self.bundles.get(override)  # refuses a bundle that does not compile (§14.3)
        bundle = override if override is not None else await self.store.get_own_policy(source_id)
        copy = await self._read_source(source_id, request.at_seq)
        async with self.transaction() as tx:
            if request.session is not None:
                await tx.take_lock(session_lock(request.session))
                if await tx.session_used(request.session):
                    raise Conflict(f"session {request.session!r} has executions already")
            # Held against retention while the fork names it (§24.2), as a parent is.
            source = await tx.hold_execution(source_id)
            fork = self._new_fork(source, request)
            batch = EventBatch(fork, fork.origin.created_at)
            await record_new(tx, fork, batch, bundle)
            batch.execution(
                EventType.EXECUTION_FORKED,
                fork,
                source_execution_id=source.id,
                fork_seq=request.at_seq,
                policy_override=override is not None,
                restoration=None if copy.restored is None else Raw(copy.restored),
            )
            fork = await _copy(tx, fork, copy, request.at_seq, batch)
            fork = await let_run(self, tx, fork, batch)
        announce(self, fork)
        return fork

    def _new_fork(self, source: Execution, request: ForkRequest) -> Execution:
        """The fork as it is created: its source's agent, version, input and whom it acts
        for, labelled as its source's fork (§26.2)."""
        now = self.clock()
        origin = Origin(
            agent_version=source.origin.agent_version,
            input=source.origin.input,
            created_at=now,
            deadline_at=deadline_after(now, self.settings.deadline_timeout),
            created_by=request.principal.id,
            on_behalf_of=source.origin.on_behalf_of,
            session=request.session,
            forked_from=source.id,
            fork_seq=request.at_seq,
        )
        parent = source.parent_execution_id
        return pending(
            new_id(), source.agent_id, origin, parent_execution_id=parent, admitted_at=now
        )

    async def _read_source(self, source_id: str, at_seq: int) -> _Source:
        """What the fork copies of its source, read without its lock: it never changes."""
        events = await self._events_up_to(source_id, at_seq)
        copied = _copied_steps(await self.store.list_steps(source_id, "terminal"), events)
        history = restoration.read_history(events)
        checkpoints: list[Checkpoint] = []
        if history.registered:
            # Those covering from `at_seq` or before are fixed by the history (§33.8).
            found = await self.store.list_checkpoints(source_id)
            checkpoints = [c for c in found if c.covered_seq <= at_seq]
        selections = restoration.select_all(history, checkpoints, at_seq)
        restored = restoration.restoration_text(selections) if selections else None
        return _Source(events, copied, history, checkpoints, selections, restored)

    async def _events_up_to(self, execution_id: str, at_seq: int) -> list[Event]:
        events: list[Event] = []
        while len(events) < at_seq:
            after = events[-1].event_seq if events else 0
            page = await self.store.list_events(execution_id, after, EVENTS_PAGE)
            events.extend(e for e in page if e.event_seq <= at_seq)
            if len(page) < EVENTS_PAGE or page[-1].event_seq >= at_seq:
                break
        return events


@dataclass(frozen=True, slots=True)
class _Source:
    """What a fork copies of its source (§26.3, §33.8)."""

    events: list[Event]
    copied: dict[str, Step]
    history: restoration.History
    checkpoints: list[Checkpoint]
    selections: dict[str, Selection]
    restored: RawJson | None
    """What the fork restores of the source's resources, when it has any (§33.8.2)."""


async def _copy(
    tx: Transaction, fork: Execution, copy: _Source, at_seq: int, batch: EventBatch
) -> Execution:
    """The copied steps and their events, then the restored resources; returns the fork as
    they leave it."""
    base = batch.last_seq
    steps, copied_seqs = _copy_into(fork.id, copy.copied, copy.events, batch)
    for step in steps:
        await tx.insert_step(step)
    if copy.restored is None:
        return fork
    fork = replace(fork, has_resources=True)
    await tx.mark_resources(fork.id)
    await tx.set_restoration(fork.id, copy.restored)
    await _keep_affected(tx, steps, copy.copied, copy.history)
    mapped = restoration.SeqMap(base, copied_seqs)
    await restoration.set_up(
        tx,
        fork.id,
        copy.history,
        copy.selections,
        copy.checkpoints,
        copy.copied,
        mapped,
        at_seq,
        batch,
    )
    return fork


def _step_of(event: Event) -> str | None:
    if not event.type.startswith("step."):
        return None
    found = json.loads(event.payload).get("step_id")  # the standard parser: any number fits
    return found if isinstance(found, str) else None


def _copied_steps(terminal: list[Step], events: list[Event]) -> dict[str, Step]:
    """§26.3: the steps that succeeded, failed or were denied by an event up to `at_seq`."""
    ended = {sid for e in events if e.type in ENDING_EVENTS and (sid := _step_of(e)) is not None}
    return {s.step_id: s for s in terminal if s.status in COPIED_STATUSES and s.step_id in ended}


async def _keep_affected(
    tx: Transaction, steps: list[Step], copied: dict[str, Step], history: restoration.History
) -> None:
    """Copied steps keep the keys they affected (§33.8.3)."""
    new_of = dict(zip(copied, steps, strict=True))
    for old, keys in history.affected.items():
        if old in new_of and keys:
            await tx.set_affected_keys(new_of[old].step_id, keys)


def _copy_into(
    fork_id: str, copied: dict[str, Step], events: list[Event], batch: EventBatch
) -> tuple[list[Step], list[int]]:
    """Appends each copied step's events and each `resource.registered` to the fork's log,
    in the source's order, the steps under their new ids; returns the copied steps, and
    the source seq of every event copied."""
    new_ids = {
        old: step_id(fork_id, s.kind.value, s.target, s.args_hash, s.occurrence)
        for old, s in copied.items()
    }
    proposed: dict[str, int] = {}
    copied_seqs: list[int] = []
    for event in events:
        if event.type == EventType.RESOURCE_REGISTERED:
            batch.add_encoded(event.type, event.payload)
            copied_seqs.append(event.event_seq)
            continue
        old = _step_of(event)
        if old is None or old not in new_ids:
            continue
        copied_seqs.append(event.event_seq)
        before, after = f'"step_id":"{old}"', f'"step_id":"{new_ids[old]}"'
        if event.payload.count(before) != 1:
            raise KernelError(f"event {event.event_seq} of step {old} cannot be copied")
        batch.add_encoded(event.type, event.payload.replace(before, after))
        proposed.setdefault(old, batch.last_seq)
    steps = [
        replace(
            s,
            step_id=new_ids[old],
            execution_id=fork_id,
            proposed_seq=proposed.get(old, batch.last_seq),
        )
        for old, s in copied.items()
    ]
    return steps, copied_seqs
