"""What a kernel call carries besides its own request (docs/extensions.md): the results of
`safe_to_retry` steps (`step-completions`) and the steps that ran before they were submitted
(`step-records`), held until the handler's next kernel call takes them, or sent on their own
by a timer when no call comes soon. Also the size limits every carried list and every recorded
value keeps, so no request outgrows what the kernel takes. Imports only the SDK's own modules;
never the kernel.
"""

from __future__ import annotations

import asyncio
import logging

from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import Carried, Completion
from rebuno.sdk.errors import RebunoError

logger = logging.getLogger("rebuno")

# A carried completion waits at most this long for the handler's next kernel call before it
# is sent on its own, so a handler busy between steps does not leave a finished step looking
# unfinished for long.
CARRY_DELAY_SECONDS = 0.02
# At most this many wait at once (the kernel takes 1,000 per request).
MAX_CARRIED = 256
MAX_REQUEST_BYTES = 10 * 1024 * 1024
"""The kernel's cap on a request body."""
MAX_RECORDED_BYTES = MAX_REQUEST_BYTES - 64 * 1024
"""The largest result, arguments or output one request can still carry, with room for the
rest of its body. Carried outcomes never add up to more than this in one request."""

_background: set[asyncio.Task[None]] = set()


class Carrier:
    """The completions and reports of one dispatch that wait for its next kernel call.

    Attributes:
        carry: `safe_to_retry` results wait here instead of being sent at once.
        reporting: `step-records` holds: safe steps run before they are submitted, and each
            call asks the kernel whether that may go on.
    """

    def __init__(self, dispatch: Dispatch, *, carry: bool, report: bool) -> None:
        self.carry = carry or report
        self.reporting = report
        self._by_heartbeat = report
        """A kernel offering `step-records` takes what waits in one heartbeat."""
        self._dispatch = dispatch
        self._waiting: list[Carried] = []
        self._bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0
        """When the oldest of what waits was held, on the owner loop's clock."""

    def stop(self) -> None:
        """Nothing is carried from now on: every outcome is sent with its own call."""
        self.carry = self.reporting = self._by_heartbeat = False

    def take(self) -> list[Carried]:
        """What waits, now handed over to the call that carries it."""
        waiting, self._waiting = self._waiting, []
        self._bytes = 0
        return waiting

    def fits_beside(self, size: int) -> bool:
        """Whether what waits still fits in one request beside `size` bytes."""
        return size + self._bytes <= MAX_RECORDED_BYTES

    def crowds(self, size: int) -> bool:
        """Whether something waits that would not fit beside `size` bytes."""
        return bool(self._waiting) and size + self._bytes > MAX_RECORDED_BYTES

    async def hold(self, carried: Carried) -> None:
        """Keeps `carried` for the next kernel call, for at most `CARRY_DELAY_SECONDS`; a
        full list is sent at once, before the handler goes on."""
        loop = self._dispatch.loop or asyncio.get_running_loop()
        size = _size(carried)
        if self._waiting and not self.fits_beside(size):
            await self.flush()  # one request never carries more than the kernel takes
        if not self._waiting:
            self._since = loop.time()
        self._waiting.append(carried)
        self._bytes += size
        if len(self._waiting) >= MAX_CARRIED:
            await self.flush()
        elif self._timer is None:
            if loop is asyncio.get_running_loop():
                self._arm()
            else:
                # A tool awaited on another thread's loop: the timer belongs to the owner's.
                loop.call_soon_threadsafe(self._arm)

    async def flush(self) -> None:
        """Sends what waits on its own. Best-effort: a completion that is lost only re-runs a
        `safe_to_retry` step on the next delivery."""
        if self._by_heartbeat:
            await self._flush_by_heartbeat()
            return
        dispatch = self._dispatch
        for carried in self.take():
            assert isinstance(carried, Completion)
            try:
                send = dispatch.kernel.complete_step(
                    dispatch.execution_id, carried.step_id, dispatch.lease, carried.result
                )
                await dispatch.call(send)
            except RebunoError as exc:
                logger.warning(
                    "could not record step_id=%s execution_id=%s: %s",
                    carried.step_id,
                    dispatch.execution_id,
                    exc,
                )
                return

    async def _flush_by_heartbeat(self) -> None:
        """Everything waiting, in one heartbeat, which also says whether `step-records` holds."""
        carried = self.take()
        if not carried:
            return
        dispatch = self._dispatch
        asked = self.reporting
        try:
            send = dispatch.kernel.heartbeat(dispatch.execution_id, dispatch.lease, carried, asked)
            if asked and not await dispatch.call(send):
                self.reporting = False
        except RebunoError as exc:
            logger.warning(
                "could not record %d steps of execution_id=%s: %s",
                len(carried),
                dispatch.execution_id,
                exc,
            )

    def _arm(self) -> None:
        if self._timer is None:
            loop = self._dispatch.loop or asyncio.get_running_loop()
            self._timer = loop.call_later(CARRY_DELAY_SECONDS, self._fire)

    def _fire(self) -> None:
        # Taking what waits leaves this timer running, which spares setting and cancelling one
        # per step; when it fires it re-arms for the oldest of what waits now.
        self._timer = None
        if not self._waiting:
            return
        loop = self._dispatch.loop or asyncio.get_running_loop()
        wait = self._since + CARRY_DELAY_SECONDS - loop.time()
        if wait > 0:
            self._timer = loop.call_later(wait, self._fire)
            return
        task = loop.create_task(self.flush())
        _background.add(task)
        task.add_done_callback(_background.discard)


class PayloadTooLarge(ValueError):
    """A value no request to the kernel can carry: the step fails with it at once (and is
    recorded so), rather than being lost or run again on every redelivery."""


def check_size(what: str, encoded: bytes) -> None:
    """Raises `PayloadTooLarge` when `encoded` (a result or an output) can never be sent."""
    if len(encoded) > MAX_RECORDED_BYTES:
        raise PayloadTooLarge(
            f"payload_too_large: the {what} is {len(encoded)} bytes of JSON, over the"
            f" {MAX_RECORDED_BYTES} one request to the kernel can carry"
        )


def _size(carried: Carried) -> int:
    """About what `carried` adds to a request's body."""
    if isinstance(carried, Completion):
        return len(carried.result) + 100
    return len(carried.args) + len(carried.result or carried.error or b"") + 200
