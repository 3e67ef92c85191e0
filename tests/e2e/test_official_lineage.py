"""The official SDK 0.29.2, unchanged, through sessions, sub-agents, forks, idempotent creates
and published agent metadata, counted in the reference dashboard's metrics (docs/protocol.md
§24-§27, §36, §37), against `rebuno dev` and against two `rebuno server` replicas on
PostgreSQL; and our SDK through the same scenarios, from the same agent code
(tests/e2e/official_lineage.py), since its public names are the official SDK's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import ROOT, Kernel, Process
from tests.e2e.compat import dev_or_replicas, official_sdk_python

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = ROOT / "tests" / "e2e" / "official_lineage.py"
AGENTS = ("chat", "parent", "child", "twostep")
TOKEN = "lineage-token"


@dataclass
class World:
    """The kernel (or two replicas) and the four agents, each agent on its own replica."""

    kernels: list[Kernel]
    python: Path
    side: Path
    env: dict[str, str]
    ports: dict[str, int]
    agents: dict[str, Process] = field(default_factory=dict)

    @property
    def kernel(self) -> Kernel:
        return self.kernels[0]

    def start(self, name: str, log: Path) -> None:
        url = self.kernels[AGENTS.index(name) % len(self.kernels)].url
        args = [str(self.python), str(SCRIPT), "agent", name, url, str(self.ports[name])]
        self.agents[name] = Process(args, log, self.env)

    def create(self, agent_id: str, input: object, **fields: Any) -> dict[str, Any]:
        body = {"agent_id": agent_id, "input": input, **fields}
        created: dict[str, Any] = self.kernels[-1].post("/v0/executions", body)
        return created

    def get(self, execution_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.kernel.get(f"/v0/executions/{execution_id}")
        return found

    def done(self, execution_id: str) -> dict[str, Any]:
        return self.kernel.wait_for_status(execution_id, {"completed", "failed", "cancelled"}, 120)

    def open_gate(self, name: str, until: Any) -> None:
        """SIGUSR1 to the agent until `until()` holds (its handler sets the gate lazily)."""

        def opened() -> bool:
            os.kill(self.agents[name].proc.pid, signal.SIGUSR1)
            return bool(until())

        poll_until(opened, 120, f"{name} to pass its gate")

    def children(self) -> list[dict[str, Any]]:
        page: dict[str, Any] = self.kernel.get("/v0/executions?agent_id=child&limit=200")
        found: list[dict[str, Any]] = page["executions"]
        return found

    def notes(self) -> list[str]:
        return self.side.read_text().split("\n")[:-1]


def scrape(kernel: Kernel) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The kernel's `/metrics` samples by name and labels."""
    text = httpx.get(f"{kernel.url}/metrics", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture(params=["official", "ours"])
def sdk_python(request: pytest.FixtureRequest) -> Path:
    """The interpreter the agents and the client run with: the official SDK's, or ours."""
    if request.param == "official":
        return official_sdk_python("0.29.2")
    return Path(sys.executable)


@pytest.fixture(params=["dev", pytest.param("replicas", marks=pytest.mark.postgres)])
def world(request: pytest.FixtureRequest, tmp_path: Path, sdk_python: Path) -> Iterator[World]:
    ports = {name: free_port() for name in AGENTS}
    manifest = tmp_path / "rebuno.yaml"
    manifest.write_text(
        "agents:\n"
        + "".join(
            f"  - id: {name}\n"
            f"    webhook_url: http://127.0.0.1:{port}/webhook\n"
            "    secret: lineage-secret\n"
            for name, port in ports.items()
        )
    )
    kernels = dev_or_replicas(
        request.param, tmp_path, manifest, TOKEN, lambda: request.getfixturevalue("postgres_url")
    )
    side = tmp_path / "side.txt"
    side.touch()
    env = {"SIDE_FILE": str(side), "REBUNO_URL": kernels[-1].url, "REBUNO_API_KEY": TOKEN}
    world = World(kernels, sdk_python, side, env, ports)
    for name in AGENTS:
        world.start(name, tmp_path / f"{name}.log")
    try:
        yield world
    finally:
        for agent in world.agents.values():
            agent.stop()
        for kernel in kernels:
            kernel.stop()


def test_the_sdk_runs_conversations_sub_agents_forks_and_idempotent_creates(
    world: World, tmp_path: Path
) -> None:
    # A three-turn conversation; the second turn, created while the first runs, waits.
    first = world.create("chat", {"message": "hi", "hold": True}, session="talk")
    poll_until(lambda: world.get(first["id"])["status"] == "running", 60, "the first turn")
    second = world.create("chat", {"message": "how"}, session="talk")
    waiting = world.get(second["id"])
    assert waiting["status"] == "pending" and "admitted_at" not in waiting
    world.open_gate("chat", lambda: world.get(first["id"])["status"] == "completed")
    assert world.done(second["id"])["output"] == {"reply": "HOW", "turns": 2}
    third = world.done(world.create("chat", {"message": "bye"}, session="talk")["id"])
    assert third["output"] == {"reply": "BYE", "turns": 3}
    assert third["parent_execution_id"] == second["id"]

    # A cancelled parent cancels its children.
    doomed = world.create("parent", {"topics": ["x", "y", "z"]})
    poll_until(lambda: len(world.children()) == 3, 60, "three children of the doomed parent")
    world.kernel.post(f"/v0/executions/{doomed['id']}/cancel", {})
    for kid in world.children():
        assert world.done(kid["id"])["failure_reason"] == "parent_agent_terminal"

    # A parent fans out to three children; its agent is killed while they run and restarted.
    fan = world.create("parent", {"topics": ["a", "b", "c"]})
    poll_until(lambda: len(world.children()) == 6, 60, "three children of the parent")
    poll_until(lambda: world.get(fan["id"])["status"] == "blocked", 60, "the parent to suspend")
    killed = world.agents["parent"]
    killed.proc.send_signal(signal.SIGKILL)
    killed.proc.wait(timeout=30)
    killed.stop()  # closes its log
    world.start("parent", tmp_path / "parent-2.log")
    world.open_gate("child", lambda: world.get(fan["id"])["status"] != "blocked")
    done = world.done(fan["id"])
    assert done["status"] == "completed", done
    assert done["output"] == {"found": ["A", "B", "C"]}
    runs = [n for n in world.notes() if n.startswith("child ")]
    assert sorted(runs) == sorted(f"child {t}" for t in "xyzabc")  # every child ran once

    # A fork at the first tool's outcome replays it and runs the second live.
    source = world.done(world.create("twostep", {"n": 1})["id"])
    assert source["output"] == 4
    events = world.kernel.get(f"/v0/executions/{source['id']}/events")
    at = next(e["event_seq"] for e in events if e["type"] == "step.succeeded")
    fork = world.kernel.post(f"/v0/executions/{source['id']}/fork", {"at_seq": at})
    assert world.done(fork["id"])["output"] == 4
    assert [n for n in world.notes() if n in ("first", "second")] == ["first", "second", "second"]

    # Ten concurrent creates under one key make one execution.
    made = subprocess.run(
        [str(world.python), str(SCRIPT), "idempotent", world.kernels[-1].url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **world.env},
    )
    assert made.returncode == 0, made.stderr
    ids = set(json.loads(made.stdout))
    assert len(ids) == 1
    world.done(ids.pop())

    # What each agent published at its start-up (§36), read through the first replica.
    shown = {name: world.kernel.get(f"/v0/agents/{name}") for name in AGENTS}
    for name, agent in shown.items():
        assert agent["description"] == f"the {name} of the lineage scenarios", agent
    assert shown["twostep"]["input_schema"]["title"] == "twostep"
    assert shown["twostep"]["input_schema"]["required"] == ["n"]
    assert shown["twostep"]["output_schema"] == {"type": "integer"}
    assert shown["parent"]["output_schema"]["title"] == "Found"
    assert "output_schema" not in shown["chat"]

    # Each replica counts what it did itself; summed, they count every execution (§37).
    listed = world.kernel.get("/v0/executions?limit=200")["executions"]
    ended = Counter(execution["status"] for execution in listed)
    samples = [scrape(kernel) for kernel in world.kernels]
    assert sum(s[("rebuno_executions_created_total", ())] for s in samples) == len(listed)
    for status in ("completed", "failed", "cancelled"):
        key = ("rebuno_executions_completed_total", (("status", status),))
        assert sum(s[key] for s in samples) == ended[status], status
