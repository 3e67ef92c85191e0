"""An agent written against the official Rebuno Python SDK 0.29.2 that uses an external
resource with a checkpoint policy, for tests/e2e/test_official_resources.py, run unchanged
against our kernel.

`URL PORT` serves the agent `builder`: it registers `workspace` (a sandbox kept in this
process, `CheckpointPolicy(every_steps=2)`), calls two tools that change it and one that does
not, and answers the sandbox's files. The driver notes each `create` in SIDE.
"""

import os
import sys
from typing import Any, ClassVar

import rebuno
from rebuno import Agent, CheckpointPolicy, CheckpointUnavailable, tool

SIDE = os.environ.get("SIDE_FILE", "")


def note(what: str) -> None:
    with open(SIDE, "a") as fh:
        fh.write(what + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class Sandboxes:
    driver_id = "test.sandbox.v1"
    configuration: ClassVar[dict[str, str]] = {"size": "small"}
    coverage_reuse = False

    def __init__(self) -> None:
        self.snapshots: dict[str, dict[str, bool]] = {}
        self.boxes: dict[str, dict[str, bool]] = {}

    async def create(self, checkpoint_ref: str | None = None) -> tuple[dict[str, bool], Any]:
        note(f"create {checkpoint_ref or '-'}")
        if checkpoint_ref is not None and checkpoint_ref not in self.snapshots:
            raise CheckpointUnavailable(f"no snapshot {checkpoint_ref}")
        box = dict(self.snapshots.get(checkpoint_ref or "", {}))
        name = f"sbx-{len(self.boxes)}"
        self.boxes[name] = box
        return box, {"sandbox": name}

    async def open(self, binding: Any) -> dict[str, bool]:
        return self.boxes[binding["sandbox"]]

    async def checkpoint(self, box: dict[str, bool]) -> str:
        ref = f"snap-{len(self.snapshots)}"
        self.snapshots[ref] = dict(box)
        return ref


SANDBOXES = Sandboxes()
OPENED: dict[str, dict[str, bool]] = {}
"""The handle `builder` opened, by execution: a tool body runs under the SDK's effects lock,
so it uses the handle rather than calling `resource()` again."""


@tool("write", resources=["workspace"])
async def write(name: str) -> str:
    OPENED[rebuno.execution().id][name] = True
    return name


@tool("look")
async def look() -> int:
    return len(SANDBOXES.boxes)


async def builder() -> list[str]:
    box = await rebuno.resource(
        "workspace", driver=SANDBOXES, checkpoints=CheckpointPolicy(every_steps=2)
    )
    OPENED[rebuno.execution().id] = box
    await write("a")
    await write("b")
    await look()
    return sorted(box)


if __name__ == "__main__":
    url, port = sys.argv[1], int(sys.argv[2])
    Agent("builder", secret="resources-secret", base_url=url).run(
        builder, host="127.0.0.1", port=port
    )
