"""The streaming LLM example end to end: examples/openai_agent.py, run offline against
examples/llm_stub.py as its docstring says, streams its answer through the kernel, and a
`Client.stream` subscriber sees every delta while the step runs; the recorded step holds the
same bytes, and the execution's output is the stub's answer."""

from __future__ import annotations

import asyncio
import json
import runpy
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rebuno import Client
from rebuno.types import StreamDelta
from tests.docs import environment as env_module
from tests.docs.environment import ROOT, Environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STUB = runpy.run_path(str(ROOT / "examples" / "llm_stub.py"))


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Environment]:
    with env_module.started(tmp_path) as environment:
        yield environment


async def test_the_streaming_example_shows_its_answer_through_client_stream(
    running: Environment,
) -> None:
    # The agent is down while the client subscribes, so the step starts after the
    # subscription and no delta can be published before it (only later ones are sent).
    running.agent_stopped("writer")
    async with Client(base_url=running.url) as client:
        created = await client.create("writer", input={"topic": "leases"})
        deltas: list[StreamDelta] = []
        follower = asyncio.create_task(_follow(client, created.id, deltas))
        await _subscribed(running.url, created.id)
        await asyncio.to_thread(running.agent_started, "writer")
        done = await client.wait(created.id, timeout=120)
        follower.cancel()
        steps = await client.list_steps(created.id, status="terminal")
    [step] = [step for step in steps if step.kind == "llm_call"]

    expected = STUB["answer"]("Explain leases to a new engineer.")
    assert done.status == "completed", done.failure_reason
    assert done.output == {"paragraph": expected, "words": len(expected.split())}
    assert step.result["headers"]["content-type"].startswith("text/event-stream")
    assert len(deltas) > 1, "the answer arrived in one piece, not streamed"
    assert [delta.seq for delta in deltas] == list(range(len(deltas)))
    assert "".join(delta.data for delta in deltas) == step.result["body"]
    assert _text_of(step.result["body"]) == expected


async def _follow(client: Client, execution_id: str, deltas: list[StreamDelta]) -> None:
    async for delta in client.stream(execution_id):
        deltas.append(delta)


async def _subscribed(url: str, execution_id: str) -> None:
    """Returns once the kernel answers a subscription to the execution's stream, opened after
    the follower's: by then the follower's own subscription has been taken too."""
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as http,
        http.stream("GET", f"/v0/executions/{execution_id}/stream") as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith(":"):
                return


def _text_of(body: str) -> str:
    """The assistant's text in a recorded chat-completions event stream."""
    text = ""
    for line in body.split("\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                text += choice["delta"].get("content") or ""
    return text
