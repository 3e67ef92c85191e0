"""The stream bus seam: how step deltas travel from the producer route to SSE subscribers.

Deltas are ephemeral (§16): nothing is persisted, a subscriber only sees what is published
after it subscribed, and a slow subscriber loses deltas rather than slowing the producer.
Must not import `service` or `api`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Delta:
    """One chunk of live output of one step; `seq` is the agent's opaque per-step counter."""

    step_id: str
    seq: int
    data: str


class Subscription(Protocol):
    """An async context manager that yields itself, iterating the deltas of one execution.

    `__anext__` must be cancellation-safe: a cancelled wait loses no delta that was queued.
    """

    async def __aenter__(self) -> Subscription: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def __aiter__(self) -> AsyncIterator[Delta]: ...

    async def __anext__(self) -> Delta: ...


class StreamBus(Protocol):
    def publish(self, execution_id: str, delta: Delta) -> None:
        """Hands the delta to every subscriber of the execution. Never blocks; call it from
        the event loop."""
        ...

    def subscribe(self, execution_id: str) -> Subscription:
        """A subscription that receives the deltas published while it is entered."""
        ...
