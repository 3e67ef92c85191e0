"""An execution's lineage listed over HTTP, on both stores (docs/protocol.md §5.1): the
executions that continue it, its sub-agents and its forks, each a filter of the execution
list that pages and combines like the others."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, SECRET, AgentClient, assert_error, claim

CHILD = "researcher-child"
UNKNOWN = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"


async def _create(client: httpx.AsyncClient, **body: Any) -> str:
    response = await client.post("/v0/executions", json={"agent_id": AGENT, **body})
    assert response.status_code == 201, response.text
    created: str = response.json()["id"]
    return created


async def _listed(client: httpx.AsyncClient, query: str) -> list[str]:
    page = (await client.get(f"/v0/executions?{query}")).json()
    return [e["id"] for e in page["executions"]]


async def test_the_sub_agents_of_an_execution_are_listed_and_paged(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    await kernel.register_agent(CHILD, "http://127.0.0.1:9/webhook", SECRET, None, None)
    parent = await _create(client)
    runner = replace(agent, lease=await claim(kernel, parent))
    children = []
    for task in ("a", "b"):
        step = {"kind": "tool_call", "target": "run_subagent", "args": {"task": task}}
        decided = (await runner.post(f"/v0/executions/{parent}/steps", step)).json()
        spawned_by = {"execution_id": parent, "step_id": decided["step_id"]}
        children.append(await _create(client, agent_id=CHILD, spawned_by=spawned_by))
    await _create(client)  # not a child

    first = (await client.get(f"/v0/executions?spawned_by={parent.upper()}&limit=1")).json()
    rest = await _listed(client, f"spawned_by={parent}&cursor={first['next_cursor']}")

    assert [e["id"] for e in first["executions"]] + rest == children[::-1]
    assert await _listed(client, f"spawned_by={parent}&agent_id={AGENT}") == []
    assert await _listed(client, f"spawned_by={children[0]}") == []


async def test_the_continuations_and_forks_of_an_execution_are_listed_apart(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    source = await _create(client)
    runner = replace(agent, lease=await claim(kernel, source))
    completed = await runner.post(f"/v0/executions/{source}/complete", {"output": "done"})
    assert completed.status_code == 204, completed.text
    forks = []
    for _ in range(2):
        forked = await client.post(f"/v0/executions/{source}/fork", json={"at_seq": 1})
        assert forked.status_code == 201, forked.text
        forks.append(forked.json()["id"])
    continuation = await _create(client, parent_execution_id=source)

    assert await _listed(client, f"forked_from={source}") == forks[::-1]
    assert await _listed(client, f"parent_execution_id={source}") == [continuation]
    assert await _listed(client, f"forked_from={source}&status=completed") == []
    assert await _listed(client, f"forked_from={UNKNOWN}") == []


@pytest.mark.parametrize("key", ["parent_execution_id", "spawned_by", "forked_from"])
async def test_a_lineage_filter_that_is_not_an_execution_id_is_refused(
    client: httpx.AsyncClient, key: str
) -> None:
    assert_error(await client.get(f"/v0/executions?{key}=not-an-id"), 400, "validation_error")
