"""One dispatch's standing with the kernel: the agent's client, the execution, the lease the
webhook was delivered under, and the event loop whose connection pool serves them.

Every kernel call of a dispatch goes through `Dispatch.call`, which makes it on that loop and
remembers what its failure means for the run: a control-flow signal (`Blocked`, `Terminated`)
the run unwinds with, a lease another delivery took over, or a kernel that did not answer.
`keep_lease` renews the lease with heartbeats (docs/protocol.md §12.4). Imports only the SDK's
own modules; never the kernel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from rebuno.sdk._kernel import KernelClient, Lease
from rebuno.sdk.errors import (
    APIError,
    Blocked,
    LeaseSuperseded,
    NetworkError,
    RebunoError,
    Terminated,
)

logger = logging.getLogger("rebuno")

_T = TypeVar("_T")
_HEARTBEAT_CAP = 30.0


class Dispatch:
    """The run of one delivery as the kernel sees it, and what its calls have taught.

    Attributes:
        kernel: The agent's signed client.
        execution_id: The execution the delivery runs.
        lease: The `(dispatch_id, attempt)` it was delivered under, with its period.
        loop: The loop the handler runs on, once known; its pool makes every call.
        signal: The `Blocked` or `Terminated` the run unwinds with, once one was raised.
        superseded: The lease was lost: nothing more may be written.
        kernel_unreachable: A call failed without an answer (network, 5xx): the outcome of
            this run cannot be trusted to be recorded, so it ends quietly and the lease
            redelivers it.
    """

    def __init__(self, kernel: KernelClient, execution_id: str, lease: Lease) -> None:
        self.kernel = kernel
        self.execution_id = execution_id
        self.lease = lease
        self.loop: asyncio.AbstractEventLoop | None = None
        self.signal: Blocked | Terminated | None = None
        self.superseded = False
        self.kernel_unreachable = False

    async def call(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Awaits a kernel call on the owner loop and remembers what its failure means."""
        try:
            if self.loop is None or self.loop is asyncio.get_running_loop():
                return await call
            return await self.on_owner_loop(call)
        except LeaseSuperseded:
            self.superseded = True
            raise
        except Terminated as exc:
            raise self.remember(exc) from None
        except (NetworkError, APIError) as exc:
            if exc.retryable:
                self.kernel_unreachable = True
            raise

    async def on_owner_loop(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Awaits `call` on the owner loop, whichever loop awaits this."""
        # A tool awaited on another thread's loop must not touch the owner loop's pool.
        running = asyncio.get_running_loop()
        if self.loop is None or self.loop is running:
            return await call
        future = asyncio.run_coroutine_threadsafe(call, self.loop)
        return await asyncio.wrap_future(future)

    def remember(self, signal: Blocked | Terminated) -> Blocked | Terminated:
        """Keeps the first signal, so the run unwinds even if the handler swallows it."""
        if self.signal is None:
            self.signal = signal
        return signal

    async def keep_lease(self, owner: asyncio.Task[Any]) -> None:
        """Renews the lease every `min(lease/3, 30 s)` until cancelled; cancels `owner` once
        the lease is lost."""
        interval = min(self.lease.timeout / 3, _HEARTBEAT_CAP)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.kernel.heartbeat(self.execution_id, self.lease)
            except (LeaseSuperseded, Terminated):
                self.superseded = True
                owner.cancel()
                return
            except RebunoError as exc:
                # Best-effort: a missed renewal is retried next tick, well inside the lease.
                logger.warning("heartbeat failed for execution_id=%s: %s", self.execution_id, exc)
