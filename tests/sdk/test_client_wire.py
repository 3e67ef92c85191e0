"""`Client` on the wire, against a recording server on loopback: how paths, queries, bodies and
headers go out, and what a refused or vanished kernel becomes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pytest

from harness.asgi import asgi_body, asgi_lifespan
from rebuno import Client, NetworkError, NotFoundError
from tests.sdk.loopback import free_socket, serving, url_of

AWKWARD = "a b&c=d +1% é/?#"


@dataclass
class Seen:
    """One request as the server received it."""

    client: tuple[str, int]
    method: str
    path: str
    raw_path: bytes
    query: dict[str, list[str]]
    headers: dict[bytes, bytes]
    body: bytes


@dataclass
class Recorder:
    """An ASGI app that records each request and answers a `not_found` envelope."""

    seen: list[Seen] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        body = await asgi_body(receive)
        query = parse_qs(scope["query_string"].decode(), keep_blank_values=True)
        self.seen.append(
            Seen(
                tuple(scope["client"]),
                scope["method"],
                scope["path"],
                scope["raw_path"],
                query,
                dict(scope["headers"]),
                body,
            )
        )
        envelope = json.dumps({"code": "not_found", "message": "nothing here"}).encode()
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": envelope})


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()
    async with serving(recorder) as url:
        yield recorder, url


async def test_query_values_arrive_intact(recorded: tuple[Recorder, str]) -> None:
    recorder, url = recorded

    async with Client(base_url=url) as client:
        with pytest.raises(NotFoundError):
            await client.list(agent_id=AWKWARD, status="a & b", cursor="x y=z", limit=7)

    [seen] = recorder.seen
    assert (seen.method, seen.path) == ("GET", "/v0/executions")
    assert seen.query == {
        "agent_id": [AWKWARD],
        "status": ["a & b"],
        "cursor": ["x y=z"],
        "limit": ["7"],
    }


async def test_empty_filters_are_left_out_of_the_query(recorded: tuple[Recorder, str]) -> None:
    recorder, url = recorded

    async with Client(base_url=url) as client:
        with pytest.raises(NotFoundError):
            await client.list_steps("e1")

    [seen] = recorder.seen
    assert (seen.path, seen.query) == ("/v0/executions/e1/steps", {})


async def test_an_id_is_escaped_as_one_path_segment(recorded: tuple[Recorder, str]) -> None:
    recorder, url = recorded

    async with Client(base_url=url) as client:
        with pytest.raises(NotFoundError):
            await client.get_step("e 1", AWKWARD)

    [seen] = recorder.seen
    assert seen.raw_path == b"/v0/executions/e%201/steps/a%20b%26c%3Dd%20%2B1%25%20%C3%A9%2F%3F%23"


async def test_json_body_is_compact_utf8_with_its_content_type_and_bearer_token(
    recorded: tuple[Recorder, str],
) -> None:
    recorder, url = recorded

    async with Client(base_url=url, api_key="tok") as client:
        with pytest.raises(NotFoundError):
            await client.create("agent", {"name": "Adé", "n": [1, 2]})

    [seen] = recorder.seen
    assert seen.method == "POST"
    assert seen.body == '{"agent_id":"agent","input":{"name":"Adé","n":[1,2]}}'.encode()
    assert seen.headers[b"content-type"] == b"application/json"
    assert seen.headers[b"authorization"] == b"Bearer tok"


async def test_a_request_without_body_or_key_sends_neither(recorded: tuple[Recorder, str]) -> None:
    recorder, url = recorded

    async with Client(base_url=url, api_key="") as client:
        with pytest.raises(NotFoundError):
            await client.cancel("e1")

    [seen] = recorder.seen
    assert (seen.method, seen.path, seen.body) == ("POST", "/v0/executions/e1/cancel", b"")
    assert b"authorization" not in seen.headers
    assert b"content-type" not in seen.headers


async def test_a_base_url_path_prefixes_every_request(recorded: tuple[Recorder, str]) -> None:
    recorder, url = recorded

    async with Client(base_url=f"{url}/kernel/") as client:
        with pytest.raises(NotFoundError):
            await client.get_approval("a1")

    assert [seen.path for seen in recorder.seen] == ["/kernel/v0/approvals/a1"]


async def test_requests_share_one_kept_alive_connection(recorded: tuple[Recorder, str]) -> None:
    recorder, url = recorded

    async with Client(base_url=url) as client:
        for _ in range(3):
            with pytest.raises(NotFoundError):
                await client.get("e1")

    assert len(recorder.seen) == 3
    assert len({seen.client for seen in recorder.seen}) == 1


async def test_refused_connection_is_a_network_error() -> None:
    sock = free_socket()
    url = url_of(sock)
    sock.close()  # nothing listens there any more

    async with Client(base_url=url) as client:
        with pytest.raises(NetworkError) as raised:
            await client.list()

    assert raised.value.retryable


async def test_a_kernel_gone_after_a_kept_alive_request_is_a_network_error() -> None:
    async with serving(Recorder()) as url:
        client = Client(base_url=url, timeout=5)
        with pytest.raises(NotFoundError):
            await client.get("e1")

    try:
        with pytest.raises(NetworkError):
            await client.get("e1")
    finally:
        await client.close()


async def test_url_without_http_scheme_is_a_network_error() -> None:
    async with Client(base_url="127.0.0.1:8080") as client:
        with pytest.raises(NetworkError, match="not an http"):
            await client.get("e1")


async def test_close_is_safe_before_any_request_and_twice() -> None:
    client = Client(base_url="http://127.0.0.1:9")

    await client.close()
    await client.close()

    with pytest.raises(RuntimeError, match="closed"):
        await client.get("e1")
