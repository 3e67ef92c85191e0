"""The lean HTTP/1.1 client (`rebuno._http`) and the agent's kernel client on top of it,
against real loopback servers: uvicorn for the ordinary exchange, and a hand-rolled asyncio
server for what uvicorn never does on purpose (chunks, closes, silence)."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvloop

from harness.asgi import asgi_body
from harness.polling import wait_until
from rebuno._http import PARSERS, Pool, Response, Timeout, TransportError
from rebuno.kernel.domain.dispatch import Webhook
from rebuno.kernel.webhooks.delivery import HttpDeliverer
from rebuno.protocol import signing
from rebuno.sdk._kernel import Completion, KernelClient, Lease, Report, encode_json
from rebuno.sdk.errors import LeaseSuperseded, NetworkError
from tests.sdk.loopback import serving

SECRET = "wire-secret"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@asynccontextmanager
async def pool_for(url: str, parser: str, **options: Any) -> AsyncIterator[Pool]:
    pool = Pool(url, timeout=options.pop("timeout", 5.0), parser=parser, **options)
    try:
        yield pool
    finally:
        await pool.aclose()


# --- uvicorn: the ordinary exchange ------------------------------------------------------------


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with what it saw: method, raw target, client port, headers and body."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = await asgi_body(receive)
    query = scope["query_string"]
    seen = {
        "method": scope["method"],
        "target": scope["raw_path"].decode() + ("?" + query.decode() if query else ""),
        "port": scope["client"][1],
        "headers": {key.decode(): value.decode() for key, value in scope["headers"]},
        "body": body.decode(),
    }
    payload = json.dumps(seen).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture
async def echo_url() -> AsyncIterator[str]:
    async with serving(echo) as url:
        yield url


async def test_request_goes_out_with_its_target_headers_and_body_exactly(
    echo_url: str, parser: str
) -> None:
    async with pool_for(echo_url, parser) as pool:
        response = await pool.request(
            "POST", "/v0/a%2Fb/c?x=1%20&y", [("Rebuno-Agent-Id", "agent-7")], b'{"k": "v"}'
        )

    seen = json.loads(response.body)
    assert response.status == 200
    assert seen["method"] == "POST"
    assert seen["target"] == "/v0/a%2Fb/c?x=1%20&y"
    assert seen["headers"]["rebuno-agent-id"] == "agent-7"
    assert seen["headers"]["content-length"] == "10"
    assert seen["body"] == '{"k": "v"}'


async def test_sequential_requests_share_one_keep_alive_connection(
    echo_url: str, parser: str
) -> None:
    async with pool_for(echo_url, parser) as pool:
        ports = {json.loads((await pool.request("GET", "/")).body)["port"] for _ in range(5)}

    assert len(ports) == 1


async def test_base_path_prefixes_every_target(echo_url: str, parser: str) -> None:
    async with pool_for(echo_url + "/rebuno/", parser) as pool:
        response = await pool.request("GET", pool.prefix + "/v0/ping")

    assert json.loads(response.body)["target"] == "/rebuno/v0/ping"


async def test_concurrent_requests_never_exceed_the_connection_bound(parser: str) -> None:
    gate = asyncio.Event()
    running: list[int] = []
    peak = 0

    async def held(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal peak
        if scope["type"] != "http":
            return
        running.append(scope["client"][1])
        peak = max(peak, len(running))
        await gate.wait()
        running.remove(scope["client"][1])
        body = str(scope["client"][1]).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async with serving(held) as url, pool_for(url, parser, max_connections=2) as pool:
        calls = [asyncio.create_task(pool.request("GET", "/")) for _ in range(6)]
        await wait_until(lambda: len(running) == 2, message="two requests held")
        gate.set()
        responses = await asyncio.gather(*calls)

    assert peak == 2
    assert len({response.body for response in responses}) <= 2


# --- a hand-rolled server for the edges ---------------------------------------------------------


@dataclass
class Exchange:
    """One request as the scripted server read it, on the `connection`-th connection (from 0)."""

    connection: int
    head: bytes
    body: bytes


Script = Callable[[int, int, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class Scripted:
    """A server whose answer to each request is a script `(connection, index, writer)`;
    the script returns False to stop serving that connection."""

    script: Script
    url: str = ""
    seen: list[Exchange] = field(default_factory=list)
    accepted: int = 0
    ended: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection, self.accepted = self.accepted, self.accepted + 1
        try:
            index = 0
            while (exchange := await _read_request(connection, reader)) is not None:
                self.seen.append(exchange)
                if not await self.script(connection, index, writer):
                    break
                index += 1
            else:
                await reader.read()
        except ConnectionError:
            pass
        finally:
            writer.close()
            self.ended += 1


async def _read_request(connection: int, reader: asyncio.StreamReader) -> Exchange | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return Exchange(connection, head, await reader.readexactly(length))


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[Scripted]:
    state = Scripted(script)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    state.url = f"http://{host}:{port}"
    try:
        yield state
    finally:
        server.close()
        await server.wait_closed()


async def answer_ok(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
    writer.write(OK)
    return True


async def test_chunked_body_is_reassembled_and_the_connection_reused(parser: str) -> None:
    async def chunked(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        writer.write(b"5\r\nhello\r\n")
        await writer.drain()
        writer.write(b"6\r\n world\r\n0\r\n\r\n")
        return True

    async with scripted(chunked) as server, pool_for(server.url, parser) as pool:
        first = await pool.request("GET", "/")
        second = await pool.request("GET", "/")

    assert first.body == second.body == b"hello world"
    assert server.accepted == 1


async def test_connection_close_answer_is_not_reused(parser: str) -> None:
    async def closing(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye")
        return False

    async with scripted(closing) as server, pool_for(server.url, parser) as pool:
        bodies = [(await pool.request("GET", "/")).body for _ in range(2)]

    assert bodies == [b"bye", b"bye"]
    assert server.accepted == 2


async def test_body_without_framing_ends_when_the_server_closes(parser: str) -> None:
    async def unframed(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        return False

    async with scripted(unframed) as server, pool_for(server.url, parser) as pool:
        response = await pool.request("GET", "/")

    assert response.body == b"until the end"


async def test_interim_answer_is_skipped_for_the_final_one(parser: str) -> None:
    async def interim(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
        return True

    async with scripted(interim) as server, pool_for(server.url, parser) as pool:
        response = await pool.request("POST", "/", body=b"x")

    assert (response.status, response.body) == (200, b"{}")


async def test_bytes_beyond_the_answer_retire_the_connection(parser: str) -> None:
    async def doubled(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        other = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"
        writer.write(OK + (other if connection == 0 else b""))
        return True

    async with scripted(doubled) as server, pool_for(server.url, parser) as pool:
        bodies = [(await pool.request("GET", "/")).body for _ in range(2)]

    assert bodies == [b"{}", b"{}"]
    assert server.accepted == 2


async def test_idle_connection_closed_by_the_server_is_replaced(parser: str) -> None:
    async def once(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK)  # keep-alive promised, then the server closes anyway
        return False

    async with scripted(once) as server, pool_for(server.url, parser) as pool:
        await pool.request("POST", "/", body=b"1")
        await wait_until(lambda: server.ended == 1, message="the server closed the connection")
        response = await pool.request("POST", "/", body=b"2")

    assert response.status == 200
    assert [(seen.connection, seen.body) for seen in server.seen][-1] == (1, b"2")


async def test_reused_connection_closed_before_any_answer_is_retried_once_on_a_fresh_one(
    parser: str,
) -> None:
    async def race(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        if connection == 0 and index == 1:
            return False  # read the request, then close without a byte: the keep-alive race
        writer.write(OK)
        return True

    async with scripted(race) as server, pool_for(server.url, parser) as pool:
        await pool.request("POST", "/", body=b"first")
        response = await pool.request("POST", "/", body=b"second")

    assert response.status == 200
    assert [(seen.connection, seen.body) for seen in server.seen] == [
        (0, b"first"),
        (0, b"second"),
        (1, b"second"),
    ]


async def test_fresh_connection_closed_before_any_answer_is_not_retried(parser: str) -> None:
    async def silent_close(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        return False

    async with scripted(silent_close) as server, pool_for(server.url, parser) as pool:
        with pytest.raises(TransportError):
            await pool.request("POST", "/", body=b"once")

    assert len(server.seen) == 1


async def test_close_in_the_middle_of_an_answer_fails_without_a_retry(parser: str) -> None:
    async def truncated(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        if index == 0:
            writer.write(OK)
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        return False

    async with scripted(truncated) as server, pool_for(server.url, parser) as pool:
        await pool.request("POST", "/", body=b"first")
        with pytest.raises(TransportError) as raised:
            await pool.request("POST", "/", body=b"second")

    assert not isinstance(raised.value, Timeout)
    assert [seen.body for seen in server.seen] == [b"first", b"second"]


async def test_silent_server_times_out_and_its_connection_is_closed(parser: str) -> None:
    async def never(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        return True

    async with scripted(never) as server, pool_for(server.url, parser, timeout=0.2) as pool:
        started = time.monotonic()
        with pytest.raises(Timeout):
            await pool.request("GET", "/")
        elapsed = time.monotonic() - started
        await wait_until(lambda: server.ended == 1, message="the timed-out connection closed")

    assert 0.15 <= elapsed < 2  # uvloop timers round to the millisecond


async def test_cancelled_request_closes_its_connection_and_the_next_uses_a_new_one(
    parser: str,
) -> None:
    async def first_never(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        if connection > 0:
            writer.write(OK)
        return True

    async with scripted(first_never) as server, pool_for(server.url, parser) as pool:
        pending = asyncio.create_task(pool.request("GET", "/"))
        await wait_until(lambda: len(server.seen) == 1, message="the request reached the server")
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        await wait_until(lambda: server.ended == 1, message="the cancelled connection closed")
        response = await pool.request("GET", "/")

    assert response.status == 200
    assert server.accepted == 2


async def test_refused_connection_is_a_transport_error(parser: str) -> None:
    async with scripted(answer_ok) as server:
        url = server.url
    async with pool_for(url, parser) as pool:
        with pytest.raises(TransportError):
            await pool.request("GET", "/")


async def test_aclose_closes_idle_connections(parser: str) -> None:
    async with scripted(answer_ok) as server:
        async with pool_for(server.url, parser) as pool:
            await pool.request("GET", "/")
        await wait_until(lambda: server.ended == 1, message="the idle connection closed")

    assert server.accepted == 1


@pytest.mark.parametrize(
    "scenario",
    [
        test_chunked_body_is_reassembled_and_the_connection_reused,
        test_reused_connection_closed_before_any_answer_is_retried_once_on_a_fresh_one,
        test_close_in_the_middle_of_an_answer_fails_without_a_retry,
        test_silent_server_times_out_and_its_connection_is_closed,
        test_cancelled_request_closes_its_connection_and_the_next_uses_a_new_one,
    ],
    ids=lambda scenario: scenario.__name__.removeprefix("test_"),
)
def test_edges_hold_on_uvloop_too(
    parser: str, scenario: Callable[[str], Coroutine[Any, Any, None]]
) -> None:
    # `Agent.run()` serves on uvloop, whose transports differ from asyncio's in the details
    # (closing, aborting, end of stream) these scenarios lean on.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario(parser))


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/ok", [("X-Forged", "a\r\nInjected: yes")]),
        ("/ok", [("Bad Name", "v")]),
        ("/a b", []),
        ("no-slash", []),
    ],
    ids=["crlf-value", "space-in-name", "space-in-target", "relative-target"],
)
async def test_unsafe_request_is_refused_before_anything_is_sent(
    parser: str, target: str, headers: list[tuple[str, str]]
) -> None:
    async with scripted(answer_ok) as server, pool_for(server.url, parser) as pool:
        with pytest.raises(ValueError):
            await pool.request("GET", target, headers)

    assert server.accepted == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_https_origin_is_reached_through_tls(parser: str, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    client_side = ssl.create_default_context(cafile=str(cert))
    state = Scripted(answer_ok)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0, ssl=server_side)
    port = server.sockets[0].getsockname()[1]
    try:
        url = f"https://localhost:{port}"
        async with pool_for(url, parser, ssl_context=client_side) as pool:
            responses = [await pool.request("GET", "/") for _ in range(2)]
    finally:
        server.close()
        await server.wait_closed()

    assert [response.body for response in responses] == [b"{}", b"{}"]
    assert state.accepted == 1


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_unusable_base_url_is_refused() -> None:
    for url in ("ftp://kernel", "127.0.0.1:8080", "http://kernel/?q=1"):
        with pytest.raises(ValueError):
            Pool(url, timeout=1)


# --- the kernel client on the transport ---------------------------------------------------------


LEASE = Lease("0190aaaa-bbbb-7ccc-8ddd-eeeeffff1111", 3, 30.0)


def _verified(exchange: Exchange) -> bool:
    lines = exchange.head.decode().split("\r\n")
    method, target, _ = lines[0].split(" ")
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    return signing.verify_request(
        SECRET,
        method,
        target,
        headers[signing.TIMESTAMP_HEADER],
        headers.get(signing.DISPATCH_ID_HEADER, ""),
        headers.get(signing.DISPATCH_ATTEMPT_HEADER, ""),
        exchange.body,
        headers[signing.SIGNATURE_HEADER],
        now=time.time(),
    )


async def test_kernel_client_signs_the_target_and_body_it_sends() -> None:
    async def decide(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        body = b'{"decision": "replay", "step_id": "s1", "result": {"n": 1}}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return True

    async with scripted(decide) as server:
        kernel = KernelClient(agent_id="a", secret=SECRET, base_url=server.url, timeout=5)
        try:
            decision, granted = await kernel.submit_step(
                "exec/1",
                LEASE,
                kind="tool_call",
                target="t",
                args=encode_json({"q": "é"}),
                idempotency="unsafe",
                completions=[
                    Completion("s0", encode_json([1, "two"])),
                    Report("local", "roll", encode_json({"sides": 6}), error=encode_json("x")),
                ],
                ask_records=True,
            )
        finally:
            await kernel.aclose()

    sent = server.seen[0]
    assert decision.decision == "replay" and decision.result == {"n": 1}
    # The fake kernel answers without `Rebuno-Extensions`, so the grant does not go on.
    assert granted is False
    assert sent.head.startswith(b"POST /v0/executions/exec%2F1/steps HTTP/1.1\r\n")
    assert b"\r\nRebuno-Extensions: step-records\r\n" in sent.head
    assert _verified(sent)
    assert json.loads(sent.body) == {
        "kind": "tool_call",
        "target": "t",
        "args": {"q": "é"},
        "idempotency": "unsafe",
        "completions": [
            {"step_id": "s0", "result": [1, "two"]},
            {"kind": "local", "target": "roll", "args": {"sides": 6}, "error": "x"},
        ],
    }


async def test_kernel_client_maps_an_error_answer_through_its_envelope() -> None:
    async def superseded(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        body = b'{"code": "lease_superseded", "message": "a newer attempt owns it"}'
        writer.write(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return True

    async with scripted(superseded) as server:
        kernel = KernelClient(agent_id="a", secret=SECRET, base_url=server.url, timeout=5)
        try:
            with pytest.raises(LeaseSuperseded, match="a newer attempt owns it"):
                await kernel.heartbeat("e1", LEASE)
        finally:
            await kernel.aclose()


async def test_kernel_client_turns_a_timeout_into_a_network_error() -> None:
    async def never(connection: int, index: int, writer: asyncio.StreamWriter) -> bool:
        return True

    async with scripted(never) as server:
        kernel = KernelClient(agent_id="a", secret=SECRET, base_url=server.url, timeout=0.2)
        try:
            with pytest.raises(NetworkError) as raised:
                await kernel.complete_step("e1", "s1", LEASE, encode_json({"ok": True}))
        finally:
            await kernel.aclose()

    assert raised.value.retryable
    assert isinstance(raised.value.__cause__, Timeout)


def test_response_keeps_status_headers_and_body() -> None:
    response = Response(204, [(b"x-a", b"1")], b"")

    assert (response.status, response.headers, response.body) == (204, [(b"x-a", b"1")], b"")


def test_a_url_with_a_password_is_refused_without_showing_it() -> None:
    with pytest.raises(ValueError) as raised:
        Pool("http://hook-user:hunter2@127.0.0.1:9/", timeout=1)

    assert "hunter2" not in str(raised.value)
    assert "kernel" not in str(raised.value)  # the pool serves webhooks as well
    assert "***@127.0.0.1:9" in str(raised.value)


async def test_a_webhook_url_password_never_reaches_a_delivery_outcome() -> None:
    deliverer = HttpDeliverer(timeout_seconds=1)
    try:
        url = "http://hook-user:hunter2@127.0.0.1:9/webhook"
        outcome = await deliverer.deliver(Webhook(url, "secret", "e", b"{}", 1.0))
    finally:
        await deliverer.close()

    assert not outcome.ok
    assert "hunter2" not in outcome.detail
