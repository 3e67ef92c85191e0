"""The cross-replica stream bus: deltas travel as NOTIFY on `rebuno_stream` (§16.3).

A replica that receives a delta does not hand it to its own subscribers directly: it sends
`pg_notify('rebuno_stream', '{"exec_id": …, "delta": {"step_id", "seq", "data"}}')`, and every
replica, itself included, LISTENs on one dedicated connection and forwards what arrives to its
local subscribers through a `MemoryBus`. One path for every subscriber keeps a step's deltas in
the order they were sent, whichever replica the consumer is attached to. Deltas are ephemeral:
while a connection is down they are dropped, never queued for later.
Must import only psycopg, orjson, the domain, `protocol`, `rebuno.kernel.pgserver` and this
package (never `service`, `api` or `store`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeAlias

import orjson
import psycopg
from psycopg.rows import TupleRow

from rebuno.kernel.pgserver import Server
from rebuno.kernel.stream.bus import Delta
from rebuno.kernel.stream.memory import MemoryBus, MemorySubscription

log = logging.getLogger(__name__)

CHANNEL = "rebuno_stream"
MAX_PAYLOAD_BYTES = 7999
"""PostgreSQL refuses a NOTIFY payload of 8000 bytes or more (default build)."""
PUBLISH_BUFFER = 1024
"""Deltas waiting for the sender before new ones are dropped."""
_PROBE_INTERVAL_SECONDS = 30.0
_FIRST_BACKOFF_SECONDS = 0.1
_MAX_BACKOFF_SECONDS = 5.0
_LOST = (psycopg.OperationalError, psycopg.InterfaceError)

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]


def encode(execution_id: str, delta: Delta) -> bytes:
    """The NOTIFY payload of one delta. Raises `orjson.JSONEncodeError` for text that is not
    valid Unicode (a lone surrogate)."""
    body = {"step_id": delta.step_id, "seq": delta.seq, "data": delta.data}
    return orjson.dumps({"exec_id": execution_id, "delta": body})


def decode(payload: str) -> tuple[str, Delta]:
    """The execution and delta of a payload; `ValueError` when it is not one of ours."""
    try:
        message = orjson.loads(payload)
        execution_id, body = message["exec_id"], message["delta"]
        delta = Delta(step_id=body["step_id"], seq=body["seq"], data=body["data"])
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a stream delta: {exc}") from None
    fields = (execution_id, delta.step_id, delta.data)
    if not all(isinstance(field, str) for field in fields) or type(delta.seq) is not int:
        raise ValueError("not a stream delta: a field has the wrong type")
    return execution_id, delta


class PostgresBus:
    """Publishes through PostgreSQL and fans out locally. `run` must be running (it owns both
    connections) for deltas to flow; `publish` and `subscribe` work from the start."""

    def __init__(self, url: str, *, local: MemoryBus | None = None) -> None:
        self._server = Server(url, application_name="rebuno-stream")
        self._local = local if local is not None else MemoryBus()
        self._outbox: asyncio.Queue[tuple[str, str, bytes]] = asyncio.Queue(PUBLISH_BUFFER)
        self._dropping = False
        self._sender: Connection | None = None

    # -- the StreamBus protocol ----------------------------------------------------------
    def publish(self, execution_id: str, delta: Delta) -> None:
        try:
            payload = encode(execution_id, delta)
        except orjson.JSONEncodeError as exc:
            self._drop(execution_id, delta.step_id, f"not encodable ({exc})")
            return
        if len(payload) > MAX_PAYLOAD_BYTES:
            self._drop(execution_id, delta.step_id, f"{len(payload)} bytes exceed the NOTIFY limit")
            return
        try:
            self._outbox.put_nowait((execution_id, delta.step_id, payload))
        except asyncio.QueueFull:
            # Publishing never blocks the producer (§16): shed load, warn once per episode.
            if not self._dropping:
                self._drop(execution_id, delta.step_id, "the publish buffer is full")
            self._dropping = True
            return
        self._dropping = False

    def subscribe(self, execution_id: str) -> MemorySubscription:
        return self._local.subscribe(execution_id)

    # -- lifecycle -----------------------------------------------------------------------
    async def run(self) -> None:
        """Listens and sends until cancelled, reconnecting after every loss."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._listen_forever(), name="stream-listen")
            group.create_task(self._send_forever(), name="stream-send")

    async def close(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            await sender.close()

    # -- receiving -----------------------------------------------------------------------
    async def _listen_forever(self) -> None:
        backoff = _FIRST_BACKOFF_SECONDS
        while True:
            try:
                conn = await self._connect()
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    backoff = _FIRST_BACKOFF_SECONDS
                    await self._forward(conn)
            except _LOST as exc:
                self._lost("listener", exc, backoff)
            # A pause between attempts: nothing signals that the server is back.
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)

    async def _forward(self, conn: Connection) -> None:
        while True:
            async for notify in conn.notifies(timeout=_PROBE_INTERVAL_SECONDS):
                self._deliver(notify.payload)
            # A quiet connection may be a dead one: a probe turns a silent loss into an error.
            await conn.execute("SELECT 1")

    def _deliver(self, payload: str) -> None:
        try:
            execution_id, delta = decode(payload)
        except ValueError as exc:
            log.warning("ignoring a notification on %s: %s", CHANNEL, exc)
            return
        self._local.publish(execution_id, delta)

    # -- sending -------------------------------------------------------------------------
    async def _send_forever(self) -> None:
        backoff = _FIRST_BACKOFF_SECONDS
        while True:
            execution_id, step_id, payload = await self._outbox.get()
            try:
                await self._send(payload)
                backoff = _FIRST_BACKOFF_SECONDS
            except _LOST as exc:
                await self.close()
                self._lost("publisher", exc, backoff)
                self._drop(execution_id, step_id, "PostgreSQL is unreachable")
                self._discard_queued()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
            except psycopg.Error as exc:  # refused by the server; the connection is fine
                self._drop(execution_id, step_id, f"NOTIFY refused ({type(exc).__name__})")

    async def _send(self, payload: bytes) -> None:
        if self._sender is None:
            self._sender = await self._connect()
        # One connection, one statement at a time: a step's deltas arrive in the order sent.
        await self._sender.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload.decode()))

    def _discard_queued(self) -> None:
        # Deltas that waited out an outage are stale; live output resumes with the next one.
        discarded = 0
        while not self._outbox.empty():
            self._outbox.get_nowait()
            discarded += 1
        if discarded:
            log.warning("dropped %d queued stream deltas while PostgreSQL was down", discarded)

    # -- shared --------------------------------------------------------------------------
    async def _connect(self) -> Connection:
        return await psycopg.AsyncConnection.connect(self._server.conninfo, autocommit=True)

    def _drop(self, execution_id: str, step_id: str, why: str) -> None:
        # Deltas are best-effort by contract (§16): the recorded step result stays the truth.
        log.warning(
            "stream delta dropped: execution_id=%s step_id=%s: %s", execution_id, step_id, why
        )

    def _lost(self, role: str, exc: BaseException, backoff: float) -> None:
        log.warning(
            "stream %s lost PostgreSQL %s (%s); reconnecting in %.1fs",
            role,
            self._server.name,
            self._server.reason(exc),
            backoff,
        )
