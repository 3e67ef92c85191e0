"""The kernel is killed with SIGKILL while an execution is mid-step and restarted on the same
SQLite file: the execution finishes, and its event log has no gap, loss or duplicate."""

from __future__ import annotations

import collections
import os
import signal
from pathlib import Path

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import FAST_RECOVERY, ROOT, Kernel, Process
from tests.e2e.compat import official_sdk_python
from tests.e2e.test_official_sdk import manifest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

AGENT_SCRIPT = ROOT / "tests" / "e2e" / "official_agent.py"


def test_killed_kernel_restarts_and_finishes_the_execution(tmp_path: Path) -> None:
    python = official_sdk_python("0.16.0")
    agent_port = free_port()
    side = tmp_path / "side.txt"
    side.touch()
    db, config = tmp_path / "kernel.db", manifest(tmp_path, agent_port)
    kernel = Kernel(db, config, tmp_path / "kernel-1.log", env=FAST_RECOVERY)
    env = {"SIDE_FILE": str(side), "WAIT_IN_SECOND": "1"}
    agent = Process(
        [str(python), str(AGENT_SCRIPT), kernel.url, str(agent_port)], tmp_path / "agent.log", env
    )
    try:
        created = kernel.post("/v0/executions", {"agent_id": "compat", "input": {"topic": "x"}})
        execution_id = created["id"]
        poll_until(lambda: "second" in side.read_text(), 30, f"the second step\n{agent.output()}")
        events_before = kernel.get(f"/v0/executions/{execution_id}/events?limit=1000")

        kernel.kill()
        os.kill(agent.proc.pid, signal.SIGUSR1)  # `second` ends while the kernel is down
        kernel = Kernel(db, config, tmp_path / "kernel-2.log", env=FAST_RECOVERY, port=kernel.port)
        done = kernel.wait_for_status(execution_id, {"completed", "failed"}, 60)
        events = kernel.get(f"/v0/executions/{execution_id}/events?limit=1000")
    finally:
        agent.stop()
        kernel.stop()

    assert done["status"] == "completed", (done, agent.output())
    assert isinstance(events, list) and isinstance(events_before, list)
    assert [e["event_seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[: len(events_before)] == events_before
    succeeded = collections.Counter(
        e["payload"]["step_id"] for e in events if e["type"] == "step.succeeded"
    )
    assert len(succeeded) == 2 and set(succeeded.values()) == {1}
    assert side.read_text().split() == ["first", "second", "second"]
