"""Scoped API keys and principals (§34): issuing, listing, rotating and revoking keys, the
token format, dev mode, and who a key decides as (§34.5)."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import replace

import httpx
import pytest

from rebuno.kernel.api.app import create_app
from rebuno.kernel.config import Settings
from rebuno.kernel.domain.api_key import token_for, token_hash
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import (
    AGENT,
    BASE_URL,
    TOKEN,
    AgentClient,
    assert_error,
    bearer,
    issue_key,
)

TOKEN_SHAPE = re.compile(r"^rbk_[0-9a-f-]{36}\.[A-Za-z0-9_-]{43}$")
GATED = """
rules:
  - id: gate-shell
    when: {target: shell}
    then: {decision: require_approval, approval_config: {approvers: %s}}
"""


def test_token_and_hash_match_the_vector() -> None:
    token = token_for("0192f3a4-0000-7000-8000-000000000001", bytes(32))

    assert token == "rbk_0192f3a4-0000-7000-8000-000000000001." + "A" * 43
    assert token_hash(token).hex() == (
        "27922fee5729f38c79369582c1d4cbb3719dd3e0bfab80361abcae61e9a82338"
    )


async def test_created_key_is_trimmed_deduplicated_and_shown_once(
    client: httpx.AsyncClient,
) -> None:
    body = {"name": " reader ", "scopes": ["executions:read", "executions:read"]}
    response = await client.post("/v0/api-keys", json=body)

    issued = response.json()
    assert response.status_code == 201
    assert response.headers["cache-control"] == "no-store"
    assert (issued["name"], issued["scopes"], issued["created_by"]) == (
        "reader",
        ["executions:read"],
        "bootstrap",
    )
    assert TOKEN_SHAPE.match(issued["token"])
    assert issued["token"].startswith(f"rbk_{issued['id']}.")
    listed = await client.get("/v0/api-keys")
    digest = hashlib.sha256(issued["token"].encode()).hexdigest()
    assert [key["id"] for key in listed.json()] == [issued["id"]]
    assert "token" not in listed.text and issued["token"] not in listed.text
    assert digest not in listed.text


async def test_a_read_key_reads_and_is_refused_everything_else(
    client: httpx.AsyncClient, anon: httpx.AsyncClient, execution: Execution
) -> None:
    _, token = await issue_key(client, "reader", "executions:read")
    headers = bearer(token)

    assert (await anon.get("/v0/executions", headers=headers)).status_code == 200
    create = await anon.post("/v0/executions", json={"agent_id": AGENT}, headers=headers)
    assert_error(create, 403, "forbidden")
    new_key = {"name": "x", "scopes": ["executions:read"]}
    assert_error(await anon.post("/v0/api-keys", json=new_key, headers=headers), 403, "forbidden")
    heartbeat = await anon.post(f"/v0/executions/{execution.id}/heartbeat", headers=headers)
    assert_error(heartbeat, 401, "unauthorized")


async def test_scope_is_checked_before_the_path_is_parsed(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    _, reader = await issue_key(client, "reader", "executions:read")
    _, approver = await issue_key(client, "approver", "approvals:read")

    right = await anon.get("/v0/executions/not-a-uuid", headers=bearer(reader))
    wrong = await anon.get("/v0/executions/not-a-uuid", headers=bearer(approver))
    assert_error(right, 400, "validation_error")
    assert_error(wrong, 403, "forbidden")


async def test_rotation_replaces_the_token_and_revocation_ends_the_key(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    key_id, old = await issue_key(client, "ci", "executions:read")

    rotated = await client.post(f"/v0/api-keys/{key_id}/rotate")
    new = rotated.json()["token"]
    assert rotated.status_code == 200 and rotated.headers["cache-control"] == "no-store"
    assert rotated.json()["id"] == key_id and new != old
    assert_error(await anon.get("/v0/executions", headers=bearer(old)), 401, "unauthorized")
    assert (await anon.get("/v0/executions", headers=bearer(new))).status_code == 200
    first = await client.delete(f"/v0/api-keys/{key_id}")
    revoked_at = (await client.get("/v0/api-keys")).json()[0]["revoked_at"]
    second = await client.delete(f"/v0/api-keys/{key_id}")
    assert (first.status_code, second.status_code) == (204, 204)
    assert (await client.get("/v0/api-keys")).json()[0]["revoked_at"] == revoked_at
    assert_error(await anon.get("/v0/executions", headers=bearer(new)), 401, "unauthorized")
    assert_error(await client.post(f"/v0/api-keys/{key_id}/rotate"), 409, "conflict")


@pytest.mark.parametrize("path", ["/rotate", ""])
async def test_unknown_or_malformed_key_ids_are_not_found(
    client: httpx.AsyncClient, path: str
) -> None:
    method = "POST" if path else "DELETE"
    for key_id in ("0192d8c0-1234-7abc-8def-0123456789ad", "not-a-uuid"):
        response = await client.request(method, f"/v0/api-keys/{key_id}{path}")
        assert_error(response, 404, "not_found")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": "t", "scopes": []},
        {"name": "t", "scopes": ["*"]},
        {"name": "t", "scopes": ["executions:read", "unknown"]},
        {"name": "   ", "scopes": ["executions:read"]},
        {"name": "x" * 201, "scopes": ["executions:read"]},
        {"name": "t", "scopes": "executions:read"},
    ],
)
async def test_invalid_key_requests_are_refused(client: httpx.AsyncClient, body: object) -> None:
    assert_error(await client.post("/v0/api-keys", json=body), 400, "validation_error")


async def test_tokens_that_are_not_exactly_a_credential_are_unauthorized(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    _, token = await issue_key(client, "reader", "executions:read")

    for presented in (TOKEN.upper(), "rbk_bad.secret", token + "x", token[:-1], f" {token}"):
        response = await anon.get("/v0/executions", headers=bearer(presented))
        assert_error(response, 401, "unauthorized")


async def test_a_key_token_is_never_logged(
    client: httpx.AsyncClient, anon: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        key_id, token = await issue_key(client, "reader", "executions:read")
        await anon.get("/v0/agents", headers=bearer(token))
        await client.delete(f"/v0/api-keys/{key_id}")
        refused = await anon.get("/v0/executions", headers=bearer(token))
    secret = token.split(".", 1)[1]
    assert secret not in caplog.text and secret not in refused.text


async def test_dev_mode_verifies_only_key_tokens(kernel: Kernel, api_settings: Settings) -> None:
    app = create_app(kernel, replace(api_settings, dev=True, bearer_token=None))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as dev:
        key_id, token = await issue_key(dev, "reader", "executions:read")
        listed = await dev.get("/v0/api-keys")
        assert listed.json()[0]["created_by"] == "anonymous"
        assert (await dev.get("/v0/executions", headers=bearer(token))).status_code == 200
        refused = await dev.get("/v0/api-keys", headers=bearer(token))
        assert_error(refused, 403, "forbidden")
        assert (await dev.get("/v0/agents", headers=bearer("stray-value"))).status_code == 200
        await dev.delete(f"/v0/api-keys/{key_id}")
        assert_error(await dev.get("/v0/executions", headers=bearer(token)), 401, "unauthorized")


# -- principals (§34.5) ---------------------------------------------------------------------


async def _gated(kernel: Kernel, leased: AgentClient, execution: Execution, approvers: str) -> str:
    await kernel.set_policy(AGENT, GATED % approvers)
    response = await leased.post(
        f"/v0/executions/{execution.id}/steps", {"kind": "tool_call", "target": "shell"}
    )
    assert response.json()["decision"] == "blocked"
    return str(response.json()["approval_id"])


async def test_a_key_creates_executions_in_its_own_name(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    key_id, token = await issue_key(client, "alice", "executions:write", "executions:read")

    created = await anon.post("/v0/executions", json={"agent_id": AGENT}, headers=bearer(token))
    events = await anon.get(f"/v0/executions/{created.json()['id']}/events", headers=bearer(token))
    assert created.json()["created_by"] == f"key:{key_id}"
    assert events.json()[0]["payload"]["created_by"] == f"key:{key_id}"


@pytest.mark.parametrize("body", [{}, {"decided_by": "alice"}])
async def test_a_key_decides_as_its_own_name(
    kernel: Kernel,
    client: httpx.AsyncClient,
    anon: httpx.AsyncClient,
    leased: AgentClient,
    execution: Execution,
    body: dict[str, str],
) -> None:
    approval_id = await _gated(kernel, leased, execution, "[alice]")
    key_id, token = await issue_key(client, "alice", "approvals:write")

    granted = await anon.post(
        f"/v0/approvals/{approval_id}/grant", json=body, headers=bearer(token)
    )
    approval = (await client.get(f"/v0/approvals/{approval_id}")).json()
    events = (await client.get(f"/v0/executions/{execution.id}/events")).json()
    assert granted.status_code == 204
    assert (approval["decided_by"], approval["asserted_by"]) == ("alice", f"key:{key_id}")
    [event] = [e for e in events if e["type"] == "approval.granted"]
    assert (event["payload"]["decided_by"], event["payload"]["asserted_by"]) == (
        "alice",
        f"key:{key_id}",
    )


async def test_a_key_cannot_decide_as_someone_else(
    kernel: Kernel,
    client: httpx.AsyncClient,
    anon: httpx.AsyncClient,
    leased: AgentClient,
    execution: Execution,
) -> None:
    approval_id = await _gated(kernel, leased, execution, "[alice, bob]")
    _, token = await issue_key(client, "alice", "approvals:write")

    response = await anon.post(
        f"/v0/approvals/{approval_id}/deny", json={"decided_by": "bob"}, headers=bearer(token)
    )
    assert_error(response, 403, "forbidden")
    assert (await client.get(f"/v0/approvals/{approval_id}")).json()["status"] == "pending"


async def test_approvers_admit_a_key_by_id_but_not_another_name(
    kernel: Kernel,
    client: httpx.AsyncClient,
    anon: httpx.AsyncClient,
    leased: AgentClient,
    execution: Execution,
) -> None:
    key_id, token = await issue_key(client, "ops-bot", "approvals:write")
    _, carol = await issue_key(client, "carol", "approvals:write")
    approval_id = await _gated(kernel, leased, execution, f'["key:{key_id}"]')
    target = f"/v0/approvals/{approval_id}/grant"

    assert_error(await anon.post(target, json={}, headers=bearer(carol)), 403, "forbidden")
    assert (await anon.post(target, json={}, headers=bearer(token))).status_code == 204
    approval = (await client.get(f"/v0/approvals/{approval_id}")).json()
    assert (approval["decided_by"], approval["asserted_by"]) == ("ops-bot", f"key:{key_id}")


async def test_the_bootstrap_token_names_the_person(
    kernel: Kernel, client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    approval_id = await _gated(kernel, leased, execution, "[alice]")

    granted = await client.post(f"/v0/approvals/{approval_id}/grant", json={"decided_by": "alice"})
    approval = (await client.get(f"/v0/approvals/{approval_id}")).json()
    assert granted.status_code == 204
    assert (approval["decided_by"], approval["asserted_by"]) == ("alice", "bootstrap")


async def test_testing_a_policy_needs_both_its_scopes(
    client: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    _, writer = await issue_key(client, "writer", "policies:write")
    _, tester = await issue_key(client, "tester", "policies:write", "executions:read")

    refused = await anon.post(f"/v0/policies/{AGENT}/test", headers=bearer(writer))
    admitted = await anon.post(f"/v0/policies/{AGENT}/test", headers=bearer(tester))
    assert_error(refused, 403, "forbidden")
    assert_error(admitted, 400, "validation_error")


async def test_a_policy_bundle_needs_policies_write_too(
    client: httpx.AsyncClient, anon: httpx.AsyncClient, execution: Execution
) -> None:
    _, writer = await issue_key(client, "deployer", "agents:write", "executions:write")
    agent = {"id": "writer", "webhook_url": "http://127.0.0.1:9/w", "secret": "s"}
    fork = f"/v0/executions/{execution.id}/fork"

    plain = await anon.post("/v0/agents", json=agent, headers=bearer(writer))
    bundled = {**agent, "policy_bundle": "rules: []\n"}
    with_bundle = await anon.post("/v0/agents", json=bundled, headers=bearer(writer))
    forked = await anon.post(
        fork, json={"at_seq": 1, "policy_bundle": "rules: []\n"}, headers=bearer(writer)
    )
    malformed = await anon.post(
        fork, json={"at_seq": 0, "policy_bundle": "x"}, headers=bearer(writer)
    )
    assert plain.status_code == 201
    assert_error(with_bundle, 403, "forbidden")
    assert_error(forked, 403, "forbidden")
    assert_error(malformed, 400, "validation_error")
