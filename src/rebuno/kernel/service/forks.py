"""Forks (docs/protocol.md §26): a new execution of the same agent and input that replays what
its source recorded up to one event and runs the rest live.

The copy needs no lock on the source: what it copies (events; steps that ended by then) never
changes once written. Copied steps get the ids the fork's own rerun computes (§7.1), so the
agent replays them through the ordinary decision of a submission.
Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from rebuno.kernel.domain.errors import Conflict, KernelError, ValidationFailed
from rebuno.kernel.domain.event import EventBatch, Raw
from rebuno.kernel.domain.execution import pending
from rebuno.kernel.domain.identity import step_id
from rebuno.kernel.domain.principal import ANONYMOUS, Principal
from rebuno.kernel.domain.records import Event, Execution, Step
from rebuno.kernel.service import restoration
from rebuno.kernel.service.base import ServiceBase, flush, new_id
from rebuno.kernel.store.base import Transaction, session_lock
from rebuno.protocol.enums import StepStatus
from rebuno.protocol.events import EventType
from rebuno.protocol.times import format_timestamp

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


class ForkUseCases(ServiceBase):
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
        events = await self._events_up_to(source_id, request.at_seq)
        copied = _copied_steps(await self.store.list_steps(source_id, "terminal"), events)
        history = restoration.read_history(events)
        checkpoints = []
        if history.registered:
            # Those covering from `at_seq` or before are fixed by the history (§33.8).
            found = await self.store.list_checkpoints(source_id)
            checkpoints = [c for c in found if c.covered_seq <= request.at_seq]
        selections = restoration.select_all(history, checkpoints, request.at_seq)
        restored = restoration.restoration_text(selections) if selections else None
        async with self.transaction() as tx:
            if request.session is not None:
                await tx.take_lock(session_lock(request.session))
                if await tx.session_used(request.session):
                    raise Conflict(f"session {request.session!r} has executions already")
            # Held against retention while the fork names it (§24.2), as a parent is.
            source = await tx.hold_execution(source_id)
            now = self.clock()
            fork = pending(
                new_id(),
                source.agent_id,
                source.agent_version,
                source.input,
                now,
                self.settings.deadline_timeout,
                parent_execution_id=source.parent_execution_id,
                created_by=request.principal.id,
                on_behalf_of=source.on_behalf_of,
                session=request.session,
                admitted_at=now,
                forked_from=source.id,
                fork_seq=request.at_seq,
            )
            batch = EventBatch(fork, now)
            batch.execution(
                EventType.EXECUTION_CREATED,
                fork,
                deadline_at=format_timestamp(fork.deadline_at) if fork.deadline_at else None,
                created_by=fork.created_by,
                on_behalf_of=fork.on_behalf_of,
            )
            batch.execution(
                EventType.EXECUTION_FORKED,
                fork,
                source_execution_id=source.id,
                fork_seq=request.at_seq,
                policy_override=override is not None,
                restoration=None if restored is None else Raw(restored),
            )
            await tx.insert_execution(fork, bundle)
            base = batch.last_seq
            steps, copied_seqs = _copy_into(fork.id, copied, events, batch)
            for step in steps:
                await tx.insert_step(step)
            if restored is not None:
                fork = replace(fork, has_resources=True, restoration=restored)
                await tx.mark_resources(fork.id)
                await tx.set_restoration(fork.id, restored)
                await _keep_affected(tx, steps, copied, history)
                mapped = restoration.SeqMap(base, copied_seqs)
                await restoration.set_up(
                    tx,
                    fork.id,
                    history,
                    selections,
                    checkpoints,
                    copied,
                    mapped,
                    request.at_seq,
                    batch,
                )
            await self.enqueue(tx, batch, self.new_dispatch(fork.id, now))
            fork = await flush(tx, fork, batch)
        self.shortcuts.created(fork.id)
        self.activity.touched(fork.id)
        self.wake()
        return fork

    async def with_restoration(self, execution: Execution) -> Execution:
        """A fork with what it restored (§33.8.2), read apart: only a fork has any."""
        if execution.forked_from is None:
            return execution
        return replace(execution, restoration=await self.store.get_restoration(execution.id))

    async def _events_up_to(self, execution_id: str, at_seq: int) -> list[Event]:
        events: list[Event] = []
        while len(events) < at_seq:
            after = events[-1].event_seq if events else 0
            page = await self.store.list_events(execution_id, after, EVENTS_PAGE)
            events.extend(e for e in page if e.event_seq <= at_seq)
            if len(page) < EVENTS_PAGE or page[-1].event_seq >= at_seq:
                break
        return events


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
