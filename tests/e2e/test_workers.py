"""`rebuno server --workers N`: N forked replicas on one listening socket, supervised by the
process that forked them. They serve executions together, stop together on SIGTERM, and stop
when their supervisor is killed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.polling import poll_until
from harness.processes import Server
from harness.webhooks import AgentClient, Delivery, WebhookReceiver
from tests.e2e.test_replicas import AGENT, FAST, SECRET, TOKEN, create, finish, write_manifest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(120),
]


@pytest.fixture
def agent() -> Iterator[AgentClient]:
    client = AgentClient(AGENT, SECRET)
    yield client
    client.close()


def workers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children]


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for a reaper counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def start(tmp_path: Path, postgres_url: str, receiver: WebhookReceiver) -> Server:
    manifest = write_manifest(tmp_path, receiver.url, lease_seconds=60)
    env = {**FAST, "REBUNO_WORKERS": "2"}
    return Server(postgres_url, TOKEN, tmp_path / "kernel.log", manifest=manifest, env=env)


def test_workers_serve_executions_together_and_stop_together_on_sigterm(
    tmp_path: Path, postgres_url: str, agent: AgentClient
) -> None:
    server: list[Server] = []

    def run_agent(lease: Delivery) -> None:
        decision = agent.submit(server[0].url, lease, "echo", {"n": lease.execution_id})
        finish(agent, server[0].url, lease, [decision["step_id"]])

    receiver = WebhookReceiver(SECRET, on_delivery=run_agent)
    server.append(start(tmp_path, postgres_url, receiver))
    supervisor = server[0].proc.pid
    workers = workers_of(supervisor)
    try:
        ids = [create(server[0]) for _ in range(8)]
        done = [server[0].wait_for_status(i, {"completed", "failed"}, 30) for i in ids]

        assert len(workers) == 2
        assert [d["status"] for d in done] == ["completed"] * 8
        # SIGTERM to the supervisor alone: it stops its workers and exits cleanly.
        os.kill(supervisor, signal.SIGTERM)
        assert server[0].proc.wait(20) == 0, server[0].output()
        poll_until(lambda: all(gone(pid) for pid in workers), 10, "the workers to stop")
    finally:
        receiver.close()
        server[0].stop()


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path, postgres_url: str) -> None:
    receiver = WebhookReceiver(SECRET)
    server = start(tmp_path, postgres_url, receiver)
    supervisor = server.proc.pid
    try:
        workers = workers_of(supervisor)
        assert len(workers) == 2

        os.kill(supervisor, signal.SIGKILL)
        server.proc.wait(10)

        poll_until(lambda: all(gone(pid) for pid in workers), 20, "the orphaned workers to stop")
    finally:
        receiver.close()
        server.stop()
