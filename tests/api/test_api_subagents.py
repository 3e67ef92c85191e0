"""Sub-agents over HTTP, on both stores (docs/protocol.md §25): a child created for an
executing step, suspend, the child's end settling the step and resuming the parent, the
cancellation cascade, and the sweep that repairs lost follow-ups."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from rebuno.kernel import background
from rebuno.kernel.decision.ending import completed
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.ending import finish_execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, SECRET, AgentClient, assert_error, claim

CHILD = "researcher-child"
UNKNOWN = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"


@pytest.fixture
async def child_agent(kernel: Kernel) -> str:
    await kernel.register_agent(CHILD, "http://127.0.0.1:9/webhook", SECRET, None, None)
    return CHILD


class Family:
    """A parent running under its lease, with a step executing that spawns children."""

    def __init__(self, client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient) -> None:
        self.client, self.kernel, self.agent = client, kernel, agent
        self.parent = ""
        self.runner = agent
        self.leases: dict[str, Lease] = {}

    async def start(self) -> None:
        created = await self.client.post("/v0/executions", json={"agent_id": AGENT})
        self.parent = created.json()["id"]
        self.runner = replace(self.agent, lease=await claim(self.kernel, self.parent))

    async def step(self, target: str = "run_subagent") -> str:
        body = {"kind": "tool_call", "target": target, "args": {"task": target}}
        decision = (await self.runner.post(f"/v0/executions/{self.parent}/steps", body)).json()
        assert decision["decision"] == "proceed", decision
        step_id: str = decision["step_id"]
        return step_id

    async def spawn(self, step_id: str, **fields: Any) -> httpx.Response:
        body = {
            "agent_id": CHILD,
            "input": {"task": "x"},
            "spawned_by": {"execution_id": self.parent, "step_id": step_id},
            **fields,
        }
        return await self.client.post("/v0/executions", json=body)

    async def suspend(self) -> httpx.Response:
        return await self.runner.post(f"/v0/executions/{self.parent}/suspend")

    async def lease_of(self, execution_id: str) -> Lease:
        """The lease of the execution's delivery; a claim takes every due one at once."""
        if execution_id not in self.leases:
            for claimed in await self.kernel.claim(10):
                dispatch = claimed.dispatch
                self.leases[dispatch.execution_id] = Lease(dispatch.id, dispatch.attempt)
        return self.leases.pop(execution_id)

    async def end_child(self, child: str, route: str, body: object) -> None:
        worker = replace(self.agent, agent_id=CHILD, lease=await self.lease_of(child))
        response = await worker.post(f"/v0/executions/{child}/{route}", body)
        assert response.status_code == 204, response.text

    async def shown(self, execution_id: str) -> dict[str, Any]:
        body: dict[str, Any] = (await self.client.get(f"/v0/executions/{execution_id}")).json()
        return body

    async def types(self, execution_id: str) -> list[str]:
        events = (await self.client.get(f"/v0/executions/{execution_id}/events")).json()
        return [event["type"] for event in events]

    async def step_of(self, step_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v0/executions/{self.parent}/steps/{step_id}")
        body: dict[str, Any] = response.json()
        return body


@pytest.fixture
async def family(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, child_agent: str
) -> Family:
    made = Family(client, kernel, agent)
    await made.start()
    return made


async def test_a_child_settles_its_step_and_the_parent_resumes(family: Family) -> None:
    step = await family.step()
    created = await family.spawn(step)
    assert created.status_code == 201, created.text
    child = created.json()
    assert child["idempotency_key"] == step
    assert child["spawned_by"] == {"execution_id": family.parent, "step_id": step}
    again = await family.spawn(step)
    assert again.json()["id"] == child["id"]
    assert again.headers["Rebuno-Idempotent-Replay"] == "true"

    suspended = await family.suspend()
    assert suspended.json() == {"suspended": True}
    parent = await family.shown(family.parent)
    assert parent["status"] == "blocked"
    events = (await family.client.get(f"/v0/executions/{family.parent}/events")).json()
    assert events[-1]["type"] == "execution.blocked"
    assert events[-1]["payload"]["reason"] == "awaiting_steps"
    late = await family.runner.post(
        f"/v0/executions/{family.parent}/steps", {"kind": "tool_call", "target": "late"}
    )
    assert_error(late, 409, "lease_superseded")

    await family.end_child(child["id"], "complete", {"output": {"answer": 42}})

    assert (await family.types(family.parent))[-3:] == [
        "step.succeeded",
        "execution.resumed",
        "dispatch.queued",
    ]
    settled = await family.step_of(step)
    assert settled["status"] == "succeeded"
    assert settled["result"] == {"answer": 42}
    rerun = replace(family.agent, lease=await claim(family.kernel, family.parent))
    body = {"kind": "tool_call", "target": "run_subagent", "args": {"task": "run_subagent"}}
    replay = (await rerun.post(f"/v0/executions/{family.parent}/steps", body)).json()
    assert replay["decision"] == "replay"
    assert replay["result"] == {"answer": 42}


async def test_a_cancelled_child_fails_its_step(family: Family) -> None:
    step = await family.step()
    child = (await family.spawn(step)).json()["id"]
    await family.suspend()

    await family.client.post(f"/v0/executions/{child}/cancel")

    settled = await family.step_of(step)
    assert settled["status"] == "failed"
    assert settled["error"] == {
        "reason": "subagent_cancelled",
        "execution_id": child,
        "failure_reason": "client_cancelled",
    }
    assert (await family.shown(family.parent))["status"] == "running"


async def test_the_parent_resumes_only_once_every_child_ended(family: Family) -> None:
    first, second = await family.step("one"), await family.step("two")
    c1 = (await family.spawn(first)).json()["id"]
    c2 = (await family.spawn(second)).json()["id"]
    assert (await family.suspend()).json() == {"suspended": True}

    await family.end_child(c1, "complete", {"output": 1})
    assert (await family.step_of(first))["status"] == "succeeded"
    assert (await family.shown(family.parent))["status"] == "blocked"
    assert "execution.resumed" not in await family.types(family.parent)

    await family.end_child(c2, "fail", {"error": "no luck"})
    assert (await family.step_of(second))["error"]["reason"] == "subagent_failed"
    assert (await family.shown(family.parent))["status"] == "running"


async def test_a_child_that_ended_before_suspend_leaves_the_parent_running(
    family: Family,
) -> None:
    step = await family.step()
    child = (await family.spawn(step)).json()["id"]
    await family.end_child(child, "complete", {"output": "done"})

    assert (await family.suspend()).json() == {"suspended": False}
    assert (await family.shown(family.parent))["status"] == "running"
    assert "execution.blocked" not in await family.types(family.parent)
    assert (await family.step_of(step))["result"] == "done"


async def test_a_spawn_is_checked_against_its_step_and_parent(family: Family) -> None:
    step = await family.step()
    await family.runner.post(
        f"/v0/executions/{family.parent}/steps/{step}/complete", {"result": None}
    )
    assert_error(await family.spawn(step), 409, "conflict")  # the step no longer executes

    live = await family.step("live")
    assert (await family.spawn(live)).status_code == 201
    other = await family.client.post(
        "/v0/executions",
        json={"agent_id": AGENT, "spawned_by": {"execution_id": family.parent, "step_id": live}},
    )
    assert_error(other, 409, "conflict")  # a step starts one sub-agent
    assert_error(await family.spawn("not-a-step"), 400, "validation_error")
    bad = await family.client.post(
        "/v0/executions", json={"agent_id": CHILD, "spawned_by": {"execution_id": "x"}}
    )
    assert_error(bad, 400, "validation_error")
    stranger = await family.client.post(
        "/v0/executions",
        json={"agent_id": CHILD, "spawned_by": {"execution_id": UNKNOWN, "step_id": "s"}},
    )
    assert_error(stranger, 404, "not_found")


async def test_a_child_may_not_wait_for_its_parents_session(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, child_agent: str
) -> None:
    made = Family(client, kernel, agent)
    created = await client.post("/v0/executions", json={"agent_id": AGENT, "session": "s"})
    made.parent = created.json()["id"]
    made.runner = replace(agent, lease=await claim(kernel, made.parent))
    step = await made.step()
    assert_error(await made.spawn(step, session="s"), 400, "validation_error")
    assert (await made.spawn(step, session="t")).status_code == 201


async def test_an_ended_parent_cancels_its_tree(family: Family) -> None:
    step = await family.step()
    child = (await family.spawn(step)).json()["id"]
    worker = replace(family.agent, agent_id=CHILD, lease=await family.lease_of(child))
    decision = (
        await worker.post(f"/v0/executions/{child}/steps", {"kind": "tool_call", "target": "g"})
    ).json()
    grandchild_body = {
        "agent_id": CHILD,
        "spawned_by": {"execution_id": child, "step_id": decision["step_id"]},
    }
    grandchild = (await family.client.post("/v0/executions", json=grandchild_body)).json()["id"]

    await family.client.post(f"/v0/executions/{family.parent}/cancel")

    for descendant in (child, grandchild):
        shown = await family.shown(descendant)
        assert shown["status"] == "cancelled"
        assert shown["failure_reason"] == "parent_agent_terminal"
        events = (await family.client.get(f"/v0/executions/{descendant}/events")).json()
        (cancelled,) = [e for e in events if e["type"] == "execution.cancelled"]
        assert cancelled["payload"]["reason"] == "parent_agent_terminal"


async def test_the_sweep_settles_what_a_lost_follow_up_left(family: Family) -> None:
    step = await family.step()
    child = (await family.spawn(step)).json()["id"]
    await family.suspend()
    # The child ends without its follow-ups, as when the kernel dies between the two.
    async with family.kernel.store.transaction(child) as tx:
        record = await tx.get_execution(child)
        await finish_execution(tx, record, completed('"late"'), family.kernel.clock())
    assert (await family.shown(family.parent))["status"] == "blocked"

    await background.deadline_tick(family.kernel)

    assert (await family.step_of(step))["result"] == "late"
    assert (await family.shown(family.parent))["status"] == "running"


async def test_suspend_refuses_without_a_live_lease(family: Family) -> None:
    no_lease = await family.agent.post(f"/v0/executions/{family.parent}/suspend", lease=None)
    assert_error(no_lease, 400, "validation_error")
    await family.client.post(f"/v0/executions/{family.parent}/cancel")
    assert_error(await family.suspend(), 409, "execution_terminal")
