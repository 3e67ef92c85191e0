"""Forks over HTTP, on both stores (docs/protocol.md §26): what a fork copies (the steps that
ended by `at_seq`, with their events, under ids the fork's rerun computes), its bounds, its
session, its own policy, and its fork points."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from rebuno.kernel.domain.identity import step_id
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, AgentClient, assert_error, claim

X = {"kind": "tool_call", "target": "x", "args": {"n": 1}}
Y = {"kind": "tool_call", "target": "y", "args": {"n": 2}}
DENY = "default_action: deny\n"


async def events(client: httpx.AsyncClient, execution_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await client.get(f"/v0/executions/{execution_id}/events")).json()
    return found


@pytest.fixture
async def source(client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient) -> str:
    """A completed execution that ran X then Y; X ended at event 8."""
    created: str = (await client.post("/v0/executions", json={"agent_id": AGENT})).json()["id"]
    runner = replace(agent, lease=await claim(kernel, created))
    await runner.post(f"/v0/executions/{created}/heartbeat")
    for step, result in ((X, "rx"), (Y, "ry")):
        decision = (await runner.post(f"/v0/executions/{created}/steps", step)).json()
        base = f"/v0/executions/{created}/steps/{decision['step_id']}"
        await runner.post(f"{base}/complete", {"result": result})
    await runner.post(f"/v0/executions/{created}/complete", {"output": "done"})
    return created


async def fork(client: httpx.AsyncClient, source: str, **body: Any) -> httpx.Response:
    return await client.post(f"/v0/executions/{source}/fork", json=body)


async def test_a_fork_copies_what_ended_by_its_seq_and_runs_the_rest(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, source: str
) -> None:
    log = await events(client, source)
    x_done = next(e["event_seq"] for e in log if e["type"] == "step.succeeded")

    response = await fork(client, source, at_seq=x_done)
    assert response.status_code == 201, response.text
    forked = response.json()
    assert forked["forked_from"] == source
    assert forked["fork_seq"] == x_done
    assert forked["status"] == "pending"
    assert forked["input"] is None
    types = [e["type"] for e in await events(client, forked["id"])]
    assert types[:2] == ["execution.created", "execution.forked"]
    assert types[-1] == "dispatch.queued"
    assert "step.succeeded" in types and types.count("step.proposed") == 1
    forked_event = (await events(client, forked["id"]))[1]["payload"]
    assert forked_event["source_execution_id"] == source
    assert forked_event["policy_override"] is False

    copy = step_id(forked["id"], "tool_call", "x", _hash_of(X), 0)
    steps = (await client.get(f"/v0/executions/{forked['id']}/steps")).json()
    assert [(s["step_id"], s["result"]) for s in steps] == [(copy, "rx")]

    runner = replace(agent, lease=await claim(kernel, forked["id"]))
    replay = (await runner.post(f"/v0/executions/{forked['id']}/steps", X)).json()
    assert replay == {"decision": "replay", "step_id": copy, "result": "rx"}
    live = (await runner.post(f"/v0/executions/{forked['id']}/steps", Y)).json()
    assert live["decision"] == "proceed"


def _hash_of(step: dict[str, Any]) -> str:
    from rebuno.protocol.canonical import args_hash, dumps

    return args_hash(dumps(step["args"]))


@pytest.mark.parametrize("at_seq", [0, 10_000, "8", 8.5, None, True])
async def test_a_seq_out_of_bounds_is_refused(
    client: httpx.AsyncClient, source: str, at_seq: object
) -> None:
    body = {} if at_seq is None else {"at_seq": at_seq}
    assert_error(await fork(client, source, **body), 400, "validation_error")


async def test_an_unknown_source_is_not_found(client: httpx.AsyncClient) -> None:
    unknown = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"
    assert_error(await fork(client, unknown, at_seq=1), 404, "not_found")
    assert_error(await client.get(f"/v0/executions/{unknown}/fork-points"), 404, "not_found")


async def test_a_fork_into_a_new_session_is_admitted_and_the_session_is_then_taken(
    client: httpx.AsyncClient, source: str
) -> None:
    first = await fork(client, source, at_seq=3, session="retry")
    assert first.status_code == 201
    assert first.json()["session"] == "retry"
    assert "admitted_at" in first.json()
    assert_error(await fork(client, source, at_seq=3, session="retry"), 409, "conflict")


async def test_a_forks_own_policy_decides_its_live_steps_and_its_forks_keep_it(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, source: str
) -> None:
    x_done = next(
        e["event_seq"] for e in await events(client, source) if e["type"] == "step.succeeded"
    )
    strict = (await fork(client, source, at_seq=x_done, policy_bundle=DENY)).json()
    assert (await events(client, strict["id"]))[1]["payload"]["policy_override"] is True
    runner = replace(agent, lease=await claim(kernel, strict["id"]))
    assert (await runner.post(f"/v0/executions/{strict['id']}/steps", X)).json()[
        "decision"
    ] == "replay"
    denied = (await runner.post(f"/v0/executions/{strict['id']}/steps", Y)).json()
    assert denied["decision"] == "denied"

    again = (await fork(client, strict["id"], at_seq=3)).json()  # inherits the override
    rerun = replace(agent, lease=await claim(kernel, again["id"]))
    assert (await rerun.post(f"/v0/executions/{again['id']}/steps", Y)).json()[
        "decision"
    ] == "denied"
    assert_error(
        await fork(client, source, at_seq=1, policy_bundle="rules: 7"), 400, "validation_error"
    )


async def test_fork_points_name_the_latest_seq(client: httpx.AsyncClient, source: str) -> None:
    latest = len(await events(client, source))
    answer = (await client.get(f"/v0/executions/{source}/fork-points")).json()
    assert answer == {"latest_seq": latest, "resources": {}, "checkpoints": []}


async def test_a_running_source_forks_into_a_complete_log_of_its_own(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    """§26.3: the copy reads only what never changes (events, ended steps), so a source still
    running forks consistently; the fork's log is contiguous from 1 and whole on its own."""
    running = (await client.post("/v0/executions", json={"agent_id": AGENT})).json()["id"]
    runner = replace(agent, lease=await claim(kernel, running))
    done = (await runner.post(f"/v0/executions/{running}/steps", X)).json()
    await runner.post(f"/v0/executions/{running}/steps/{done['step_id']}/complete", {"result": 1})
    open_step = (await runner.post(f"/v0/executions/{running}/steps", Y)).json()
    assert open_step["decision"] == "proceed"  # Y is executing in the source

    latest = len(await events(client, running))
    forked = (await fork(client, running, at_seq=latest)).json()
    log = await events(client, forked["id"])

    assert [e["event_seq"] for e in log] == list(range(1, len(log) + 1))
    steps = (await client.get(f"/v0/executions/{forked['id']}/steps")).json()
    assert [s["target"] for s in steps] == ["x"]  # the open one runs live in the fork
    assert (await client.get(f"/v0/executions/{running}")).json()["status"] == "running"
