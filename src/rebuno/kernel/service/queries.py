"""Execution use cases that only read: an execution (with our long poll), lists of executions,
events and steps, the activity feed (§40.5), and what a turn continues from (§24.5).

They read committed data and write nothing. Must not import a concrete store backend, the API,
httpx or another use-case module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.execution import check_owner
from rebuno.kernel.domain.records import Event, Execution, RawJson, Step
from rebuno.kernel.service.activity import Watcher
from rebuno.kernel.service.context import Context, Wake
from rebuno.kernel.store.base import ExecutionFilter, Page, Store

T = TypeVar("T")
REPLICA_POLL_SECONDS = 0.25


class QueryUseCases(Context):
    async def get_execution(
        self, execution_id: str, agent_id: str | None = None, wait: float = 0.0
    ) -> Execution:
        """The execution. With `wait` (our long poll), a live one is held up to that many
        seconds for it to become terminal."""

        async def read(ended: Execution | None) -> tuple[Execution, bool]:
            execution = ended or await self.store.get_execution(execution_id)
            check_owner(execution, agent_id)
            return execution, execution.status.is_terminal

        # Woken only by the use cases that can end an execution, not by every step. One
        # created here and not seen ending is live: waiting comes first. Should it have
        # ended on another replica and the news been lost, the look every
        # REPLICA_POLL_SECONDS finds it.
        live = wait > 0 and self.shortcuts.known_live(execution_id)
        return await _hold(wait, lambda: self.on_end(execution_id), read, live=live)

    async def restoration_of(self, execution: Execution) -> RawJson | None:
        """What a fork restored of its source's resources (§33.8.2), read apart: only a fork
        has any, and only its own representation shows it."""
        if execution.origin.forked_from is None:
            return None
        return await self.store.get_restoration(execution.id)

    async def list_executions(self, flt: ExecutionFilter) -> Page[Execution]:
        return await self.store.list_executions(flt)

    async def watch_executions(
        self, watcher: Watcher, quiet: float
    ) -> AsyncGenerator[list[Execution] | None, None]:
        """The activity feed (§40.5): batches of executions as they are now, one per
        wake-up; an empty batch after `quiet` seconds without one, `None` when the watcher lost
        count. Each is read from the store, so the feed is never a second record."""
        while True:
            ids = await watcher.changed(quiet)
            if ids is None:
                yield None
                continue
            found = [await _maybe_current(self.store, one) for one in ids]
            yield [one for one in found if one is not None]

    async def list_events(
        self, execution_id: str, after_seq: int, limit: int, wait: float = 0.0
    ) -> list[Event]:
        """Events after `after_seq`. With `wait` (our long poll), an empty answer is held up
        to that many seconds for the next commit on the execution, unless it is terminal."""

        async def read(_: Execution | None) -> tuple[list[Event], bool]:
            events = await self.store.list_events(execution_id, after_seq, limit)
            if events:
                return events, True
            # Also answers NotFound for an unknown execution; a terminal one has no more.
            execution = await self.store.get_execution(execution_id)
            return events, execution.status.is_terminal

        return await _hold(wait, lambda: self.on_append(execution_id), read)

    async def list_steps(
        self, execution_id: str, status: str | None, agent_id: str | None = None
    ) -> list[Step]:
        await self.get_execution(execution_id, agent_id)
        return await self.store.list_steps(execution_id, status)

    async def get_step(self, execution_id: str, step_id: str, agent_id: str | None = None) -> Step:
        await self.get_execution(execution_id, agent_id)
        step = await self.store.get_step(step_id)
        if step is None or step.execution_id != execution_id:
            raise NotFound(f"step {step_id} not found in execution {execution_id}")
        return step

    async def previous_state(self, execution_id: str, agent_id: str | None = None) -> RawJson:
        """§24.5: what the execution continues from: its parent's stored `state`, else the
        parent's output (`null` when it had none), else `null` when it has no parent. A
        parent whose row is gone answers `NotFound`, loud rather than an empty conversation."""
        execution = await self.store.get_execution(execution_id)
        check_owner(execution, agent_id)
        parent_id = execution.parent_execution_id
        if parent_id is None:
            return "null"
        state = await self.store.get_state(parent_id)
        if state is not None:
            return state
        return (await self.store.get_execution(parent_id)).output or "null"


async def _maybe_current(store: Store, execution_id: str) -> Execution | None:
    try:
        return await store.get_execution(execution_id)
    except NotFound:  # deleted by retention since it changed: nothing to show
        return None


async def _hold(
    wait: float,
    register: Callable[[], Wake],
    read: Callable[[Execution | None], Awaitable[tuple[T, bool]]],
    *,
    live: bool = False,
) -> T:
    """Our long poll: `read()` until it says it is done or `wait` seconds passed, looking
    again whenever the registered wake-up fires. The wake-up is registered before each read, so
    a commit landing in between is not missed; another replica's commits wake no one here, so
    it also looks again every `REPLICA_POLL_SECONDS`. A wake-up that carries the terminal
    record is handed to `read`, which need not read it again. `live`: the first read is
    known to find nothing done, so it is skipped."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    ended: Execution | None = None
    if wait <= 0:
        return (await read(None))[0]
    while True:
        woken = register()
        if live:
            live = False
        else:
            value, done = await read(ended)
            if done or deadline - loop.time() <= 0:
                return value
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(deadline - loop.time(), REPLICA_POLL_SECONDS)):
                await woken.wait()
        ended = woken.record if woken.is_set() else None
