"""The authorization matrix (§34.2): every route of the route table, called with no
credential, a key holding each single scope, the bootstrap token, a revoked key, a key's
rotated-away token and an agent's signature, answers as its declared access says. The table
below is the spec's, written out again: a route that declares no access, or one that
declares other scopes than these, fails here."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from starlette.routing import Mount
from starlette.types import ASGIApp

from rebuno.kernel.api.routing import Credential, DirectRoutes, MethodRoute
from rebuno.kernel.console.routes import CONSOLE_PATH
from rebuno.protocol.enums import Scope
from tests.api.harness import AgentClient, bearer, issue_key

R, W = Scope.EXECUTIONS_READ, Scope.EXECUTIONS_WRITE
NONE, AGENT, BEARER, EITHER = (
    Credential.NONE,
    Credential.AGENT,
    Credential.BEARER,
    Credential.BEARER_OR_AGENT,
)
EXPECTED: dict[tuple[str, str], tuple[Credential, tuple[Scope, ...]]] = {
    ("POST", "/v0/executions"): (BEARER, (W,)),
    ("GET", "/v0/executions"): (BEARER, (R,)),
    ("GET", "/v0/executions/{execution_id}"): (EITHER, (R,)),
    ("GET", "/v0/executions/{execution_id}/events"): (BEARER, (R,)),
    ("GET", "/v0/executions/{execution_id}/stream"): (BEARER, (R,)),
    ("POST", "/v0/executions/{execution_id}/cancel"): (BEARER, (W,)),
    ("GET", "/v0/executions/{execution_id}/previous"): (EITHER, (R,)),
    ("POST", "/v0/executions/{execution_id}/suspend"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/fork"): (BEARER, (W,)),
    ("GET", "/v0/executions/{execution_id}/fork-points"): (BEARER, (R,)),
    ("POST", "/v0/executions/{execution_id}/heartbeat"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/complete"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/fail"): (AGENT, ()),
    ("GET", "/v0/executions/{execution_id}/steps"): (EITHER, (R,)),
    ("POST", "/v0/executions/{execution_id}/steps"): (AGENT, ()),
    ("GET", "/v0/executions/{execution_id}/steps/{step_id}"): (EITHER, (R,)),
    ("POST", "/v0/executions/{execution_id}/steps/{step_id}/complete"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/steps/{step_id}/fail"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/steps/{step_id}/stream"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/resources"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/resources/checkpoints"): (AGENT, ()),
    ("POST", "/v0/executions/{execution_id}/resources/{key}/binding"): (AGENT, ()),
    ("POST", "/v0/agents"): (BEARER, (Scope.AGENTS_WRITE,)),
    ("GET", "/v0/agents"): (BEARER, (Scope.AGENTS_READ,)),
    ("GET", "/v0/agents/{agent_id}"): (BEARER, (Scope.AGENTS_READ,)),
    ("DELETE", "/v0/agents/{agent_id}"): (BEARER, (Scope.AGENTS_WRITE,)),
    ("PUT", "/v0/agents/{agent_id}/metadata"): (AGENT, ()),
    ("POST", "/v0/agents/{agent_id}/instances"): (AGENT, ()),
    ("POST", "/v0/policies/{agent_id}"): (BEARER, (Scope.POLICIES_WRITE,)),
    ("POST", "/v0/policies/{agent_id}/test"): (BEARER, (Scope.POLICIES_WRITE, R)),
    ("GET", "/v0/approvals"): (BEARER, (Scope.APPROVALS_READ,)),
    ("GET", "/v0/approvals/{approval_id}"): (BEARER, (Scope.APPROVALS_READ,)),
    ("POST", "/v0/approvals/{approval_id}/grant"): (BEARER, (Scope.APPROVALS_WRITE,)),
    ("POST", "/v0/approvals/{approval_id}/deny"): (BEARER, (Scope.APPROVALS_WRITE,)),
    ("POST", "/v0/api-keys"): (BEARER, (Scope.API_KEYS_MANAGE,)),
    ("GET", "/v0/api-keys"): (BEARER, (Scope.API_KEYS_MANAGE,)),
    ("POST", "/v0/api-keys/{key_id}/rotate"): (BEARER, (Scope.API_KEYS_MANAGE,)),
    ("DELETE", "/v0/api-keys/{key_id}"): (BEARER, (Scope.API_KEYS_MANAGE,)),
    ("GET", "/v0/health"): (NONE, ()),
    ("GET", "/v0/ready"): (NONE, ()),
    ("GET", "/v0/openapi.json"): (NONE, ()),
    ("GET", "/metrics"): (NONE, ()),
    ("GET", "/v0/activity"): (BEARER, (R,)),
    ("POST", "/v0/policies/{agent_id}/check"): (BEARER, (Scope.POLICIES_WRITE,)),
    ("GET", "/"): (NONE, ()),
    ("GET", "/ui"): (NONE, ()),
    ("GET", "/ui/sign-in"): (NONE, ()),
    ("POST", "/ui/sign-in"): (NONE, ()),
    ("POST", "/ui/sign-out"): (NONE, ()),
}
# Path values that pass parsing and name nothing, so no call changes anything: a bearer
# caller names an agent no one registered; the signing agent names itself.
SAMPLE = {
    "execution_id": "0192d8c0-1234-7abc-8def-0123456789ab",
    "step_id": "a" * 64,
    "agent_id": "nobody",
    "approval_id": "0192d8c0-1234-7abc-8def-0123456789ac",
    "key_id": "0192d8c0-1234-7abc-8def-0123456789ad",
    "key": "workspace",
}


@dataclass(frozen=True, slots=True)
class Cell:
    method: str
    path: str
    caller: str
    status: int
    code: str

    def __str__(self) -> str:
        return f"{self.method} {self.path} as {self.caller}: {self.status} {self.code}"


def _route_table(app: ASGIApp) -> dict[tuple[str, str], tuple[Credential, tuple[Scope, ...]]]:
    assert isinstance(app, DirectRoutes)
    table = {}
    for candidate in app.fallback.router.routes:
        if isinstance(candidate, Mount) and candidate.path == CONSOLE_PATH + "/static":
            continue  # the console's files, public like its pages (§40.1)
        assert isinstance(candidate, MethodRoute), candidate
        for method, access in candidate.access.items():
            if method != "HEAD":
                table[(method, candidate.path)] = (access.credential, access.scopes)
    return table


def test_every_route_declares_the_access_the_spec_gives_it(app: ASGIApp) -> None:
    assert _route_table(app) == EXPECTED


async def _callers(client: httpx.AsyncClient) -> dict[str, dict[str, str]]:
    """The bearer credentials of the matrix, by name: headers to send."""
    callers: dict[str, dict[str, str]] = {"no key": {}, "bootstrap": dict(client.headers)}
    for scope in Scope:
        callers[scope.value] = bearer((await issue_key(client, scope.value, scope.value))[1])
    revoked_id, revoked = await issue_key(client, "revoked", *Scope)
    await client.delete(f"/v0/api-keys/{revoked_id}")
    rotated_id, rotated = await issue_key(client, "rotated", *Scope)
    await client.post(f"/v0/api-keys/{rotated_id}/rotate")
    callers["revoked key"] = bearer(revoked)
    callers["rotated-away token"] = bearer(rotated)
    callers["bootstrap"] = {"Authorization": client.headers["authorization"]}
    return callers


def _admitted(credential: Credential, scopes: tuple[Scope, ...], caller: str) -> bool:
    """Whether the cell's caller gets past authentication and the scope check."""
    if credential is NONE:
        return True
    if caller == "agent":
        return credential in (AGENT, EITHER)
    if credential is AGENT or caller in ("no key", "revoked key", "rotated-away token"):
        return False
    return caller == "bootstrap" or set(scopes) <= {Scope(caller)}


