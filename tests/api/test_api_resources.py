"""External resources and checkpoints over HTTP, on both stores (docs/protocol.md §33): the
examples R1-R7 of the protocol, session turns inheriting resources, and retention."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, AgentClient, assert_error, claim
from tests.support import ManualClock

WRITE = {"kind": "tool_call", "target": "write", "resources": ["workspace"]}
PLAIN = {"kind": "tool_call", "target": "read", "resources": []}
LLM = {"kind": "llm_call", "target": "model", "resources": []}
WORKSPACE = {"key": "workspace", "driver_id": "test.v1", "every_steps": 2}


@dataclass
class Run:
    """One execution as its agent drives it."""

    id: str
    agent: AgentClient
    client: httpx.AsyncClient

    @property
    def base(self) -> str:
        return f"/v0/executions/{self.id}"

    async def register(self, **body: Any) -> httpx.Response:
        return await self.agent.post(f"{self.base}/resources", {**WORKSPACE, **body})

    async def bind(self, binding: object, key: str = "workspace") -> httpx.Response:
        return await self.agent.post(f"{self.base}/resources/{key}/binding", {"binding": binding})

    async def publish(self, **body: Any) -> httpx.Response:
        return await self.agent.post(f"{self.base}/resources/checkpoints", body)

    async def submit(self, step: dict[str, Any], n: int = 0) -> dict[str, Any]:
        response = await self.agent.post(f"{self.base}/steps", {**step, "args": {"n": n}})
        assert response.status_code == 200, response.text
        decision: dict[str, Any] = response.json()
        return decision

    async def complete(self, step_id: str, **extra: Any) -> dict[str, Any]:
        response = await self.agent.post(
            f"{self.base}/steps/{step_id}/complete", {"result": "ok", **extra}
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    async def events(self, execution_id: str | None = None) -> list[dict[str, Any]]:
        target = execution_id or self.id
        found: list[dict[str, Any]] = (
            await self.client.get(f"/v0/executions/{target}/events?limit=1000")
        ).json()
        return found

    async def fork_points(self) -> dict[str, Any]:
        found: dict[str, Any] = (await self.client.get(f"{self.base}/fork-points")).json()
        return found


def capture(generation: int, ref: str, key: str = "workspace") -> dict[str, Any]:
    return {"key": key, "generation": generation, "checkpoint_ref": ref}


@pytest.fixture
async def run(client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient) -> Run:
    created = (await client.post("/v0/executions", json={"agent_id": AGENT})).json()["id"]
    return Run(created, replace(agent, lease=await claim(kernel, created)), client)


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def cadence(run: Run) -> tuple[int, int]:
    """R1 up to the second write's capture; the seqs of the two writes' `step.succeeded`."""
    registered = await run.register()
    assert registered.status_code == 200, registered.text
    assert (await run.bind({"sandbox_id": "sbx-1"})).status_code == 204
    assert (await run.publish(captures=[capture(0, "s0")])).status_code == 204
    first = await run.submit(WRITE, 1)
    await run.complete(first["step_id"])
    second = await run.submit(WRITE, 2)
    assert second["resources"] == [{"key": "workspace", "generation": 2, "due": True}]
    await run.complete(second["step_id"], captures=[capture(2, "s2")])
    done = of_type(await run.events(), "step.succeeded")
    return done[0]["event_seq"], done[1]["event_seq"]


async def test_r1_a_baseline_and_the_policys_cadence(run: Run) -> None:
    registered = await run.register()
    assert registered.status_code == 200, registered.text
    view = registered.json()
    assert view == {
        "key": "workspace",
        "driver_id": "test.v1",
        "coverage_reuse": False,
        "every_steps": 2,
        "on_completion": True,
        "registered_seq": view["registered_seq"],
        "generation": 0,
        "count": 0,
        "covered": False,
    }
    n = view["registered_seq"]
    assert (await run.bind({"sandbox_id": "sbx-1"})).status_code == 204
    assert (await run.publish(captures=[capture(0, "s0")])).status_code == 204
    log = await run.events()
    assert [e["type"] for e in log if e["event_seq"] >= n] == [
        "resource.registered",
        "resource.bound",
        "resource.checkpointed",
    ]
    assert log[-1]["payload"]["covered_seq"] == n + 1

    first = await run.submit(WRITE, 1)
    assert first["resources"] == [{"key": "workspace", "generation": 1, "due": False}]
    executing = of_type(await run.events(), "step.executing")[-1]
    assert executing["payload"]["generations"] == {"workspace": 1}
    assert executing["payload"]["resources"] == ["workspace"]
    points = await run.fork_points()
    assert points["resources"] == {"workspace": n}
    assert points["checkpoints"] == [
        {
            "key": "workspace",
            "generation": 0,
            "checkpoint_ref": "s0",
            "covered_seq": n + 1,
            "invalidated_seq": executing["event_seq"],
        }
    ]
    assert await run.complete(first["step_id"]) == {"decision": "recorded"}
    assert (await run.register()).json()["count"] == 1

    second = await run.submit(WRITE, 2)
    assert second["resources"] == [{"key": "workspace", "generation": 2, "due": True}]
    await run.complete(second["step_id"], captures=[capture(2, "s2")])
    log = await run.events()
    succeeded = of_type(log, "step.succeeded")[-1]
    checkpointed = of_type(log, "resource.checkpointed")[-1]
    assert checkpointed["payload"] == {
        "key": "workspace",
        "generation": 2,
        "checkpoint_ref": "s2",
        "covered_seq": succeeded["event_seq"],
    }
    assert (await run.register()).json()["covered"] is True


async def test_r2_coverage_reuse_keeps_coverage_across_unaffecting_steps(run: Run) -> None:
    assert (await run.register(coverage_reuse=True)).status_code == 200
    await run.publish(captures=[capture(0, "s0")])
    for step in (PLAIN, LLM):
        decision = await run.submit(step)
        assert decision["decision"] == "proceed"
        assert "resources" not in decision
        await run.complete(decision["step_id"])
    assert (await run.register(coverage_reuse=True)).json()["covered"] is True
    assert (await run.fork_points())["checkpoints"][0].get("invalidated_seq") is None


async def test_r2_without_coverage_reuse_any_live_step_ends_coverage(run: Run) -> None:
    await run.register()
    await run.publish(captures=[capture(0, "s0")])
    decision = await run.submit(LLM)
    assert decision["resources"] == [{"key": "workspace", "generation": 1, "due": False}]
    executing = of_type(await run.events(), "step.executing")[-1]
    assert "resources" not in executing["payload"]
    assert executing["payload"]["generations"] == {"workspace": 1}
    assert (await run.register()).json()["covered"] is False


async def test_r3_stale_and_concurrent_captures_are_refused_but_outcomes_recorded(
    run: Run,
) -> None:
    await run.register(coverage_reuse=True)
    s = await run.submit(WRITE, 1)
    assert await run.complete(s["step_id"], captures=[capture(0, "old")]) == {
        "decision": "recorded"
    }
    a, b = await run.submit(WRITE, 2), await run.submit(WRITE, 3)
    assert [a["resources"][0]["generation"], b["resources"][0]["generation"]] == [2, 3]
    assert await run.complete(a["step_id"], captures=[capture(3, "early")]) == {
        "decision": "recorded"
    }
    failed = of_type(await run.events(), "resource.checkpoint_failed")
    assert [e["payload"]["error"] for e in failed] == ["stale_generation", "writers_active"]
    steps = (await run.client.get(f"{run.base}/steps")).json()
    assert [st["status"] for st in steps] == ["succeeded", "succeeded", "executing"]
    assert (await run.register(coverage_reuse=True)).json()["covered"] is False


async def test_r4_registration_and_binding_conflicts(run: Run) -> None:
    await run.register()
    assert (await run.register(every_steps=1)).json()["every_steps"] == 2
    assert_error(await run.register(driver_id="other.v1"), 409, "conflict")
    assert_error(await run.register(coverage_reuse=True), 409, "conflict")
    assert (await run.bind({"sandbox_id": "sbx-1"})).status_code == 204
    before = len(await run.events())
    assert (await run.bind({"sandbox_id": "sbx-1"})).status_code == 204
    assert len(await run.events()) == before
    assert_error(await run.bind({"sandbox_id": "sbx-2"}), 409, "conflict")


async def test_a_policy_is_enabled_once_by_a_later_registration(run: Run) -> None:
    assert (await run.register(every_steps=0)).json()["on_completion"] is False
    enabled = (await run.register(every_steps=3, on_completion=False)).json()
    assert (enabled["every_steps"], enabled["on_completion"]) == (3, False)
    assert len(of_type(await run.events(), "resource.registered")) == 2


@pytest.mark.parametrize(
    "body",
    [{"key": "bad key"}, {"every_steps": -1}, {"every_steps": 1.5}, {"driver_id": ""}],
)
async def test_r5_a_bad_registration_is_refused(run: Run, body: dict[str, Any]) -> None:
    assert_error(await run.register(**body), 400, "validation_error")


async def test_r5_validation_of_declarations_and_binding(run: Run) -> None:
    await run.register()
    response = await run.agent.post(
        f"{run.base}/steps", {"kind": "tool_call", "target": "t", "resources": ["nope"]}
    )
    envelope = assert_error(response, 400, "validation_error")
    assert "nope" in envelope["message"]
    assert (await run.client.get(f"{run.base}/steps")).json() == []
    assert_error(await run.bind({"x": 1}, key="unknown"), 404, "not_found")
    assert_error(await run.bind({"x": 1}, key="bad,key"), 404, "not_found")
    assert_error(await run.bind(None), 400, "validation_error")
    bad = await run.agent.post(f"{run.base}/steps", {"kind": "tool_call", "resources": "x"})
    assert_error(bad, 400, "validation_error")


async def test_r5_resource_routes_after_the_end_and_after_a_reclaim(
    run: Run, kernel: Kernel, clock: ManualClock
) -> None:
    await run.register()
    clock.advance(timedelta(seconds=60))
    await kernel.reclaim_expired_leases()
    assert_error(await run.register(), 409, "lease_superseded")
    runner = replace(run, agent=replace(run.agent, lease=await claim(kernel, run.id)))
    await runner.agent.post(f"{run.base}/complete", {"output": "done"})
    for response in (
        await runner.register(),
        await runner.bind({"x": 1}),
        await runner.publish(captures=[capture(0, "s")]),
    ):
        assert_error(response, 409, "execution_terminal")


async def test_r6_an_orphaned_rerun_moves_the_generation_and_counts_once(
    run: Run, kernel: Kernel, clock: ManualClock
) -> None:
    await run.register()
    first = await run.submit(WRITE, 1)
    assert first["resources"][0]["generation"] == 1
    clock.advance(timedelta(seconds=60))
    await kernel.reclaim_expired_leases()
    runner = replace(run, agent=replace(run.agent, lease=await claim(kernel, run.id)))
    again = await runner.submit(WRITE, 1)
    assert (again["decision"], again["step_id"]) == ("proceed", first["step_id"])
    assert again["resources"][0]["generation"] == 2
    await runner.complete(again["step_id"], captures=[capture(1, "late")])
    failed = of_type(await run.events(), "resource.checkpoint_failed")
    assert failed[-1]["payload"]["error"] == "stale_generation"
    assert (await runner.register()).json()["count"] == 1


async def test_r7_a_fork_restores_the_selected_checkpoint(run: Run, kernel: Kernel) -> None:
    first_done, last_done = await cadence(run)
    n = (await run.register()).json()["registered_seq"]

    early = await run.client.post(f"{run.base}/fork", json={"at_seq": first_done})
    assert early.status_code == 201, early.text
    fork = early.json()
    assert fork["restoration"] == {
        "workspace": {"checkpoint_ref": "s0", "checkpoint_seq": n + 1, "covered": False}
    }
    assert (await run.client.get(f"/v0/executions/{fork['id']}")).json()["restoration"] == fork[
        "restoration"
    ]
    forked = Run(fork["id"], replace(run.agent, lease=await claim(kernel, fork["id"])), run.client)
    view = (await forked.register()).json()
    assert "binding" not in view
    assert (view["checkpoint_ref"], view["generation"], view["count"], view["covered"]) == (
        "s0",
        2,
        1,
        False,
    )
    log = await forked.events()
    assert [e["type"] for e in log[:3]] == [
        "execution.created",
        "execution.forked",
        "resource.registered",
    ]
    assert of_type(log, "resource.initialized")[0]["payload"] == {
        "key": "workspace",
        "generation": 2,
        "checkpoint_ref": "s0",
    }
    assert of_type(log, "execution.forked")[0]["payload"]["restoration"] == fork["restoration"]

    late = (await run.client.post(f"{run.base}/fork", json={"at_seq": last_done})).json()
    assert late["restoration"]["workspace"]["covered"] is True
    assert late["restoration"]["workspace"]["checkpoint_ref"] == "s2"
    forked = Run(late["id"], replace(run.agent, lease=await claim(kernel, late["id"])), run.client)
    view = (await forked.register()).json()
    assert (view["checkpoint_ref"], view["generation"], view["count"], view["covered"]) == (
        "s2",
        2,
        2,
        True,
    )
    points = await forked.fork_points()
    assert all(
        c["covered_seq"] < c.get("invalidated_seq", c["covered_seq"] + 1)
        for c in points["checkpoints"]
    )


async def test_a_copied_checkpoint_whose_interval_maps_to_nothing_is_dropped(
    run: Run, kernel: Kernel
) -> None:
    """§33.8.3: the baseline is closed by a write's `step.executing`; a fork at that boundary,
    before the write finished, copies no event of the write, so the baseline's interval maps
    to nothing and it is not copied; a fork after the write finished keeps it, closed."""
    await run.register()
    await run.bind({"sandbox_id": "sbx-1"})
    await run.publish(captures=[capture(0, "s0")])
    write = await run.submit(WRITE, 1)
    log = await run.events()
    executing = of_type(log, "step.executing")[0]["event_seq"]
    baseline = (await run.fork_points())["checkpoints"][0]
    assert baseline["invalidated_seq"] == executing

    early = (await run.client.post(f"{run.base}/fork", json={"at_seq": executing})).json()
    assert early["restoration"] == {
        "workspace": {
            "checkpoint_ref": "s0",
            "checkpoint_seq": baseline["covered_seq"],
            "covered": False,
        }
    }
    dropped = Run(early["id"], run.agent, run.client)
    assert (await dropped.fork_points())["checkpoints"] == []
    assert of_type(await dropped.events(), "resource.checkpointed") == []
    assert [(r.generation, r.count) for r in await kernel.store.list_resources(early["id"])] == [
        (2, 0)
    ]

    await run.complete(write["step_id"])
    done = of_type(await run.events(), "step.succeeded")[0]["event_seq"]
    late = (await run.client.post(f"{run.base}/fork", json={"at_seq": done})).json()
    kept = Run(late["id"], run.agent, run.client)
    points = await kept.fork_points()
    forked_log = await kept.events()
    registered = of_type(forked_log, "resource.registered")[0]["event_seq"]
    copied_executing = of_type(forked_log, "step.executing")[0]["event_seq"]
    assert points["checkpoints"] == [
        {
            "key": "workspace",
            "generation": 0,
            "checkpoint_ref": "s0",
            "covered_seq": registered,
            "invalidated_seq": copied_executing,
        }
    ]
    assert [e["payload"] for e in of_type(forked_log, "resource.checkpointed")] == [
        {"key": "workspace", "generation": 0, "checkpoint_ref": "s0", "covered_seq": registered}
    ]


async def test_a_fork_of_an_execution_without_resources_restores_nothing(run: Run) -> None:
    decision = await run.submit(PLAIN)
    await run.complete(decision["step_id"])
    fork = (await run.client.post(f"{run.base}/fork", json={"at_seq": 3})).json()
    assert "restoration" not in fork
    assert (await run.fork_points())["resources"] == {}


async def test_capture_failures_are_logged_and_bad_entries_refused(run: Run) -> None:
    await run.register()
    assert (await run.publish()).status_code == 204
    sent = await run.publish(capture_failures=[{"key": "other", "generation": 0, "error": "x"}])
    assert sent.status_code == 204
    assert of_type(await run.events(), "resource.checkpoint_failed")[-1]["payload"] == {
        "key": "other",
        "generation": 0,
        "error": "x",
    }
    assert_error(await run.publish(captures=[{"generation": 0}]), 400, "validation_error")
    refused = await run.publish(captures=[capture(0, ""), capture(0, "a"), capture(0, "b")])
    assert refused.status_code == 204
    errors = [
        e["payload"]["error"] for e in of_type(await run.events(), "resource.checkpoint_failed")
    ]
    assert errors[-2:] == ["missing_checkpoint_ref", "duplicate_capture"]


async def test_a_session_turn_inherits_its_parents_resources(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    body = {"agent_id": AGENT, "session": "chat"}
    first_id = (await client.post("/v0/executions", json=body)).json()["id"]
    first = Run(first_id, replace(agent, lease=await claim(kernel, first_id)), client)
    await first.register()
    await first.bind({"sandbox_id": "sbx-1"})
    await first.publish(captures=[capture(0, "s0")])
    await first.agent.post(f"{first.base}/complete", {"output": "one"})

    second_id = (await client.post("/v0/executions", json=body)).json()["id"]
    second = Run(second_id, replace(agent, lease=await claim(kernel, second_id)), client)
    types = [e["type"] for e in await second.events()]
    assert types == [
        "execution.created",
        "resource.registered",
        "resource.bound",
        "dispatch.queued",
    ]
    view = (await second.register()).json()
    assert view["binding"] == {"sandbox_id": "sbx-1"}
    assert (view["generation"], view["count"], view["covered"]) == (0, 0, False)
    assert (await second.fork_points())["checkpoints"] == []


async def test_retention_deletes_resources_with_their_execution(
    run: Run, kernel: Kernel, clock: ManualClock
) -> None:
    await cadence(run)
    await run.agent.post(f"{run.base}/complete", {"output": "done"})
    clock.advance(timedelta(days=400))
    assert await kernel.store.delete_terminal_before(clock.now()) == 1
    assert await kernel.store.list_resources(run.id) == []
    assert await kernel.store.list_checkpoints(run.id) == []


async def test_concurrent_affecting_steps_get_distinct_generations(run: Run) -> None:
    await run.register(coverage_reuse=True)
    decisions = await asyncio.gather(*(run.submit(WRITE, n) for n in range(6)))
    generations = sorted(d["resources"][0]["generation"] for d in decisions)
    assert generations == [1, 2, 3, 4, 5, 6]
    last = max(decisions, key=lambda d: d["resources"][0]["generation"])
    others = [d for d in decisions if d is not last]
    for decision in others:
        generation = decision["resources"][0]["generation"]
        await run.complete(decision["step_id"], captures=[capture(generation, f"g{generation}")])
    await run.complete(last["step_id"], captures=[capture(6, "g6")])
    accepted = [
        e["payload"]["checkpoint_ref"] for e in of_type(await run.events(), "resource.checkpointed")
    ]
    assert accepted == ["g6"]
    view = (await run.register(coverage_reuse=True)).json()
    assert (view["generation"], view["count"], view["covered"]) == (6, 6, True)


async def test_a_failed_step_carries_captures_and_a_cancelled_one_is_counted(
    run: Run, kernel: Kernel
) -> None:
    await run.register(every_steps=1)
    first = await run.submit(WRITE, 1)
    assert first["resources"] == [{"key": "workspace", "generation": 1, "due": True}]
    failed = await run.agent.post(
        f"{run.base}/steps/{first['step_id']}/fail",
        {"error": {"message": "boom"}, "captures": [capture(1, "after-failure")]},
    )
    assert failed.json() == {"decision": "recorded"}
    assert of_type(await run.events(), "resource.checkpointed")[-1]["payload"]["generation"] == 1
    await run.submit(WRITE, 2)
    assert (await run.client.post(f"{run.base}/cancel")).status_code == 204
    stored = await run.fork_points()
    assert stored["checkpoints"][-1]["invalidated_seq"] > stored["checkpoints"][-1]["covered_seq"]
    resources = {r.key: r for r in await kernel.store.list_resources(run.id)}
    assert resources["workspace"].count == 2
