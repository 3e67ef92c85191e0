"""The in-process stream bus: one bounded queue per subscriber, deltas dropped when full.

Used by single-process deployments (SQLite, dev) and as the local fan-out of a broadcast bus.
Must not import `service` or `api`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import TracebackType

from rebuno.kernel.stream.bus import Delta

logger = logging.getLogger(__name__)

SUBSCRIBER_BUFFER = 64
"""Deltas queued per subscriber before new ones are dropped (§16.2)."""


class MemorySubscription:
    """One subscriber's queue; registered with its bus only while entered."""

    def __init__(self, bus: MemoryBus, execution_id: str, buffer: int) -> None:
        self._bus = bus
        self.execution_id = execution_id
        self._queue: asyncio.Queue[Delta] = asyncio.Queue(maxsize=buffer)
        self._dropping = False

    async def __aenter__(self) -> MemorySubscription:
        self._bus._attach(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bus._detach(self)

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    async def __anext__(self) -> Delta:
        # Queue.get is cancellation-safe: a cancelled wait leaves the queue untouched.
        return await self._queue.get()

    def offer(self, delta: Delta) -> None:
        try:
            self._queue.put_nowait(delta)
        except asyncio.QueueFull:
            # Dropping is the contract for a slow subscriber (the client sees a seq gap and
            # falls back to the recorded result); warn once per episode, not per delta.
            if not self._dropping:
                logger.warning(
                    "stream subscriber is full, dropping deltas",
                    extra={"execution_id": self.execution_id, "step_id": delta.step_id},
                )
            self._dropping = True
            return
        self._dropping = False


class MemoryBus:
    """Fans deltas out to the subscribers of this process."""

    def __init__(self, buffer: int = SUBSCRIBER_BUFFER) -> None:
        self._buffer = buffer
        self._subscribers: dict[str, set[MemorySubscription]] = {}

    def publish(self, execution_id: str, delta: Delta) -> None:
        for subscription in tuple(self._subscribers.get(execution_id, ())):
            subscription.offer(delta)

    def subscribe(self, execution_id: str) -> MemorySubscription:
        return MemorySubscription(self, execution_id, self._buffer)

    def subscriber_count(self, execution_id: str) -> int:
        return len(self._subscribers.get(execution_id, ()))

    def _attach(self, subscription: MemorySubscription) -> None:
        self._subscribers.setdefault(subscription.execution_id, set()).add(subscription)

    def _detach(self, subscription: MemorySubscription) -> None:
        subscribers = self._subscribers.get(subscription.execution_id)
        if subscribers is None:
            return
        subscribers.discard(subscription)
        if not subscribers:
            del self._subscribers[subscription.execution_id]
