"""The two chores of a hand-written ASGI server (a fake provider, a test's own webhook): its
lifespan and a request's whole body.

Standard library only.
"""

from __future__ import annotations

from typing import Any


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
