"""`rebuno.resource` and `CheckpointPolicy` against a real kernel (docs/protocol.md §33.10):
the baseline, captures at the policy's cadence, the capture on completion, a fork that starts
from the checkpoint, and a driver that cannot restore it."""

from __future__ import annotations

from typing import Any, ClassVar

import httpx
import pytest

import rebuno
from rebuno import CheckpointPolicy, CheckpointUnavailable, tool
from tests.sdk.conftest import Harness


class FakeDriver:
    """A provider kept in memory: a sandbox is a dict, a checkpoint a copy of it."""

    driver_id = "test.fake.v1"
    configuration: ClassVar[dict[str, str]] = {"size": "small"}

    def __init__(self) -> None:
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.created: list[str | None] = []

    async def create(self, checkpoint_ref: str | None = None) -> tuple[dict[str, Any], Any]:
        self.created.append(checkpoint_ref)
        if checkpoint_ref is not None and checkpoint_ref not in self.snapshots:
            raise CheckpointUnavailable(f"snapshot {checkpoint_ref} is gone")
        state = dict(self.snapshots.get(checkpoint_ref or "", {}))
        return state, {"sandbox": len(self.created)}

    def open(self, binding: Any) -> dict[str, Any]:
        return {}

    def checkpoint(self, handle: dict[str, Any]) -> str:
        ref = f"snap-{len(self.snapshots)}"
        self.snapshots[ref] = dict(handle)
        return ref


async def events(harness: Harness, execution_id: str) -> list[dict[str, Any]]:
    return [e.model_dump() for e in await harness.client.events(execution_id, limit=1000)]


def handler(driver: FakeDriver) -> Any:
    @tool("write", resources=["workspace"])
    async def write(name: str) -> str:
        box = await rebuno.resource("workspace", driver=driver)
        box[name] = True
        return name

    @tool("look")
    async def look() -> int:
        return 1

    async def process() -> list[str]:
        box = await rebuno.resource(
            "workspace", driver=driver, checkpoints=CheckpointPolicy(every_steps=2)
        )
        await write("a")
        await write("b")
        await look()
        return sorted(box)

    return process


async def test_checkpoints_follow_the_policy_and_a_fork_starts_from_one(
    harness: Harness,
) -> None:
    driver = FakeDriver()
    async with harness.serve("builder", handler(driver)):
        done = await harness.run("builder")
        assert done.status == "completed", done.failure_reason
        log = await events(harness, done.id)
        checkpointed = [e["payload"] for e in log if e["type"] == "resource.checkpointed"]
        assert [c["generation"] for c in checkpointed] == [0, 2, 3]
        decided = [e["payload"]["generations"] for e in log if e["type"] == "step.executing"]
        assert decided == [{"workspace": 1}, {"workspace": 2}, {"workspace": 3}]
        succeeded = [e["event_seq"] for e in log if e["type"] == "step.succeeded"]
        assert checkpointed[1]["covered_seq"] == succeeded[1]

        fork = await harness.client.fork(done.id, at_seq=succeeded[1])
        restored = fork.restoration["workspace"]
        assert (restored["checkpoint_ref"], restored["covered"]) == ("snap-1", True)
        forked = await harness.client.wait(fork.id, timeout=20)
        assert forked.status == "completed", forked.failure_reason
    assert driver.created == [None, "snap-1"]


async def test_a_checkpoint_that_is_gone_fails_the_run(harness: Harness) -> None:
    driver = FakeDriver()
    async with harness.serve("builder", handler(driver)):
        done = await harness.run("builder")
        succeeded = [
            e["event_seq"] for e in await events(harness, done.id) if e["type"] == "step.succeeded"
        ]
        driver.snapshots.clear()
        fork = await harness.client.fork(done.id, at_seq=succeeded[1])
        failed = await harness.client.wait(fork.id, timeout=20)
    assert failed.status == "failed"
    assert "CheckpointUnavailable" in (failed.failure_reason or "")


def test_a_policy_needs_at_least_one_step() -> None:
    with pytest.raises(ValueError):
        CheckpointPolicy(every_steps=0)
    assert CheckpointPolicy() == CheckpointPolicy(every_steps=1, on_completion=True)


async def test_a_resource_without_a_policy_registers_no_checkpointing(harness: Harness) -> None:
    driver = FakeDriver()

    async def process() -> str:
        await rebuno.resource("db", driver=driver)
        return "ok"

    async with harness.serve("plain", process):
        done = await harness.run("plain")
    async with httpx.AsyncClient(base_url=harness.kernel_url) as http:
        points = (await http.get(f"/v0/executions/{done.id}/fork-points")).json()
    assert done.status == "completed"
    assert points["checkpoints"] == []
    registered = [e for e in await events(harness, done.id) if e["type"] == "resource.registered"]
    assert registered[0]["payload"]["every_steps"] == 0
