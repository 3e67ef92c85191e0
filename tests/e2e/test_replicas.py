"""Several `rebuno server` processes on one PostgreSQL database behave as one kernel: racing
submissions get contiguous occurrences, each dispatch is delivered once, a killed replica's
lease is taken over by a survivor, deltas cross replicas, and readiness follows the database.
The test acts as the agent itself, through a loopback webhook and signed calls."""

from __future__ import annotations

import collections
import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from harness.polling import poll_until
from harness.processes import Server
from harness.webhooks import AgentClient, Delivery, WebhookReceiver
from tests.e2e.relay import Relay

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

AGENT, SECRET, TOKEN = "replica-agent", "replica-secret", "replica-token"
FAST = {
    "REBUNO_DISPATCH_LEASE_TIMEOUT": "1s",
    "REBUNO_DISPATCH_BACKOFF_BASE": "100ms",
    "REBUNO_DISPATCH_POLL_INTERVAL": "50ms",
}


def write_manifest(tmp_path: Path, webhook_url: str, lease_seconds: int | None = None) -> Path:
    """The agent's manifest; without `lease_seconds` its lease is the kernel default (1 s)."""
    lease = f"    lease_timeout_seconds: {lease_seconds}\n" if lease_seconds else ""
    path = tmp_path / "rebuno.yaml"
    path.write_text(
        f"agents:\n  - id: {AGENT}\n    webhook_url: {webhook_url}\n    secret: {SECRET}\n{lease}"
    )
    return path


@pytest.fixture
def agent() -> Iterator[AgentClient]:
    client = AgentClient(AGENT, SECRET)
    yield client
    client.close()


@pytest.fixture
def start(postgres_url: str, tmp_path: Path) -> Iterator[Any]:
    """Starts replicas on the test's database; every one is stopped afterwards."""
    started: list[Server] = []

    def replica(
        manifest: Path, db_url: str = postgres_url, env: dict[str, str] | None = None
    ) -> Server:
        log = tmp_path / f"replica-{len(started) + 1}.log"
        server = Server(db_url, TOKEN, log, manifest=manifest, env={**FAST, **(env or {})})
        started.append(server)
        return server

    yield replica
    for server in started:
        server.stop()


def create(server: Server) -> str:
    created = server.post("/v0/executions", {"agent_id": AGENT, "input": {"n": 1}})
    assert isinstance(created, dict)
    execution_id: str = created["id"]
    return execution_id


def assert_contiguous(events: list[dict[str, Any]]) -> None:
    assert [e["event_seq"] for e in events] == list(range(1, len(events) + 1))


def finish(agent: AgentClient, url: str, lease: Delivery, step_ids: list[str]) -> None:
    """Completes every step and then the execution, as the agent under `lease`."""
    base = f"/v0/executions/{lease.execution_id}"
    for step_id in step_ids:
        done = agent.call(url, f"{base}/steps/{step_id}/complete", {"result": step_id}, lease)
        assert done.json() == {"decision": "recorded"}, done.text
    completed = agent.call(url, f"{base}/complete", {"output": {"done": True}}, lease)
    assert completed.status_code == 204, completed.text


def test_identical_steps_racing_across_replicas_get_contiguous_occurrences(
    tmp_path: Path, start: Any, agent: AgentClient
) -> None:
    receiver = WebhookReceiver(SECRET)
    manifest = write_manifest(tmp_path, receiver.url, lease_seconds=60)
    replicas = [start(manifest) for _ in range(3)]
    execution_id = create(replicas[0])
    [lease] = receiver.wait_for(lambda d: len(d) == 1, 20, "the delivery")
    burst = 24
    barrier = threading.Barrier(burst)

    def submit(index: int) -> dict[str, Any]:
        barrier.wait(10)
        return agent.submit(replicas[index % 3].url, lease, "echo", {"same": "args"})

    with ThreadPoolExecutor(burst) as pool:
        decisions = list(pool.map(submit, range(burst)))
    steps = replicas[1].get(f"/v0/executions/{execution_id}/steps")
    finish(agent, replicas[2].url, lease, [d["step_id"] for d in decisions])
    events = replicas[0].events(execution_id)
    receiver.close()

    assert {d["decision"] for d in decisions} == {"proceed"}
    assert len({d["step_id"] for d in decisions}) == burst
    assert isinstance(steps, list)
    assert sorted(s["occurrence"] for s in steps) == list(range(burst))
    assert events[-1]["type"] == "execution.completed"
    assert_contiguous(events)


