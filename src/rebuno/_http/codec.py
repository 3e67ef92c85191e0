"""Bytes to and from one HTTP/1.1 exchange: a request serialised, its answer parsed, by
httptools when it is importable and by h11 otherwise. Each codec serves one connection and one
exchange at a time. Imports only the standard library, httptools and h11.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import h11

try:
    import httptools

    PARSERS: tuple[str, ...] = ("httptools", "h11")
except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
    PARSERS = ("h11",)

_FRAMING = frozenset((b"content-length", b"transfer-encoding"))

Headers = Sequence[tuple[str, str]]


class TransportError(Exception):
    """No usable answer: the connection failed or closed early, or the answer was malformed."""


@dataclass(frozen=True, slots=True)
class Response:
    """A complete answer: status, headers with lower-cased names, and the whole body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class Codec(Protocol):
    """Serialises requests and parses responses for one connection, one exchange at a time."""

    keep_alive: bool

    def encode(self, method: str, target: str, headers: Headers, body: bytes) -> bytes: ...
    def feed(self, data: bytes) -> Response | None: ...
    def feed_eof(self) -> Response | None: ...


class HttptoolsCodec:
    """Our own request serialiser; responses parsed by httptools' callbacks."""

    def __init__(self, authority: str) -> None:
        self._authority = authority
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._headers_done = False
        self._framed = False
        self._done: Response | None = None
        self.keep_alive = True

    def encode(self, method: str, target: str, headers: Headers, body: bytes) -> bytes:
        self._reset()
        return encode_request(self._authority, method, target, headers, body)

    def feed(self, data: bytes) -> Response | None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise TransportError("the server switched protocols") from None
        except httptools.HttpParserError as exc:
            raise TransportError(f"malformed response: {exc}") from None
        return self._done

    def feed_eof(self) -> Response | None:
        # A body framed by neither length nor chunks ends when the server closes.
        if self._headers_done and not self._framed and self._done is None:
            self._finish()
            self.keep_alive = False
        return self._done

    def on_message_begin(self) -> None:
        if self._done is not None:
            # A second answer to one request: keep it out of the first, stop trusting framing.
            self.keep_alive = False
            self._headers, self._chunks = [], []

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self._framed = self._framed or name in _FRAMING
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._parser.get_status_code() < 200:
            self._reset()  # an interim 1xx answer; the final one follows
        elif self._done is None:
            self._finish()
            self.keep_alive = self._parser.should_keep_alive()

    def _reset(self) -> None:
        self._headers = []
        self._chunks = []
        self._headers_done = False
        self._framed = False
        self._done = None

    def _finish(self) -> None:
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._done = Response(self._parser.get_status_code(), self._headers, body)


class H11Codec:
    """Requests and responses both through h11's client state machine."""

    def __init__(self, authority: str) -> None:
        self._authority = authority
        self._connection = h11.Connection(h11.CLIENT)
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self.keep_alive = True

    def encode(self, method: str, target: str, headers: Headers, body: bytes) -> bytes:
        connection = self._connection
        if connection.our_state is h11.DONE and connection.their_state is h11.DONE:
            connection.start_next_cycle()
        self._status, self._headers, self._chunks = 0, [], []
        fields = [("Host", self._authority), *headers, *_length(method, body)]
        request = h11.Request(method=method, target=target, headers=fields)
        events: list[h11.Event] = [request, h11.Data(data=body), h11.EndOfMessage()]
        try:
            return b"".join(connection.send(event) or b"" for event in events)
        except h11.LocalProtocolError as exc:
            raise ValueError(f"request cannot go on the wire: {exc}") from None

    def feed(self, data: bytes) -> Response | None:
        self._connection.receive_data(data)
        return self._next()

    def feed_eof(self) -> Response | None:
        self._connection.receive_data(b"")
        return self._next()

    def _next(self) -> Response | None:
        while True:
            try:
                event = self._connection.next_event()
            except h11.RemoteProtocolError as exc:
                raise TransportError(f"malformed response: {exc}") from None
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Response):
                self._status, self._headers = event.status_code, list(event.headers)
            elif isinstance(event, h11.Data):
                self._chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                leftover, _ = self._connection.trailing_data
                self.keep_alive = self._connection.their_state is h11.DONE and not leftover
                return Response(self._status, self._headers, b"".join(self._chunks))


def encode_request(
    authority: str, method: str, target: str, headers: Headers, body: bytes
) -> bytes:
    """The request's bytes: request line, `Host`, the headers, `Content-Length`, the body."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n"]
    lines.extend(f"{name}: {value}\r\n" for name, value in headers)
    lines.extend(f"{name}: {value}\r\n" for name, value in _length(method, body))
    lines.append("\r\n")
    return "".join(lines).encode("ascii") + body


def _length(method: str, body: bytes) -> list[tuple[str, str]]:
    if body or method not in ("GET", "HEAD"):
        return [("Content-Length", str(len(body)))]
    return []


def codec_factory(parser: str, authority: str) -> Callable[[], Codec]:
    """Makes a fresh codec per connection to `authority`; ValueError for an unknown parser."""
    if parser not in PARSERS:
        raise ValueError(f"parser {parser!r} is not available; choose from {PARSERS}")
    if parser == "httptools":
        return lambda: HttptoolsCodec(authority)
    return lambda: H11Codec(authority)
