"""Coalesced writes: what one loop turn writes leaves together, in order, and only then."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from rebuno.kernel.http_protocol import CoalescedWrites


@pytest.fixture
async def pair() -> AsyncIterator[tuple[CoalescedWrites, socket.socket]]:
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    yield CoalescedWrites(transport, loop), peer
    transport.abort()
    peer.close()


def _received(peer: socket.socket) -> bytes:
    try:
        return peer.recv(65536)
    except BlockingIOError:
        return b""


async def _next_turn() -> None:
    # Ends this turn: the flush, scheduled before this task yields, runs before it resumes.
    await asyncio.sleep(0)


async def test_writes_of_one_turn_are_held_until_the_turn_ends(
    pair: tuple[CoalescedWrites, socket.socket],
) -> None:
    writes, peer = pair
    writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    writes.write(memoryview(b"{}"))
    assert _received(peer) == b""
    assert writes.get_write_buffer_size() == 40

    await _next_turn()

    assert _received(peer) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    assert writes.get_write_buffer_size() == 0


async def test_close_sends_what_is_held_first(
    pair: tuple[CoalescedWrites, socket.socket],
) -> None:
    writes, peer = pair
    writes.write(b"last words")

    writes.close()
    await _next_turn()

    assert _received(peer) == b"last words"


async def test_abort_drops_what_is_held(pair: tuple[CoalescedWrites, socket.socket]) -> None:
    writes, peer = pair
    writes.write(b"never sent")

    writes.abort()
    await _next_turn()

    assert _received(peer) == b""
