"""The agent the cluster scenarios run: `steps` durable steps, each of which thinks for `pause`
seconds before it returns (as a model call or a slow tool would), so executions are in flight
long enough for a fault to land inside them.

Run as `python -m chaos.thinking_agent`; configured by the environment: `REBUNO_URL`,
`REBUNO_AGENT_SECRET`, `CHAOS_AGENT_ID` and `CHAOS_PORT`. Served as a user serves an agent
(`Agent.app` under uvicorn). Imports only the public SDK.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import uvicorn

from rebuno import Agent, step


async def think(i: int, pause: float) -> dict[str, Any]:
    await asyncio.sleep(pause)
    return {"i": i}


async def work(steps: int, pause: float = 0.0) -> dict[str, Any]:
    last: Any = None
    for i in range(steps):
        last = await step("think", think, args={"i": i, "pause": pause})
    return {"steps": steps, "last": last}


def main() -> None:
    agent = Agent(os.environ["CHAOS_AGENT_ID"])
    agent.bind(work)
    uvicorn.run(
        agent.app,
        host="127.0.0.1",
        port=int(os.environ["CHAOS_PORT"]),
        lifespan="on",
        interface="asgi3",
        log_level="warning",
    )


if __name__ == "__main__":
    main()
