"""Replays of captured `v1=` agent requests within the timestamp window (§2.3): each one below
is sent byte for byte as first accepted, and what it does is pinned route by route. A copy of
a heartbeat (after a short grace) or an announcement changes nothing and gets the first
answer; completions, failures and finishes are no-ops by their own rules; a submission under
`step-occurrences` names the same step again."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import httpx

from rebuno.kernel.api.auth import seen_request
from rebuno.kernel.domain.records import Execution, Lease, SeenRequest
from rebuno.kernel.service.executions import COPY_GRACE
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.extensions import AgentInstance
from tests.api.harness import AGENT, AgentClient
from tests.kernel.conftest import delivered
from tests.support import ManualClock

SEARCH = {"kind": "tool_call", "target": "web_search", "args": {"query": "durable agents"}}
LEASE = timedelta(seconds=30)
NAME = "worker-1:5000"


class Captured:
    """One signed request as it went on the wire, to be sent again unchanged."""

    def __init__(
        self, agent: AgentClient, target: str, body: object = None, *, lease: Lease | None
    ) -> None:
        self.http = agent.http
        self.target = target
        self.content = b"" if body is None else json.dumps(body).encode()
        self.headers = agent.headers("POST", target, self.content, lease)

    async def send(self, extra: dict[str, str] | None = None) -> httpx.Response:
        headers = {**self.headers, **(extra or {})}
        return await self.http.post(self.target, content=self.content, headers=headers)


async def event_count(kernel: Kernel, execution_id: str) -> int:
    return len(await kernel.list_events(execution_id, 0, 1000))


async def test_a_replayed_heartbeat_answers_the_same_and_does_not_renew_the_lease(
    kernel: Kernel, clock: ManualClock, leased: AgentClient, execution: Execution
) -> None:
    heartbeat = Captured(leased, f"/v0/executions/{execution.id}/heartbeat", lease=leased.lease)
    assert (await heartbeat.send()).status_code == 204
    clock.advance(timedelta(seconds=20))

    replayed = await heartbeat.send()
    clock.advance(LEASE - timedelta(seconds=19))

    assert replayed.status_code == 204
    assert await kernel.reclaim_expired_leases() == 1


async def test_identical_heartbeats_within_the_grace_all_renew_the_lease(
    kernel: Kernel, clock: ManualClock, leased: AgentClient, execution: Execution
) -> None:
    # An agent beating faster than once a second signs several heartbeats alike.
    heartbeat = Captured(leased, f"/v0/executions/{execution.id}/heartbeat", lease=leased.lease)
    assert (await heartbeat.send()).status_code == 204
    clock.advance(COPY_GRACE)

    again = await heartbeat.send()
    clock.advance(LEASE - timedelta(seconds=1))

    assert again.status_code == 204
    assert await kernel.reclaim_expired_leases() == 0


async def test_a_fresh_heartbeat_still_renews_the_lease(
    kernel: Kernel, clock: ManualClock, leased: AgentClient, execution: Execution
) -> None:
    target = f"/v0/executions/{execution.id}/heartbeat"
    assert (await Captured(leased, target, lease=leased.lease).send()).status_code == 204
    clock.advance(timedelta(seconds=20))

    fresh = await Captured(leased, target, lease=leased.lease).send()
    clock.advance(LEASE - timedelta(seconds=19))

    assert fresh.status_code == 204
    assert await kernel.reclaim_expired_leases() == 0


async def test_a_heartbeat_copy_sent_to_another_replica_is_known_there(
    kernel: Kernel, clock: ManualClock, leased: AgentClient, execution: Execution
) -> None:
    # What is remembered lives in the store: a second kernel on the same store is a replica.
    other = Kernel(kernel.store, kernel.settings, clock=clock.now, bus=kernel.bus)
    heartbeat = Captured(leased, f"/v0/executions/{execution.id}/heartbeat", lease=leased.lease)
    assert (await heartbeat.send()).status_code == 204
    clock.advance(timedelta(seconds=20))

    await other.heartbeat(
        execution.id, AGENT, leased.lease or Lease("", 0), seen=_seen_of(heartbeat)
    )
    clock.advance(LEASE - timedelta(seconds=19))

    assert await kernel.reclaim_expired_leases() == 1


def _seen_of(captured: Captured) -> SeenRequest:
    return seen_request(
        captured.headers["Rebuno-Agent-Id"],
        captured.headers["Rebuno-Signature"],
        captured.headers["Rebuno-Timestamp"],
    )


async def test_a_replayed_announcement_does_not_end_a_later_incarnations_work(
    kernel: Kernel, agent: AgentClient
) -> None:
    route = f"/v0/agents/{AGENT}/instances"
    first = str(uuid.uuid4())
    announced = Captured(agent, route, {"instance": NAME, "incarnation": first}, lease=None)
    assert (await announced.send()).json() == {"reclaimed": 0}
    await delivered(kernel, AgentInstance(NAME, first), AGENT)
    later = {"instance": NAME, "incarnation": str(uuid.uuid4())}
    assert (await agent.post(route, later, lease=None)).json() == {"reclaimed": 1}
    await delivered(kernel, AgentInstance(NAME, later["incarnation"]), AGENT)

    replayed = await announced.send()

    assert replayed.status_code == 200
    assert replayed.json() == {"reclaimed": 0}
    assert await kernel.reclaim_expired_leases() == 0


async def test_a_replayed_step_completion_is_answered_as_a_replay_and_writes_nothing(
    kernel: Kernel, leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    step_id = (await leased.post(base, SEARCH)).json()["step_id"]
    completion = Captured(leased, f"{base}/{step_id}/complete", {"result": 1}, lease=leased.lease)
    assert (await completion.send()).json() == {"decision": "recorded"}
    before = await event_count(kernel, execution.id)

    replayed = await completion.send()

    assert replayed.json() == {"decision": "replay", "result": 1}
    assert await event_count(kernel, execution.id) == before


async def test_a_replayed_step_failure_is_answered_as_a_replay_and_writes_nothing(
    kernel: Kernel, leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    step_id = (await leased.post(base, SEARCH)).json()["step_id"]
    error = {"error": {"message": "boom"}}
    failure = Captured(leased, f"{base}/{step_id}/fail", error, lease=leased.lease)
    assert (await failure.send()).json() == {"decision": "recorded"}
    before = await event_count(kernel, execution.id)

    replayed = await failure.send()

    assert replayed.json() == {"decision": "replay", **error}
    assert await event_count(kernel, execution.id) == before


async def test_a_replayed_submission_under_step_occurrences_names_the_same_step(
    kernel: Kernel, leased: AgentClient, execution: Execution
) -> None:
    numbered = {"Rebuno-Extensions": "step-occurrences"}
    base = f"/v0/executions/{execution.id}/steps"
    submission = Captured(leased, base, {**SEARCH, "occurrence": 0}, lease=leased.lease)
    first = (await submission.send(numbered)).json()
    before = await event_count(kernel, execution.id)

    replayed = (await submission.send(numbered)).json()

    assert replayed["step_id"] == first["step_id"]
    assert len(await kernel.list_steps(execution.id, None)) == 1
    assert await event_count(kernel, execution.id) == before


async def test_identical_submissions_without_occurrences_stay_separate_calls(
    kernel: Kernel, leased: AgentClient, execution: Execution
) -> None:
    # SDK 0.29.2 signs two identical calls in one second byte for byte: they must both run.
    submission = Captured(
        leased, f"/v0/executions/{execution.id}/steps", SEARCH, lease=leased.lease
    )

    first, second = (await submission.send()).json(), (await submission.send()).json()

    assert first["decision"] == second["decision"] == "proceed"
    assert first["step_id"] != second["step_id"]


async def test_a_replayed_completion_of_the_execution_changes_nothing(
    kernel: Kernel, leased: AgentClient, execution: Execution
) -> None:
    completion = Captured(
        leased, f"/v0/executions/{execution.id}/complete", {"output": 1}, lease=leased.lease
    )
    assert (await completion.send()).status_code == 204
    before = await kernel.get_execution(execution.id)

    replayed = await completion.send()

    assert replayed.status_code == 409, replayed.text
    assert await kernel.get_execution(execution.id) == before


async def test_a_replayed_failure_of_the_execution_changes_nothing(
    kernel: Kernel, leased: AgentClient, execution: Execution
) -> None:
    failure = Captured(
        leased, f"/v0/executions/{execution.id}/fail", {"error": "boom"}, lease=leased.lease
    )
    assert (await failure.send()).status_code == 204
    before = await kernel.get_execution(execution.id)

    replayed = await failure.send()

    assert replayed.status_code == 409, replayed.text
    assert await kernel.get_execution(execution.id) == before
