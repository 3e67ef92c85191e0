"""What every use case shares: the store, settings, clock, policy cache and wake-up hook.

Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import uuid_utils

from rebuno.kernel import metrics
from rebuno.kernel.config import Settings
from rebuno.kernel.domain.errors import LeaseSuperseded
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import transition
from rebuno.kernel.domain.records import Dispatch, Execution, Lease
from rebuno.kernel.policy.loader import BundleCache
from rebuno.kernel.store.base import Store, Transaction, Unchanged
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


ACK_WAIT_SECONDS = 1.0
LIVE_REMEMBERED = 65_536
FIRST_RUNS_REMEMBERED = 16_384
PAST_HISTORY_REMEMBERED = 16_384
FIRST_RUN_INPUT_LIMIT = 4096
"""A first run whose input is longer (in characters) is not remembered: a record is held
until its run ends, and inputs may be megabytes; its end takes the ordinary way."""


@dataclass(frozen=True, slots=True)
class FirstRun:
    """An execution's first delivery, acknowledged here: no step was recorded before it (a
    `pending` execution has none) and its dispatch had no occurrence counter (the claim
    cleared them). `execution` is the record the acknowledgement wrote."""

    lease: Lease
    execution: Execution


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
        self.secrets: dict[str, tuple[float, str | None]] = {}
        """Agent secrets by id, with the monotonic time each entry expires."""
        self.appended: dict[str, Wake] = {}
        """Readers waiting for new events of an execution, woken after each commit."""
        self.ends: dict[str, Wake] = {}
        """Readers waiting for an execution to end, woken when a use case may have ended it."""
        self.live: OrderedDict[str, None] = OrderedDict()
        """Executions created here that this process has not seen end (the newest
        `LIVE_REMEMBERED`): a long poll on one of them need not read it before waiting."""
        self.first_runs: OrderedDict[str, FirstRun] = OrderedDict()
        """Executions whose first delivery this process has just acknowledged (the newest
        `FIRST_RUNS_REMEMBERED`, inputs up to `FIRST_RUN_INPUT_LIMIT`), with the record it
        wrote: their completion is tried optimistically on that record."""
        self.past_history: OrderedDict[Lease, None] = OrderedDict()
        """Delivery attempts with no recorded step left to replay (the newest
        `PAST_HISTORY_REMEMBERED`): a first delivery, or one a submission of which found its
        step unrecorded. Their submissions go the locked way at once rather than first
        paying the unlocked read of `step-occurrences` for a step that is not there."""
        self.acknowledging: dict[str, asyncio.Event] = {}
        """Executions whose first delivery this process is delivering, until the outcome is
        recorded. An agent may end a short run before the kernel has recorded that it
        acknowledged the webhook; the end then waits for that record (at most
        `ACK_WAIT_SECONDS`), so both are written in their order, each optimistically."""

    @asynccontextmanager
    async def transaction(
        self, execution_id: str | None = None, unchanged: Unchanged | None = None
    ) -> AsyncIterator[Transaction]:
        """The store's transaction, and once it committed, a wake-up for whoever waits on
        this execution's event log in this process."""
        async with self.store.transaction(execution_id, unchanged) as tx:
            yield tx
        if execution_id is not None and (waiting := self.appended.pop(execution_id, None)):
            waiting.set()

    def on_append(self, execution_id: str) -> Wake:
        """A wake-up set after the next commit of a transaction on this execution."""
        return self.appended.setdefault(execution_id, Wake())

    def on_end(self, execution_id: str) -> Wake:
        """A wake-up set after a transaction that may have ended this execution committed."""
        return self.ends.setdefault(execution_id, Wake())

    def created(self, execution_id: str) -> None:
        self.live[execution_id] = None
        if len(self.live) > LIVE_REMEMBERED:
            self.live.popitem(last=False)

    def first_run(self, lease: Lease, execution: Execution) -> None:
        """Remembers the record a first delivery's acknowledgement wrote under `lease`."""
        if len(execution.input) > FIRST_RUN_INPUT_LIMIT:
            return
        self.first_runs[execution.id] = FirstRun(lease, execution)
        if len(self.first_runs) > FIRST_RUNS_REMEMBERED:
            self.first_runs.popitem(last=False)

    def past_recorded_history(self, lease: Lease) -> None:
        self.past_history[lease] = None
        if len(self.past_history) > PAST_HISTORY_REMEMBERED:
            self.past_history.popitem(last=False)

    def ended(self, execution_id: str, record: Execution | None = None) -> None:
        """Wakes the readers waiting for this execution to end; `record`, when given, is the
        terminal record the use case has just committed, so they need not read it again.
        Called after every use case that may end an execution here, and for the ends other
        replicas announce."""
        self.live.pop(execution_id, None)
        self.first_runs.pop(execution_id, None)
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


def mark_started(execution: Execution, batch: EventBatch) -> Execution:
    """The first time the agent is reached, `pending` becomes `running` (§10.1), once."""
    if execution.status is not ExecutionStatus.PENDING:
        return execution
    started = transition(execution, ExecutionStatus.RUNNING, batch.now)
    batch.execution(EventType.EXECUTION_STARTED, started)
    return started


async def flush(tx: Transaction, execution: Execution, batch: EventBatch) -> None:
    """Appends the batch and moves the execution's `last_event_seq` with it."""
    if not batch.events:
        return
    await tx.append_events(batch.events)
    metrics.record_events(batch.events)
    await tx.update_execution(replace(execution, last_event_seq=batch.last_seq))


def superseded(execution_id: str, lease: Lease) -> LeaseSuperseded:
    return LeaseSuperseded(
        f"lease superseded: dispatch {lease.dispatch_id} attempt {lease.attempt} "
        f"no longer owns execution {execution_id}"
    )
