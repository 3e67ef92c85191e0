"""Sessions over HTTP, on both stores (docs/protocol.md §24): one execution of a session runs
at a time, the others wait their turn in creation order; each turn continues the agent's last
completed one; a branch starts a new session; a lost release is repaired by the sweep; and
retention takes a session whole."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from rebuno.kernel import background
from rebuno.kernel.decision.ending import Ending
from rebuno.kernel.service.ending import finish_execution
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import ExecutionStatus
from tests.api.harness import AGENT, SECRET, AgentClient, assert_error, claim
from tests.support import ManualClock

OTHER = "summariser"


@pytest.fixture
async def other_agent(kernel: Kernel) -> str:
    await kernel.register_agent(OTHER, "http://127.0.0.1:9/webhook", SECRET, None, None)
    return OTHER


async def create(client: httpx.AsyncClient, agent_id: str = AGENT, **fields: Any) -> str:
    response = await client.post("/v0/executions", json={"agent_id": agent_id, **fields})
    assert response.status_code == 201, response.text
    execution_id: str = response.json()["id"]
    return execution_id


async def shown(client: httpx.AsyncClient, execution_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get(f"/v0/executions/{execution_id}")).json()
    return body


async def types(client: httpx.AsyncClient, execution_id: str) -> list[str]:
    events = (await client.get(f"/v0/executions/{execution_id}/events")).json()
    return [event["type"] for event in events]


async def finish(
    kernel: Kernel, agent: AgentClient, execution_id: str, route: str, body: object
) -> None:
    leased = replace(agent, lease=await claim(kernel, execution_id))
    response = await leased.post(f"/v0/executions/{execution_id}/{route}", body)
    assert response.status_code == 204, response.text


async def test_one_execution_of_a_session_runs_at_a_time_across_agents(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, other_agent: str
) -> None:
    e1 = await create(client, session="s")
    e2 = await create(client, other_agent, session="s")
    e3 = await create(client, session="s")
    e4 = await create(client, session="s2")

    for admitted in (e1, e4):
        assert "admitted_at" in await shown(client, admitted)
        assert await types(client, admitted) == ["execution.created", "dispatch.queued"]
    for waiting in (e2, e3):
        body = await shown(client, waiting)
        assert body["status"] == "pending"
        assert "admitted_at" not in body
        assert await types(client, waiting) == ["execution.created"]
    listed = (await client.get("/v0/executions", params={"session": "s"})).json()
    assert [e["id"] for e in listed["executions"]] == [e3, e2, e1]

    await finish(kernel, agent, e1, "complete", {"output": None})
    assert await types(client, e2) == ["execution.created", "dispatch.queued"]
    assert await types(client, e3) == ["execution.created"]

    other = replace(agent, agent_id=other_agent)
    await finish(kernel, other, e2, "fail", {"error": "boom"})
    assert await types(client, e3) == ["execution.created", "dispatch.queued"]
    leased = replace(agent, lease=await claim(kernel, e3))
    await leased.post(f"/v0/executions/{e3}/heartbeat")
    assert (await types(client, e3)).count("execution.started") == 1


async def test_each_turn_continues_the_agents_last_completed_one(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, other_agent: str
) -> None:
    e1 = await create(client, session="chat")
    await finish(kernel, agent, e1, "complete", {"output": {"answer": 1}, "state": {"turns": 1}})
    e2 = await create(client, session="chat")
    assert (await shown(client, e2))["parent_execution_id"] == e1
    assert (await agent.get(f"/v0/executions/{e2}/previous")).json() == {"state": {"turns": 1}}
    await finish(kernel, agent, e2, "fail", {"error": "boom"})

    e3 = await create(client, session="chat")  # a failed turn is never a parent
    assert (await shown(client, e3))["parent_execution_id"] == e1
    leased = replace(agent, lease=await claim(kernel, e3))
    await leased.post(f"/v0/executions/{e3}/heartbeat")
    events = (await client.get(f"/v0/executions/{e3}/events")).json()
    (started,) = [e for e in events if e["type"] == "execution.started"]
    assert started["payload"]["parent_execution_id"] == e1
    assert started["payload"]["session"] == "chat"
    await leased.post(f"/v0/executions/{e3}/complete", {"output": {"answer": 3}})

    e4 = await create(client, other_agent, session="chat")  # another agent's turns are not
    assert "parent_execution_id" not in await shown(client, e4)
    assert (await client.get(f"/v0/executions/{e4}/previous")).json() == {"state": None}
    other = replace(agent, agent_id=other_agent)
    await finish(kernel, other, e4, "complete", {"output": None})
    e5 = await create(client, session="chat")
    assert (await client.get(f"/v0/executions/{e5}/previous")).json() == {"state": {"answer": 3}}


async def test_a_branch_from_a_parent_starts_a_new_session(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    e1 = await create(client, session="chat")
    await finish(kernel, agent, e1, "complete", {"output": None, "state": {"turns": 1}})

    branch = await create(client, session="chat-b", parent_execution_id=e1)
    assert (await shown(client, branch))["parent_execution_id"] == e1
    assert (await client.get(f"/v0/executions/{branch}/previous")).json() == {"state": {"turns": 1}}
    response = await client.post(
        "/v0/executions", json={"agent_id": AGENT, "session": "chat", "parent_execution_id": e1}
    )
    assert_error(response, 409, "conflict")


async def test_cancelling_the_holder_admits_the_next(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    e1 = await create(client, session="s")
    e2 = await create(client, session="s")
    e3 = await create(client, session="s")
    await client.post(f"/v0/executions/{e2}/cancel")  # a waiter: nothing to release
    assert await types(client, e3) == ["execution.created"]

    await client.post(f"/v0/executions/{e1}/cancel")
    assert await types(client, e3) == ["execution.created", "dispatch.queued"]
    assert (await shown(client, e2))["status"] == "cancelled"


async def test_racing_creates_in_one_session_admit_one(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    ids = await asyncio.gather(*(create(client, session="race") for _ in range(12)))

    admitted = [i for i in ids if "admitted_at" in await shown(client, i)]
    assert admitted == [min(ids)]  # the oldest: creation order decides
    assert len(await kernel.claim(50)) == 1


async def test_the_sweep_admits_what_a_lost_release_left_waiting(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    e1 = await create(client, session="s")
    e2 = await create(client, session="s")
    # E1 ends without its follow-up, as when the kernel dies between the two transactions.
    async with kernel.store.transaction(e1) as tx:
        execution = await tx.get_execution(e1)
        lost = Ending(ExecutionStatus.FAILED, reason="lost", reached=False)
        await finish_execution(tx, execution, lost, kernel.clock())
    assert await types(client, e2) == ["execution.created"]

    await background.deadline_tick(kernel)

    assert await types(client, e2) == ["execution.created", "dispatch.queued"]


async def test_a_waiter_past_its_deadline_is_skipped_then_cancelled(
    client: httpx.AsyncClient, kernel: Kernel, clock: ManualClock
) -> None:
    holder = await create(client, session="s")
    settings = kernel.settings
    kernel.settings = replace(settings, deadline_timeout=timedelta(minutes=5))
    overdue = await create(client, session="s")  # the only one with a deadline
    kernel.settings = settings
    later = await create(client, session="s")
    clock.advance(timedelta(minutes=6))

    await client.post(f"/v0/executions/{holder}/cancel")

    assert "admitted_at" in await shown(client, later)
    assert "admitted_at" not in await shown(client, overdue)
    await background.deadline_tick(kernel)
    assert (await shown(client, overdue))["failure_reason"] == "deadline_exceeded"


async def test_retention_takes_a_session_whole(
    client: httpx.AsyncClient, kernel: Kernel, clock: ManualClock
) -> None:
    old = await create(client, session="s")
    await client.post(f"/v0/executions/{old}/cancel")
    waiter_session = [await create(client, session="w") for _ in range(2)]
    await client.post(f"/v0/executions/{waiter_session[0]}/cancel")  # the second is admitted
    clock.advance(timedelta(hours=25))
    await background.sweep(kernel)

    assert_error(await client.get(f"/v0/executions/{old}"), 404, "not_found")
    for kept in waiter_session:  # one is live, so none goes
        assert (await client.get(f"/v0/executions/{kept}")).status_code == 200


async def test_retention_keeps_a_session_another_session_continues(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, clock: ManualClock
) -> None:
    parent = await create(client, session="y")
    await finish(kernel, agent, parent, "complete", {"output": None})
    branch = await create(client, session="x", parent_execution_id=parent)
    clock.advance(timedelta(hours=25))
    await background.sweep(kernel)
    assert (await client.get(f"/v0/executions/{parent}")).status_code == 200

    await client.post(f"/v0/executions/{branch}/cancel")
    clock.advance(timedelta(hours=25))
    await background.sweep(kernel)
    await background.sweep(kernel)
    for gone in (branch, parent):
        assert_error(await client.get(f"/v0/executions/{gone}"), 404, "not_found")
