"""`PUT /v0/agents/{id}/metadata` (§36): what an agent publishes about itself is stored, kept
across re-registrations and returned by the agent routes; bad bodies are refused whole."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from rebuno.kernel.service.agents import MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, SECRET, AgentClient, assert_error, encode
from tests.support import ManualClock

WEBHOOK = "http://127.0.0.1:9/webhook"
PATH = f"/v0/agents/{AGENT}/metadata"
INPUT_SCHEMA = {
    "type": "object",
    "properties": {"topic": {"type": "string"}, "depth": {"type": "integer", "maximum": 3}},
    "required": ["topic"],
}
OUTPUT_SCHEMA = {"type": "object", "properties": {"summary": {"type": "string"}}}


@pytest.fixture
def clock() -> ManualClock:
    """The moment of example M1's signature (§36.3)."""
    return ManualClock(datetime.fromtimestamp(1767225600, UTC))


async def publish(agent: AgentClient, body: object) -> httpx.Response:
    return await agent.request("PUT", PATH, body, lease=None)


async def shown(client: httpx.AsyncClient) -> dict[str, object]:
    response = await client.get(f"/v0/agents/{AGENT}")
    assert response.status_code == 200
    body: dict[str, object] = response.json()
    return body


async def test_example_m1_signed_by_the_sdk_is_stored_and_shown(
    kernel: Kernel, anon: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    await kernel.register_agent(AGENT, WEBHOOK, "hello-secret", None, None)
    body = {"description": "Research agent", "input_schema": None, "output_schema": None}
    headers = {
        "Rebuno-Agent-Id": AGENT,
        "Rebuno-Timestamp": "1767225600",
        "Rebuno-Signature": "v1=4ee335e32c439fe0cc2842d099384a7fee2f3897e49613482bbf5aa519a3bb13",
        "Content-Type": "application/json",
    }

    response = await anon.put(PATH, content=encode(body), headers=headers)

    assert response.status_code == 204
    agent = await shown(client)
    assert agent["description"] == "Research agent"
    assert agent["metadata_updated_at"] == "2026-01-01T00:00:00Z"
    assert "input_schema" not in agent and "output_schema" not in agent


async def test_schemas_are_returned_as_published_by_get_and_list(
    agent: AgentClient, client: httpx.AsyncClient
) -> None:
    body = {"description": "d", "input_schema": INPUT_SCHEMA, "output_schema": OUTPUT_SCHEMA}

    assert (await publish(agent, body)).status_code == 204

    one = await shown(client)
    listed = [a for a in (await client.get("/v0/agents")).json() if a["id"] == AGENT]
    assert one["input_schema"] == INPUT_SCHEMA
    assert one["output_schema"] == OUTPUT_SCHEMA
    assert listed == [one]
    assert "secret" not in one


async def test_re_registration_keeps_metadata_and_an_all_null_publish_clears_it(
    agent: AgentClient, client: httpx.AsyncClient, clock: ManualClock
) -> None:
    """Example M3."""
    body = {"description": "d", "input_schema": INPUT_SCHEMA, "output_schema": OUTPUT_SCHEMA}
    await publish(agent, body)
    registered = await client.post(
        "/v0/agents", json={"id": AGENT, "webhook_url": WEBHOOK, "secret": SECRET}
    )
    assert registered.status_code == 201
    assert registered.json()["input_schema"] == INPUT_SCHEMA
    assert (await shown(client))["output_schema"] == OUTPUT_SCHEMA

    nulls = {"description": None, "input_schema": None, "output_schema": None}
    assert (await publish(agent, nulls)).status_code == 204

    cleared = await shown(client)
    assert not {"description", "input_schema", "output_schema"} & cleared.keys()
    assert cleared["metadata_updated_at"] == "2026-01-01T00:00:00Z"


async def test_an_absent_member_is_null_so_each_publish_replaces_the_whole(
    agent: AgentClient, client: httpx.AsyncClient
) -> None:
    await publish(agent, {"description": "d", "output_schema": OUTPUT_SCHEMA})

    await publish(agent, {"input_schema": INPUT_SCHEMA})

    stored = await shown(client)
    assert stored["input_schema"] == INPUT_SCHEMA
    assert "description" not in stored and "output_schema" not in stored


async def test_an_agent_never_published_shows_no_metadata(client: httpx.AsyncClient) -> None:
    agent = await shown(client)
    assert not {"description", "input_schema", "output_schema", "metadata_updated_at"} & set(agent)


async def test_an_agent_cannot_describe_another(kernel: Kernel, agent: AgentClient) -> None:
    await kernel.register_agent("writer", WEBHOOK, "w", None, None)
    response = await agent.request("PUT", "/v0/agents/writer/metadata", {}, lease=None)
    assert_error(response, 403, "forbidden")


async def test_a_bearer_only_request_is_unauthorized(client: httpx.AsyncClient) -> None:
    assert_error(await client.put(PATH, json={}), 401, "unauthorized")


BAD_BODIES: list[dict[str, object]] = [
    {"input_schema": "x"},
    {"output_schema": [1]},
    {"input_schema": True},
    {"description": 5},
    {"description": {"text": "d"}},
    {"description": "nul\u0000"},
    {"description": "d" * (MAX_DESCRIPTION_BYTES + 1)},
    {"description": "\u00e9" * (MAX_DESCRIPTION_BYTES // 2 + 1)},  # bytes, not characters
    {"output_schema": {"description": "x" * MAX_SCHEMA_BYTES}},
]


async def test_bad_metadata_is_refused_naming_the_member_and_stores_nothing(
    agent: AgentClient, client: httpx.AsyncClient
) -> None:
    await publish(agent, {"description": "kept"})

    for body in BAD_BODIES:
        envelope = assert_error(await publish(agent, body), 400, "validation_error")
        assert next(iter(body)) in envelope["message"], body

    assert (await shown(client))["description"] == "kept"


async def test_metadata_at_the_bounds_is_accepted(
    agent: AgentClient, client: httpx.AsyncClient
) -> None:
    # The canonical text of this schema is exactly the limit.
    filler = "x" * (MAX_SCHEMA_BYTES - len('{"description":""}'))
    body = {"description": "d" * MAX_DESCRIPTION_BYTES, "input_schema": {"description": filler}}

    assert (await publish(agent, body)).status_code == 204

    stored = await shown(client)
    assert stored["input_schema"] == {"description": filler}


async def test_a_body_that_is_not_an_object_is_refused(agent: AgentClient) -> None:
    response = await agent.request("PUT", PATH, content=b"[]", lease=None)
    assert_error(response, 400, "validation_error")


async def test_deleting_the_agent_removes_its_metadata(
    kernel: Kernel, agent: AgentClient, client: httpx.AsyncClient
) -> None:
    await publish(agent, {"description": "gone soon"})
    assert (await client.delete(f"/v0/agents/{AGENT}")).status_code == 204

    await kernel.register_agent(AGENT, WEBHOOK, SECRET, None, None)

    assert "description" not in await shown(client)
