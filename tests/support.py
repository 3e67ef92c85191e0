"""Test support of the suites alone: a controllable clock and `parked`, to know that a task
waits on an event. What the chaos suite and the benchmark share with the tests (ports, polls,
processes) is in the `harness` package.

Imports nothing from rebuno, so any suite may use it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class ManualClock:
    """A clock that moves only when told to; `now()` is an aware UTC datetime."""

    def __init__(self, start: datetime = START) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        self._now += delta
        return self._now


def parked(event: asyncio.Event | None) -> bool:
    """Whether some task waits in `event.wait()`: how a test knows a long poll or a waiter
    has got as far as it can, instead of guessing with a sleep. asyncio keeps no public count
    of an Event's waiters; this reads the private one, which typeshed declares."""
    return event is not None and bool(event._waiters)
