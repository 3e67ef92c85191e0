"""An agent process built with this SDK, served by `Agent.run()`, that writes into an external
resource with a checkpoint policy (docs/protocol.md §33): `rebuno.resource("workspace", ...,
CheckpointPolicy(every_steps=2))`, then `steps` writes, each a tool declaring the resource.

The provider is a directory: a sandbox is a JSON file `box-<n>.json` holding the numbers
written to it, a checkpoint a copy `snap-<n>.json`, so a restarted process opens the same
sandbox from its binding.

Configured by the environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `AGENT_ID`, `PORT`,
`PROVIDER` (the provider's directory), `LEDGER` (each write's body appends `<i> <pid>` there
and fsyncs before it returns) and `CRASH_AT` (the write whose body, once its line is in the
ledger and its number in the sandbox, kills this process with SIGKILL) or `CRASH_AT_SNAPSHOT`
(the checkpoint ref whose capture kills it, before the copy is made).

Imports the public SDK and the standard library.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import rebuno
from rebuno import Agent, CheckpointPolicy, tool

PROVIDER = Path(os.environ["PROVIDER"])
LEDGER = Path(os.environ["LEDGER"])
CRASH_AT = int(os.environ.get("CRASH_AT") or 0)
CRASH_AT_SNAPSHOT = os.environ.get("CRASH_AT_SNAPSHOT")


class Box:
    """One sandbox: the set of numbers written to it, saved on every write."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def items(self) -> list[int]:
        found: list[int] = json.loads(self.path.read_text())
        return found

    def add(self, i: int) -> None:
        _save(self.path, sorted({*self.items(), i}))


def _save(path: Path, items: list[int]) -> None:
    path.write_text(json.dumps(items))
    with path.open("a") as file:
        os.fsync(file.fileno())


class DirectoryDriver:
    """The driver of the directory provider."""

    driver_id = "test.directory.v1"

    def create(self, checkpoint_ref: str | None = None) -> tuple[Box, dict[str, int]]:
        number = len(list(PROVIDER.glob("box-*.json"))) + 1
        box = Box(PROVIDER / f"box-{number}.json")
        start = Box(PROVIDER / f"{checkpoint_ref}.json").items() if checkpoint_ref else []
        _save(box.path, start)
        return box, {"box": number}

    def open(self, binding: dict[str, int]) -> Box:
        return Box(PROVIDER / f"box-{binding['box']}.json")

    def checkpoint(self, box: Box) -> str:
        ref = f"snap-{len(list(PROVIDER.glob('snap-*.json')))}"
        if ref == CRASH_AT_SNAPSHOT:
            os.kill(os.getpid(), signal.SIGKILL)
        _save(PROVIDER / f"{ref}.json", box.items())
        return ref


DRIVER = DirectoryDriver()


@tool("write", resources=["workspace"])
async def write(i: int) -> int:
    box = await rebuno.resource("workspace", driver=DRIVER)
    box.add(i)
    pid = os.getpid()
    with LEDGER.open("a") as ledger:
        ledger.write(f"{i} {pid}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    if i == CRASH_AT:
        os.kill(pid, signal.SIGKILL)
    return i


async def build(steps: int) -> dict[str, Any]:
    """Writes 1 to `steps`; the output is the sandbox's numbers at the end."""
    policy = CheckpointPolicy(every_steps=2)
    box = await rebuno.resource("workspace", driver=DRIVER, checkpoints=policy)
    for i in range(1, steps + 1):
        await write(i)
    return {"items": box.items()}


if __name__ == "__main__":
    Agent(os.environ["AGENT_ID"]).run(build, host="127.0.0.1", port=int(os.environ["PORT"]))
