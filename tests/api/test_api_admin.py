"""Admin routes (§5.3): agents, policies and approvals (the agent metadata route has its own
file)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, SECRET, AgentClient, assert_error

BUNDLE = "default_action: deny\nrules: []\n"
GATED = """
rules:
  - id: gate-shell
    when: {target: shell}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], message: run a shell command?}
"""
WRITER = {"id": "writer", "webhook_url": "http://127.0.0.1:9/w", "secret": "top-secret"}

# -- agents ---------------------------------------------------------------------------------


async def test_registered_agent_is_returned_without_its_secret(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v0/agents", json={**WRITER, "lease_timeout_seconds": 600})
    body = response.json()
    assert response.status_code == 201
    assert set(body) == {"id", "webhook_url", "registered_at", "lease_timeout_seconds"}
    assert body["lease_timeout_seconds"] == 600
    assert "top-secret" not in response.text
    listed = await client.get("/v0/agents")
    fetched = await client.get("/v0/agents/writer")
    assert "top-secret" not in listed.text + fetched.text


@pytest.mark.parametrize(
    "lease", ["0", "-1", "1e12", "1e20", "1e300", "1e999", "604801", "9" * 5000]
)
async def test_a_lease_that_is_not_a_finite_week_or_less_is_refused(
    client: httpx.AsyncClient, lease: str
) -> None:
    body = '{"id": "writer", "webhook_url": "http://127.0.0.1:9/w", "secret": "s", '
    body += f'"lease_timeout_seconds": {lease}}}'

    response = await client.post(
        "/v0/agents", content=body, headers={"Content-Type": "application/json"}
    )

    assert_error(response, 400, "validation_error")
    assert (await client.get("/v0/agents/writer")).status_code == 404
    assert (await client.get("/v0/agents")).status_code == 200


async def test_a_lease_of_a_week_is_accepted(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/agents", json={**WRITER, "lease_timeout_seconds": 604800})
    assert response.status_code == 201


async def test_agents_are_listed_by_id(client: httpx.AsyncClient) -> None:
    await client.post("/v0/agents", json={**WRITER, "id": "zeta"})
    await client.post("/v0/agents", json={**WRITER, "id": "alpha"})
    ids = [a["id"] for a in (await client.get("/v0/agents")).json()]
    assert ids == ["alpha", AGENT, "zeta"]


@pytest.mark.parametrize(
    "body",
    [
        {**WRITER, "id": ""},
        {"id": "w", "secret": "s"},
        {**WRITER, "secret": None},
        {**WRITER, "lease_timeout_seconds": -5},
        {**WRITER, "lease_timeout_seconds": "soon"},
        {**WRITER, "policy_bundle": "rules: 5"},
        {**WRITER, "policy_bundle": 5},
    ],
)
async def test_invalid_registration_is_a_validation_error(
    client: httpx.AsyncClient, body: dict[str, object]
) -> None:
    assert_error(await client.post("/v0/agents", json=body), 400, "validation_error")


async def test_reregistration_keeps_the_bundle_unless_one_is_given(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/v0/agents", json={**WRITER, "policy_bundle": BUNDLE})
    kept = (await client.post("/v0/agents", json=WRITER)).json()
    removed = (await client.post("/v0/agents", json={**WRITER, "policy_bundle": ""})).json()
    assert kept["policy_bundle"] == BUNDLE
    assert "policy_bundle" not in removed


async def test_unknown_agent_is_not_found(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v0/agents/ghost"), 404, "not_found")
    assert_error(await client.delete("/v0/agents/ghost"), 404, "not_found")


async def test_deleted_agent_is_gone(client: httpx.AsyncClient) -> None:
    await client.post("/v0/agents", json=WRITER)
    deleted = await client.delete("/v0/agents/writer")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_error(await client.get("/v0/agents/writer"), 404, "not_found")


# -- policies -------------------------------------------------------------------------------


async def test_policy_is_set_and_removed(client: httpx.AsyncClient) -> None:
    set_response = await client.post(f"/v0/policies/{AGENT}", json={"bundle": BUNDLE})
    with_bundle = (await client.get(f"/v0/agents/{AGENT}")).json()
    await client.post(f"/v0/policies/{AGENT}", json={"bundle": ""})
    without = (await client.get(f"/v0/agents/{AGENT}")).json()
    assert set_response.status_code == 204
    assert with_bundle["policy_bundle"] == BUNDLE
    assert "policy_bundle" not in without


async def test_invalid_bundle_is_refused_before_the_agent_is_looked_up(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v0/policies/ghost", json={"bundle": "rules: 5"})
    assert_error(response, 400, "validation_error")


async def test_policy_for_unknown_agent_is_not_found(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/policies/ghost", json={"bundle": BUNDLE})
    assert_error(response, 404, "not_found")


@pytest.mark.parametrize("body", [{}, {"bundle": 3}, {"bundle": None}])
async def test_policy_body_needs_a_bundle_string(
    client: httpx.AsyncClient, body: dict[str, object]
) -> None:
    response = await client.post(f"/v0/policies/{AGENT}", json=body)
    assert_error(response, 400, "validation_error")


# -- approvals ------------------------------------------------------------------------------


@pytest.fixture
async def approval_id(kernel: Kernel, leased: AgentClient, execution: Execution) -> str:
    """The pending approval of a gated step in `execution`."""
    await kernel.set_policy(AGENT, GATED)
    response = await leased.post(
        f"/v0/executions/{execution.id}/steps", {"kind": "tool_call", "target": "shell"}
    )
    decision = response.json()
    assert decision["decision"] == "blocked"
    found: str = decision["approval_id"]
    return found


async def test_pending_approvals_are_listed_by_default(
    client: httpx.AsyncClient, approval_id: str, execution: Execution
) -> None:
    [approval] = (await client.get("/v0/approvals")).json()
    assert approval["id"] == approval_id
    assert approval["status"] == "pending"
    assert approval["approvers"] == ["alice"]
    assert approval["message"] == "run a shell command?"
    assert "decided_by" not in approval and "decided_at" not in approval


@pytest.mark.parametrize(
    ("query", "count"),
    [("status=pending", 1), ("status=all", 1), ("status=granted", 0), ("status=expired", 0)],
)
async def test_approvals_filter_by_status(
    client: httpx.AsyncClient, approval_id: str, query: str, count: int
) -> None:
    assert len((await client.get(f"/v0/approvals?{query}")).json()) == count


async def test_approvals_filter_by_execution(
    kernel: Kernel, client: httpx.AsyncClient, approval_id: str, execution: Execution
) -> None:
    other = await kernel.create_execution(AGENT, "{}", None)
    mine = (await client.get(f"/v0/approvals?execution_id={execution.id.upper()}")).json()
    theirs = (await client.get(f"/v0/approvals?execution_id={other.id}")).json()
    assert [a["id"] for a in mine] == [approval_id]
    assert theirs == []


@pytest.mark.parametrize("query", ["status=maybe", "execution_id=nope"])
async def test_bad_approval_query_is_a_validation_error(
    client: httpx.AsyncClient, query: str
) -> None:
    assert_error(await client.get(f"/v0/approvals?{query}"), 400, "validation_error")


async def test_granted_approval_records_who_and_why(
    client: httpx.AsyncClient, approval_id: str
) -> None:
    body = {"decided_by": "alice", "rationale": "looks safe"}
    granted = await client.post(f"/v0/approvals/{approval_id}/grant", json=body)
    approval = (await client.get(f"/v0/approvals/{approval_id}")).json()
    assert granted.status_code == 204
    assert (approval["status"], approval["decided_by"], approval["rationale"]) == (
        "granted",
        "alice",
        "looks safe",
    )
    assert approval["decided_at"].endswith("Z")
    # §27.2: the principal that made the request, beside the name it gave.
    assert approval["asserted_by"] == "bootstrap"
    events = (await client.get(f"/v0/executions/{approval['execution_id']}/events")).json()
    (decided,) = [e for e in events if e["type"] == "approval.granted"]
    assert decided["payload"]["asserted_by"] == "bootstrap"


async def test_a_pending_approval_names_no_asserter(
    client: httpx.AsyncClient, approval_id: str
) -> None:
    assert "asserted_by" not in (await client.get(f"/v0/approvals/{approval_id}")).json()


async def test_deciding_twice_is_a_conflict(client: httpx.AsyncClient, approval_id: str) -> None:
    await client.post(f"/v0/approvals/{approval_id}/deny", json={"decided_by": "alice"})
    again = await client.post(f"/v0/approvals/{approval_id}/grant", json={"decided_by": "alice"})
    assert_error(again, 409, "conflict")


async def test_approver_outside_the_list_is_forbidden(
    client: httpx.AsyncClient, approval_id: str
) -> None:
    response = await client.post(f"/v0/approvals/{approval_id}/grant", json={"decided_by": "bob"})
    assert_error(response, 403, "forbidden")


async def test_decision_without_decided_by_is_read_as_empty(
    client: httpx.AsyncClient, approval_id: str
) -> None:
    # The rule names approvers, so an anonymous decision is refused, not a malformed body.
    response = await client.post(f"/v0/approvals/{approval_id}/deny", json={"rationale": ""})
    assert_error(response, 403, "forbidden")


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v0/approvals/nope", 400, "validation_error"),
        ("/v0/approvals/01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f", 404, "not_found"),
    ],
)
async def test_approval_lookup_errors(
    client: httpx.AsyncClient, path: str, status: int, code: str
) -> None:
    assert_error(await client.get(path), status, code)
    assert_error(await client.post(f"{path}/grant", json={}), status, code)


async def test_approval_routes_need_the_bearer_token(
    anon: httpx.AsyncClient, agent: AgentClient
) -> None:
    signed = replace(agent, secret=SECRET)
    assert_error(await anon.get("/v0/approvals"), 401, "unauthorized")
    assert_error(await signed.get("/v0/approvals"), 401, "unauthorized")
