"""Live streaming (§16) over a real loopback server, since the in-process httpx transport
buffers whole response bodies: SSE framing, delivery of published deltas, keep-alives."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp

from harness.polling import wait_until
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.stream.memory import MemoryBus
from tests.api.harness import AGENT, TOKEN, AgentClient, assert_error

FRAME_TIMEOUT = 5.0


@pytest.fixture
async def live_url(app: ASGIApp) -> AsyncIterator[str]:
    """The app served by uvicorn on a free loopback port."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, message="uvicorn started")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def live(live_url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=live_url, headers=headers) as http:
        yield http


class Frames:
    """Splits an SSE body into frames (the text before each blank line)."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._buffer = ""

    async def next(self) -> str:
        return await asyncio.wait_for(self._next(), FRAME_TIMEOUT)

    async def _next(self) -> str:
        while "\n\n" not in self._buffer:
            self._buffer += await anext(self._chunks)
        frame, self._buffer = self._buffer.split("\n\n", 1)
        return frame

    async def next_data(self) -> dict[str, object]:
        while True:
            frame = await self.next()
            if frame.startswith("data: "):
                payload: dict[str, object] = json.loads(frame.removeprefix("data: "))
                return payload


async def _executing_step(leased: AgentClient, execution: Execution) -> str:
    response = await leased.post(
        f"/v0/executions/{execution.id}/steps", {"kind": "llm_call", "target": "gpt"}
    )
    step_id: str = response.json()["step_id"]
    return step_id


async def test_stream_opens_with_sse_headers_and_an_ok_comment(
    live: httpx.AsyncClient, execution: Execution
) -> None:
    async with live.stream("GET", f"/v0/executions/{execution.id}/stream") as response:
        first = await Frames(response).next()
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    assert first == ": ok"


async def test_published_deltas_arrive_in_order_as_data_frames(
    live: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    step_id = await _executing_step(leased, execution)
    produce = f"/v0/executions/{execution.id}/steps/{step_id}/stream"
    async with live.stream("GET", f"/v0/executions/{execution.id}/stream") as response:
        frames = Frames(response)
        assert await frames.next() == ": ok"
        for seq, chunk in enumerate(["Hel", "lo ", "wörld"]):
            assert (await leased.post(produce, {"seq": seq, "data": chunk})).status_code == 204
        received = [await frames.next_data() for _ in range(3)]
    assert received == [
        {"step_id": step_id, "seq": 0, "data": "Hel"},
        {"step_id": step_id, "seq": 1, "data": "lo "},
        {"step_id": step_id, "seq": 2, "data": "wörld"},
    ]


async def test_quiet_stream_sends_keepalive_comments(
    live: httpx.AsyncClient, execution: Execution
) -> None:
    async with live.stream("GET", f"/v0/executions/{execution.id}/stream") as response:
        frames = Frames(response)
        received = [await frames.next(), await frames.next(), await frames.next()]
    assert received == [": ok", ": keep-alive", ": keep-alive"]


async def test_disconnecting_client_is_unsubscribed(
    kernel: Kernel, live: httpx.AsyncClient, execution: Execution
) -> None:
    bus = kernel.bus
    assert isinstance(bus, MemoryBus)
    async with live.stream("GET", f"/v0/executions/{execution.id}/stream") as response:
        await Frames(response).next()
        assert bus.subscriber_count(execution.id) == 1
    await wait_until(lambda: bus.subscriber_count(execution.id) == 0, message="unsubscribed")


async def test_stream_of_unknown_execution_is_not_found(live: httpx.AsyncClient) -> None:
    response = await live.get("/v0/executions/01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f/stream")
    assert_error(response, 404, "not_found")


async def test_stream_needs_the_bearer_token(live_url: str, execution: Execution) -> None:
    async with httpx.AsyncClient(base_url=live_url) as anonymous:
        response = await anonymous.get(f"/v0/executions/{execution.id}/stream")
    assert_error(response, 401, "unauthorized")


async def test_consumer_that_stops_reading_stalls_neither_producer_nor_others(
    kernel: Kernel,
    live: httpx.AsyncClient,
    live_url: str,
    leased: AgentClient,
    execution: Execution,
) -> None:
    step_id = await _executing_step(leased, execution)
    produce = f"/v0/executions/{execution.id}/steps/{step_id}/stream"
    stalled = _stalled_consumer(live_url, execution.id)
    bus = kernel.bus
    assert isinstance(bus, MemoryBus)
    await wait_until(lambda: bus.subscriber_count(execution.id) == 1, message="stalled subscribed")
    chunk = "x" * 7000
    try:
        async with live.stream("GET", f"/v0/executions/{execution.id}/stream") as response:
            frames = Frames(response)
            assert await frames.next() == ": ok"
            # Lockstep: each delta must reach the reading consumer before the next is sent.
            # Far more bytes than the stalled consumer's socket and the server's write buffer
            # hold go out; had it back-pressured anyone, this loop would hang.
            for seq in range(400):
                posted = await leased.post(produce, {"seq": seq, "data": chunk})
                assert posted.status_code == 204
                assert (await frames.next_data())["seq"] == seq
    finally:
        stalled.close()


def _stalled_consumer(live_url: str, execution_id: str) -> socket.socket:
    """A subscriber that sends its request and then never reads a byte."""
    host, port = live_url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(
        f"GET /v0/executions/{execution_id}/stream HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    return sock


@pytest.mark.parametrize(
    ("data", "status"),
    [("\x01" * 1166, 204), ("\x01" * 1167, 413), ('"' * 3500, 204), ('"' * 3501, 413)],
    ids=["control-at-limit", "control-over", "quotes-at-limit", "quotes-over"],
)
async def test_a_delta_is_measured_as_it_travels_json_escaped(
    leased: AgentClient, execution: Execution, data: str, status: int
) -> None:
    step_id = await _executing_step(leased, execution)

    posted = await leased.post(
        f"/v0/executions/{execution.id}/steps/{step_id}/stream", {"seq": 0, "data": data}
    )

    assert posted.status_code == status, posted.text


# -- the activity feed (§40.5) -------------------------------------------------------------


async def test_the_activity_feed_names_a_created_execution_and_its_cancel(
    live: httpx.AsyncClient, kernel: Kernel
) -> None:
    async with live.stream("GET", "/v0/activity") as response:
        frames = Frames(response)
        assert await frames.next() == ": ok"
        made = await kernel.create_execution(AGENT, '{"big": "input"}', None)
        created = await frames.next_data()
        await kernel.cancel_execution(made.id)
        while (ended := await frames.next_data())["execution"]["status"] != "cancelled":  # type: ignore[index]
            pass

    assert response.headers["content-type"] == "text/event-stream"
    assert created["type"] == "execution"
    summary = created["execution"]
    assert isinstance(summary, dict) and summary["id"] == made.id
    assert "input" not in summary and summary["status"] == "pending"
    assert ended["execution"]["id"] == made.id  # type: ignore[index]


async def test_the_activity_feed_needs_credentials(live_url: str) -> None:
    async with httpx.AsyncClient(base_url=live_url) as anon:
        response = await anon.get("/v0/activity", timeout=5)

    assert_error(response, 401, "unauthorized")
