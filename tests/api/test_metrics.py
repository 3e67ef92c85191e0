"""`GET /metrics` (§5.4): Prometheus text whose counters move with the API traffic.

Counters are process-wide, so every test reads a scrape before acting and asserts the change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from rebuno.kernel.metrics import HttpMetrics
from rebuno.kernel.service import dispatches
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, BASE_URL, TOKEN, AgentClient, claim
from tests.support import ManualClock

GATED = """
rules:
  - id: gate-shell
    when: {target: shell_exec}
    then: {decision: require_approval}
"""
SEARCH = {"kind": "tool_call", "target": "web_search", "args": {"query": "x"}}


class Scrape:
    """One parsed `/metrics` answer: sample values by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._samples = [
            sample for family in text_string_to_metric_families(text) for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        return sum(
            sample.value
            for sample in self._samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )


@pytest.fixture
async def http(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    """A bearer client through the HTTP metrics middleware, as the server mounts it."""
    transport = httpx.ASGITransport(app=HttpMetrics(app))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as c:
        yield c


async def scrape(http: httpx.AsyncClient) -> Scrape:
    response = await http.get("/metrics")
    assert response.status_code == 200
    return Scrape(response.text)


async def test_metrics_is_prometheus_text_without_auth(anon: httpx.AsyncClient) -> None:
    response = await anon.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {
        "rebuno_events",
        "rebuno_step_decisions",
        "rebuno_dispatch_attempts",
        "rebuno_http_request_duration_seconds",
        "rebuno_approval_wait_seconds",
        "rebuno_policy_evaluation_seconds",
        "rebuno_dispatch_queue_lag_seconds",
        "rebuno_dispatch_queue_depth",
    } <= names


async def test_creating_an_execution_counts_its_events_and_transition(
    http: httpx.AsyncClient,
) -> None:
    before = await scrape(http)

    created = await http.post("/v0/executions", json={"agent_id": AGENT, "input": {}})

    assert created.status_code == 201
    after = await scrape(http)
    for event in ("execution.created", "dispatch.queued"):
        delta = after.value("rebuno_events_total", type=event) - before.value(
            "rebuno_events_total", type=event
        )
        assert delta == 1
    status = {"status": "pending"}
    transitions = "rebuno_execution_transitions_total"
    assert after.value(transitions, **status) - before.value(transitions, **status) == 1


async def test_http_requests_are_labelled_by_route_template(http: httpx.AsyncClient) -> None:
    missing = "/v0/executions/01900000-0000-7000-8000-000000000000"
    route = {"route": "/v0/executions/{execution_id}", "method": "GET", "status": "404"}
    before = await scrape(http)

    assert (await http.get(missing)).status_code == 404
    assert (await http.get("/no/such/path")).status_code == 404

    after = await scrape(http)
    counted = "rebuno_http_requests_total"
    assert after.value(counted, **route) - before.value(counted, **route) == 1
    unmatched = {"route": "unmatched"}
    assert after.value(counted, **unmatched) - before.value(counted, **unmatched) == 1
    timed = "rebuno_http_request_duration_seconds_count"
    template = {"route": route["route"], "method": "GET"}
    assert after.value(timed, **template) - before.value(timed, **template) == 1
    assert missing not in after.text


async def test_step_decisions_policy_time_and_replay_after_a_reclaimed_lease(
    http: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, clock: ManualClock
) -> None:
    await kernel.set_policy(AGENT, "rules: []\ndefault_action: allow\n")
    execution = await kernel.create_execution(AGENT, "{}", None)
    first = replace(agent, lease=await claim(kernel, execution.id))
    steps_path = f"/v0/executions/{execution.id}/steps"
    before = await scrape(http)

    proceed = (await first.post(steps_path, SEARCH)).json()
    step_id = proceed["step_id"]
    completed = await first.post(f"{steps_path}/{step_id}/complete", {"result": "ok"})
    assert completed.status_code == 200
    clock.advance(timedelta(seconds=31))
    assert await dispatches.reclaim_expired_leases(kernel) == 1
    second = replace(agent, lease=await claim(kernel, execution.id))
    replayed = (await second.post(steps_path, SEARCH)).json()

    assert (proceed["decision"], replayed["decision"]) == ("proceed", "replay")
    after = await scrape(http)

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert grew("rebuno_step_decisions_total", kind="tool_call", decision="proceed") == 1
    assert grew("rebuno_step_decisions_total", kind="tool_call", decision="replay") == 1
    assert grew("rebuno_step_replays_total", kind="tool_call") == 1
    assert grew("rebuno_lease_reclaims_total") == 1
    assert grew("rebuno_dispatch_claims_total") == 1
    # Only the new step is evaluated: a replay never consults policy.
    assert grew("rebuno_policy_evaluation_seconds_count") == 1


async def test_approval_wait_is_observed_when_the_approval_is_granted(
    http: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, clock: ManualClock
) -> None:
    await kernel.set_policy(AGENT, GATED)
    execution = await kernel.create_execution(AGENT, "{}", None)
    leased = replace(agent, lease=await claim(kernel, execution.id))
    shell = {"kind": "tool_call", "target": "shell_exec", "args": {"command": "ls"}}
    blocked = (await leased.post(f"/v0/executions/{execution.id}/steps", shell)).json()
    before = await scrape(http)

    clock.advance(timedelta(minutes=2))
    granted = await http.post(
        f"/v0/approvals/{blocked['approval_id']}/grant", json={"decided_by": "alice"}
    )

    assert granted.status_code == 204
    after = await scrape(http)
    waited = {"resolution": "granted"}
    count, total = "rebuno_approval_wait_seconds_count", "rebuno_approval_wait_seconds_sum"
    assert after.value(count, **waited) - before.value(count, **waited) == 1
    assert after.value(total, **waited) - before.value(total, **waited) == pytest.approx(120)
    le = {"resolution": "granted", "le": "60.0"}
    bucket = "rebuno_approval_wait_seconds_bucket"
    assert after.value(bucket, **le) == before.value(bucket, **le)


async def test_queue_depth_and_lag_show_the_unclaimed_backlog(
    http: httpx.AsyncClient, kernel: Kernel, clock: ManualClock
) -> None:
    await kernel.create_execution(AGENT, "{}", None)
    await kernel.create_execution(AGENT, "{}", None)

    clock.advance(timedelta(seconds=45))

    scraped = await scrape(http)
    assert scraped.value("rebuno_dispatch_queue_lag_seconds") == pytest.approx(45)
    assert scraped.value("rebuno_dispatch_queue_depth") == 2
