"""`Client` against a tiny envelope server on loopback: errors are chosen from the envelope's
code, connection failures become `NetworkError`, and the bearer token is sent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rebuno import (
    APIError,
    Client,
    ConflictError,
    ForbiddenError,
    LeaseSuperseded,
    NetworkError,
    NotFoundError,
    Terminated,
    UnauthorizedError,
    ValidationError,
)
from rebuno.protocol.codes import HTTP_STATUS, ErrorCode
from tests.sdk.loopback import free_socket, serving, url_of

SEEN_AUTH: list[str] = []


async def envelope_server(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`GET /v0/executions/<code>` answers the envelope of that code; `raw` answers text."""
    if scope["type"] == "lifespan":
        message = await receive()
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        assert message["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.complete"})
        return
    headers = dict(scope["headers"])
    SEEN_AUTH.append(headers.get(b"authorization", b"").decode())
    code = scope["path"].rsplit("/", 1)[-1]
    if code == "raw":
        status, body = 502, b"upstream exploded"
    else:
        status = HTTP_STATUS.get(ErrorCode(code), 500) if code in set(ErrorCode) else 418
        body = json.dumps({"code": code, "message": f"{code} happened"}).encode()
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with serving(envelope_server) as url, Client(base_url=url, api_key="tok") as client:
        yield client


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("validation_error", ValidationError),
        ("unauthorized", UnauthorizedError),
        ("forbidden", ForbiddenError),
        ("not_found", NotFoundError),
        ("conflict", ConflictError),
        ("lease_superseded", LeaseSuperseded),
        ("execution_terminal", Terminated),
        ("internal_error", APIError),
        ("brand_new_code", APIError),
    ],
)
async def test_error_envelope_maps_to_exception(client: Client, code: str, expected: type) -> None:
    with pytest.raises(expected) as raised:
        await client.get(code)

    assert type(raised.value) is expected
    assert f"{code} happened" in str(raised.value)


async def test_unknown_code_keeps_the_http_status(client: Client) -> None:
    with pytest.raises(APIError) as raised:
        await client.get("brand_new_code")

    assert (raised.value.code, raised.value.status_code) == ("brand_new_code", 418)


async def test_non_envelope_error_body_is_an_api_error(client: Client) -> None:
    with pytest.raises(APIError) as raised:
        await client.get("raw")

    assert (raised.value.status_code, raised.value.message) == (502, "upstream exploded")


async def test_bearer_token_is_sent(client: Client) -> None:
    SEEN_AUTH.clear()
    with pytest.raises(NotFoundError):
        await client.get("not_found")

    assert SEEN_AUTH == ["Bearer tok"]


async def test_unreachable_kernel_is_a_network_error() -> None:
    sock = free_socket()
    url = url_of(sock)
    sock.close()  # nothing listens there any more
    async with Client(base_url=url) as client:
        with pytest.raises(NetworkError) as raised:
            await client.get("anything")

    assert raised.value.retryable


def test_client_needs_a_kernel_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REBUNO_URL", raising=False)

    with pytest.raises(ValueError, match="REBUNO_URL"):
        Client()
