"""`Pool`: a few keep-alive HTTP/1.1 connections to one origin (asyncio Protocols; https
through asyncio's ssl), one request at a time on each.

A request may not be idempotent, so it is sent twice only in the keep-alive race: a reused idle
connection that the server had already closed, noticed before any byte of the answer arrived.
Imports only the standard library and `rebuno._http.codec`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from rebuno._http.codec import PARSERS, Codec, Headers, Response, TransportError, codec_factory

Resolve = Callable[[str, int], Awaitable[str]]
"""`(host, port)` to the address a new connection is made to; may raise `TransportError`."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
# HEAD answers carry no body whatever their length says, and CONNECT answers carry a tunnel:
# neither fits the one-request, one-framed-answer exchange here.
_UNSUPPORTED = frozenset(("HEAD", "CONNECT"))


class Timeout(TransportError):
    """No complete answer within the request's timeout."""


@dataclass(frozen=True, slots=True)
class _Origin:
    scheme: str
    host: str
    port: int
    authority: str
    prefix: str


class Pool:
    """Keep-alive HTTP/1.1 connections to the origin of `base_url`.

    At most `max_connections` requests run at once (the others wait, inside their timeout) and
    at most `max_idle` connections stay open between requests. `parser` forces "httptools" or
    "h11"; by default httptools when importable.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None,
        max_connections: int = 100,
        max_idle: int = 20,
        ssl_context: ssl.SSLContext | None = None,
        parser: str | None = None,
        resolve: Resolve | None = None,
    ) -> None:
        self._origin = _parse_origin(base_url)
        self._resolve = resolve
        """Chooses the address each new connection goes to (and may refuse it, raising
        `TransportError`); by default the host is left to the connection to resolve."""
        self._timeout = timeout
        self._max_idle = max_idle
        self._ssl = _ssl_for(self._origin.scheme, ssl_context)
        self._codec = codec_factory(parser or PARSERS[0], self._origin.authority)
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False

    @property
    def prefix(self) -> str:
        """The path of `base_url` without its trailing slash; targets start with it."""
        return self._origin.prefix

    async def request(
        self, method: str, target: str, headers: Headers = (), body: bytes = b""
    ) -> Response:
        """Send one request and return its answer, whatever its status.

        `target` is the escaped path (plus `?query`) exactly as it goes on the request line.

        Raises:
            Timeout: no complete answer within the timeout.
            TransportError: no answer (refused, reset, closed early) or a malformed one.
            ValueError: a method, target or header that cannot go on the wire.
            RuntimeError: the pool is closed.
        """
        _check_request(method, target, headers)
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                return await self._exchange(method, target, headers, body)
        except TimeoutError:
            raise Timeout(f"no complete response within {self._timeout}s") from None

    async def aclose(self) -> None:
        """Close every connection; requests in flight finish and then close theirs."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        waits = [connection.lost for connection in self._open if connection.closing]
        if waits:
            await asyncio.wait(waits, timeout=1.0)

    async def _exchange(self, method: str, target: str, headers: Headers, body: bytes) -> Response:
        connection = self._take_idle() or await self._connect()
        try:
            return await self._send_on(connection, method, target, headers, body)
        except _Stale:
            # The keep-alive race: the server closed this idle connection before reading the
            # request, so nothing of it was acted on and a fresh connection may carry it.
            connection = await self._connect()
            return await self._send_on(connection, method, target, headers, body)

    async def _send_on(
        self, connection: _Connection, method: str, target: str, headers: Headers, body: bytes
    ) -> Response:
        try:
            response = await connection.exchange(method, target, headers, body)
        except TransportError as exc:
            connection.abort()
            if connection.reused and not connection.received:
                raise _Stale(str(exc)) from exc
            raise
        except BaseException:
            # Cancelled or timed out mid-exchange: what is left of the answer could be read as
            # the next request's, so this connection is never reused.
            connection.abort()
            raise
        self._check_in(connection)
        return response

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                return connection
            connection.abort()
        return None

    def _check_in(self, connection: _Connection) -> None:
        if self._closed or not connection.keep_alive or len(self._idle) >= self._max_idle:
            connection.close()
            return
        connection.reused = True
        self._idle.append(connection)

    async def _connect(self) -> _Connection:
        origin = self._origin
        loop = asyncio.get_running_loop()
        codec = self._codec()
        hostname = origin.host if self._ssl is not None else None
        address = origin.host
        if self._resolve is not None:
            address = await self._resolve(origin.host, origin.port)
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(loop, codec, self._open),
                address,
                origin.port,
                ssl=self._ssl,
                server_hostname=hostname,
            )
        except (OSError, ssl.CertificateError) as exc:
            raise TransportError(f"cannot connect to {origin.authority}: {exc!r}") from exc
        return connection


