"""Clients that hold a connection without finishing their request are let go: a request head
that trickles in (slowloris) is cut after `header_timeout`, a body after `body_timeout`
(408), and past `max_connections` the kernel answers 503 at once. The real server (uvicorn
with the kernel's own protocol) on loopback, with short timings."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from harness.polling import wait_until
from rebuno.kernel.config import Settings
from rebuno.kernel.server import serve

HEAD_TIMEOUT = timedelta(milliseconds=300)
BODY_TIMEOUT = timedelta(milliseconds=300)
MAX_CONNECTIONS = 3


@pytest.fixture
async def kernel_address(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    settings = Settings(
        dev=True,
        listen_addr="127.0.0.1:0",
        db_url=f"sqlite:///{tmp_path / 'kernel.db'}",
        header_timeout=HEAD_TIMEOUT,
        body_timeout=BODY_TIMEOUT,
        max_connections=MAX_CONNECTIONS,
    )
    urls: list[str] = []
    task = asyncio.create_task(serve(settings, on_ready=urls.append))
    await wait_until(lambda: bool(urls) or task.done(), timeout=20, message="kernel ready")
    host, port = urls[0].removeprefix("http://").split(":")
    try:
        yield host, int(port)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _open(address: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*address)


async def test_a_head_that_trickles_in_is_cut_off(kernel_address: tuple[str, int]) -> None:
    reader, writer = await _open(kernel_address)
    writer.write(b"GET /v0/health HTTP/1.1\r\nHost: kernel\r\nX-Slow: ")  # never finished
    await writer.drain()
    loop = asyncio.get_running_loop()
    started = loop.time()

    closed = await asyncio.wait_for(reader.read(), timeout=10)

    assert closed == b""  # the kernel closed the connection without an answer
    assert loop.time() - started >= HEAD_TIMEOUT.total_seconds() * 0.9
    writer.close()


async def test_a_complete_head_is_not_cut_off(kernel_address: tuple[str, int]) -> None:
    reader, writer = await _open(kernel_address)
    writer.write(b"GET /v0/health HTTP/1.1\r\nHost: kernel\r\n\r\n")
    await writer.drain()

    status = await asyncio.wait_for(reader.readline(), timeout=10)

    assert status.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_body_that_trickles_in_is_answered_408(kernel_address: tuple[str, int]) -> None:
    reader, writer = await _open(kernel_address)
    writer.write(
        b"POST /v0/executions HTTP/1.1\r\nHost: kernel\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"agent_id": '
    )
    await writer.drain()

    status = await asyncio.wait_for(reader.readline(), timeout=10)

    assert status.startswith(b"HTTP/1.1 408")
    writer.close()


async def test_past_the_connection_limit_the_kernel_answers_503(
    kernel_address: tuple[str, int],
) -> None:
    held = [socket.create_connection(kernel_address) for _ in range(MAX_CONNECTIONS)]
    try:
        reader, writer = await _open(kernel_address)
        writer.write(b"GET /v0/health HTTP/1.1\r\nHost: kernel\r\n\r\n")
        await writer.drain()

        status = await asyncio.wait_for(reader.readline(), timeout=10)

        assert status.startswith(b"HTTP/1.1 503")
        writer.close()
    finally:
        for sock in held:
            sock.close()


async def test_bytes_that_are_not_http_get_the_error_envelope(
    kernel_address: tuple[str, int],
) -> None:
    reader, writer = await _open(kernel_address)
    writer.write(b"GET /v0/health HTTP/1.1\r\nHost: kernel\r\nBad\x00Header: x\r\n\r\n")
    await writer.drain()

    answer = await asyncio.wait_for(reader.read(), timeout=10)  # closed after the answer
    writer.close()

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"content-type: application/json; charset=utf-8" in head.lower()
    envelope = json.loads(body)
    assert envelope["code"] == "validation_error"
    assert envelope["message"] == "validation error: the request is not HTTP/1.1"
