"""Live step deltas (§16): the agent's producer route and the client's SSE consumer route.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import timedelta

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import integer_field, parse_object, text_field
from rebuno.kernel.api.routes.executions import execution_id
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import no_content
from rebuno.kernel.domain.errors import PayloadTooLarge, ValidationFailed
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.stream.sse import sse_frames
from rebuno.protocol.enums import Scope

MAX_DELTA_BYTES = 7000
"""Fits one Postgres NOTIFY payload with its envelope (§16.3); SDKs send 1750 characters."""
_INT64 = (-(2**63), 2**63 - 1)
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}


def delta_seq(value: int) -> int:
    low, high = _INT64
    if not low <= value <= high:
        raise ValidationFailed("validation error: seq must fit in 64 bits")
    return value


def delta_data(text: str) -> str:
    """The delta's text, measured as it travels: JSON-escaped, where a control character
    takes six bytes, so what is accepted here always fits a NOTIFY payload."""
    try:
        encoded = orjson.dumps(text)
    except orjson.JSONEncodeError:
        raise ValidationFailed("validation error: stream data is not valid Unicode text") from None
    if len(encoded) - 2 > MAX_DELTA_BYTES:
        raise PayloadTooLarge(
            f"stream data is larger than {MAX_DELTA_BYTES} bytes once JSON-escaped"
        )
    return text


class StreamRoutes:
    def __init__(self, kernel: Kernel, gate: Gate, keepalive: timedelta) -> None:
        self._kernel = kernel
        self._gate = gate
        self._keepalive = keepalive

    def routes(self) -> list[BaseRoute]:
        one = "/v0/executions/{execution_id}"
        return [
            route(one + "/stream", GET=self._gate.scoped(self.subscribe, Scope.EXECUTIONS_READ)),
            route(one + "/steps/{step_id}/stream", POST=self._gate.signed(self.publish)),
        ]

    async def publish(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        body = parse_object(caller.body)
        lease = params.optional_lease(request.headers)
        seq = delta_seq(integer_field(body, "seq"))
        data = delta_data(text_field(body, "data"))
        await self._kernel.publish_delta(
            target,
            caller.agent_id,
            params.step_id(request.path_params["step_id"]),
            lease,
            seq,
            data,
        )
        return no_content()

    async def subscribe(self, request: Request) -> Response:
        await self._gate.client(request)
        target = execution_id(request)
        await self._kernel.get_execution(target)
        return StreamingResponse(self._frames(target), headers=SSE_HEADERS)

    async def _frames(self, target: str) -> AsyncIterator[bytes]:
        # Subscribed before `: ok` goes out, so a client that has read it misses nothing.
        async with (
            self._kernel.bus.subscribe(target) as subscription,
            aclosing(sse_frames(subscription, self._keepalive)) as frames,
        ):
            async for frame in frames:
                yield frame
