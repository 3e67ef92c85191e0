"""What every use case shares: the store, settings, clock, policy cache and wake-up hook.

Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import uuid_utils

from rebuno.kernel import metrics
from rebuno.kernel.config import Settings
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Dispatch, Execution, replace
from rebuno.kernel.policy.loader import BundleCache
from rebuno.kernel.service.activity import Activity
from rebuno.kernel.service.restoration import inherit
from rebuno.kernel.service.shortcuts import Shortcuts
from rebuno.kernel.store.base import Store, Transaction, Unchanged, execution_lock, session_lock
from rebuno.kernel.stream.bus import StreamBus
from rebuno.protocol.enums import DispatchStatus, ExecutionStatus
from rebuno.protocol.events import EventType

Clock = Callable[[], datetime]
log = logging.getLogger("rebuno.kernel")


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    """A UUIDv7: time-ordered, so ids sort by creation."""
    return str(uuid_utils.uuid7())


def _noop() -> None:
    return None


class Wake(asyncio.Event):
    """Wakes the long polls registered for one execution; `record` is the execution as the
    waking use case committed it, when it has it at hand."""

    def __init__(self) -> None:
        super().__init__()
        self.record: Execution | None = None


class ServiceBase:
    """State shared by the use-case mixins that make up `Kernel`."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        clock: Clock = utc_now,
        bus: StreamBus,
        wake: Callable[[], None] = _noop,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.bus = bus
        self.wake = wake
        self.bundles = BundleCache()
        self.secrets: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        """Agent secrets by id, with the monotonic time each entry expires (bounded, see
        `agents.SECRETS_REMEMBERED`)."""
        self.appended: dict[str, Wake] = {}
        """Readers waiting for new events of an execution, woken after each commit."""
        self.ends: dict[str, Wake] = {}
        """Readers waiting for an execution to end, woken when a use case may have ended it."""
        self.shortcuts = Shortcuts(settings.shortcuts)
        """What this process knows that may spare work; advisory only (`shortcuts.py`)."""
        self.activity = Activity()
        """Who watches executions change (§40.5), told after each commit on one."""

    @asynccontextmanager
    async def transaction(
        self, execution_id: str | None = None, unchanged: Unchanged | None = None
    ) -> AsyncIterator[Transaction]:
        """The store's transaction, and once it committed, a wake-up for whoever waits on
        this execution's event log in this process."""
        with metrics.counted_on_commit():
            async with self.store.transaction(execution_id, unchanged) as tx:
                yield tx
        if execution_id is None:
            return
        self.activity.touched(execution_id)
        if waiting := self.appended.pop(execution_id, None):
            waiting.set()

    def on_append(self, execution_id: str) -> Wake:
        """A wake-up set after the next commit of a transaction on this execution."""
        return self.appended.setdefault(execution_id, Wake())

    def on_end(self, execution_id: str) -> Wake:
        """A wake-up set after a transaction that may have ended this execution committed."""
        return self.ends.setdefault(execution_id, Wake())

    def ended(self, execution_id: str, record: Execution | None = None) -> None:
        """Wakes the readers waiting for this execution to end; `record`, when given, is the
        terminal record the use case has just committed, so they need not read it again.
        Called after every use case that may end an execution here, and for the ends other
        replicas announce."""
        self.shortcuts.ended(execution_id)
        self.activity.touched(execution_id)
        if waiting := self.ends.pop(execution_id, None):
            waiting.record = record
            waiting.set()

    def new_dispatch(self, execution_id: str, now: datetime, delay: float = 0.0) -> Dispatch:
        return Dispatch(
            id=new_id(),
            execution_id=execution_id,
            status=DispatchStatus.PENDING,
            attempt=0,
            max_attempts=self.settings.dispatch_max_attempts,
            next_attempt_at=now + timedelta(seconds=delay),
            locked_by=None,
            locked_at=None,
            created_at=now,
            updated_at=now,
        )

    async def enqueue(self, tx: Transaction, batch: EventBatch, dispatch: Dispatch) -> None:
        """Queues a delivery in the transaction of the event that needs it (§12.1)."""
        await tx.insert_dispatch(dispatch)
        batch.dispatch(EventType.DISPATCH_QUEUED, dispatch, DispatchStatus.PENDING.value)

    # -- sessions (§24.3): shared by every use case that creates or ends an execution -----
    async def _admit_next(self, tx: Transaction, session: str, now: datetime) -> Execution | None:
        """§24.3, under the session's lock: when no admitted execution of the session is
        live, its oldest waiter whose deadline has not passed is admitted, with the agent's
        latest completed execution in the session as its parent unless it has one, and
        queued for delivery. Returns the execution admitted."""
        if await tx.session_held(session):
            return None
        waiter = await tx.first_waiter(session, now)
        if waiter is None:
            return None
        await tx.take_lock(execution_lock(waiter.id))
        waiter = await tx.get_execution(waiter.id)  # as it is under its lock
        if waiter.admitted_at is not None or waiter.status is not ExecutionStatus.PENDING:
            return None
        parent = waiter.parent_execution_id or await tx.last_completed(waiter.agent_id, session)
        await tx.admit(waiter.id, now, parent)
        admitted = replace(waiter, admitted_at=now, parent_execution_id=parent)
        batch = EventBatch(admitted, now)
        if parent is not None and waiter.parent_execution_id is None:
            # §33.8.4: an implicit parent is completed, so its resources no longer change
            # and are read without its lock.
            inherited = await tx.list_resources(parent)
            await inherit(tx, admitted.id, inherited, batch)
            admitted = replace(admitted, has_resources=bool(inherited))
        await self.enqueue(tx, batch, self.new_dispatch(admitted.id, now))
        return await flush(tx, admitted, batch)

    async def release_session(self, session: str) -> None:
        """Admits the session's next waiter when nothing holds it: the follow-up of every
        end of a session's execution (§24.3), and the lineage sweep's repair."""
        async with self.transaction() as tx:
            await tx.take_lock(session_lock(session))
            admitted = await self._admit_next(tx, session, self.clock())
        if admitted is not None:
            self.shortcuts.created(admitted.id)
            self.wake()

    async def after_end(self, record: Execution) -> None:
        """The follow-ups of an execution's end, run after its commit by every use case that
        ends one (`lineage.LineageUseCases` implements them)."""
        raise NotImplementedError


async def flush(tx: Transaction, execution: Execution, batch: EventBatch) -> Execution:
    """Appends the batch and moves the execution's `last_event_seq` with it; returns the
    record as written (written only when the batch holds events)."""
    written = replace(execution, last_event_seq=batch.last_seq)
    if batch.events:
        await tx.append_events(batch.events)
        metrics.record_events(batch.events)
        await tx.update_execution(written)
    return written
