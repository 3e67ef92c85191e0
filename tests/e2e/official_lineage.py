"""Agents and a client written against the official Rebuno Python SDK 0.29.2, for the
conversation, sub-agent, fork and idempotency scenarios of tests/e2e/test_official_lineage.py,
run unchanged against our kernel.

`agent NAME URL PORT` serves one agent:
- `chat`: counts turns through `previous()` and `Result(output, state)`; with `hold` in its
  input it waits for the process's SIGUSR1 first;
- `parent`: fans out to three `child` sub-agents through `subagent()` in parallel tools and
  completes with their outputs;
- `child`: notes its run in SIDE, waits for SIGUSR1, answers its topic upper-cased;
- `twostep`: two tools that note their runs in SIDE.
Each agent publishes a description at start-up; `parent` and `twostep` also an output schema
(a pydantic model, a dict).

`idempotent URL` creates one `twostep` execution ten times at once under one key, and prints
the ids it was answered.
"""

import asyncio
import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

import rebuno
from rebuno import Agent, Client, Result, tool

SIDE = os.environ.get("SIDE_FILE", "")


def note(what: str) -> None:
    with open(SIDE, "a") as fh:
        fh.write(what + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@functools.cache
def opened() -> asyncio.Event:
    """Set by SIGUSR1, and open from then on."""
    event = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, event.set)
    return event


async def gate() -> None:
    await opened().wait()


async def chat(message: str, hold: bool = False) -> Result:
    if hold:
        await gate()
    before = await rebuno.previous() or {}
    turns = before.get("turns", 0) + 1
    return Result(output={"reply": message.upper(), "turns": turns}, state={"turns": turns})


@tool
async def research(topic: str) -> Any:
    return await rebuno.subagent("child", {"topic": topic})


async def parent(topics: list[str]) -> dict[str, Any]:
    found = await asyncio.gather(*(research(topic) for topic in topics))
    return {"found": list(found)}


async def child(topic: str) -> str:
    note(f"child {topic}")
    await gate()
    return topic.upper()


@tool
async def first(n: int) -> int:
    note("first")
    return n + 1


@tool
async def second(n: int) -> int:
    note("second")
    return n * 2


async def twostep(n: int) -> int:
    return int(await second(await first(n)))


async def idempotent(url: str) -> list[str]:
    async with Client(base_url=url) as client:
        created = await asyncio.gather(
            *(client.create("twostep", {"n": 1}, idempotency_key="once") for _ in range(10))
        )
    return [execution.id for execution in created]


class Found(BaseModel):
    found: list[str]


OUTPUT_SCHEMAS: dict[str, Any] = {"parent": Found, "twostep": {"type": "integer"}}

HANDLERS: dict[str, Callable[..., Any]] = {
    "chat": chat,
    "parent": parent,
    "child": child,
    "twostep": twostep,
}

if __name__ == "__main__":
    if sys.argv[1] == "agent" and sys.argv[2] in ("chat", "child"):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until the loop's handler is set
    if sys.argv[1] == "agent":
        name, url, port = sys.argv[2], sys.argv[3], int(sys.argv[4])
        Agent(
            name,
            secret="lineage-secret",
            base_url=url,
            description=f"the {name} of the lineage scenarios",
            output_schema=OUTPUT_SCHEMAS.get(name),
        ).run(HANDLERS[name], host="127.0.0.1", port=port)
    else:
        print(json.dumps(asyncio.run(idempotent(sys.argv[2]))))
