"""PostgreSQL restarts under two running replicas: every execution still finishes, nothing is
lost or done twice, and live deltas flow again.

The server is a private throwaway cluster (initdb into a temporary directory, its own port),
never the shared one other tests use. The test acts as the agent: a loopback webhook and signed
calls that retry while the kernel answers 5xx or cannot be reached, as a robust agent does.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from harness.polling import poll_until
from harness.postgres import Cluster, pg_bindir, private_cluster
from harness.processes import Server
from harness.webhooks import AgentClient, Delivery, WebhookReceiver
from tests.e2e.test_replicas import (
    AGENT,
    FAST,
    SECRET,
    TOKEN,
    SseReader,
    assert_contiguous,
    create,
    write_manifest,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(240),
]

EXECUTIONS, STEPS = 6, 3
ENV = {**FAST, "REBUNO_DISPATCH_MAX_ATTEMPTS": "20"}


def _bindir() -> Path:
    located = pg_bindir()
    if located is None:
        message = "initdb is not installed: cannot create a private PostgreSQL cluster"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return located


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with private_cluster(_bindir()) as private:
        yield private


@pytest.fixture
def database(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    name = f"rebuno_{request.node.name.removeprefix('test_')[:40]}"
    cluster.create_database(name)
    return cluster.url(name)


@pytest.fixture
def replicas(database: str, tmp_path: Path) -> Iterator[Callable[[Path], list[Server]]]:
    started: list[Server] = []

    def start(manifest: Path) -> list[Server]:
        for number in (1, 2):
            log = tmp_path / f"replica-{number}.log"
            started.append(Server(database, TOKEN, log, manifest=manifest, env=ENV))
        return started

    yield start
    for server in started:
        server.stop()


class PatientAgent:
    """Runs each delivery as `STEPS` tool calls, the first before `gate` opens and the rest
    after, writing one side-file line per effect. Kernel calls are retried while the answer
    is a 5xx or no answer; `409 lease_superseded` ends the run quietly."""

    def __init__(self, replicas: list[Server], side: Path) -> None:
        self.gate = threading.Event()
        self.first_done: set[str] = set()
        self.orphaned: collections.Counter[tuple[str, int]] = collections.Counter()
        self.errors: list[BaseException] = []
        self._replicas = replicas
        self._side = side
        self._lock = threading.Lock()
        self._calls = 0
        self._called_after_gate: set[str] = set()
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._client = AgentClient(AGENT, SECRET)

    def close(self) -> None:
        self._client.close()

    def run(self, lease: Delivery) -> None:
        try:
            self._run(lease)
        except BaseException as exc:  # surfaced by the test thread
            self.errors.append(exc)
            raise

    def _run(self, lease: Delivery) -> None:
        base = f"/v0/executions/{lease.execution_id}"
        for index in range(STEPS):
            if index == 1 and not self._wait_for_gate(lease):
                return
            body = {"kind": "tool_call", "target": "work", "args": {"index": index}}
            decision = self._call(f"{base}/steps", body, lease)
            if decision.status_code == 409:
                return
            step = decision.json()
            if step["decision"] == "proceed" and not self._effect(lease, index, step["step_id"]):
                return
            if index == 0:
                with self._lock:
                    self.first_done.add(lease.execution_id)
        self._call(f"{base}/complete", {"output": {"steps": STEPS}}, lease)

    def _effect(self, lease: Delivery, index: int, step_id: str) -> bool:
        with self._lock, self._side.open("a") as side:
            side.write(f"{lease.execution_id} {index}\n")
        path = f"/v0/executions/{lease.execution_id}/steps/{step_id}/complete"
        if self._call(path, {"result": {"index": index}}, lease).status_code == 409:
            # The effect ran but its result was refused: the next attempt re-runs it.
            with self._lock:
                self.orphaned[(lease.execution_id, index)] += 1
            return False
        return True

    def _wait_for_gate(self, lease: Delivery) -> bool:
        """Heartbeats every third of the lease until the gate opens; False once superseded."""
        path = f"/v0/executions/{lease.execution_id}/heartbeat"
        while not self.gate.wait(lease.lease_timeout_seconds / 3):
            if self._send(path, None, lease).status_code == 409:
                return False
        return True

    def _call(self, path: str, body: object, lease: Delivery) -> httpx.Response:
        answers: list[httpx.Response] = []

        def answered() -> bool:
            try:
                response = self._send(path, body, lease)
            except httpx.TransportError:
                response = None
            if response is None or response.status_code >= 500:
                return False
            answers.append(response)
            return True

        poll_until(answered, 60, f"an answer to {path}")
        [response] = answers
        assert response.status_code < 300 or response.status_code == 409, response.text
        return response

    def spanning(self) -> set[str]:
        """Runs with a call in flight, or made one since the gate opened."""
        with self._lock:
            return self._called_after_gate | set(self._in_flight)

    def _send(self, path: str, body: object, lease: Delivery) -> httpx.Response:
        # Alternating replicas: one run's calls cross both, as behind a load balancer.
        with self._lock:
            if self.gate.is_set():
                self._called_after_gate.add(lease.execution_id)
            self._in_flight[lease.execution_id] += 1
            self._calls += 1
            url = self._replicas[self._calls % len(self._replicas)].url
        try:
            return self._client.call(url, path, body, lease)
        finally:
            with self._lock:
                self._in_flight[lease.execution_id] -= 1
                if not self._in_flight[lease.execution_id]:
                    del self._in_flight[lease.execution_id]


def test_executions_finish_once_each_across_a_postgres_restart(
    cluster: Cluster, replicas: Callable[[Path], list[Server]], tmp_path: Path
) -> None:
    side = tmp_path / "side.txt"
    side.touch()
    servers: list[Server] = []
    agent = PatientAgent(servers, side)
    receiver = WebhookReceiver(SECRET, on_delivery=agent.run)
    servers.extend(replicas(write_manifest(tmp_path, receiver.url)))
    ids = [create(servers[i % 2]) for i in range(EXECUTIONS)]
    poll_until(lambda: agent.first_done == set(ids), 30, "every run to finish its first step")

    cluster.stop()
    agent.gate.set()
    # Started again only once every run has a call in flight, so each one spans the outage.
    poll_until(lambda: agent.spanning() >= set(ids), 30, "every run to call the kernel")
    cluster.start()
    done = {i: servers[1].wait_for_status(i, {"completed", "failed"}, 60) for i in ids}
    logs = {i: servers[0].events(i) for i in ids}
    receiver.close()
    agent.close()

    assert agent.errors == []
    assert {i: d["status"] for i, d in done.items()} == dict.fromkeys(ids, "completed")
    effects = collections.Counter(tuple(line.split()) for line in side.read_text().splitlines())
    for execution_id, events in logs.items():
        assert_contiguous(events)
        succeeded = [e["payload"]["step_id"] for e in events if e["type"] == "step.succeeded"]
        assert len(succeeded) == len(set(succeeded)) == STEPS
        for index in range(STEPS):
            orphaned = agent.orphaned[(execution_id, index)]
            assert effects[(execution_id, str(index))] == 1 + orphaned


def test_deltas_cross_replicas_again_after_a_postgres_restart(
    cluster: Cluster, replicas: Callable[[Path], list[Server]], tmp_path: Path
) -> None:
    receiver = WebhookReceiver(SECRET)
    consumer_side, producer_side = replicas(write_manifest(tmp_path, receiver.url, 60))
    execution_id = create(consumer_side)
    [lease] = receiver.wait_for(lambda d: len(d) == 1, 20, "the delivery")
    agent = AgentClient(AGENT, SECRET)
    step_id = agent.submit(producer_side.url, lease, "llm", {"prompt": "hi"})["step_id"]
    path = f"/v0/executions/{execution_id}/steps/{step_id}/stream"
    reader = SseReader(f"{consumer_side.url}/v0/executions/{execution_id}/stream")
    poll_until(reader.opened.is_set, 10, "the stream to open")

    def probed() -> bool:
        seen = len(reader.deltas)
        response = agent.call(producer_side.url, path, {"seq": 0, "data": "probe"})
        return response.status_code == 204 and len(reader.deltas) > seen

    poll_until(probed, 20, "a probe delta before the restart")
    cluster.restart()
    poll_until(probed, 30, "a probe delta after the restart")
    for seq in range(1, 6):
        agent.call(producer_side.url, path, {"seq": seq, "data": f"chunk-{seq}"})
    agent.call(producer_side.url, path, {"seq": 6, "data": "end"})
    poll_until(reader.finished.is_set, 20, "the end delta")
    completed = agent.call(
        producer_side.url, f"/v0/executions/{execution_id}/complete", {"output": None}, lease
    )
    events = consumer_side.events(execution_id)
    agent.close()
    receiver.close()

    chunks = [(d["seq"], d["data"]) for d in reader.deltas if d["data"] != "probe"]
    assert chunks == [(s, f"chunk-{s}") for s in range(1, 6)] + [(6, "end")]
    assert completed.status_code == 204, completed.text
    assert_contiguous(events)