def test_each_dispatch_is_delivered_by_exactly_one_replica(tmp_path: Path, start: Any) -> None:
    receiver = WebhookReceiver(SECRET)
    manifest = write_manifest(tmp_path, receiver.url, lease_seconds=60)
    replicas = [start(manifest) for _ in range(3)]
    count = 30
    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(lambda i: create(replicas[i % 3]), range(count)))

    def all_acked() -> bool:
        return all(any(e["type"] == "dispatch.acked" for e in replicas[0].events(i)) for i in ids)

    poll_until(all_acked, 30, "every delivery to be acknowledged")
    deliveries = receiver.deliveries
    logs = {i: replicas[1].events(i) for i in ids}
    receiver.close()

    per_execution = collections.Counter(d.execution_id for d in deliveries)
    assert per_execution == dict.fromkeys(ids, 1)
    assert {d.attempt for d in deliveries} == {1}
    for events in logs.values():
        assert_contiguous(events)
        assert [e["type"] for e in events].count("dispatch.acked") == 1


def test_lease_of_a_killed_replica_is_redelivered_by_a_survivor(
    tmp_path: Path, start: Any, agent: AgentClient
) -> None:
    survivor: list[Server] = []
    survivor_up = threading.Event()
    errors: list[BaseException] = []

    def run_agent(lease: Delivery) -> None:
        try:
            # The survivor may redeliver before `start` has even returned it.
            assert survivor_up.wait(30), "the survivor never started"
            decision = agent.submit(survivor[0].url, lease, "echo", {"once": True})
            finish(agent, survivor[0].url, lease, [decision["step_id"]])
        except BaseException as exc:  # surfaced by the test thread below
            errors.append(exc)
            raise

    receiver = WebhookReceiver(SECRET, on_delivery=run_agent, hold_first=True)
    manifest = write_manifest(tmp_path, receiver.url)
    # Every replica reaps expired leases with its own default lease. The doomed one's is long,
    # so it never takes back the held delivery itself, however long the survivor takes to
    # start: the redelivery is the survivor's.
    doomed = start(manifest, env={"REBUNO_DISPATCH_LEASE_TIMEOUT": "120s"})
    execution_id = create(doomed)
    poll_until(receiver.held.is_set, 20, "the first delivery to arrive and be held")
    survivor.append(start(manifest))
    survivor_up.set()

    doomed.kill()
    receiver.release()
    done = survivor[0].wait_for_status(execution_id, {"completed", "failed"}, 30)
    events = survivor[0].events(execution_id)
    deliveries = receiver.deliveries
    receiver.close()

    assert errors == []
    assert done["status"] == "completed", survivor[0].output()
    assert [(d.dispatch_id, d.attempt) for d in deliveries] == [
        (deliveries[0].dispatch_id, 1),
        (deliveries[0].dispatch_id, 2),
    ]
    acked = [e["payload"]["attempt"] for e in events if e["type"] == "dispatch.acked"]
    assert acked == [2]
    assert [e["type"] for e in events].count("step.succeeded") == 1
    assert_contiguous(events)


class SseReader:
    """Reads `GET …/stream` on a thread until a delta with data `end` arrives."""

    def __init__(self, url: str) -> None:
        self.opened = threading.Event()
        self.finished = threading.Event()
        self.deltas: list[dict[str, Any]] = []
        self._url = url
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        timeout = httpx.Timeout(5, read=None)
        with httpx.stream("GET", self._url, headers=headers, timeout=timeout) as response:
            for line in response.iter_lines():
                if line == ": ok":
                    self.opened.set()
                elif line.startswith("data: "):
                    self.deltas.append(json.loads(line.removeprefix("data: ")))
                    if self.deltas[-1]["data"] == "end":
                        break
        self.finished.set()


