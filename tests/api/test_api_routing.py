"""Direct routing: the route found by method and path shape is the one Starlette's ordered
route list picks, and whatever it leaves to Starlette is answered exactly as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.routing import Match, Mount, Route
from starlette.types import ASGIApp

from rebuno.kernel.api.routing import DirectRoutes
from rebuno.kernel.domain.records import Execution
from tests.api.harness import BASE_URL, TOKEN, AgentClient

SAMPLE = {
    "execution_id": "0192d8c0-1234-7abc-8def-0123456789ab",
    "step_id": "a" * 64,
    "agent_id": "researcher",
    "approval_id": "0192d8c0-1234-7abc-8def-0123456789ac",
    "key": "workspace",
    "key_id": "0192d8c0-1234-7abc-8def-0123456789ad",
}


def _direct(app: ASGIApp) -> DirectRoutes:
    assert isinstance(app, DirectRoutes)
    return app


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def _starlette_pick(direct: DirectRoutes, method: str, path: str) -> tuple[Route, Any] | None:
    """What Starlette's router would do: the first route that fully matches, in order."""
    for candidate in direct.fallback.router.routes:
        match, child = candidate.matches(_scope(method, path))
        if match is Match.FULL:
            assert isinstance(candidate, Route)
            return candidate, child["path_params"]
    return None


def _sample_paths(direct: DirectRoutes) -> list[tuple[str, str]]:
    paths = []
    for candidate in direct.fallback.router.routes:
        if isinstance(candidate, Mount):
            continue  # the console's static files (§40.1) are left to Starlette
        assert isinstance(candidate, Route)
        concrete = candidate.path.format(**SAMPLE)
        paths += [(method, concrete) for method in sorted(candidate.methods or ())]
    return paths


async def test_every_route_is_found_as_starlette_finds_it(app: ASGIApp) -> None:
    direct = _direct(app)
    paths = _sample_paths(direct)
    assert len(paths) > 30

    for method, path in paths:
        found = direct.find(_scope(method, path))
        assert found is not None, (method, path)
        shape, params = found
        assert (shape.route, params) == _starlette_pick(direct, method, path), (method, path)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "/v0/executions"),  # a known path, another method: Starlette's 405
        ("GET", "/v0/nothing"),
        ("GET", "/v0/executions/"),  # an empty parameter
        ("GET", "/v0/executions//events"),
        ("POST", "/v0/executions/x/steps/"),
        ("GET", "/v0/health/"),
        ("GET", "/v0/health\n"),  # Starlette's `$` also matches before a final newline
    ],
)
async def test_what_does_not_match_a_shape_is_left_to_starlette(
    app: ASGIApp, method: str, path: str
) -> None:
    assert _direct(app).find(_scope(method, path)) is None


async def test_a_mounted_root_path_is_left_to_starlette(app: ASGIApp) -> None:
    scope = {**_scope("GET", "/api/v0/health"), "root_path": "/api"}

    assert _direct(app).find(scope) is None


@pytest.fixture
async def pair(app: ASGIApp) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Bearer clients of the app, and of its Starlette app alone."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    direct = httpx.ASGITransport(app=app)
    bare = httpx.ASGITransport(app=_direct(app).fallback)
    async with (
        httpx.AsyncClient(transport=direct, base_url=BASE_URL, headers=headers) as one,
        httpx.AsyncClient(transport=bare, base_url=BASE_URL, headers=headers) as other,
    ):
        yield one, other


async def test_answers_are_those_of_the_starlette_app_alone(
    pair: tuple[httpx.AsyncClient, httpx.AsyncClient],
    execution: Execution,
    agent: AgentClient,
) -> None:
    one = f"/v0/executions/{execution.id}"
    requests = [
        ("GET", one, {}),
        ("HEAD", one, {}),
        ("GET", one.upper().replace("/V0/EXECUTIONS", "/v0/executions"), {}),
        ("GET", "/v0/executions/not-a-uuid", {}),
        ("GET", "/v0/health", {}),
        ("DELETE", one, {}),
        ("GET", "/v0/nothing", {}),
        ("GET", one + "/", {}),
        ("POST", one + "/steps", {"Rebuno-Agent-Id": agent.agent_id}),
        ("POST", one + "/steps", {"Authorization": "Bearer wrong"}),
    ]
    for method, path, headers in requests:
        direct, bare = [
            await client.request(method, path, headers=headers, content=b"{}") for client in pair
        ]
        assert direct.status_code == bare.status_code, (method, path)
        assert direct.headers.multi_items() == bare.headers.multi_items(), (method, path)
        assert direct.content == bare.content, (method, path)
