"""`GET /metrics` (§5.4): Prometheus text whose counters move with the API traffic.

Counters are process-wide, so every test reads a scrape before acting and asserts the change.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from harness.polling import wait_until
from rebuno.kernel import background
from rebuno.kernel.metrics import HttpMetrics
from rebuno.kernel.service.executions import Labels
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.webhooks.delivery import HttpDeliverer
from tests.api.harness import AGENT, BASE_URL, SECRET, TOKEN, AgentClient, claim
from tests.support import ManualClock

GATED = """
rules:
  - id: gate-shell
    when: {target: shell_exec}
    then: {decision: require_approval}
"""
SEARCH = {"kind": "tool_call", "target": "web_search", "args": {"query": "x"}}
LIMITED = """
default_action: allow
rules:
  - id: search-limit
    when: {target: web_search}
    then: {decision: allow, rate_limit: {max_calls: 1, window: 1h}}
  - id: no-shell
    when: {target: shell_exec}
    then: {decision: deny}
"""


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
    assert await kernel.reclaim_expired_leases() == 1
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
    assert grew("rebuno_dispatches_reclaimed_total") == 1
    assert grew("rebuno_steps_submitted_total", kind="tool_call") == 2
    assert grew("rebuno_replay_total", hit="true") == 1
    assert grew("rebuno_replay_total", hit="false") == 1
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
    held = {"decision": "require_approval"}
    decided = "rebuno_policy_decisions_total"
    first = await scrape(http)
    blocked = (await leased.post(f"/v0/executions/{execution.id}/steps", shell)).json()
    before = await scrape(http)
    assert before.value(decided, **held) - first.value(decided, **held) == 1

    clock.advance(timedelta(minutes=2))
    granted = await http.post(
        f"/v0/approvals/{blocked['approval_id']}/grant", json={"decided_by": "alice"}
    )

    assert granted.status_code == 204
    after = await scrape(http)
    waited = {"resolution": "granted"}
    count, total = "rebuno_approval_wait_seconds_count", "rebuno_approval_wait_seconds_sum"
    assert after.value(count, **waited) - before.value(count, **waited) == 1
    outcome = {"outcome": "granted"}
    resolved = "rebuno_approval_outcomes_total"
    assert after.value(resolved, **outcome) - before.value(resolved, **outcome) == 1
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


# -- the families the reference's dashboard reads (§37) --------------------------------------

DASHBOARD_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # family name (as the parser reports it): type, label, pre-created values
    "rebuno_executions_created": ("counter", "", ()),
    "rebuno_executions_completed": ("counter", "status", ("completed", "failed", "cancelled")),
    "rebuno_steps_submitted": ("counter", "kind", ("tool_call", "llm_call", "local")),
    "rebuno_replay": ("counter", "hit", ("true", "false")),
    "rebuno_dispatch_outcomes": ("counter", "outcome", ("success", "rejected", "exhausted")),
    "rebuno_dispatches_reclaimed": ("counter", "", ()),
    "rebuno_policy_decisions": ("counter", "decision", ("allow", "deny", "require_approval")),
    "rebuno_approval_outcomes": ("counter", "outcome", ("granted", "denied", "expired")),
    "rebuno_rate_limit_decisions": (
        "counter",
        "outcome",
        ("limited", "error_allowed", "error_denied"),
    ),
    "rebuno_worker_errors": ("counter", "worker", ("dispatch", "singletons")),
    "rebuno_llm_usage_missing": ("counter", "", ()),
    "rebuno_dispatch_latency_seconds": ("histogram", "", ()),
    "rebuno_policy_latency_seconds": ("histogram", "", ()),
    "rebuno_queue_depth": ("gauge", "", ()),
}


@asynccontextmanager
async def webhook_answering(status: int) -> AsyncIterator[str]:
    """A loopback webhook that reads each request whole and answers `status`."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" % status)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/webhook"
    finally:
        server.close()
        await server.wait_closed()