def _refusal(credential: Credential, caller: str) -> int:
    """The status of a refused cell: 403 only for a live key that lacks the scope."""
    live_key = caller not in ("no key", "revoked key", "rotated-away token", "agent")
    return 403 if live_key and credential in (BEARER, EITHER) else 401


async def test_every_cell_of_the_matrix_answers_as_declared(
    app: ASGIApp, anon: httpx.AsyncClient, client: httpx.AsyncClient, agent: AgentClient
) -> None:
    callers = await _callers(client)
    wrong: list[Cell] = []
    successes_refused = 0
    for (method, template), (credential, scopes) in sorted(_route_table(app).items()):
        path = template.format(**SAMPLE)
        body: dict[str, object] | None = {} if method in ("POST", "PUT") else None
        for caller in [*callers, "agent"]:
            if template == "/v0/activity" and _admitted(credential, scopes, caller):
                continue  # admitted, it streams until the client leaves (§40.5)
            if caller == "agent":
                own = template.format(**{**SAMPLE, "agent_id": agent.agent_id})
                response = await agent.request(method, own, body, lease=None)
            else:
                response = await anon.request(method, path, json=body, headers=callers[caller])
            is_json = response.headers.get("content-type", "").startswith("application/json")
            code = (
                response.json().get("code", "") if response.status_code >= 400 and is_json else ""
            )
            cell = Cell(method, template, caller, response.status_code, code)
            if _admitted(credential, scopes, caller):
                if cell.status in (401, 403) and code in ("unauthorized", "forbidden"):
                    wrong.append(cell)
                continue
            expected = _refusal(credential, caller)
            successes_refused += response.is_success
            if (cell.status, code) != (expected, _CODES[expected]):
                wrong.append(cell)

    assert successes_refused == 0
    assert wrong == [], "\n".join(map(str, wrong))


_CODES = {401: "unauthorized", 403: "forbidden"}
