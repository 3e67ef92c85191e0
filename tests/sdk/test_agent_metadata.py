"""An agent of this SDK publishes its description and schemas (§36) as SDK 0.29.2 does: once
per process, at the app's start-up, and `publish_metadata()` awaits it. Against a real kernel
on both stores."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from harness.polling import wait_until
from rebuno import Agent
from tests.sdk.conftest import SECRET, Harness
from tests.sdk.loopback import free_socket, serving, url_of


class Summary(BaseModel):
    text: str
    sources: list[str] = []


async def summarise(topic: str, depth: int = 1) -> dict[str, Any]:
    return {"text": topic, "sources": []}


async def shown(harness: Harness, agent_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=harness.kernel_url) as http:
        response = await http.get(f"/v0/agents/{agent_id}")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def test_the_app_publishes_its_metadata_at_start_up(harness: Harness) -> None:
    sock = free_socket()
    await harness.register("summariser", url_of(sock) + "/webhook")
    agent = Agent(
        "summariser",
        secret=SECRET,
        base_url=harness.kernel_url,
        description="Summarises a topic",
        output_schema=Summary,
    )
    harness.agents.append(agent)
    agent.bind(summarise)

    async with serving(agent.app, sock):

        async def published() -> bool:
            return "description" in await shown(harness, "summariser")

        await wait_until(published, message="the metadata was published")

    stored = await shown(harness, "summariser")
    assert stored["description"] == "Summarises a topic"
    assert stored["output_schema"] == Summary.model_json_schema()
    assert stored["input_schema"]["title"] == "summarise"
    assert stored["input_schema"]["required"] == ["topic"]


async def test_publish_metadata_awaits_the_one_publication(harness: Harness) -> None:
    await harness.register("plain", "http://127.0.0.1:9/webhook")
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    agent = Agent(
        "plain", secret=SECRET, base_url=harness.kernel_url, description="d", output_schema=schema
    )
    harness.agents.append(agent)

    await agent.publish_metadata()

    stored = await shown(harness, "plain")
    assert (stored["description"], stored["output_schema"]) == ("d", schema)
    assert "input_schema" not in stored  # no handler bound yet


async def test_a_refused_publication_is_logged_once_and_not_retried(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent("unregistered", secret=SECRET, base_url=harness.kernel_url, description="d")
    harness.agents.append(agent)
    caplog.set_level(logging.WARNING, logger="rebuno")

    await agent.publish_metadata()
    await agent.publish_metadata()

    refused = [r for r in caplog.records if "refused agent unregistered's metadata" in r.message]
    assert len(refused) == 1


async def test_an_unreachable_kernel_is_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    closed = free_socket()
    kernel_url = url_of(closed)
    closed.close()
    agent = Agent("offline", secret=SECRET, base_url=kernel_url, check_kernel=False)
    caplog.set_level(logging.WARNING, logger="rebuno")

    await agent.publish_metadata()
    await agent.publish_metadata()
    await agent.close()

    unreachable = [r for r in caplog.records if "could not publish agent metadata" in r.message]
    assert len(unreachable) == 2


def test_an_output_schema_must_be_a_dict_or_a_model() -> None:
    with pytest.raises(TypeError, match="output_schema"):
        Agent("a", secret="s", base_url="http://127.0.0.1:9", output_schema="x")  # type: ignore[arg-type]
