"""A conversation and a sub-agent written against the official Rebuno Python SDK 0.29.2, run
unchanged against our kernel. `agent URL PORT [NAME]` serves `chat` (its handler counts turns
through `previous()` and `Result(output, state)`), `parent` (a tool runs `child` through
`subagent()`) or `child`; `create URL` makes three turns of one session with the SDK's
`Client` (the first twice, under one idempotency key) and prints their ids; `read URL IDS...`
prints them as the SDK's models parse them.
"""

import asyncio
import json
import sys
from typing import Any

import rebuno
from rebuno import Agent, Client, Result, tool


async def chat(message: str) -> Result:
    before = await rebuno.previous() or {}
    turns = before.get("turns", 0) + 1
    return Result(output={"reply": message.upper(), "turns": turns}, state={"turns": turns})


@tool
async def research(topic: str) -> Any:
    return await rebuno.subagent("child", {"topic": topic})


async def parent(topic: str) -> dict[str, Any]:
    return {"report": await research(topic)}


async def child(topic: str) -> dict[str, str]:
    return {"found": topic.upper()}


async def converse(url: str) -> list[str]:
    """Creates the three turns; the first twice, under one key, must name one execution."""
    async with Client(base_url=url) as client:
        first = await client.create(
            "chat", {"message": "hi"}, session="talk", idempotency_key="turn-1"
        )
        again = await client.create(
            "chat", {"message": "ignored"}, session="talk", idempotency_key="turn-1"
        )
        assert again.id == first.id, (again, first)
        ids = [first.id]
        for message in ("how", "bye"):
            ids.append((await client.create("chat", {"message": message}, session="talk")).id)
        return ids


async def read(url: str, ids: list[str]) -> list[dict[str, Any]]:
    """The executions as the SDK's models parse them."""
    async with Client(base_url=url) as client:
        return [(await client.get(i)).model_dump(mode="json") for i in ids]


if __name__ == "__main__":
    if sys.argv[1] == "agent":
        handlers = {"chat": chat, "parent": parent, "child": child}
        name = sys.argv[4] if len(sys.argv) > 4 else "chat"
        Agent(name, secret="chat-secret", base_url=sys.argv[2]).run(
            handlers[name], host="127.0.0.1", port=int(sys.argv[3])
        )
    elif sys.argv[1] == "create":
        print(json.dumps(asyncio.run(converse(sys.argv[2]))))
    else:
        print(json.dumps(asyncio.run(read(sys.argv[2], sys.argv[3:]))))