def test_deltas_produced_on_one_replica_reach_consumers_on_every_replica(
    tmp_path: Path, start: Any, agent: AgentClient
) -> None:
    receiver = WebhookReceiver(SECRET)
    manifest = write_manifest(tmp_path, receiver.url, lease_seconds=60)
    consumer_side, producer_side = start(manifest), start(manifest)
    execution_id = create(consumer_side)
    [lease] = receiver.wait_for(lambda d: len(d) == 1, 20, "the delivery")
    step_id = agent.submit(producer_side.url, lease, "llm", {"prompt": "hi"})["step_id"]
    path = f"/v0/executions/{execution_id}/stream"
    readers = [SseReader(consumer_side.url + path), SseReader(producer_side.url + path)]
    poll_until(lambda: all(r.opened.is_set() for r in readers), 10, "both streams to open")

    def produce(seq: int, data: str) -> None:
        response = agent.call(
            producer_side.url,
            f"{path.removesuffix('/stream')}/steps/{step_id}/stream",
            {"seq": seq, "data": data},
        )
        assert response.status_code == 204, response.text

    def probed() -> bool:
        # Until both listeners are up a delta may reach nobody; deltas are never replayed.
        produce(0, "probe")
        return all(r.deltas for r in readers)

    poll_until(probed, 20, "a probe delta to reach both consumers")
    for seq in range(1, 11):
        produce(seq, f"chunk-{seq}")
    produce(11, "end")
    poll_until(lambda: all(r.finished.is_set() for r in readers), 20, "the end delta on both")
    finish(agent, producer_side.url, lease, [step_id])
    events = consumer_side.events(execution_id)
    receiver.close()

    expected = [{"step_id": step_id, "seq": s, "data": f"chunk-{s}"} for s in range(1, 11)]
    expected.append({"step_id": step_id, "seq": 11, "data": "end"})
    for reader in readers:
        assert [d for d in reader.deltas if d["data"] != "probe"] == expected
    assert_contiguous(events)


class ActivityReader:
    """Reads `GET /v0/activity` on a thread; `wait_for` blocks on its frames, not a clock."""

    def __init__(self, url: str) -> None:
        self.opened = threading.Event()
        self.statuses: dict[str, list[str]] = collections.defaultdict(list)
        self._changed = threading.Condition()
        self._url = url
        self._stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        timeout = httpx.Timeout(5, read=None)
        # The feed never ends on its own: the replica stopping at the test's end cuts it.
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream("GET", self._url, headers=headers, timeout=timeout) as response,
        ):
            for line in response.iter_lines():
                if line == ": ok":
                    self.opened.set()
                elif line.startswith("data: "):
                    self._record(json.loads(line.removeprefix("data: ")))
                if self._stop.is_set():
                    break

    def _record(self, frame: dict[str, Any]) -> None:
        if frame["type"] == "execution":
            with self._changed:
                changed = frame["execution"]
                self.statuses[changed["id"]].append(changed["status"])
                self._changed.notify_all()

    def wait_for(self, execution_id: str, status: str, timeout: float) -> None:
        with self._changed:
            seen = self._changed.wait_for(lambda: status in self.statuses[execution_id], timeout)
        assert seen, f"no {status} frame of {execution_id}: {dict(self.statuses)}"

    def close(self) -> None:
        self._stop.set()  # the next keep-alive or frame ends the thread; it is a daemon


