"""Waiting for a condition: `wait_until` inside an event loop, `poll_until` for code that waits
on other processes. Both fail with a message once their timeout passes.

These polls are the only place a test sleeps: everywhere else a test waits for a condition or
moves a manual clock (tests/unit/test_no_sleeps.py holds the suites to that). Standard library
only.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

_POLL_INTERVAL = 0.01
_BLOCKING_POLL_INTERVAL = 0.02


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
    """Calls `condition` with short blocking sleeps until it holds; fails with `message` after
    `timeout` seconds. For sync code that waits on other processes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(_BLOCKING_POLL_INTERVAL)
