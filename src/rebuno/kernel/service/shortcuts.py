"""Per-process knowledge that lets a use case take a cheaper way to the same outcome.

Everything a replica remembers to skip work lives here, behind named methods, and nothing
else in the service layer keeps such state. It is advisory only: every question may be
answered "not known", which always sends the use case the ordinary way (locked, reading what
it needs), so a cold process, an evicted entry or a replica that never saw the execution
decide exactly as a warm one does. `Shortcuts(enabled=False)` (`REBUNO_SHORTCUTS=false`)
answers "not known" to everything and remembers nothing; the behavioural suite runs both ways.

Every map is bounded (oldest forgotten first). Must not import a store backend, the API or
httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from rebuno.kernel.domain.records import Execution, Lease

LIVE_REMEMBERED = 65_536
FIRST_RUNS_REMEMBERED = 16_384
PAST_HISTORY_REMEMBERED = 16_384
FIRST_RUN_INPUT_LIMIT = 4096
"""A first run whose input is longer (in characters) is not remembered: a record is held
until its run ends, and inputs may be megabytes; its end takes the ordinary way."""
ACK_WAIT_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class FirstRun:
    """An execution's first delivery, acknowledged here: no step was recorded before it (a
    `pending` execution has none) and its dispatch had no occurrence counter (the claim
    cleared them). `execution` is the record the acknowledgement wrote."""

    lease: Lease
    execution: Execution


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _remember(entries: OrderedDict[K, V], limit: int) -> None:
    if len(entries) > limit:
        entries.popitem(last=False)


class Shortcuts:
    """What this process knows that may spare a read, a lock or a transaction."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._live: OrderedDict[str, None] = OrderedDict()
        self._first_runs: OrderedDict[str, FirstRun] = OrderedDict()
        self._past_history: OrderedDict[Lease, None] = OrderedDict()
        self._acknowledging: dict[str, asyncio.Event] = {}

    # -- long polls: an execution created here and not seen ending is live -------------------
    def created(self, execution_id: str) -> None:
        if self.enabled:
            self._live[execution_id] = None
            _remember(self._live, LIVE_REMEMBERED)

    def known_live(self, execution_id: str) -> bool:
        """True only when this process created the execution and has not seen it end, so a
        long poll may wait before reading it."""
        return execution_id in self._live

    # -- first runs: an end tried optimistically on the acknowledgement's record -------------
    def acknowledged_first(self, lease: Lease, execution: Execution) -> None:
        """Remembers the record a first delivery's acknowledgement wrote under `lease`."""
        if self.enabled and len(execution.input) <= FIRST_RUN_INPUT_LIMIT:
            self._first_runs[execution.id] = FirstRun(lease, execution)
            _remember(self._first_runs, FIRST_RUNS_REMEMBERED)

    def take_first_run(self, execution_id: str, lease: Lease) -> Execution | None:
        """The acknowledgement's record of this execution's first run under `lease`, once."""
        first = self._first_runs.pop(execution_id, None)
        return first.execution if first is not None and first.lease == lease else None

    # -- replays: a delivery attempt with nothing left to replay skips the unlocked read -----
    def past_history(self, lease: Lease) -> None:
        """Nothing recorded is left for this delivery attempt to replay: a first delivery,
        or one a submission of which found its step unrecorded."""
        if self.enabled:
            self._past_history[lease] = None
            _remember(self._past_history, PAST_HISTORY_REMEMBERED)

    def may_replay_unlocked(self, lease: Lease) -> bool:
        """Whether a submission under `lease` may first try the unlocked replay read."""
        return self.enabled and lease not in self._past_history

    # -- a first delivery being acknowledged: an early end waits for its record --------------
    @contextlib.contextmanager
    def acknowledging(self, execution_id: str) -> Iterator[None]:
        """While a first delivery of `execution_id` is delivered and its acknowledgement
        recorded here. An agent may end a short run before the kernel has recorded that it
        acknowledged the webhook; the end then waits for that record (`wait_acknowledged`),
        so both are written in their order, each optimistically."""
        if not self.enabled:
            yield
            return
        done = self._acknowledging[execution_id] = asyncio.Event()
        try:
            yield
        finally:
            done.set()
            if self._acknowledging.get(execution_id) is done:
                del self._acknowledging[execution_id]

    async def wait_acknowledged(self, execution_id: str) -> None:
        """At most `ACK_WAIT_SECONDS`; at once when no acknowledgement is being recorded."""
        done = self._acknowledging.get(execution_id)
        if done is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), ACK_WAIT_SECONDS)

    def ended(self, execution_id: str) -> None:
        self._live.pop(execution_id, None)
        self._first_runs.pop(execution_id, None)
