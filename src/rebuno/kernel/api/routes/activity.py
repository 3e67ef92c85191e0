"""`GET /v0/activity` (§40.5, bearer): a server-sent-event feed of the executions that
change, as they are after each change, for live status badges.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import timedelta
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.routes.stream import SSE_HEADERS
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import render_execution
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.stream.sse import KEEPALIVE_FRAME, OK_FRAME
from rebuno.protocol.enums import Scope

RESYNC_FRAME = b'data: {"type":"resync"}\n\n'
_PAYLOADS = ("input", "output", "omitted")


def activity_frame(execution: Execution) -> bytes:
    """One changed execution, without its payloads (the feed says what changed, the
    execution's own route holds the rest)."""
    summary: dict[str, Any] = {
        key: value for key, value in render_execution(execution).items() if key not in _PAYLOADS
    }
    summary["last_event_seq"] = execution.last_event_seq
    return b"data: " + orjson.dumps({"type": "execution", "execution": summary}) + b"\n\n"


class ActivityRoutes:
    def __init__(self, kernel: Kernel, gate: Gate, keepalive: timedelta) -> None:
        self._kernel = kernel
        self._gate = gate
        self._keepalive = keepalive

    def routes(self) -> list[BaseRoute]:
        return [route("/v0/activity", GET=self._gate.scoped(self.watch, Scope.EXECUTIONS_READ))]

    async def watch(self, request: Request) -> Response:
        await self._gate.client(request)
        return StreamingResponse(self._frames(), headers=SSE_HEADERS)

    async def _frames(self) -> AsyncIterator[bytes]:
        # Watching before `: ok` goes out, so a client that has read it misses no change.
        quiet = self._keepalive.total_seconds()
        with self._kernel.activity.watch() as watcher:
            yield OK_FRAME
            async with aclosing(self._kernel.watch_executions(watcher, quiet)) as batches:
                async for batch in batches:
                    if batch is None:
                        yield RESYNC_FRAME
                    elif not batch:
                        yield KEEPALIVE_FRAME
                    for execution in batch or ():
                        yield activity_frame(execution)
