"""The replica listener: LISTEN on `rebuno_dispatch` (a dispatch was enqueued), on
`rebuno_execution` (an execution ended) and on `rebuno_activity` (an execution was created or
its status changed short of an end) over a dedicated connection.

A pooled connection cannot listen (it is handed to other work between uses), so the listener
keeps one of its own, probes it when it has been quiet for a while (a dead peer would
otherwise go unnoticed), and reconnects with capped exponential backoff after a loss. After
every (re)connection it wakes the loop once: a dispatch enqueued while nobody was listening
would otherwise wait for the next poll.
Must import only psycopg, the domain, `rebuno.kernel.pgserver` and this package.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from rebuno.kernel.pgserver import Server
from rebuno.kernel.store.postgres.dispatches import CHANNEL

ENDED_CHANNEL = "rebuno_execution"
"""Notified by `rebuno_apply` when an execution reaches a terminal status."""
ACTIVITY_CHANNEL = "rebuno_activity"
"""Notified by `rebuno_apply` when an execution is created or its status changes to one that
is not terminal (§40.5), with the writing store's tag and the execution's id."""

log = logging.getLogger(__name__)

_PROBE_INTERVAL_SECONDS = 30.0
_FIRST_BACKOFF_SECONDS = 0.1
_MAX_BACKOFF_SECONDS = 10.0


class DispatchListener:
    """Until cancelled, calls `wake` per dispatch enqueued by another store (one not tagged
    `tag`: this store's own enqueues woke its loop already), `ended` per execution that
    reached a terminal status, and `touched` per execution another store created or moved to
    another status that is not terminal (an end goes to `ended` alone)."""

    def __init__(
        self,
        server: Server,
        tag: str,
        wake: Callable[[], None],
        ended: Callable[[str], None] | None = None,
        touched: Callable[[str], None] | None = None,
    ) -> None:
        self._server = server
        self._tag = tag
        self._wake = wake
        self._ended = ended
        self._touched = touched
        self._backoff = _FIRST_BACKOFF_SECONDS

    async def run(self) -> None:
        while True:
            try:
                await self._listen()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.warning(
                    "dispatch listener lost PostgreSQL %s (%s); reconnecting in %.1fs",
                    self._server.name,
                    self._server.reason(exc),
                    self._backoff,
                )
            # A pause between attempts, not a wait for a condition: nothing signals that the
            # server is back.
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF_SECONDS)

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self._server.conninfo, autocommit=True)
        async with conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            if self._ended is not None:
                await conn.execute(f"LISTEN {ENDED_CHANNEL}")
            if self._touched is not None:
                await conn.execute(f"LISTEN {ACTIVITY_CHANNEL}")
            self._backoff = _FIRST_BACKOFF_SECONDS
            self._wake()
            while True:
                async for notify in conn.notifies(timeout=_PROBE_INTERVAL_SECONDS):
                    self._route(notify.channel, notify.payload)
                await conn.execute("SELECT 1")

    def _route(self, channel: str, payload: str) -> None:
        if channel == CHANNEL:
            if payload != self._tag:
                self._wake()
        elif channel == ENDED_CHANNEL and self._ended is not None:
            self._ended(payload)
        elif channel == ACTIVITY_CHANNEL and self._touched is not None:
            tag, _, execution_id = payload.partition(" ")
            if tag != self._tag:
                self._touched(execution_id)
