"""The official SDK 0.29.2, unchanged, with an external resource and a checkpoint policy
(docs/protocol.md §33), against `rebuno dev` and against two `rebuno server` replicas on
PostgreSQL: checkpoints are recorded at the policy's cadence, and a fork of the execution
starts with the selected checkpoint restored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.ports import free_port
from harness.processes import ROOT, Kernel, Process
from tests.e2e.compat import dev_or_replicas, official_sdk_python

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = ROOT / "tests" / "e2e" / "official_resources.py"
TOKEN = "resources-token"


@dataclass
class World:
    kernels: list[Kernel]
    side: Path

    def done(self, execution_id: str) -> dict[str, Any]:
        return self.kernels[0].wait_for_status(
            execution_id, {"completed", "failed", "cancelled"}, 120
        )

    def events(self, execution_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.kernels[0].get(
            f"/v0/executions/{execution_id}/events?limit=1000"
        )
        return found


@pytest.fixture(params=["dev", pytest.param("replicas", marks=pytest.mark.postgres)])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    port = free_port()
    manifest = tmp_path / "rebuno.yaml"
    manifest.write_text(
        "agents:\n"
        "  - id: builder\n"
        f"    webhook_url: http://127.0.0.1:{port}/webhook\n"
        "    secret: resources-secret\n"
    )
    kernels = dev_or_replicas(
        request.param, tmp_path, manifest, TOKEN, lambda: request.getfixturevalue("postgres_url")
    )
    side = tmp_path / "side.txt"
    side.touch()
    env = {"SIDE_FILE": str(side)}
    # The agent talks to the second replica, the test to the first.
    python = official_sdk_python("0.29.2")
    agent = Process([str(python), str(SCRIPT), kernels[-1].url, str(port)], tmp_path / "a.log", env)
    try:
        yield World(kernels, side)
    finally:
        agent.stop()
        for kernel in kernels:
            kernel.stop()


def test_checkpoints_follow_the_policy_and_a_fork_starts_from_the_checkpoint(
    world: World,
) -> None:
    kernel = world.kernels[0]
    source = world.done(kernel.post("/v0/executions", {"agent_id": "builder"})["id"])
    assert source["status"] == "completed", source
    assert source["output"] == ["a", "b"]
    log = world.events(source["id"])
    checkpointed = [e for e in log if e["type"] == "resource.checkpointed"]
    assert [e["payload"]["generation"] for e in checkpointed] == [0, 2, 3]
    executing = [e["payload"].get("generations") for e in log if e["type"] == "step.executing"]
    assert executing == [{"workspace": 1}, {"workspace": 2}, {"workspace": 3}]
    succeeded = [e["event_seq"] for e in log if e["type"] == "step.succeeded"]
    assert checkpointed[1]["payload"]["covered_seq"] == succeeded[1]
    completed = next(e["event_seq"] for e in log if e["type"] == "execution.completed")
    assert checkpointed[2]["event_seq"] < completed
    assert not [e for e in log if e["type"] == "resource.checkpoint_failed"]
    points = kernel.get(f"/v0/executions/{source['id']}/fork-points")
    assert [c["checkpoint_ref"] for c in points["checkpoints"]] == ["snap-0", "snap-1", "snap-2"]
    assert "invalidated_seq" not in points["checkpoints"][-1]

    at = succeeded[1]
    fork = kernel.post(f"/v0/executions/{source['id']}/fork", {"at_seq": at})
    assert fork["restoration"] == {
        "workspace": {"checkpoint_ref": "snap-1", "checkpoint_seq": at, "covered": True}
    }
    forked = world.done(fork["id"])
    assert forked["status"] == "completed", forked
    assert forked["output"] == ["a", "b"]
    assert world.side.read_text().split("\n")[:-1] == ["create -", "create snap-1"]
