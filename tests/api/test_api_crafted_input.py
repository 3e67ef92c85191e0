"""Crafted input answers a 400 `validation_error` envelope, never a 500, on both stores: JSON
nested too deep, integers too long for 64 bits, attempts past the column's range, NUL
characters, agent ids that a path cannot address, malformed step ids."""

from __future__ import annotations

import httpx
import pytest

from rebuno.kernel.domain.records import Execution
from rebuno.protocol.signing import sign_request
from tests.api.harness import AgentClient, assert_error

HUGE = "9" * 5000
WRITER = {"id": "writer", "webhook_url": "http://127.0.0.1:9/w", "secret": "s"}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [129, 500, 980, 5000])
async def test_json_nested_too_deep_is_refused(client: httpx.AsyncClient, depth: int) -> None:
    body = '{"agent_id": "researcher", "input": ' + nested(depth) + "}"

    response = await client.post(
        "/v0/executions", content=body, headers={"Content-Type": "application/json"}
    )

    assert_error(response, 400, "validation_error")


async def test_json_nested_to_the_limit_is_accepted(client: httpx.AsyncClient) -> None:
    body = '{"agent_id": "researcher", "input": ' + nested(127) + "}"

    response = await client.post(
        "/v0/executions", content=body, headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 201, response.text


@pytest.mark.parametrize("query", [f"limit={HUGE}", f"limit=-{HUGE}", f"after_seq={HUGE}"])
async def test_integers_past_64_bits_in_a_query_are_clamped(
    client: httpx.AsyncClient, execution: Execution, query: str
) -> None:
    response = await client.get(f"/v0/executions/{execution.id}/events?{query}")

    assert response.status_code == 200, response.text


@pytest.mark.parametrize("attempt", [HUGE, str(2**63), str(2**31), "0", "-1"])
async def test_an_attempt_out_of_range_is_refused(
    leased: AgentClient, execution: Execution, attempt: str
) -> None:
    assert leased.lease is not None
    body = b'{"kind": "tool_call", "target": "web_search"}'
    target = f"/v0/executions/{execution.id}/steps"
    headers = leased.headers("POST", target, body, leased.lease)
    # Signed with the crafted attempt, so the signature holds and the value itself is judged.
    headers["Rebuno-Dispatch-Attempt"] = attempt
    headers["Rebuno-Signature"] = sign_request(
        leased.secret,
        "POST",
        target,
        headers["Rebuno-Timestamp"],
        leased.lease.dispatch_id,
        attempt,
        body,
    )

    response = await leased.http.post(target, content=body, headers=headers)

    assert_error(response, 400, "validation_error")


async def test_a_stream_seq_past_64_bits_is_refused(
    leased: AgentClient, execution: Execution
) -> None:
    submitted = await leased.post(
        f"/v0/executions/{execution.id}/steps", {"kind": "llm_call", "target": "gpt"}
    )
    step_id = submitted.json()["step_id"]
    body = ('{"seq": ' + HUGE + ', "data": "x"}').encode()

    response = await leased.post(
        f"/v0/executions/{execution.id}/steps/{step_id}/stream", content=body
    )

    assert_error(response, 400, "validation_error")


@pytest.mark.parametrize(
    "changes",
    [
        {"id": "a/b"},
        {"id": "x" * 129},
        {"id": "tab\there"},
        {"id": "nul\x00"},
        {"webhook_url": "http://127.0.0.1:9/w\x00"},
        {"secret": "s\x00"},
    ],
    ids=["slash", "too-long", "control", "nul-id", "nul-url", "nul-secret"],
)
async def test_an_agent_that_could_not_be_addressed_or_stored_is_refused(
    client: httpx.AsyncClient, changes: dict[str, str]
) -> None:
    response = await client.post("/v0/agents", json={**WRITER, **changes})

    assert_error(response, 400, "validation_error")
    listed = await client.get("/v0/agents")
    assert [a["id"] for a in listed.json()] == ["researcher"]


async def test_a_nul_in_a_step_target_is_refused(leased: AgentClient, execution: Execution) -> None:
    response = await leased.post(
        f"/v0/executions/{execution.id}/steps", {"kind": "tool_call", "target": "a\x00b"}
    )

    assert_error(response, 400, "validation_error")


@pytest.mark.parametrize("path", ["/v0/agents/" + "x" * 129, "/v0/agents/a%00b"])
async def test_an_agent_path_that_no_agent_can_have_is_refused(
    client: httpx.AsyncClient, path: str
) -> None:
    assert_error(await client.get(path), 400, "validation_error")


@pytest.mark.parametrize("agent_id", ["a%00b", "x" * 129, "a/b"])
async def test_an_execution_filter_on_an_agent_id_no_agent_can_have_is_refused(
    client: httpx.AsyncClient, execution: Execution, agent_id: str
) -> None:
    response = await client.get(f"/v0/executions?agent_id={agent_id}")

    assert_error(response, 400, "validation_error")


async def test_a_malformed_step_id_is_refused(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    response = await client.get(f"/v0/executions/{execution.id}/steps/{'z' * 64}")

    assert_error(response, 400, "validation_error")


async def test_an_unbounded_agent_id_header_is_unauthorized(
    agent: AgentClient, execution: Execution
) -> None:
    response = await AgentClient(agent.http, agent.clock, agent_id="x" * 16_000).get(
        f"/v0/executions/{execution.id}"
    )

    assert_error(response, 401, "unauthorized")


@pytest.mark.parametrize(
    "escaped",
    ['"a\\0b"', '"a\\ud800b"'],
    ids=["nul", "surrogate"],
)
@pytest.mark.parametrize("where", ["reason", "message", "approver"])
async def test_a_bundle_whose_yaml_escapes_unsendable_text_is_refused(
    client: httpx.AsyncClient, leased: AgentClient, execution: Execution, escaped: str, where: str
) -> None:
    then = {
        "reason": f"{{decision: deny, reason: {escaped}}}",
        "message": f"{{decision: require_approval, approval_config: {{message: {escaped}}}}}",
        "approver": f"{{decision: require_approval, approval_config: {{approvers: [{escaped}]}}}}",
    }[where]
    bundle = f"default_action: allow\nrules:\n  - id: r\n    then: {then}\n"

    refused = await client.post("/v0/policies/researcher", json={"bundle": bundle})
    registered = await client.post("/v0/agents", json={**WRITER, "policy_bundle": bundle})

    assert_error(refused, 400, "validation_error")
    assert_error(registered, 400, "validation_error")
    # Nothing was stored, so the agent's next step is decided without that rule.
    submitted = await leased.post(f"/v0/executions/{execution.id}/steps", {"kind": "local"})
    assert submitted.status_code == 200, submitted.text
    assert submitted.json()["decision"] == "proceed"
