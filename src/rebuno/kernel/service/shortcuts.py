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
from collections.abc import Hashable, Iterator, Sequence
from typing import TypeVar

from rebuno.kernel.domain.records import Execution, Lease, Step
from rebuno.protocol.enums import StepStatus

LIVE_REMEMBERED = 65_536
RUNS_REMEMBERED = 16_384
PAST_HISTORY_REMEMBERED = 16_384
RUN_INPUT_LIMIT = 4096
"""A run whose input is longer (in characters) is not remembered: a record is held until its
run ends, and inputs may be megabytes; its steps and its end take the ordinary way."""
RUN_STEPS_REMEMBERED = 1024
"""A run is forgotten once it has recorded more steps, or a step whose arguments are longer
than `RUN_INPUT_LIMIT` characters."""
STEPS_REMEMBERED = 131_072
"""Step ids held across all runs at most (some 20 MB); the oldest runs are forgotten first."""
ACK_WAIT_SECONDS = 1.0


class Run:
    """A first delivery attempt followed here since its claim, and what
    its execution holds as this process last committed it: the record, the id of every step
    recorded (none before a first run), the steps still executing, and the policy bundle the
    claim or the last submission read. Nothing here is trusted: a write
    built on it applies only while the execution is still at `execution.last_event_seq`,
    the lease is live and the bundle unchanged (`store.base.Unchanged`)."""

    __slots__ = ("bundle", "executing", "execution", "lease", "recorded")

    def __init__(self, lease: Lease, execution: Execution, bundle: str | None) -> None:
        self.lease = lease
        self.execution = execution
        self.bundle = bundle
        self.recorded: set[str] = set()
        self.executing: dict[str, Step] = {}


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
        self._runs: OrderedDict[str, Run] = OrderedDict()
        self._steps_held = 0
        """The step ids the runs hold, together (`STEPS_REMEMBERED`)."""
        self._past_history: OrderedDict[Lease, None] = OrderedDict()
        self._acknowledging: dict[str, asyncio.Event] = {}
        self._recording: dict[str, asyncio.Event] = {}

    # -- long polls: an execution created here and not seen ending is live -------------------
    def created(self, execution_id: str) -> None:
        if self.enabled:
            self._live[execution_id] = None
            _remember(self._live, LIVE_REMEMBERED)

    def known_live(self, execution_id: str) -> bool:
        """True only when this process created the execution and has not seen it end, so a
        long poll may wait before reading it."""
        return execution_id in self._live

    # -- runs: a submission or an end tried optimistically on what this process wrote -------
    def claimed_first(self, lease: Lease, execution: Execution, bundle: str | None) -> None:
        """Follows the run of a first delivery under `lease` from the record its claim read:
        a `pending` execution that is not a fork has no step recorded, and its policy is its
        agent's `bundle`, as the claim read it."""
        if self.enabled and len(execution.origin.input) <= RUN_INPUT_LIMIT:
            self._drop(execution.id)
            self._runs[execution.id] = Run(lease, execution, bundle)
            if len(self._runs) > RUNS_REMEMBERED:
                self._drop(next(iter(self._runs)))

    def acknowledged(self, lease: Lease, before: int, after: Execution) -> None:
        """The acknowledgement of the delivery under `lease` committed here, moving the
        execution from `last_event_seq` `before` to the record `after` (no step with it)."""
        self._moved(lease, before, after)

    def run(self, execution_id: str, lease: Lease) -> Run | None:
        """What this process knows of the execution's run under `lease`, if it followed it."""
        run = self._runs.get(execution_id)
        return run if run is not None and run.lease == lease else None

    def advanced(
        self,
        lease: Lease,
        before: int,
        after: Execution,
        bundle: str | None,
        finished: Sequence[str],
        written: Sequence[Step],
    ) -> None:
        """A step submission under `lease` committed here, moving the execution from
        `last_event_seq` `before` to the record `after`, on the policy bundle it read: the
        steps `finished` are terminal now and the steps `written` are as written. Kept only
        while nothing else wrote in between (the run was at `before`)."""
        run = self._moved(lease, before, after)
        if run is None:
            return
        run.bundle = bundle
        for step_id in finished:
            run.executing.pop(step_id, None)
        for step in written:
            if len(step.args or "") > RUN_INPUT_LIMIT:
                self.forget(after.id)
                return
            if step.step_id not in run.recorded:
                run.recorded.add(step.step_id)
                self._steps_held += 1
            if step.status is StepStatus.EXECUTING:
                run.executing[step.step_id] = step
            else:
                run.executing.pop(step.step_id, None)
        if len(run.recorded) > RUN_STEPS_REMEMBERED:
            self.forget(after.id)
        while self._steps_held > STEPS_REMEMBERED and self._runs:
            self._drop(next(iter(self._runs)))

    def _moved(self, lease: Lease, before: int, after: Execution) -> Run | None:
        """The run a commit here moved from `last_event_seq` `before` to the record `after`,
        holding `after` now; when the run was not at `before` (something else wrote in
        between) it is forgotten, and None."""
        run = self.run(after.id, lease)
        if run is None:
            return None
        if run.execution.last_event_seq != before:
            self.forget(after.id)
            return None
        run.execution = after
        return run

    def forget(self, execution_id: str) -> None:
        """Something this process did not write changed the run, or may have."""
        self._drop(execution_id)

    def _drop(self, execution_id: str) -> Run | None:
        run = self._runs.pop(execution_id, None)
        if run is not None:
            self._steps_held -= len(run.recorded)
        return run

    def take_run(self, execution_id: str, lease: Lease) -> Run | None:
        """The run followed under `lease`, forgotten as it is handed over: its end is on its
        way."""
        run = self._drop(execution_id)
        return run if run is not None and run.lease == lease else None

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

    # -- a first delivery being acknowledged: an early end or step waits for its record -----
    @contextlib.contextmanager
    def acknowledging(self, execution_id: str) -> Iterator[None]:
        """While a first delivery of `execution_id` is delivered and its acknowledgement
        recorded here. An agent may end a short run before the kernel has recorded that it
        acknowledged the webhook; the end then waits for that record (`wait_acknowledged`),
        so both are written in their order, each optimistically."""
        with self._window(self._acknowledging, execution_id):
            yield

    async def wait_acknowledged(self, execution_id: str) -> None:
        """At most `ACK_WAIT_SECONDS`; at once when no acknowledgement is being recorded."""
        await _wait(self._acknowledging.get(execution_id))

    @contextlib.contextmanager
    def recording_acknowledgement(self, execution_id: str) -> Iterator[None]:
        """While the acknowledgement of a first delivery the agent has answered is being
        recorded here. A step the agent submits meanwhile waits for that record
        (`wait_recorded`): otherwise the acknowledgement may commit between two steps, and
        the second, built on the first's record, would find the run moved and lose it. Only
        this part of the delivery is waited for: an agent that answers its webhook once its
        run is over submits its steps before the answer."""
        with self._window(self._recording, execution_id):
            yield

    async def wait_recorded(self, execution_id: str) -> None:
        """At most `ACK_WAIT_SECONDS`; at once when no acknowledgement is being recorded."""
        await _wait(self._recording.get(execution_id))

    @contextlib.contextmanager
    def _window(self, windows: dict[str, asyncio.Event], execution_id: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        done = windows[execution_id] = asyncio.Event()
        try:
            yield
        finally:
            done.set()
            if windows.get(execution_id) is done:
                del windows[execution_id]

    def ended(self, execution_id: str) -> None:
        self._live.pop(execution_id, None)
        self._drop(execution_id)


async def _wait(done: asyncio.Event | None) -> None:
    if done is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), ACK_WAIT_SECONDS)
