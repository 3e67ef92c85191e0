"""`subagent()` against a real kernel on both stores (docs/protocol.md §25): a tool runs
another agent and returns its output; the parent blocks while the child runs and replays the
step afterwards; two tools in parallel share one suspend; a failed child raises `ToolError`
in the parent's tool; and outside a step body it refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rebuno
from rebuno import ToolError, tool
from rebuno.types import ExecutionStatus
from tests.sdk.conftest import Harness

bodies: list[str] = []


@tool
async def research(topic: str) -> Any:
    bodies.append(topic)
    return await rebuno.subagent("child", {"topic": topic})


async def child(topic: str) -> dict[str, str]:
    if topic == "doomed":
        raise RuntimeError("nothing found")
    return {"found": topic.upper()}


async def test_a_tool_returns_its_sub_agents_output(harness: Harness) -> None:
    bodies.clear()

    async def parent(topic: str) -> Any:
        return {"report": await research(topic)}

    async with harness.serve("child", child), harness.serve("parent", parent):
        done = await harness.run("parent", {"topic": "tides"}, timeout=30)

    assert done.status is ExecutionStatus.COMPLETED, done
    assert done.output == {"report": {"found": "TIDES"}}
    assert bodies == ["tides"]  # the rerun replayed the step, it did not run it again
    page = await harness.client.list(agent_id="child")
    (kid,) = page.executions
    assert kid.spawned_by is not None
    assert kid.spawned_by.execution_id == done.id
    events = [e.type for e in await harness.client.events(done.id)]
    assert "execution.blocked" in events
    assert events.count("execution.resumed") == 1


async def test_parallel_tools_share_one_suspend(harness: Harness) -> None:
    async def parent(a: str, b: str) -> Any:
        return list(await asyncio.gather(research(a), research(b)))

    async with harness.serve("child", child), harness.serve("parent", parent):
        done = await harness.run("parent", {"a": "x", "b": "y"}, timeout=30)

    assert done.output == [{"found": "X"}, {"found": "Y"}]
    events = [e.type for e in await harness.client.events(done.id)]
    assert events.count("execution.blocked") == 1
    assert events.count("execution.resumed") == 1


async def test_a_failed_child_raises_in_the_parents_tool(harness: Harness) -> None:
    async def parent(topic: str) -> Any:
        try:
            return await research(topic)
        except ToolError as exc:
            return {"error": str(exc)}

    async with harness.serve("child", child), harness.serve("parent", parent):
        done = await harness.run("parent", {"topic": "doomed"}, timeout=30)

    assert done.status is ExecutionStatus.COMPLETED
    assert "subagent_failed" in done.output["error"]


async def test_outside_a_step_body_it_refuses(harness: Harness) -> None:
    async def parent() -> Any:
        with pytest.raises(RuntimeError, match="inside a step body"):
            await rebuno.subagent("child")
        return "refused"

    async with harness.serve("parent", parent):
        done = await harness.run("parent", timeout=30)

    assert done.output == "refused"
