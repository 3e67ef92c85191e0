"""The HTTP protocol uvicorn runs per connection, with the writes of one loop turn coalesced.

uvicorn writes a response's status line and headers in one `transport.write` and its body in
another, and the event loop sends each at once: two system calls and, on a loopback or a
`TCP_NODELAY` socket, two segments the client wakes up for. `CoalescedWrites` holds what is
written during one turn of the event loop and sends it in one call as soon as the turn ends,
so a whole small response leaves together. Bytes and their order are unchanged; only the
number of sends is.

Must not import the services, the API, `kernel.webhooks` or a store; of rebuno, it knows only
the protocol's error codes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from rebuno.protocol.codes import ErrorCode

try:  # uvicorn's own choice for "auto": httptools when installed, h11 otherwise
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Http
except ImportError:  # pragma: no cover - httptools is a wheel on every platform we target
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Http  # type: ignore[assignment]


class CoalescedWrites:
    """A transport whose writes wait for the end of the loop turn, then leave in one send.

    Everything else goes straight to the wrapped transport; closing sends what is held first,
    aborting drops it (as aborting the transport itself would)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def _flush(self) -> None:
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        # A connection lost meanwhile has nowhere to send to: the peer is gone.
        if not self._transport.is_closing():
            self._transport.write(data)


class CoalescedHttp(_Http):
    """uvicorn's HTTP/1.1 protocol, writing through `CoalescedWrites`, and closing a
    connection whose request head has not arrived within `header_timeout` seconds of its
    first byte (or of the connection): a client that trickles its headers in (slowloris)
    would otherwise hold its connection, and its memory, for ever. uvicorn's own keep-alive
    timeout covers the quiet gap between two requests."""

    header_timeout: float | None = None
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # uvicorn narrows asyncio's BaseTransport to Transport here too; the flow control
        # super() sets up keeps the transport itself, as pausing is not a write.
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, CoalescedWrites(transport, self.loop))
        self._arm_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head()

    def on_headers_complete(self) -> None:
        self._disarm_head()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        if self.header_timeout is not None and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        self.transport.abort()

    def send_400_response(self, msg: str) -> None:
        """What uvicorn answers bytes that do not parse as an HTTP/1.1 request: the error
        envelope (§3.1) like any other bad input, instead of its plain text; the connection
        is closed, as nothing after such bytes can be read as a request."""
        body = _not_http(msg)
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        head += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        head.append(b"content-type: application/json; charset=utf-8\r\n")
        head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def _not_http(detail: str) -> bytes:
    message = "validation error: the request is not HTTP/1.1"
    envelope = {"code": ErrorCode.VALIDATION_ERROR.value, "message": message, "details": detail}
    return json.dumps(envelope).encode()


def http_protocol(header_timeout: float | None) -> type[CoalescedHttp]:
    """The protocol class uvicorn runs per connection, with this head timeout."""
    return type("CoalescedHttp", (CoalescedHttp,), {"header_timeout": header_timeout})
