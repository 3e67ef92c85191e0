"""Listings (§5.1, §5.2): execution pages and cursors, event windows, step filters."""

from __future__ import annotations

import httpx
import pytest

from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, AgentClient, assert_error


async def _create(kernel: Kernel, count: int, agent_id: str = AGENT) -> list[str]:
    return [(await kernel.create_execution(agent_id, "{}", None)).id for _ in range(count)]


async def test_executions_are_listed_newest_first(
    kernel: Kernel, client: httpx.AsyncClient
) -> None:
    ids = await _create(kernel, 3)
    page = (await client.get("/v0/executions")).json()
    assert [e["id"] for e in page["executions"]] == sorted(ids, reverse=True)
    assert "next_cursor" not in page


async def test_cursor_walks_every_page_once(kernel: Kernel, client: httpx.AsyncClient) -> None:
    ids = await _create(kernel, 5)
    seen: list[str] = []
    query = "limit=2"
    for _ in range(3):
        page = (await client.get(f"/v0/executions?{query}")).json()
        seen += [e["id"] for e in page["executions"]]
        if "next_cursor" not in page:
            break
        assert page["next_cursor"] == seen[-1]
        query = f"limit=2&cursor={page['next_cursor'].upper()}"
    assert seen == sorted(ids, reverse=True)
    assert "next_cursor" not in page


@pytest.mark.parametrize("limit", ["0", "-3", "1000"])
async def test_out_of_range_limit_is_clamped(
    kernel: Kernel, client: httpx.AsyncClient, limit: str
) -> None:
    await _create(kernel, 3)
    page = (await client.get(f"/v0/executions?limit={limit}")).json()
    assert len(page["executions"]) == 3


@pytest.mark.parametrize("query", ["limit=ten", "limit=1.5", "cursor=abc", "status=sleeping"])
async def test_bad_execution_query_is_a_validation_error(
    client: httpx.AsyncClient, query: str
) -> None:
    assert_error(await client.get(f"/v0/executions?{query}"), 400, "validation_error")


async def test_executions_filter_by_agent_and_status(
    kernel: Kernel, client: httpx.AsyncClient
) -> None:
    await kernel.register_agent("writer", "http://127.0.0.1:9/w", "w", None, None)
    mine = await _create(kernel, 2)
    await _create(kernel, 1, agent_id="writer")
    await kernel.cancel_execution(mine[0])
    by_agent = (await client.get("/v0/executions?agent_id=researcher")).json()
    cancelled = (await client.get("/v0/executions?status=cancelled&agent_id=")).json()
    assert {e["id"] for e in by_agent["executions"]} == set(mine)
    assert [e["id"] for e in cancelled["executions"]] == [mine[0]]


async def test_events_window_by_after_seq_and_limit(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    await client.post(f"/v0/executions/{execution.id}/cancel")
    events = f"/v0/executions/{execution.id}/events"
    everything = (await client.get(events)).json()
    window = (await client.get(f"{events}?after_seq=1&limit=2")).json()
    assert [e["event_seq"] for e in everything] == list(range(1, len(everything) + 1))
    assert [e["event_seq"] for e in window] == [2, 3]


@pytest.mark.parametrize("query", ["after_seq=soon", "limit=lots", "limit=0", "after_seq=-4"])
async def test_unreadable_event_query_falls_back_to_defaults(
    client: httpx.AsyncClient, execution: Execution, query: str
) -> None:
    response = await client.get(f"/v0/executions/{execution.id}/events?{query}")
    assert [e["event_seq"] for e in response.json()] == [1, 2]


async def test_events_of_unknown_execution_are_not_found(client: httpx.AsyncClient) -> None:
    response = await client.get("/v0/executions/01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f/events")
    assert_error(response, 404, "not_found")


async def test_steps_filter_by_terminal_and_by_status(
    leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    done = (await leased.post(base, {"kind": "local", "target": "a"})).json()["step_id"]
    running = (await leased.post(base, {"kind": "local", "target": "b"})).json()["step_id"]
    await leased.post(f"{base}/{done}/complete", {"result": 1})

    async def ids(query: str) -> list[str]:
        return [s["step_id"] for s in (await leased.get(f"{base}{query}")).json()]

    assert await ids("?status=terminal") == [done]
    assert await ids("?status=executing") == [running]
    assert await ids("?status=whatever") == [done, running]
    assert await ids("") == [done, running]


async def test_step_of_another_execution_is_not_found(
    kernel: Kernel, client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    step_id = (await leased.post(base, {"kind": "local", "target": "a"})).json()["step_id"]
    other = await kernel.create_execution(AGENT, "{}", None)
    response = await client.get(f"/v0/executions/{other.id}/steps/{step_id}")
    assert_error(response, 404, "not_found")
    assert_error(await client.get(f"{base}/{'0' * 64}"), 404, "not_found")
