"""Agents for the CLI tests, written with this SDK and served by `Agent.run()`.

Configured by the environment: `AGENT_ID` (`greeter`, `gated` or `streamer`), `REBUNO_URL`,
`REBUNO_AGENT_SECRET` and `PORT`. The streamer publishes `tick` deltas until the process gets
SIGUSR1, so a test can attach a stream first and then let the run finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Awaitable, Callable
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


@functools.cache
def gate() -> asyncio.Event:
    """Set by SIGUSR1, and open from then on. Made inside the agent's loop before the first
    tick, so the test's signal never meets the default action (which ends the process)."""
    opened = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, opened.set)
    return opened


async def streamer() -> dict[str, Any]:
    context = execution()
    decision = await context.begin_llm("ticker", {"prompt": "tick"})
    opened = gate()
    seq = 0
    while not opened.is_set():
        await context.publish_llm_delta(decision.step_id, seq, f"tick{seq} ")
        seq += 1
        # The ticks' pace, as a model's tokens come; the gate opening ends the wait at once.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(opened.wait(), _TICK_SECONDS)
    await context.record_llm(decision.step_id, {"status": 200, "headers": {}, "body": "done"})
    return {"ticks": seq}


HANDLERS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    "greeter": greeter,
    "gated": gated,
    "streamer": streamer,
}

if __name__ == "__main__":
    agent_id = os.environ["AGENT_ID"]
    agent = Agent(agent_id, description=f"the {agent_id} of the CLI tests")
    agent.run(HANDLERS[agent_id], host="127.0.0.1", port=int(os.environ["PORT"]))
