"""`POST /v0/agents/{id}/instances` (`agent-instances`): signed by the agent itself, validated,
and answered with how many deliveries of an earlier incarnation it reclaimed."""

from __future__ import annotations

import uuid
from dataclasses import replace

import httpx
import pytest

from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.extensions import AgentInstance
from tests.api.harness import AGENT, AgentClient, assert_error
from tests.kernel.conftest import delivered

ROUTE = f"/v0/agents/{AGENT}/instances"
NAME = "worker-1:5000"


def announcement(name: object = NAME, incarnation: object = None) -> dict[str, object]:
    return {"instance": name, "incarnation": incarnation or str(uuid.uuid4())}


async def test_an_announcement_answers_how_many_deliveries_it_reclaimed(
    kernel: Kernel, agent: AgentClient
) -> None:
    await delivered(kernel, AgentInstance(NAME, str(uuid.uuid4())), AGENT)

    response = await agent.post(ROUTE, announcement(), lease=None)

    assert response.status_code == 200, response.text
    assert response.json() == {"reclaimed": 1}


async def test_an_unsigned_announcement_is_unauthorized(anon: httpx.AsyncClient) -> None:
    response = await anon.post(ROUTE, json=announcement())

    assert_error(response, 401, "unauthorized")


async def test_an_unknown_agent_is_unauthorized(agent: AgentClient) -> None:
    stranger = replace(agent, agent_id="stranger")

    response = await stranger.post("/v0/agents/stranger/instances", announcement(), lease=None)

    assert_error(response, 401, "unauthorized")


async def test_an_agent_announces_only_itself(kernel: Kernel, agent: AgentClient) -> None:
    await kernel.register_agent("other", "http://127.0.0.1:9/webhook", "x", None, None)

    response = await agent.post("/v0/agents/other/instances", announcement(), lease=None)

    assert_error(response, 403, "forbidden")


@pytest.mark.parametrize(
    "body",
    [
        announcement(name=""),
        announcement(name="a" * 201),
        announcement(name="has space"),
        announcement(name="semi;colon"),
        announcement(name=7),
        announcement(incarnation="not-a-uuid"),
        announcement(incarnation=str(uuid.uuid4()).upper()),
        {"instance": NAME},
    ],
)
async def test_a_malformed_announcement_is_a_validation_error(
    agent: AgentClient, body: dict[str, object]
) -> None:
    response = await agent.post(ROUTE, body, lease=None)

    assert_error(response, 400, "validation_error")