class _Stale(TransportError):
    """A reused connection closed before any byte of the answer: safe to send again."""


class _Connection(asyncio.Protocol):
    """One connection with at most one exchange in flight."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, codec: Codec, registry: set[_Connection]
    ) -> None:
        self._loop = loop
        self._codec = codec
        self._registry = registry
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self.lost: asyncio.Future[None] = loop.create_future()
        self.reused = False
        self.received = False
        self.closing = False

    @property
    def usable(self) -> bool:
        # A transport can be closing (a failed write) before connection_lost has run.
        transport = self._transport
        return not self.closing and transport is not None and not transport.is_closing()

    @property
    def keep_alive(self) -> bool:
        return not self.closing and self._codec.keep_alive

    async def exchange(self, method: str, target: str, headers: Headers, body: bytes) -> Response:
        assert self._transport is not None and self._waiter is None
        self.received = False
        if self.closing:
            raise TransportError("connection closed before the request was sent")
        data = self._codec.encode(method, target, headers, body)
        waiter: asyncio.Future[Response] = self._loop.create_future()
        self._waiter = waiter
        try:
            self._transport.write(data)
        except (OSError, RuntimeError) as exc:
            self._waiter = None
            raise TransportError(f"could not send the request: {exc!r}") from exc
        return await waiter

    def close(self) -> None:
        self.closing = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self.closing = True
        self._waiter = None
        if self._transport is not None:
            self._transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._registry.add(self)

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self._waiter is None:
            # Bytes nobody asked for: this connection's framing can no longer be trusted.
            self.abort()
            return
        try:
            response = self._codec.feed(data)
        except TransportError as exc:
            self._settle(exc)
            return
        if response is not None:
            self._settle(response)

    def eof_received(self) -> bool:
        self.closing = True
        if self._waiter is not None:
            try:
                response = self._codec.feed_eof()
            except TransportError as exc:
                self._settle(exc)
                return False
            closed = TransportError("connection closed before the response was complete")
            self._settle(response or closed)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._registry.discard(self)
        if not self.lost.done():
            self.lost.set_result(None)
        reason = f": {exc!r}" if exc is not None else ""
        self._settle(TransportError(f"connection lost before the response{reason}"))

    def _settle(self, outcome: Response | TransportError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if isinstance(outcome, Response):
            waiter.set_result(outcome)
        else:
            self.closing = True
            waiter.set_exception(outcome)


def _check_request(method: str, target: str, headers: Headers) -> None:
    # isprintable() is false for CR, LF and every other control character, so no value can end
    # its line early and forge a header; non-ASCII text fails when the head is encoded.
    if not method.isalpha() or not method.isupper() or method in _UNSUPPORTED:
        raise ValueError(f"unsupported HTTP method {method!r}")
    if not target.startswith("/") or " " in target or not target.isprintable():
        raise ValueError(f"request target {target!r} is not an escaped absolute path")
    for name, value in headers:
        if not name.isprintable() or not value.isprintable() or ":" in name or " " in name:
            raise ValueError(f"header {name!r} cannot go on the wire")


def redacted(url: str) -> str:
    """`url` with any user and password replaced by `***`, fit for a message or a log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]).geturl()


def _parse_origin(base_url: str) -> _Origin:
    parts = urlsplit(base_url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"URL {redacted(base_url)!r} is not an http:// or https:// URL")
    if parts.query or parts.fragment or parts.username:
        raise ValueError(f"URL {redacted(base_url)!r} must not carry a query, fragment or user")
    port = parts.port or _DEFAULT_PORTS[scheme]
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    authority = shown if port == _DEFAULT_PORTS[scheme] else f"{shown}:{port}"
    return _Origin(scheme, host, port, authority, parts.path.rstrip("/"))


def _ssl_for(scheme: str, context: ssl.SSLContext | None) -> ssl.SSLContext | None:
    if scheme != "https":
        return None
    return context or ssl.create_default_context()
