"""An agent process for the end-to-end tests, written with this SDK and served by `Agent.run()`
(or, with `SERVE=uvicorn`, as `Agent.app` under uvicorn).

Configured by the environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `PORT`, `SIDE_FILE` (each
tool body appends its name there, so the test can count real runs), `HANG_IN` (the tool whose
body, once it ran, waits forever: the test kills the process there, after the effect and
before its result is recorded), and `PROVIDER_URL` (an OpenAI-compatible provider).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from rebuno import Agent, ToolError, http_client, tool

SIDE_FILE = Path(os.environ["SIDE_FILE"])


async def _effect(name: str) -> None:
    with SIDE_FILE.open("a") as side:
        side.write(name + "\n")
    if os.environ.get("HANG_IN") == name:
        await asyncio.Event().wait()


@tool
async def fetch(item: str) -> str:
    await _effect("fetch")
    return f"fetched {item}"


@tool(idempotency="at_most_once")
async def charge(item: str) -> str:
    await _effect("charge")
    return f"charged {item}"


async def shop(item: str) -> dict[str, Any]:
    fetched = await fetch(item)
    try:
        charged = await charge(item)
    except ToolError as exc:
        charged = f"unknown: {exc.message}"
    return {"fetched": fetched, "charged": charged}


async def ask(question: str) -> dict[str, Any]:
    http = http_client()
    # openai annotates `http_client` with its own httpx2 client type only, but it checks at
    # run time for an httpx2 or an httpx `AsyncClient` and takes either; ours is httpx's.
    provider = os.environ["PROVIDER_URL"]
    async with AsyncOpenAI(api_key="sk-e2e", base_url=provider, http_client=http) as llm:  # type: ignore[arg-type]
        reply = await llm.chat.completions.create(
            model="gpt-e2e", messages=[{"role": "user", "content": question}]
        )
    with SIDE_FILE.open("a") as side:
        side.write(reply.model_dump_json() + "\n")
    await _effect("after-llm")
    return {"answer": reply.choices[0].message.content}


HANDLERS = {"shop": shop, "ask": ask}

if __name__ == "__main__":
    agent_id = os.environ.get("AGENT_ID", "shop")
    agent = Agent(agent_id)
    port = int(os.environ["PORT"])
    if os.environ.get("SERVE") == "uvicorn":
        # `Agent.app` under a server of the user's own, which opens its port only after the
        # lifespan's startup (the instance is named by REBUNO_AGENT_INSTANCE).
        import uvicorn

        agent.bind(HANDLERS[agent_id])
        uvicorn.run(agent.app, host="127.0.0.1", port=port, lifespan="on", log_level="warning")
    else:
        agent.run(HANDLERS[agent_id], host="127.0.0.1", port=port)
