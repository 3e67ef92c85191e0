"""The route guard: every failure leaves as an envelope; unexpected ones are logged, not told."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from rebuno.kernel.api.errors import Endpoint, guarded
from rebuno.kernel.api.routing import Access, Credential, Handler, route
from rebuno.kernel.domain.errors import Conflict
from rebuno.protocol.enums import Scope


async def _explode(request: Request) -> Response:
    raise RuntimeError("password=hunter2 in a driver message")


async def _conflict(request: Request) -> Response:
    raise Conflict("approval 1 is already granted", details="granted by alice")


def _open(endpoint: Endpoint) -> Handler:
    return Handler(Access(Credential.NONE), endpoint)


def test_a_route_without_declared_access_is_refused() -> None:
    with pytest.raises(TypeError, match="declare who may call it"):
        route("/undeclared", GET=_explode)  # type: ignore[arg-type]  # what the check is for


def test_a_bearer_route_must_name_its_scopes() -> None:
    with pytest.raises(ValueError, match="scopes"):
        Access(Credential.BEARER)
    with pytest.raises(ValueError, match="scopes"):
        Access(Credential.AGENT, (Scope.EXECUTIONS_READ,))


def _client() -> httpx.AsyncClient:
    app = Starlette(
        routes=[route("/explode", GET=_open(_explode)), route("/conflict", POST=_open(_conflict))]
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_unexpected_error_is_a_generic_500_with_its_traceback_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        async with _client() as client:
            response = await client.get("/explode")
    assert response.status_code == 500
    assert response.json() == {"code": "internal_error", "message": "internal error"}
    assert "hunter2" not in response.text
    [record] = [r for r in caplog.records if r.name == "rebuno.kernel.api.errors"]
    assert record.exc_info is not None


async def test_kernel_error_keeps_its_message_and_details() -> None:
    async with _client() as client:
        response = await client.post("/conflict")
    assert response.status_code == 409
    assert response.json() == {
        "code": "conflict",
        "message": "approval 1 is already granted",
        "details": "granted by alice",
    }


async def test_guard_preserves_the_endpoint_name() -> None:
    assert guarded(_explode).__name__ == "_explode"


async def test_head_is_served_by_the_get_handler() -> None:
    async with _client() as client:
        response = await client.head("/explode")
    assert response.status_code == 500
