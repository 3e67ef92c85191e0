"""The error envelope (§3.1) and the status of every code of §3.2, through the app."""

from __future__ import annotations

import logging
from dataclasses import replace

import httpx
import pytest

from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from tests.api.harness import AGENT, AgentClient, assert_error

UNKNOWN = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"
GATED = """
rules:
  - id: gate
    when: {target: shell}
    then: {decision: require_approval}
"""


async def test_unknown_route_is_not_found_in_the_envelope(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v0/nothing-here"), 404, "not_found")
    assert_error(await client.get("/v0/executions/"), 404, "not_found")


async def test_known_path_with_wrong_method_is_method_not_allowed(
    client: httpx.AsyncClient,
) -> None:
    response = await client.delete("/v0/executions")
    assert_error(response, 405, "method_not_allowed")
    assert set(response.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


async def test_envelope_omits_empty_details(client: httpx.AsyncClient) -> None:
    envelope = assert_error(await client.get(f"/v0/executions/{UNKNOWN}"), 404, "not_found")
    assert "details" not in envelope


async def test_cancelling_a_terminal_execution_is_execution_terminal(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    first = await client.post(f"/v0/executions/{execution.id}/cancel")
    second = await client.post(f"/v0/executions/{execution.id}/cancel")
    assert first.status_code == 204 and first.content == b""
    assert_error(second, 409, "execution_terminal")


async def test_heartbeat_under_a_replaced_lease_is_lease_superseded(
    leased: AgentClient, execution: Execution
) -> None:
    assert leased.lease is not None
    stale = replace(leased.lease, attempt=leased.lease.attempt + 1)
    response = await leased.post(f"/v0/executions/{execution.id}/heartbeat", lease=stale)
    assert_error(response, 409, "lease_superseded")


async def test_deleting_an_agent_with_executions_is_a_conflict(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    assert_error(await client.delete(f"/v0/agents/{AGENT}"), 409, "conflict")


async def test_completing_a_step_that_is_not_executing_is_a_conflict(
    kernel: Kernel, client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    await kernel.set_policy(AGENT, GATED)
    blocked = await leased.post(
        f"/v0/executions/{execution.id}/steps", {"kind": "tool_call", "target": "shell"}
    )
    step_id = blocked.json()["step_id"]
    response = await leased.post(
        f"/v0/executions/{execution.id}/steps/{step_id}/complete", {"result": 1}
    )
    assert_error(response, 409, "conflict")


async def test_store_failure_is_an_internal_error_without_its_text(
    store: Store, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    await store.close()
    with caplog.at_level(logging.ERROR):
        response = await client.get("/v0/agents")
    envelope = assert_error(response, 500, "internal_error")
    assert envelope == {"code": "internal_error", "message": "internal error"}
    assert caplog.records, "the failure is logged"