def listening(postgres_url: str, channel: str) -> int:
    """How many sessions on the test's database last ran `LISTEN channel`: a replica's
    listener, once it waits for notifications."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = %s",
            (f"LISTEN {channel}",),
        ).fetchone()
    return int(row[0]) if row else 0


def test_status_changes_committed_on_one_replica_reach_the_activity_feed_of_another(
    tmp_path: Path, start: Any, agent: AgentClient, postgres_url: str
) -> None:
    """§40.5: the watching replica commits nothing of the execution (the delivery is held,
    so no acknowledgement is written): every frame it sends was announced by the other."""
    receiver = WebhookReceiver(SECRET, hold_first=True)
    manifest = write_manifest(tmp_path, receiver.url, lease_seconds=60)
    watched = start(manifest)
    # Notifications are not replayed: the watched replica listens before anything happens.
    poll_until(lambda: listening(postgres_url, "rebuno_activity") == 1, 10, "the listener")
    writer = start(manifest)
    feed = ActivityReader(watched.url + "/v0/activity")
    try:
        assert feed.opened.wait(10), "the activity feed to open"
        execution_id = create(writer)
        feed.wait_for(execution_id, "pending", 10)
        poll_until(receiver.held.is_set, 20, "the delivery to arrive and be held")
        [lease] = receiver.deliveries
        agent.submit(writer.url, lease, "echo", {"n": 1})  # starts the execution
        feed.wait_for(execution_id, "running", 10)
        writer.post(f"/v0/executions/{execution_id}/cancel", {})
        feed.wait_for(execution_id, "cancelled", 10)
        seen = list(feed.statuses[execution_id])
    finally:
        feed.close()
        receiver.close()

    assert seen == ["pending", "running", "cancelled"]


def test_ready_answers_503_while_the_database_is_unreachable_and_200_after(
    tmp_path: Path, start: Any, postgres_url: str
) -> None:
    parts = urlsplit(postgres_url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    relayed_url = parts._replace(netloc=f"{parts.username}@127.0.0.1:{relay.port}").geturl()
    receiver = WebhookReceiver(SECRET)
    server = start(write_manifest(tmp_path, receiver.url, lease_seconds=60), relayed_url)
    try:
        ready_before = server.ready()
        relay.cut()
        poll_until(lambda: server.ready() == 503, 15, "readiness to fail with the database away")
        relay.restore()
        poll_until(lambda: server.ready() == 200, 30, "readiness to return with the database")
        execution_id = create(server)
        receiver.wait_for(lambda d: len(d) == 1, 20, "a delivery after the outage")
        events = server.events(execution_id)
    finally:
        relay.close()
        receiver.close()

    assert ready_before == 200
    assert server.proc.poll() is None
    assert_contiguous(events)


def test_creates_racing_into_one_session_across_replicas_admit_one(
    tmp_path: Path, start: Any
) -> None:
    """§24.3: the session lock serialises creates on every replica; one execution is
    admitted and delivered, the others wait in creation order."""
    receiver = WebhookReceiver(SECRET)
    manifest = write_manifest(tmp_path, receiver.url, lease_seconds=60)
    replicas = [start(manifest) for _ in range(3)]
    body = {"agent_id": AGENT, "input": {"n": 1}, "session": "raced"}
    with ThreadPoolExecutor(6) as pool:
        created = list(pool.map(lambda i: replicas[i % 3].post("/v0/executions", body), range(12)))
    ids = sorted(c["id"] for c in created)

    poll_until(lambda: len(receiver.deliveries) >= 1, 30, "the first turn to be delivered")
    shown = [replicas[0].get(f"/v0/executions/{i}") for i in ids]
    receiver.close()

    admitted = [e["id"] for e in shown if "admitted_at" in e]
    assert admitted == [ids[0]]  # the oldest, whichever replica created it
    assert {d.execution_id for d in receiver.deliveries} == {ids[0]}
    for waiting in ids[1:]:
        types = [e["type"] for e in replicas[1].events(waiting)]
        assert types == ["execution.created"]


def test_creates_racing_under_one_key_across_replicas_make_one_execution(
    tmp_path: Path, start: Any
) -> None:
    """§27.1 I4: the unique index decides between replicas; the losers answer the winner."""
    receiver = WebhookReceiver(SECRET)
    manifest = write_manifest(tmp_path, receiver.url, lease_seconds=60)
    replicas = [start(manifest) for _ in range(2)]
    body = {"agent_id": AGENT, "idempotency_key": "once"}
    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(lambda i: replicas[i % 2].post("/v0/executions", body), range(20)))

    assert len({c["id"] for c in created}) == 1
    (execution_id,) = {c["id"] for c in created}
    poll_until(lambda: len(receiver.deliveries) >= 1, 30, "the execution to be delivered")
    types = [e["type"] for e in replicas[0].events(execution_id)]
    receiver.close()
    assert types.count("execution.created") == 1
    assert types.count("dispatch.queued") == 1
