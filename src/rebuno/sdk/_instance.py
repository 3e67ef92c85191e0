"""The agent process as one instance (`agent-instances`): a name, the same for every start of
one process slot, and an incarnation, fresh per start. The agent names both in each webhook's
acknowledgement and announces a new incarnation to the kernel once, so that what an earlier
incarnation held (it was killed, say) is redelivered at once instead of after its lease.
Imports only the standard library, `rebuno.protocol` and the SDK's own modules.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

from rebuno.protocol.extensions import (
    AGENT_INSTANCE_HEADER,
    AgentInstance,
    format_instance,
    is_instance_name,
)
from rebuno.sdk._kernel import KernelClient

logger = logging.getLogger("rebuno")

INSTANCE_ENV = "REBUNO_AGENT_INSTANCE"
_HEADER = AGENT_INSTANCE_HEADER.lower().encode("ascii")


def configured_name(name: str | None) -> str | None:
    """The name given, else `REBUNO_AGENT_INSTANCE`, else None (named once the port is known).
    Raises ValueError for a name the header cannot carry."""
    source = "instance"
    if name is None:
        name, source = os.environ.get(INSTANCE_ENV) or None, INSTANCE_ENV
    if name is not None and not is_instance_name(name):
        raise ValueError(
            f"{source} must be 1 to 200 visible ASCII characters, with no double quote, comma,"
            f" semicolon or backslash, not {name!r}"
        )
    return name


_TURNS_BEFORE_ANNOUNCING = 16


class Instance:
    """This process's instance, and its one announcement."""

    def __init__(self, kernel: KernelClient, name: str | None) -> None:
        self.name = name
        self.incarnation = str(uuid.uuid4())
        self._kernel = kernel
        self._header: tuple[bytes, bytes] | None = None
        self._announcement: asyncio.Task[None] | None = None

    def serving_on(self, port: int | None) -> None:
        """Names the instance `<hostname>:<port>`, unless it has a name already."""
        if self.name is not None or port is None:
            return
        name = f"{socket.gethostname()}:{port}"
        if is_instance_name(name):
            self.name = name
        else:
            logger.warning("host name %r cannot name an agent instance; set %s", name, INSTANCE_ENV)

    def header(self) -> tuple[bytes, bytes] | None:
        """The `Rebuno-Agent-Instance` header of an acknowledgement, once the name is known."""
        if self._header is None and self.name is not None:
            value = format_instance(AgentInstance(self.name, self.incarnation))
            self._header = (_HEADER, value.encode("ascii"))
        return self._header

    def announce(self) -> asyncio.Task[None] | None:
        """Starts the announcement, once, when the name is known; the task sending it."""
        if self._announcement is None and self.name is not None:
            self._announcement = asyncio.create_task(
                self._announce(self.name), name="rebuno-announce-instance"
            )
        return self._announcement

    async def _announce(self, name: str) -> None:
        # Started from the lifespan's startup, which a server such as uvicorn completes before
        # it opens its port: the kernel redelivers at once what the announcement reclaims, so
        # the server is first given the loop's next turns to start listening. A delivery that
        # still finds the port closed is retried with the kernel's backoff.
        for _ in range(_TURNS_BEFORE_ANNOUNCING):
            await asyncio.sleep(0)
        try:
            await self._kernel.announce_instance(name, self.incarnation)
        except Exception as exc:
            # Best effort: without it, what a previous incarnation held comes back when its
            # lease expires, as it would with any other SDK. The agent serves either way.
            logger.warning(
                "could not announce agent instance %s to the kernel (%s); deliveries held"
                " before a restart return when their leases expire",
                name,
                exc,
            )

    async def close(self) -> None:
        task = self._announcement
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
