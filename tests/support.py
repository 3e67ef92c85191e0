"""Test support shared by every suite: a controllable clock, the `wait_until` poller (and its
blocking twin for tests that drive processes), `parked` to know that a task waits on an event,
the two chores of a hand-written ASGI test server (its lifespan, a request's whole body), and
`free_port` for the servers tests start.

The polls here are the only place a test sleeps: everywhere else a test waits for a condition
(tests/unit/test_no_sleeps.py holds the suites to that).

Imports nothing from rebuno, so any suite may use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
_POLL_INTERVAL = 0.01
_BLOCKING_POLL_INTERVAL = 0.02
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


class ManualClock:
    """A clock that moves only when told to; `now()` is an aware UTC datetime."""

    def __init__(self, start: datetime = START) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        self._now += delta
        return self._now


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float = 5.0,
    message: str | None = None,
) -> None:
    """Polls `condition` (sync or async) with short sleeps until it holds; fails the test
    with a message after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if loop.time() >= deadline:
            what = message or getattr(condition, "__name__", repr(condition))
            raise AssertionError(f"timed out after {timeout}s waiting until: {what}")
        await asyncio.sleep(_POLL_INTERVAL)


def poll_until(condition: Callable[[], bool], timeout: float, message: str) -> None:
    """Calls `condition` with short blocking sleeps until it holds; fails the test with
    `message` after `timeout` seconds. For sync tests that wait on other processes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(_BLOCKING_POLL_INTERVAL)


def _listening_ports() -> tuple[int, ...]:
    """The ports `free_port` picks from: every unprivileged one outside the range this machine
    takes the source ports of outgoing connections from (Linux's default, 32768-60999, when it
    does not say). A port from that range, once the probe has closed it, can become the source
    port of any outgoing connection (to PostgreSQL, say) before the server the test starts
    binds it, and the server then exits with "Address already in use"."""
    low, high = 32768, 60999
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, _EPHEMERAL.read_text().split())
    return tuple(port for port in range(1024, 65536) if not low <= port <= high)


_PORTS = _listening_ports()


def free_port() -> int:
    """A loopback TCP port nothing listens on, outside the ephemeral range and not handed out
    before by this process, for a server a test is about to start."""
    while True:
        port = random.choice(_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


def parked(event: asyncio.Event | None) -> bool:
    """Whether some task waits in `event.wait()`: how a test knows a long poll or a waiter
    has got as far as it can, instead of guessing with a sleep. asyncio keeps no public count
    of an Event's waiters; this reads the private one, which typeshed declares."""
    return event is not None and bool(event._waiters)


async def asgi_lifespan(receive: Any, send: Any) -> None:
    """Answers an ASGI lifespan: startup, then shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


async def asgi_body(receive: Any) -> bytes:
    """The whole body of an ASGI HTTP request."""
    body = b""
    while True:
        message = await receive()
        chunk: bytes = message.get("body", b"")
        body += chunk
        if not message.get("more_body"):
            return body
