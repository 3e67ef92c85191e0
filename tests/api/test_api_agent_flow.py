"""An agent's run over HTTP (§5.2, §8, §9), with both signature schemes: submit, record,
replay after redelivery, heartbeat, finish."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import httpx
import pytest

from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AgentClient, assert_error, claim
from tests.support import ManualClock

SEARCH = {"kind": "tool_call", "target": "web_search", "args": {"query": "durable agents"}}
LEASE = timedelta(seconds=30)


@pytest.fixture(params=["v1", "sha256"])
def runner(request: pytest.FixtureRequest, leased: AgentClient) -> AgentClient:
    """The leased agent, signing like SDK 0.29 (`v1`) or SDK 0.16 (`sha256`)."""
    return replace(leased, scheme=request.param)


async def _redeliver(
    kernel: Kernel, clock: ManualClock, agent: AgentClient, execution: Execution
) -> AgentClient:
    """Lets the lease lapse and claims the dispatch again: the next delivery attempt."""
    clock.advance(LEASE + timedelta(seconds=1))
    await kernel.store.reclaim_expired(clock.now(), LEASE)
    return replace(agent, lease=await claim(kernel, execution.id))


async def test_new_step_proceeds_and_its_result_is_recorded(
    runner: AgentClient, client: httpx.AsyncClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    decision = (await runner.post(base, SEARCH)).json()
    recorded = await runner.post(f"{base}/{decision['step_id']}/complete", {"result": ["a"]})
    step = (await client.get(f"{base}/{decision['step_id']}")).json()
    assert decision["decision"] == "proceed"
    assert recorded.json() == {"decision": "recorded"}
    assert (step["status"], step["result"]) == ("succeeded", ["a"])


async def test_redelivered_run_replays_the_recorded_result(
    kernel: Kernel, clock: ManualClock, runner: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    first = (await runner.post(base, SEARCH)).json()
    await runner.post(f"{base}/{first['step_id']}/complete", {"result": {"hits": 3}})
    again = await _redeliver(kernel, clock, runner, execution)
    replay = (await again.post(base, SEARCH)).json()
    assert replay == {"decision": "replay", "step_id": first["step_id"], "result": {"hits": 3}}


async def test_failed_step_replays_its_error_object(
    kernel: Kernel, clock: ManualClock, runner: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    step_id = (await runner.post(base, SEARCH)).json()["step_id"]
    failed = await runner.post(f"{base}/{step_id}/fail", {"error": {"message": "timeout"}})
    again = await _redeliver(kernel, clock, runner, execution)
    replay = (await again.post(base, SEARCH)).json()
    assert failed.json() == {"decision": "recorded"}
    assert replay["error"] == {"message": "timeout"}


async def test_write_from_a_replaced_attempt_is_lease_superseded(
    kernel: Kernel, clock: ManualClock, runner: AgentClient, execution: Execution
) -> None:
    await _redeliver(kernel, clock, runner, execution)
    response = await runner.post(f"/v0/executions/{execution.id}/steps", SEARCH)
    assert_error(response, 409, "lease_superseded")


async def test_heartbeat_renews_the_lease(runner: AgentClient, execution: Execution) -> None:
    response = await runner.post(f"/v0/executions/{execution.id}/heartbeat")
    assert response.status_code == 204
    assert response.content == b""


async def test_completed_execution_keeps_its_output(
    runner: AgentClient, client: httpx.AsyncClient, execution: Execution
) -> None:
    done = await runner.post(f"/v0/executions/{execution.id}/complete", {"output": {"ok": True}})
    body = (await client.get(f"/v0/executions/{execution.id}")).json()
    assert done.status_code == 204
    assert (body["status"], body["output"]) == ("completed", {"ok": True})


async def test_failed_execution_keeps_its_reason(
    runner: AgentClient, client: httpx.AsyncClient, execution: Execution
) -> None:
    failed = await runner.post(f"/v0/executions/{execution.id}/fail", {"error": "out of budget"})
    body = (await client.get(f"/v0/executions/{execution.id}")).json()
    assert failed.status_code == 204
    assert (body["status"], body["failure_reason"]) == ("failed", "out of budget")


async def test_terminal_execution_answers_steps_and_refuses_finishing_again(
    runner: AgentClient, execution: Execution
) -> None:
    await runner.post(f"/v0/executions/{execution.id}/complete", {"output": None})
    decision = await runner.post(f"/v0/executions/{execution.id}/steps", SEARCH)
    again = await runner.post(f"/v0/executions/{execution.id}/fail", {"error": "late"})
    assert decision.json() == {"decision": "execution_terminal"}
    assert_error(again, 409, "execution_terminal")


async def test_agent_reads_its_execution_and_steps(
    runner: AgentClient, execution: Execution
) -> None:
    step_id = (await runner.post(f"/v0/executions/{execution.id}/steps", SEARCH)).json()["step_id"]
    read = await runner.get(f"/v0/executions/{execution.id}")
    steps = await runner.get(f"/v0/executions/{execution.id}/steps?status=executing")
    one = await runner.get(f"/v0/executions/{execution.id}/steps/{step_id}")
    assert read.json()["input"] == {"topic": "x"}
    assert [s["step_id"] for s in steps.json()] == [step_id]
    assert one.json()["status"] == "executing"


async def test_previous_state_is_always_null(
    runner: AgentClient, client: httpx.AsyncClient, execution: Execution
) -> None:
    by_agent = await runner.get(f"/v0/executions/{execution.id}/previous")
    by_client = await client.get(f"/v0/executions/{execution.id}/previous")
    assert by_agent.json() == by_client.json() == {"state": None}


async def test_previous_of_unknown_execution_is_not_found(client: httpx.AsyncClient) -> None:
    response = await client.get("/v0/executions/01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f/previous")
    assert_error(response, 404, "not_found")


async def test_streaming_into_a_finished_step_is_a_conflict(
    runner: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    step_id = (await runner.post(base, SEARCH)).json()["step_id"]
    await runner.post(f"{base}/{step_id}/complete", {"result": 1})
    late = await runner.post(f"{base}/{step_id}/stream", {"seq": 9, "data": "late"})
    unknown = await runner.post(f"{base}/{'0' * 64}/stream", {"seq": 0, "data": "x"})
    assert_error(late, 409, "conflict")
    assert_error(unknown, 404, "not_found")
