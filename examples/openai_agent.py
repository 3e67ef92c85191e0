"""An agent whose LLM calls go through the official `openai` client and are recorded as steps.

Needs OPENAI_API_KEY (and OPENAI_BASE_URL for any OpenAI-compatible provider):

    make dev                            # terminal 1
    python examples/openai_agent.py     # terminal 2: this agent on port 5002
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
            reply = await llm.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": "You write one short paragraph."},
                    {"role": "user", "content": f"Explain {topic} to a new engineer."},
                ],
            )
        except Exception as exc:
            rebuno.raise_for_refusal(exc)  # a policy refusal unwinds as Blocked or PolicyError
            raise
    text = reply.choices[0].message.content or ""
    return {"paragraph": text, "words": await word_count(text)}


agent = Agent(
    "writer",
    secret=os.environ.get("REBUNO_AGENT_SECRET", "writer-dev-secret"),
    base_url=os.environ.get("REBUNO_URL", "http://127.0.0.1:8080"),
)

if __name__ == "__main__":
    agent.run(process, host="127.0.0.1", port=int(os.environ.get("PORT", "5002")))
