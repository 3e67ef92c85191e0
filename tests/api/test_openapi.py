"""The OpenAPI document (`src/rebuno/kernel/api/openapi.yaml`) is valid OpenAPI 3.1 and names
exactly the routes the kernel serves, each with exactly its methods and the credentials it
takes; the kernel serves it to anyone at `GET /v0/openapi.json`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from rebuno.kernel.api import openapi
from rebuno.kernel.api.routing import DirectRoutes, MethodRoute
from rebuno.kernel.console.routes import CONSOLE_PATH
from rebuno.protocol.codes import HTTP_STATUS, ErrorCode
from tests.api.harness import AGENT, AgentClient

ACTIVITY = "/v0/activity"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
ENVELOPES = {
    "ValidationError": 400,
    "Unauthorized": 401,
    "Forbidden": 403,
    "NotFound": 404,
    "Conflict": 409,
    "RequestTimeout": 408,
    "PayloadTooLarge": 413,
    "InternalError": 500,
}
# Path values that pass parsing and name nothing (so no answer is a never-ending stream).
SAMPLE = {
    "execution_id": "0192d8c0-1234-7abc-8def-0123456789ab",
    "step_id": "a" * 64,
    "agent_id": AGENT,
    "approval_id": "0192d8c0-1234-7abc-8def-0123456789ac",
    "key": "workspace",
    "key_id": "0192d8c0-1234-7abc-8def-0123456789ad",
}


def _served(app: ASGIApp) -> set[tuple[str, str]]:
    """Every (method, path template) of the route table; `HEAD` comes with every `GET`."""
    assert isinstance(app, DirectRoutes)
    served: set[tuple[str, str]] = set()
    for candidate in app.fallback.router.routes:
        if isinstance(candidate, Mount):
            continue  # the console's static files (§40.1)
        assert isinstance(candidate, Route)
        if candidate.path == "/" or candidate.path.startswith(CONSOLE_PATH):
            continue  # the console's pages (§40.1), not the API
        methods = candidate.methods or set()
        assert ("HEAD" in methods) == ("GET" in methods), candidate.path
        served |= {(method, candidate.path) for method in methods if method != "HEAD"}
    return served


def _documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in METHODS
        if method in item
    }


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi.document()

    validate(document)

    assert document["openapi"].startswith("3.1.")


async def test_every_route_served_is_documented_and_nothing_else(app: ASGIApp) -> None:
    served, documented = _served(app), _documented(openapi.document())

    assert served - documented == set(), "routes missing from openapi.yaml"
    assert documented - served == set(), "openapi.yaml names routes the kernel does not serve"


async def test_each_operation_documents_the_scopes_its_route_declares(app: ASGIApp) -> None:
    assert isinstance(app, DirectRoutes)
    declared = {
        (method, candidate.path): [scope.value for scope in access.scopes]
        for candidate in app.fallback.router.routes
        if isinstance(candidate, MethodRoute)
        and candidate.path != "/"
        and not candidate.path.startswith(CONSOLE_PATH)
        for method, access in candidate.access.items()
        if method != "HEAD"
    }
    documented = {
        (method.upper(), path): item[method].get("x-scopes", [])
        for path, item in openapi.document()["paths"].items()
        for method in METHODS
        if method in item
    }

    assert documented == declared
    for (method, path), scopes in declared.items():
        responses = openapi.document()["paths"][path][method.lower()]["responses"]
        assert ("403" in responses) or not scopes, f"{method} {path} documents no 403"


def test_every_operation_has_a_unique_id_and_documents_its_500() -> None:
    operations = [
        item[method]
        for item in openapi.document()["paths"].values()
        for method in METHODS
        if method in item
    ]

    ids = [operation["operationId"] for operation in operations]
    assert len(ids) == len(set(ids))
    assert all("500" in operation["responses"] for operation in operations)


def test_each_error_response_names_the_codes_of_its_status() -> None:
    components = openapi.document()["components"]
    by_status: dict[int, set[str]] = {}
    for code, status in HTTP_STATUS.items():
        if code is not ErrorCode.POLICY_DENIED:  # reserved, never sent (§3.2)
            by_status.setdefault(status, set()).add(code.value)

    for name, status in ENVELOPES.items():
        schema = components["responses"][name]["content"]["application/json"]["schema"]
        envelope = components["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        assert set(envelope["properties"]["code"]["enum"]) == by_status[status], name
    assert set(components["schemas"]["Error"]["properties"]["code"]["enum"]) == {
        code.value for code in ErrorCode
    }


async def test_the_document_is_served_without_credentials(anon: httpx.AsyncClient) -> None:
    response = await anon.get(openapi.PATH)

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert response.json() == openapi.document()


def _operations() -> list[tuple[str, str, set[str]]]:
    """Each operation's method, a concrete path, and the credentials it takes."""
    found = []
    for path, item in openapi.document()["paths"].items():
        for method in METHODS:
            if method in item:
                security = item[method].get("security", [{"bearer": []}])
                kinds = {"agent" if "agentSignature" in one else "bearer" for one in security}
                found.append((method.upper(), path.format(**SAMPLE), kinds))
    return found


@pytest.mark.parametrize("sent", ["nothing", "bearer", "agent"])
async def test_each_operation_takes_the_credentials_it_documents(
    anon: httpx.AsyncClient, client: httpx.AsyncClient, agent: AgentClient, sent: str
) -> None:
    wrong = []
    for method, path, kinds in _operations():
        if path == ACTIVITY and sent == "bearer":
            continue  # accepted, its answer never ends (the other credentials get their 401)
        body: dict[str, object] | None = {} if method in ("POST", "PUT") else None
        if sent == "agent":
            response = await agent.request(method, path, body, lease=None)
        else:
            http = client if sent == "bearer" else anon
            response = await http.request(method, path, json=body)
        refused = response.status_code == 401
        if refused != (bool(kinds) and sent not in kinds):
            wrong.append(f"{method} {path}: {response.status_code} to {sent}, documents {kinds}")

    assert wrong == []
