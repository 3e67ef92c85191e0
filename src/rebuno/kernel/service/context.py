"""What every use case and transaction fragment shares: the store, the settings, the clock, the
policy cache, this process's knowledge and its wake-ups (`Context`).

Every use-case class derives from `Context` and from nothing else, so a use case reaches
another's work only through a fragment below it; `Kernel` composes them.
Must not import a concrete store backend, the API, httpx or a use-case module.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import cached_property

import uuid_utils

from rebuno.kernel import metrics
from rebuno.kernel.config import Settings
from rebuno.kernel.decision.submission import Rules
from rebuno.kernel.domain.decision import StepRequest
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Dispatch, Execution, replace
from rebuno.kernel.policy.engine import PERMISSIVE, PolicyResult, bundle_error
from rebuno.kernel.policy.loader import BundleCache
from rebuno.kernel.service.activity import Activity
from rebuno.kernel.service.shortcuts import Shortcuts
from rebuno.kernel.store.base import Store, Transaction, Unchanged
from rebuno.kernel.stream.bus import StreamBus
from rebuno.protocol.enums import DispatchStatus
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


class Context:
    """The state the use cases share; each use-case class of `Kernel` derives from it."""

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

    async def reclaim_expired_leases(self) -> int:
        """Returns every expired lease to the queue and wakes the dispatch loop: the reaper's
        tick, and the second half of reclaiming the deliveries of a restarted agent
        instance."""
        count = await self.store.reclaim_expired(self.clock(), self.settings.dispatch_lease_timeout)
        metrics.leases_reclaimed(count)
        if count:
            log.info("returned %d expired dispatch leases to the queue", count)
            self.wake()
        return count

    @cached_property
    def rules(self) -> Rules:
        """What deciding a submission needs besides it; built once: the settings never
        change."""
        return Rules(approval_timeout=self.settings.approval_timeout, new_id=new_id)

    def verdict(
        self, execution: Execution, policy_bundle: str | None, request: StepRequest
    ) -> PolicyResult:
        """The policy's verdict on a new step. Fail closed: a stored bundle that no longer
        compiles denies rather than allows. A bundle's verdict names the bundle by its hash
        (§35.6)."""
        if not policy_bundle:
            return PERMISSIVE
        hashed = self.bundles.hash_of(policy_bundle)
        try:
            bundle = self.bundles.get(policy_bundle)
        except ValidationFailed:
            log.exception("stored policy bundle of agent %s no longer compiles", execution.agent_id)
            return replace(bundle_error("policy_bundle_invalid"), policy_hash=hashed)
        verdict = metrics.evaluate_policy(
            bundle, execution.agent_id, request.kind, request.target, request.args
        )
        return replace(verdict, policy_hash=hashed)


async def flush(tx: Transaction, execution: Execution, batch: EventBatch) -> Execution:
    """Appends the batch and moves the execution's `last_event_seq` with it; returns the
    record as written (written only when the batch holds events)."""
    written = replace(execution, last_event_seq=batch.last_seq)
    if batch.events:
        await tx.append_events(batch.events)
        metrics.record_events(batch.events)
        await tx.update_execution(written)
    return written
