"""An agent of this SDK with a checkpointed resource (docs/protocol.md §33) is killed with
SIGKILL and restarted, on `rebuno dev` and on `rebuno server` over PostgreSQL: once inside a
write, after two checkpoints, and once inside the capture before completing. The kernel's
records then hold §33.9: each touch raised the generation by exactly one, no checkpoint covers
a boundary after a later touch, the re-run of the killed write moved the generation again and
counted once, and only captures of the current generation were accepted after the restart.
Writes finished before a crash did not run again (the agent's ledger)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import FAST_RECOVERY, ROOT, Kernel, Process, Server
from rebuno.kernel.domain.records import Resource
from rebuno.kernel.store.base import Store
from rebuno.kernel.store.sqlite import SqliteStore

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(120)]

SCRIPT = ROOT / "tests" / "e2e" / "resource_agent.py"
AGENT = "builder"
SECRET = "resource-crash-secret"
TOKEN = "resource-crash-token"
STEPS = 5
CRASH_AT = 4


@dataclass
class World:
    tmp_path: Path
    kernel: Kernel
    store: Store
    env: dict[str, str]
    agents: list[Process] = field(default_factory=list)

    @property
    def ledger(self) -> Path:
        return self.tmp_path / "ledger.txt"

    def start_agent(self, **env: str) -> Process:
        log = self.tmp_path / f"agent-{len(self.agents) + 1}.log"
        agent = Process([sys.executable, str(SCRIPT)], log, {**self.env, **env})
        self.agents.append(agent)
        return agent

    def lines(self) -> list[str]:
        return self.ledger.read_text().splitlines()

    def logs(self) -> str:
        return "\n".join(a.output() for a in self.agents) + self.kernel.output()

    def resources(self, execution_id: str) -> list[Resource]:
        """The stored resources, read through the store seam once the kernel is stopped."""
        self.kernel.stop()

        async def read() -> list[Resource]:
            await self.store.open()
            try:
                return await self.store.list_resources(execution_id)
            finally:
                await self.store.close()

        return asyncio.run(read())


@pytest.fixture(params=["dev", pytest.param("server", marks=pytest.mark.postgres)])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    port = free_port()
    manifest = tmp_path / "rebuno.yaml"
    manifest.write_text(
        f"agents:\n  - id: {AGENT}\n"
        f"    webhook_url: http://127.0.0.1:{port}/webhook\n    secret: {SECRET}\n"
    )
    kernel: Kernel
    store: Store
    if request.param == "dev":
        db = tmp_path / "kernel.db"
        kernel = Kernel(db, manifest, tmp_path / "kernel.log", env=FAST_RECOVERY)
        store = SqliteStore(str(db))
    else:
        from rebuno.kernel.store.postgres import PostgresStore

        url: str = request.getfixturevalue("postgres_url")
        kernel = Server(url, TOKEN, tmp_path / "kernel.log", manifest=manifest, env=FAST_RECOVERY)
        store = PostgresStore(url)
    provider = tmp_path / "provider"
    provider.mkdir()
    (tmp_path / "ledger.txt").touch()
    env = {
        "REBUNO_URL": kernel.url,
        "REBUNO_AGENT_SECRET": SECRET,
        "AGENT_ID": AGENT,
        "PORT": str(port),
        "PROVIDER": str(provider),
        "LEDGER": str(tmp_path / "ledger.txt"),
    }
    world = World(tmp_path, kernel, store, env)
    try:
        yield world
    finally:
        for agent in world.agents:
            agent.stop()
        kernel.stop()


def _generation_at(touches: list[tuple[int, int]], seq: int) -> int:
    """The generation after the last touch at or before `seq` (0 before any)."""
    return max((g for s, g in touches if s <= seq), default=0)


@dataclass
class Records:
    """What the kernel recorded of a finished run: its events, its fork points, and each
    touch as (seq of the `step.executing`, generation it moved to)."""

    log: list[dict[str, Any]]
    points: dict[str, Any]
    touches: list[tuple[int, int]]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.log if e["type"] == kind]


def _crash_and_finish(world: World, **crash: str) -> tuple[str, list[dict[str, Any]], Records]:
    """Runs the build with `crash` in the first agent's environment, waits for that agent to
    kill itself, takes the checkpoints recorded by then, restarts the agent and waits for the
    end; then checks §33.9's invariants 1-3 on the records."""
    first = world.start_agent(**crash)
    kernel = world.kernel
    created = kernel.post("/v0/executions", {"agent_id": AGENT, "input": {"steps": STEPS}})
    execution_id: str = created["id"]
    poll_until(lambda: first.proc.poll() is not None, 30, f"the crash\n{world.logs()}")
    before = kernel.get(f"/v0/executions/{execution_id}/fork-points")["checkpoints"]
    world.start_agent()
    done = kernel.wait_for_status(execution_id, {"completed", "failed"}, 60)
    assert done["status"] == "completed", world.logs()
    assert done["output"] == {"items": list(range(1, STEPS + 1))}
    log = kernel.events(execution_id)
    points = kernel.get(f"/v0/executions/{execution_id}/fork-points")
    executing = [e for e in log if e["type"] == "step.executing"]
    touches = [(e["event_seq"], e["payload"]["generations"]["workspace"]) for e in executing]
    records = Records(log, points, touches)

    # 1. Each touch raised the generation by exactly one.
    assert [g for _, g in touches] == list(range(1, len(touches) + 1))
    # 2-3. Every checkpoint had the generation current at its boundary and was closed by the
    # first touch after it: none covers a boundary after a later touch.
    for checkpoint in points["checkpoints"]:
        covered = checkpoint["covered_seq"]
        assert checkpoint["generation"] == _generation_at(touches, covered)
        later = [s for s, _ in touches if s > covered]
        assert checkpoint.get("invalidated_seq") == (later[0] if later else None)
        assert covered < checkpoint.get("invalidated_seq", covered + 1)
    recorded = [e["payload"] for e in records.of_type("resource.checkpointed")]
    assert [(c["generation"], c["covered_seq"]) for c in recorded] == [
        (c["generation"], c["covered_seq"]) for c in points["checkpoints"]
    ]
    return execution_id, before, records


