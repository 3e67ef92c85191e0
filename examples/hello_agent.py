"""A minimal agent with two tools.

make dev                           # terminal 1: the kernel on http://127.0.0.1:8080
python examples/hello_agent.py     # terminal 2: this agent on port 5001
python examples/client.py hello '{"name": "Ada"}'
"""

import os

from rebuno import Agent, tool


@tool
async def greet(name: str) -> str:
    return f"Hello, {name}!"


@tool("text.count_letters")
async def count_letters(text: str) -> int:
    return sum(character.isalpha() for character in text)


async def process(name: str) -> dict[str, object]:
    greeting = await greet(name)
    letters = await count_letters(greeting)
    return {"greeting": greeting, "letters": letters}


agent = Agent(
    "hello",
    secret=os.environ.get("REBUNO_AGENT_SECRET", "hello-dev-secret"),
    base_url=os.environ.get("REBUNO_URL", "http://127.0.0.1:8080"),
)

if __name__ == "__main__":
    agent.run(process, host="127.0.0.1", port=int(os.environ.get("PORT", "5001")))
