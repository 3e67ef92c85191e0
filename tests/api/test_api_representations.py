"""Resource representations (§4): omitted fields, raw JSON kept literally, lists never null."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import httpx
import pytest

from rebuno.kernel.api.app import create_app
from rebuno.kernel.config import Settings
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.stream.memory import MemoryBus
from tests.api.harness import AGENT, BASE_URL, TOKEN, AgentClient
from tests.support import ManualClock

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z")
LITERALS = b'{"x": 1.0, "big": 12345678901234567890, "e": 1E+2, "neg": -0}'
JSON_TYPE = "application/json; charset=utf-8"


async def test_new_execution_shows_only_the_fields_it_has(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/executions", json={"agent_id": AGENT})
    body = response.json()
    assert response.status_code == 201
    assert response.headers["content-type"] == JSON_TYPE
    assert set(body) == {
        "id",
        "agent_id",
        "input",
        "status",
        "created_at",
        "updated_at",
        "created_by",
        "subject_groups",
        "admitted_at",
    }
    assert body["created_by"] == "bootstrap"  # the holder of the configured token
    assert body["subject_groups"] == []
    assert body["input"] is None
    assert body["status"] == "pending"
    assert TIMESTAMP.fullmatch(body["created_at"])


async def test_agent_version_is_shown_when_given(client: httpx.AsyncClient) -> None:
    body = {"agent_id": AGENT, "agent_version": "v7", "input": {}}
    response = await client.post("/v0/executions", json=body)
    assert response.json()["agent_version"] == "v7"


async def test_input_number_literals_survive_the_round_trip(client: httpx.AsyncClient) -> None:
    content = b'{"agent_id": "researcher", "input": ' + LITERALS + b"}"
    created = await client.post("/v0/executions", content=content)
    fetched = await client.get(f"/v0/executions/{created.json()['id']}")
    for literal in (b"1.0", b"12345678901234567890", b"1E+2", b"-0"):
        assert literal in created.content
        assert literal in fetched.content


async def test_cancelled_execution_shows_its_failure_reason(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    await client.post(f"/v0/executions/{execution.id}/cancel")
    body = (await client.get(f"/v0/executions/{execution.id}")).json()
    assert body["status"] == "cancelled"
    assert body["failure_reason"] == "client_cancelled"
    assert "output" not in body


async def test_completed_execution_shows_its_output_literally(
    client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    content = b'{"output": ' + LITERALS + b"}"
    await leased.post(f"/v0/executions/{execution.id}/complete", content=content)
    fetched = await client.get(f"/v0/executions/{execution.id}")
    assert fetched.json()["status"] == "completed"
    assert b'"output":{' in fetched.content
    assert b"12345678901234567890" in fetched.content and b"1E+2" in fetched.content
    assert "failure_reason" not in fetched.json()


async def test_deadline_is_shown_when_configured(
    store: Store, clock: ManualClock, api_settings: Settings
) -> None:
    settings = replace(api_settings, deadline_timeout=timedelta(hours=1))
    kernel = Kernel(store, settings, clock=clock.now, bus=MemoryBus())
    await kernel.register_agent(AGENT, "http://127.0.0.1:9/webhook", "s", None, None)
    transport = httpx.ASGITransport(app=create_app(kernel, settings))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as c:
        body = (await c.post("/v0/executions", json={"agent_id": AGENT})).json()
    assert body["deadline_at"] == "2026-01-01T13:00:00Z"


async def test_new_execution_has_empty_step_list_not_null(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    response = await client.get(f"/v0/executions/{execution.id}/steps")
    assert response.status_code == 200
    assert response.content == b"[]"


async def test_executing_step_omits_what_it_does_not_have_yet(
    client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    args = b'{"x": 1.0, "y": 1e3, "z": 12345678901234567890}'  # vector V2 of §7.4
    content = b'{"kind": "tool_call", "target": "calc", "args": ' + args + b"}"
    decision = await leased.post(f"/v0/executions/{execution.id}/steps", content=content)
    step = (await client.get(f"/v0/executions/{execution.id}/steps")).json()[0]
    assert decision.json() == {"decision": "proceed", "step_id": step["step_id"]}
    assert set(step) == {
        "step_id",
        "execution_id",
        "kind",
        "target",
        "args_hash",
        "occurrence",
        "status",
        "idempotency",
        "args",
        "started_at",
    }
    assert (step["status"], step["idempotency"], step["occurrence"]) == (
        "executing",
        "safe_to_retry",
        0,
    )
    assert step["args_hash"] == "fd48af5417b1c9b5e590dad1702cd0bc61d6633dd11b1b392b6762927ec47ed8"


async def test_step_args_keep_their_number_literals(
    client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    content = b'{"kind": "tool_call", "target": "calc", "args": {"x": 1.0, "y": 1e3}}'
    decision = await leased.post(f"/v0/executions/{execution.id}/steps", content=content)
    step_id = decision.json()["step_id"]
    fetched = await client.get(f"/v0/executions/{execution.id}/steps/{step_id}")
    assert b'"args":{"x":1.0,"y":1e3}' in fetched.content


async def test_completed_step_shows_result_and_completion_time(
    client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    step_id = (await leased.post(base, {"kind": "local", "target": "t"})).json()["step_id"]
    await leased.post(f"{base}/{step_id}/complete", content=b'{"result": {"n": 2.50}}')
    step = await client.get(f"{base}/{step_id}")
    assert b'"result":{"n":2.50}' in step.content
    assert TIMESTAMP.fullmatch(step.json()["completed_at"])
    assert "error" not in step.json()


async def test_events_are_objects_with_json_payloads(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    events = (await client.get(f"/v0/executions/{execution.id}/events")).json()
    assert [e["type"] for e in events] == ["execution.created", "dispatch.queued"]
    assert [e["event_seq"] for e in events] == [1, 2]
    first = events[0]
    assert set(first) == {"execution_id", "event_seq", "type", "payload", "occurred_at"}
    assert isinstance(first["payload"], dict)
    assert TIMESTAMP.fullmatch(first["occurred_at"])


@pytest.mark.parametrize("path", ["/v0/agents", "/v0/approvals"])
async def test_empty_collections_are_arrays(
    kernel: Kernel, client: httpx.AsyncClient, path: str
) -> None:
    await kernel.delete_agent(AGENT)
    assert (await client.get(path)).content == b"[]"


async def test_empty_execution_page_is_an_array_without_cursor(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.get("/v0/executions")).json() == {"executions": []}
