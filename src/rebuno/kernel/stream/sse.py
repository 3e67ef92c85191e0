"""Server-sent-event framing of a delta subscription (§16.2).

`: ok` once at connect, one `data:` frame per delta, `: keep-alive` whenever the stream has
been quiet for the keep-alive interval. Must not import `service` or `api`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from datetime import timedelta

import orjson

from rebuno.kernel.stream.bus import Delta, Subscription

OK_FRAME = b": ok\n\n"
KEEPALIVE_FRAME = b": keep-alive\n\n"
DEFAULT_KEEPALIVE = timedelta(seconds=15)


def delta_frame(delta: Delta) -> bytes:
    payload = orjson.dumps({"step_id": delta.step_id, "seq": delta.seq, "data": delta.data})
    return b"data: " + payload + b"\n\n"


async def sse_frames(
    subscription: Subscription, keepalive: timedelta = DEFAULT_KEEPALIVE
) -> AsyncGenerator[bytes, None]:
    """Frames for an entered subscription, until the consumer stops iterating."""
    yield OK_FRAME
    timeout = keepalive.total_seconds()
    # One pending read is carried across keep-alives, so a quiet period never cancels a
    # read that is about to deliver a delta.
    pending: asyncio.Future[Delta] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(subscription))
            done, _ = await asyncio.wait({pending}, timeout=timeout)
            if not done:
                yield KEEPALIVE_FRAME
                continue
            finished, pending = pending, None
            try:
                delta = finished.result()
            except StopAsyncIteration:
                return
            yield delta_frame(delta)
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
