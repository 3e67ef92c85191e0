"""An agent whose LLM call goes through the official `openai` client, streamed, and recorded as
a step: clients see the answer grow (`Client.stream`, `rebuno exec stream`) while it runs.

With a provider, set OPENAI_API_KEY (and OPENAI_BASE_URL for any OpenAI-compatible one);
offline, point it at the stub in this directory:

    make dev                                     # terminal 1
    python examples/llm_stub.py                  # terminal 2: the stub on port 5010
    OPENAI_BASE_URL=http://127.0.0.1:5010/v1 OPENAI_API_KEY=stub \
        python examples/openai_agent.py          # terminal 3: this agent on port 5002
    python examples/client.py writer '{"topic": "durable execution"}'

A re-dispatch replays the recorded answer instead of calling the model again.
"""

import os

from openai import AsyncOpenAI

import rebuno
from rebuno import Agent, tool

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")


@tool
async def word_count(text: str) -> int:
    return len(text.split())


async def process(topic: str) -> dict[str, object]:
    async with AsyncOpenAI(http_client=rebuno.http_client(timeout=120.0)) as llm:
        try:
            stream = await llm.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": "You write one short paragraph."},
                    {"role": "user", "content": f"Explain {topic} to a new engineer."},
                ],
                stream=True,
            )
            parts = [
                chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices
            ]
        except Exception as exc:
            rebuno.raise_for_refusal(exc)  # a policy refusal unwinds as Blocked or PolicyError
            raise
    text = "".join(parts)
    return {"paragraph": text, "words": await word_count(text)}


agent = Agent(
    "writer",
    secret=os.environ.get("REBUNO_AGENT_SECRET", "writer-dev-secret"),
    base_url=os.environ.get("REBUNO_URL", "http://127.0.0.1:8080"),
)

if __name__ == "__main__":
    agent.run(process, host="127.0.0.1", port=int(os.environ.get("PORT", "5002")))
