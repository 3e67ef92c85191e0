"""Serves an ASGI app on a loopback port inside the test's event loop, with uvicorn.

Used for the true external edges the SDK talks to over HTTP: an agent's webhook, a tiny
envelope server for `Client` error mapping, a fake LLM provider.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from harness.polling import wait_until


def free_socket() -> socket.socket:
    """A listening socket on 127.0.0.1 with a port the OS chose."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


@asynccontextmanager
async def serving(app: Any, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """Serve `app` until the block ends; yields its base URL."""
    sock = sock or free_socket()
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", ws="none", interface="asgi3", access_log=False
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="loopback-server")
    try:
        await wait_until(lambda: server.started or task.done(), message="server started")
        if task.done():
            task.result()
        yield url_of(sock)
    finally:
        server.should_exit = True
        await task
        sock.close()
