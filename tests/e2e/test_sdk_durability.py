"""What a crash of an agent built with this SDK costs under each `durability` (docs/sdk.md),
in real processes on both stores: `rebuno dev` on SQLite, `rebuno server` on PostgreSQL.

The agent runs ten plain `step()` calls, each noting in a ledger that its body ran, and kills
itself with SIGKILL at the start of step 5's body (step 4's body has returned). A new agent
process takes the redelivery, once the short lease has expired, and finishes the execution.
"""

from __future__ import annotations

import collections
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import FAST_RECOVERY, ROOT, Kernel, Process, Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

AGENT_SCRIPT = ROOT / "tests" / "e2e" / "ledger_agent.py"
AGENT_ID, SECRET, TOKEN = "ledger", "ledger-secret", "ledger-token"
STEPS, CRASH_AT = 10, 5
"""The agent dies in the body of step `CRASH_AT`, after the body of step `CRASH_AT - 1`
returned."""
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Rig:
    """A kernel on one store and the agent processes started against it, one at a time, on
    one loopback port; every step body they run is a line in `ledger`."""

    def __init__(self, tmp_path: Path, kernel: Kernel, port: int) -> None:
        self.tmp_path, self.kernel, self.port = tmp_path, kernel, port
        self.ledger = tmp_path / "ledger.txt"
        self.ledger.touch()
        self.agents: list[Process] = []

    def start_agent(self, durability: str | None, crash_at: int = 0) -> Process:
        """An agent process built with `durability`, or with the defaults when it is None."""
        env = {
            "REBUNO_URL": self.kernel.url,
            "REBUNO_AGENT_SECRET": SECRET,
            "AGENT_ID": AGENT_ID,
            "PORT": str(self.port),
            "LEDGER": str(self.ledger),
            "CRASH_AT": str(crash_at),
        }
        if durability is not None:
            env["DURABILITY"] = durability
        log = self.tmp_path / f"agent-{len(self.agents) + 1}.log"
        agent = Process([sys.executable, str(AGENT_SCRIPT)], log, env)
        self.agents.append(agent)
        return agent

    def runs(self) -> list[tuple[int, int]]:
        """Every step body that ran, in order: (step index, pid of the process)."""
        lines = self.ledger.read_text().splitlines()
        return [(int(i), int(pid)) for i, pid in (line.split() for line in lines)]

    def step_statuses(self, execution_id: str) -> dict[int, str]:
        """What the kernel has recorded of each step, by step index."""
        steps = self.kernel.get(f"/v0/executions/{execution_id}/steps")
        assert isinstance(steps, list)
        return {s["args"]["i"]: s["status"] for s in steps}

    def logs(self) -> str:
        return "\n".join(a.output() for a in self.agents) + self.kernel.output()

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.kernel.stop()


@pytest.fixture(params=BACKENDS)
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    port = free_port()
    manifest = tmp_path / "rebuno.yaml"
    manifest.write_text(
        f"agents:\n  - id: {AGENT_ID}\n"
        f"    webhook_url: http://127.0.0.1:{port}/webhook\n"
        f"    secret: {SECRET}\n"
    )
    log = tmp_path / "kernel.log"
    kernel: Kernel
    if request.param == "sqlite":
        kernel = Kernel(tmp_path / "kernel.db", manifest, log, FAST_RECOVERY)
    else:
        url: str = request.getfixturevalue("postgres_url")
        kernel = Server(url, TOKEN, log, manifest=manifest, env=FAST_RECOVERY)
    setup = Rig(tmp_path, kernel, port)
    yield setup
    setup.close()


def _crash_and_recover(
    rig: Rig, durability: str | None = None
) -> tuple[dict[int, str], dict[str, Any]]:
    """Runs the execution through the crash and the recovery: what the kernel had recorded
    of each step when the first agent died, and the finished execution."""
    first = rig.start_agent(durability, crash_at=CRASH_AT)
    created = rig.kernel.post("/v0/executions", {"agent_id": AGENT_ID, "input": {"steps": STEPS}})
    assert isinstance(created, dict)
    poll_until(lambda: first.proc.poll() is not None, 30, f"the agent to crash\n{rig.logs()}")
    assert first.proc.returncode == -signal.SIGKILL, rig.logs()
    recorded = rig.step_statuses(created["id"])

    rig.start_agent(durability)
    done = rig.kernel.wait_for_status(created["id"], {"completed", "failed"}, 60)
    assert done["status"] == "completed", rig.logs()
    return recorded, done


def _ran(pid: int, start: int, end: int) -> list[tuple[int, int]]:
    """The ledger lines of process `pid` running steps `start` to `end`, in order."""
    return [(i, pid) for i in range(start, end + 1)]


def _output_by(pids: dict[int, int]) -> dict[str, Any]:
    """The execution's output when step i's result is the one the process `pids[i]` got."""
    return {"steps": [{"i": i, "pid": pids[i]} for i in range(1, STEPS + 1)]}


def test_default_agent_never_reruns_a_step_whose_body_returned_before_a_crash(rig: Rig) -> None:
    recorded, done = _crash_and_recover(rig)

    first, second = (agent.proc.pid for agent in rig.agents)
    runs = collections.Counter(i for i, _ in rig.runs())
    # The outcome of the step before the crash travelled with the crashing step's submission,
    # which the kernel recorded before that body ran.
    assert recorded == {**{i: "succeeded" for i in range(1, CRASH_AT)}, CRASH_AT: "executing"}
    assert runs == {**{i: 1 for i in range(1, STEPS + 1)}, CRASH_AT: 2}, rig.logs()
    assert rig.runs() == _ran(first, 1, CRASH_AT) + _ran(second, CRASH_AT, STEPS)
    # The steps before the crash replayed their recorded results, the first process's.
    pids = {i: first if i < CRASH_AT else second for i in range(1, STEPS + 1)}
    assert done["output"] == _output_by(pids)


def test_batched_steps_not_yet_reported_run_again_after_a_crash(rig: Rig) -> None:
    recorded, done = _crash_and_recover(rig, durability="batched")

    first, second = (agent.proc.pid for agent in rig.agents)
    runs = collections.Counter(i for i, _ in rig.runs())
    # The steps ran before they were recorded, and the crash came before any was reported.
    assert recorded == {}
    assert runs == {i: 2 if i <= CRASH_AT else 1 for i in range(1, STEPS + 1)}, rig.logs()
    assert rig.runs() == _ran(first, 1, CRASH_AT) + _ran(second, 1, STEPS)
    assert done["output"] == _output_by(dict.fromkeys(range(1, STEPS + 1), second))
