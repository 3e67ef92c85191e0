"""Agents for the CLI tests, written with this SDK and served by `Agent.run()`.

Configured by the environment: `AGENT_ID` (`greeter`, `gated` or `streamer`), `REBUNO_URL`,
`REBUNO_AGENT_SECRET`, `PORT`, and for the streamer `GATE_FILE`: it publishes `tick` deltas
until that file exists, so a test can attach a stream first and then let the run finish.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rebuno import Agent, execution, tool

_TICK_SECONDS = 0.05


@tool
async def shout(text: str) -> str:
    return text.upper()


@tool
async def shell_exec(command: str) -> str:
    return f"ran {command}"


async def greeter(name: str) -> dict[str, Any]:
    return {"greeting": await shout(f"hello {name}")}


async def gated(command: str) -> dict[str, Any]:
    # A denied tool call comes back as text the model can read, not as an exception.
    return {"ran": await shell_exec(command)}


async def streamer() -> dict[str, Any]:
    context = execution()
    decision = await context.begin_llm("ticker", {"prompt": "tick"})
    gate = Path(os.environ["GATE_FILE"])
    seq = 0
    while not gate.exists():
        await context.publish_llm_delta(decision.step_id, seq, f"tick{seq} ")
        seq += 1
        await asyncio.sleep(_TICK_SECONDS)
    await context.record_llm(decision.step_id, {"status": 200, "headers": {}, "body": "done"})
    return {"ticks": seq}


HANDLERS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    "greeter": greeter,
    "gated": gated,
    "streamer": streamer,
}

if __name__ == "__main__":
    agent_id = os.environ["AGENT_ID"]
    Agent(agent_id).run(HANDLERS[agent_id], host="127.0.0.1", port=int(os.environ["PORT"]))
