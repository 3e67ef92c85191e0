"""The bare reference, measured in the same run: an ASGI app on uvicorn that does nothing but
one one-row INSERT and COMMIT per request, and a client that makes two requests per "step" --
the two HTTP round trips and two durable writes a step costs through the standard protocol,
with no kernel, no agent and no logic. It is what a Python server on this machine, at this
moment, does with that shape of work; the report gives the kernel's step cost and rate as
multiples of it, which stay comparable when the machine is slower or busier than usual.

`python -m bench.reference DB_URL PORT` runs the server (one process, uvicorn's defaults as
the kernel uses them); the client side runs in the harness, on the lean HTTP pool the SDK
uses. Imports psycopg, uvicorn, `rebuno._http` and the bench's own modules.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import psycopg
import uvicorn
from psycopg_pool import AsyncConnectionPool

from bench.outcome import Context, Outcome
from bench.processes import Process, fresh_store
from bench.stats import median
from harness.ports import free_port
from rebuno._http import Pool

MS = 1000.0
BODY = b'{"i":0,"payload":"' + b"x" * 100 + b'"}'
_HEADERS = (("content-type", "application/json"),)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def reference(ctx: Context) -> Outcome:
    """`reference.<store>_step` (ms per step, one client) and `reference.<store>_steps_per_s`
    (with `b_clients` clients), for the store of `ctx`."""
    outcome, sizes = Outcome(), ctx.sizes
    workdir = ctx.workdir / "reference"
    workdir.mkdir(parents=True, exist_ok=True)
    with fresh_store(ctx.store, workdir) as store:
        port = free_port()
        url = store.url.replace("sqlite:///", "", 1) if ctx.store == "sqlite" else store.url
        server = Process(
            [sys.executable, "-m", "bench.reference", url, str(port)], workdir / "reference.log", {}
        )
        try:
            server.wait_for_port(port)
            base = f"http://127.0.0.1:{port}"
            reps = [
                asyncio.run(_measure(base, sizes.ref_steps, sizes.ref_rate_steps, sizes.b_clients))
                for _ in range(sizes.reps)
            ]
        finally:
            server.stop()
    outcome.add(f"reference.{ctx.store}_step", "ms", [rep[0] for rep in reps])
    outcome.add(f"reference.{ctx.store}_steps_per_s", "1/s", [rep[1] for rep in reps])
    return outcome


async def _measure(base: str, steps: int, rate_steps: int, clients: int) -> tuple[float, float]:
    """The median time of `steps` steps of one client, and the steps per second of `clients`
    at once over `rate_steps` steps, timed once every client's connection is open."""
    pool = Pool(base, timeout=30.0, max_connections=clients, max_idle=clients)
    try:
        for _ in range(20):
            await _step(pool)
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            await _step(pool)
            times.append(time.perf_counter() - started)
        await asyncio.gather(*(_step(pool) for _ in range(clients)))
        remaining = rate_steps

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await _step(pool)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        rate = rate_steps / (time.perf_counter() - started)
    finally:
        await pool.aclose()
    return median(times) * MS, rate


async def _step(pool: Pool) -> None:
    for _ in range(2):
        response = await pool.request("POST", "/step", _HEADERS, BODY)
        if response.status != 200:
            raise RuntimeError(f"the reference server answered {response.status}")


class App:
    """One INSERT and COMMIT per request, on PostgreSQL (a pool, as a server would have) or on
    an SQLite file with the kernel's settings (WAL, `synchronous = NORMAL`)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._sqlite: sqlite3.Connection | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await self._commit(body.decode())
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"ok":true}'})

    async def _commit(self, body: str) -> None:
        if self._pool is not None:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute("INSERT INTO reference (body) VALUES (%s)", (body,))
            return
        assert self._sqlite is not None
        self._sqlite.execute("BEGIN IMMEDIATE")
        self._sqlite.execute("INSERT INTO reference (body) VALUES (?)", (body,))
        self._sqlite.execute("COMMIT")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._pool is not None:
                    await self._pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _open(self) -> None:
        create = "CREATE TABLE IF NOT EXISTS reference (id bigserial PRIMARY KEY, body text)"
        if self._url.startswith("postgres"):
            async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
                await conn.execute(create)
            self._pool = AsyncConnectionPool(self._url, min_size=16, max_size=16, open=False)
            await self._pool.open(wait=True)
            return
        self._sqlite = sqlite3.connect(Path(self._url), isolation_level=None)
        self._sqlite.execute("PRAGMA journal_mode = WAL")
        self._sqlite.execute("PRAGMA synchronous = NORMAL")
        self._sqlite.execute(create.replace("bigserial", "INTEGER"))


def main() -> None:
    url, port = sys.argv[1], int(sys.argv[2])
    uvicorn.run(
        App(url), host="127.0.0.1", port=port, lifespan="on", access_log=False, log_level="warning"
    )


if __name__ == "__main__":
    main()
