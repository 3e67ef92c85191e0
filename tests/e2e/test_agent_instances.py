"""`agent-instances` in real processes, on both stores: an agent served by `Agent.run()`, or as
`Agent.app` under uvicorn, is killed with SIGKILL in the middle of a run and started again with
the same instance name. Its start-up announcement has the kernel redeliver the run at once; the
lease is 60 s, and the run completes within a few seconds of the restart, its redelivery
finding the agent listening."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import ROOT, Kernel, Process, Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(120)]

AGENT_SCRIPT = ROOT / "tests" / "sdk" / "e2e_agent.py"
AGENT, SECRET, TOKEN = "shop", "instances-secret", "instances-token"
LONG_LEASE = {
    "REBUNO_DISPATCH_LEASE_TIMEOUT": "60s",
    "REBUNO_DISPATCH_BACKOFF_BASE": "100ms",
    "REBUNO_DISPATCH_POLL_INTERVAL": "50ms",
    "REBUNO_DISPATCH_MAX_ATTEMPTS": "40",
}
BACK_WITHIN = 15.0
"""Seconds from the restart to the run's end at most: a quarter of the lease."""


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _sqlite(tmp_path: Path, manifest: Path) -> Kernel:
    return Kernel(tmp_path / "kernel.db", manifest, tmp_path / "kernel.log", LONG_LEASE)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def start_kernel(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[Path], Kernel]]:
    started: list[Kernel] = []

    def start(manifest: Path) -> Kernel:
        if request.param == "sqlite":
            kernel = _sqlite(tmp_path, manifest)
        else:
            url: str = request.getfixturevalue("postgres_url")
            log = tmp_path / "kernel.log"
            kernel = Server(url, TOKEN, log, manifest=manifest, env=LONG_LEASE)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.stop()


@pytest.mark.parametrize("serve", ["run", "uvicorn"])
def test_a_killed_agent_restarted_in_its_slot_gets_its_run_back_before_the_lease(
    tmp_path: Path, start_kernel: Callable[[Path], Kernel], serve: str
) -> None:
    """Served by uvicorn, the agent announces itself from the lifespan's startup, before
    uvicorn opens its port: the redelivery must still find it listening, at the first try."""
    port = free_port()
    side = tmp_path / "side.txt"
    side.touch()
    manifest = tmp_path / "rebuno.yaml"
    manifest.write_text(
        f"agents:\n  - id: {AGENT}\n"
        f"    webhook_url: http://127.0.0.1:{port}/webhook\n    secret: {SECRET}\n"
    )
    kernel = start_kernel(manifest)
    env = {
        "REBUNO_URL": kernel.url,
        "REBUNO_AGENT_SECRET": SECRET,
        "PORT": str(port),
        "SIDE_FILE": str(side),
        "AGENT_ID": AGENT,
        "SERVE": serve,
        "REBUNO_AGENT_INSTANCE": "shop-1",
    }
    agents: list[Process] = []

    def start_agent(**extra: str) -> Process:
        log = tmp_path / f"agent-{len(agents) + 1}.log"
        agents.append(Process([sys.executable, str(AGENT_SCRIPT)], log, {**env, **extra}))
        return agents[-1]

    def logs() -> str:
        return "\n".join(a.output() for a in agents) + kernel.output()

    try:
        first = start_agent(HANG_IN="fetch")
        poll_until(lambda: _listening(port), 30, f"the agent to listen\n{logs()}")
        created = kernel.post("/v0/executions", {"agent_id": AGENT, "input": {"item": "tea"}})
        execution_id = str(created["id"])
        poll_until(lambda: "fetch" in side.read_text().splitlines(), 30, f"fetch to run\n{logs()}")
        first.kill()
        restarted = time.monotonic()
        start_agent()
        done = kernel.wait_for_status(execution_id, {"completed", "failed"}, BACK_WITHIN)
        back_after = time.monotonic() - restarted
    finally:
        for agent in agents:
            agent.stop()

    assert done["status"] == "completed", logs()
    assert done["output"] == {"fetched": "fetched tea", "charged": "charged tea"}
    assert side.read_text().splitlines() == ["fetch", "fetch", "charge"]
    assert back_after < BACK_WITHIN
    failed = [e for e in kernel.events(execution_id) if e["type"] == "dispatch.failed"]
    assert failed == [], logs()