def _ran(world: World) -> list[tuple[int, int]]:
    """The ledger: (write, index of the agent process it ran in)."""
    pids = [str(agent.proc.pid) for agent in world.agents]
    return [(int(i), pids.index(pid)) for i, pid in (line.split() for line in world.lines())]


def test_a_write_killed_in_its_body_reruns_once_at_a_new_generation(world: World) -> None:
    execution_id, before, records = _crash_and_finish(world, CRASH_AT=str(CRASH_AT))

    # The crash came after the baseline and the second write's capture; the writes finished
    # before it did not run again, the killed one ran again in the new process.
    assert [c["generation"] for c in before] == [0, 2]
    assert _ran(world) == [(1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (5, 1)]
    # The killed write's re-run (an orphan run again) touched the resource again.
    executing = records.of_type("step.executing")
    step_ids = [e["payload"]["step_id"] for e in executing]
    assert step_ids[CRASH_AT - 1] == step_ids[CRASH_AT]
    assert len(set(step_ids)) == STEPS
    succeeded = [e["payload"]["step_id"] for e in records.of_type("step.succeeded")]
    assert sorted(succeeded) == sorted(set(step_ids))
    assert [c["generation"] for c in records.points["checkpoints"]] == [0, 2, STEPS, STEPS + 1]

    # After the restart, the baseline the new process tried at the killed write's generation
    # was refused while that write was still executing; only current generations were taken.
    killed = records.touches[CRASH_AT - 1][0]
    failed = [e["payload"] for e in records.of_type("resource.checkpoint_failed")]
    assert failed == [{"key": "workspace", "generation": CRASH_AT, "error": "writers_active"}]
    late = [e for e in records.of_type("resource.checkpointed") if e["event_seq"] > killed]
    assert [e["payload"]["generation"] for e in late] == [STEPS, STEPS + 1]
    for event in late:
        assert event["payload"]["generation"] == _generation_at(records.touches, event["event_seq"])

    # 6. The count holds each write once, the re-run included.
    stored = world.resources(execution_id)
    assert [(r.key, r.generation, r.count) for r in stored] == [("workspace", STEPS + 1, STEPS)]


def test_a_run_killed_in_its_last_capture_replays_every_write_and_captures_anew(
    world: World,
) -> None:
    # The captures are snap-0 (baseline), snap-1 and snap-2 (writes 2 and 4), snap-3 (before
    # completing, the last write having moved the generation): the crash is in the last.
    execution_id, before, records = _crash_and_finish(world, CRASH_AT_SNAPSHOT="snap-3")

    assert [c["generation"] for c in before] == [0, 2, 4]
    assert _ran(world) == [(i, 0) for i in range(1, STEPS + 1)]
    assert [g for _, g in records.touches] == list(range(1, STEPS + 1))
    # The new process found the resource uncovered at the last write's generation and took
    # its baseline there; nothing touched it since the crash.
    checkpoints = records.points["checkpoints"]
    assert [c["generation"] for c in checkpoints] == [0, 2, 4, STEPS]
    assert checkpoints[-1]["covered_seq"] > records.touches[-1][0]
    assert records.of_type("resource.checkpoint_failed") == []
    stored = world.resources(execution_id)
    assert [(r.key, r.generation, r.count) for r in stored] == [("workspace", STEPS, STEPS)]