def refused_url() -> str:
    """A loopback URL nothing listens on: the port was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/webhook"


async def deliver_once(kernel: Kernel, url: str) -> None:
    """Creates an execution of an agent served at `url` and makes one webhook attempt."""
    await kernel.register_agent(AGENT, url, SECRET, None, None)
    execution = await kernel.create_execution(AGENT, "{}", None)
    (claimed,) = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution.id]
    await kernel.deliver(claimed, HttpDeliverer(timeout_seconds=5))


async def test_a_fresh_scrape_has_every_dashboard_family_and_label_value(
    anon: httpx.AsyncClient,
) -> None:
    """Example X1 (whatever earlier tests of this process counted)."""
    text = (await anon.get("/metrics")).text
    families = {family.name: family for family in text_string_to_metric_families(text)}

    for name, (kind, label, values) in DASHBOARD_FAMILIES.items():
        assert families[name].type == kind, name
        samples = families[name].samples
        if kind == "counter":
            assert {s.name for s in samples} == {f"{name}_total"}, name
            assert sorted(s.labels.get(label, "") for s in samples) == sorted(values or ("",))
        elif kind == "histogram":
            assert {s.name for s in samples} == {f"{name}_{x}" for x in ("bucket", "sum", "count")}
            buckets = [s for s in samples if s.name.endswith("_bucket")]
            count = next(s.value for s in samples if s.name.endswith("_count"))
            assert buckets[-1].labels == {"le": "+Inf"} and buckets[-1].value == count
        else:
            assert [(s.name, s.labels) for s in samples] == [(name, {})]
    sample_names = {s.name for family in families.values() for s in family.samples}
    assert not [name for name in sample_names if name.endswith("_created")]


async def test_dashboard_counters_move_with_real_activity(
    http: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    """Examples X2 and X3, a policy decision and each webhook outcome."""
    before = await scrape(http)

    execution = await kernel.create_execution(AGENT, "{}", None)
    leased = replace(agent, lease=await claim(kernel, execution.id))
    steps_path = f"/v0/executions/{execution.id}/steps"
    step_id = (await leased.post(steps_path, SEARCH)).json()["step_id"]
    await leased.post(f"{steps_path}/{step_id}/complete", {"result": "ok"})
    ended = await leased.post(f"/v0/executions/{execution.id}/complete", {"output": {}})
    assert ended.status_code == 204
    async with webhook_answering(200) as ok, webhook_answering(503) as refusing:
        await deliver_once(kernel, ok)
        await deliver_once(kernel, refusing)
    await deliver_once(kernel, refused_url())

    after = await scrape(http)

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert grew("rebuno_executions_created_total") == 4
    assert grew("rebuno_executions_completed_total", status="completed") == 1
    assert grew("rebuno_executions_completed_total", status="failed") == 0
    assert grew("rebuno_steps_submitted_total", kind="tool_call") == 1
    assert grew("rebuno_replay_total", hit="false") == 1
    assert grew("rebuno_policy_decisions_total", decision="allow") == 1
    for outcome in ("success", "rejected", "exhausted"):
        assert grew("rebuno_dispatch_outcomes_total", outcome=outcome) == 1, outcome
    assert grew("rebuno_dispatch_latency_seconds_count") == 3
    assert grew("rebuno_dispatch_latency_seconds_bucket", le="+Inf") == 3


async def test_a_refused_rate_limited_call_and_a_denial_are_counted(
    http: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    await kernel.set_policy(AGENT, LIMITED)
    execution = await kernel.create_execution(AGENT, "{}", None)
    leased = replace(agent, lease=await claim(kernel, execution.id))
    steps_path = f"/v0/executions/{execution.id}/steps"
    before = await scrape(http)

    answers = [(await leased.post(steps_path, SEARCH)).json()["decision"] for _ in range(2)]
    denied = {**SEARCH, "target": "shell_exec"}
    answers.append((await leased.post(steps_path, denied)).json()["decision"])

    assert answers == ["proceed", "rate_limited", "denied"]
    after = await scrape(http)

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert grew("rebuno_rate_limit_decisions_total", outcome="limited") == 1
    assert grew("rebuno_policy_decisions_total", decision="allow") == 1
    assert grew("rebuno_policy_decisions_total", decision="deny") == 1


async def test_a_failing_background_tick_counts_a_worker_error(anon: httpx.AsyncClient) -> None:
    async def failing() -> None:
        raise RuntimeError("the database went away")

    before = Scrape((await anon.get("/metrics")).text)
    loop = asyncio.create_task(background.every(timedelta(hours=1), failing, "sweep", "singletons"))
    try:

        async def counted() -> bool:
            after = Scrape((await anon.get("/metrics")).text)
            name, labels = "rebuno_worker_errors_total", {"worker": "singletons"}
            return after.value(name, **labels) - before.value(name, **labels) == 1

        await wait_until(counted)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_racing_idempotent_creates_count_one_created_execution(
    http: httpx.AsyncClient, kernel: Kernel
) -> None:
    before = await scrape(http)

    made = await asyncio.gather(
        *(
            kernel.create_execution(AGENT, "{}", None, Labels(idempotency_key="once"))
            for _ in range(10)
        )
    )

    assert len({execution.id for execution in made}) == 1
    after = await scrape(http)
    name = "rebuno_executions_created_total"
    assert after.value(name) - before.value(name) == 1
