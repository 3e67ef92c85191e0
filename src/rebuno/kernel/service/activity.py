"""The activity feed (§40.5): which executions changed, for the console's live badges.

Each watcher holds the ids of the executions committed since it last looked, coalesced:
an execution that changed three times while the watcher was busy is read once, as it is
now. What a watcher is sent is always read back from the store, so the feed is a hint to
look and never a second record. Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

PENDING_LIMIT = 1000
"""Ids one watcher keeps before it is told to look again at everything (`None`)."""


class Watcher:
    """The executions changed since the last `changed()`; `overflowed` once it lost count."""

    def __init__(self) -> None:
        self.pending: dict[str, None] = {}
        self.overflowed = False
        self.woken = asyncio.Event()

    def add(self, execution_id: str) -> None:
        if len(self.pending) >= PENDING_LIMIT:
            self.overflowed = True
        else:
            self.pending[execution_id] = None
        self.woken.set()

    async def changed(self, quiet: float) -> list[str] | None:
        """The ids changed since the last call, waiting up to `quiet` seconds for one;
        `None` when too many changed to name them."""
        if not self.woken.is_set():
            try:
                await asyncio.wait_for(self.woken.wait(), quiet)
            except TimeoutError:
                return []
        self.woken.clear()
        ids, self.pending = list(self.pending), {}
        if self.overflowed:
            self.overflowed = False
            return None
        return ids


class Activity:
    """The watchers of this process; `touched` is called after each commit that may have
    changed an execution."""

    def __init__(self) -> None:
        self._watchers: set[Watcher] = set()

    def touched(self, execution_id: str) -> None:
        for watcher in self._watchers:
            watcher.add(execution_id)

    @contextmanager
    def watch(self) -> Iterator[Watcher]:
        watcher = Watcher()
        self._watchers.add(watcher)
        try:
            yield watcher
        finally:
            self._watchers.discard(watcher)
