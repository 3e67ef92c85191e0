"""Our SDK runs the handler on the input a webhook carries (`execution-input`) without reading
the execution first; a webhook without it (a larger input) is read over the API."""

from __future__ import annotations

from typing import Any

from harness.polling import wait_until
from rebuno import execution
from tests.sdk.conftest import Harness


async def reads(harness: Harness) -> float:
    """How many times the kernel has answered `GET /v0/executions/{id}` so far."""
    return await harness.answered("GET", "/v0/executions/{execution_id}")


async def run_counting_reads(harness: Harness, agent_id: str, input: Any) -> tuple[Any, float]:
    """The execution's output, and how many reads of an execution its run made. The test
    waits on the event log, which is another route."""
    before = await reads(harness)
    created = await harness.client.create(agent_id, input=input)

    async def ended() -> bool:
        events = await harness.client.events(created.id)
        return any(e.type == "execution.completed" for e in events)

    await wait_until(ended, timeout=20, message="the execution completed")
    made = await reads(harness) - before
    return (await harness.client.get(created.id)).output, made


async def test_a_small_input_runs_without_reading_the_execution(harness: Harness) -> None:
    seen: list[tuple[str, str]] = []

    async def process(topic: str) -> str:
        seen.append((topic, execution().status))
        return topic.upper()

    async with harness.serve("carried", process):
        output, made = await run_counting_reads(harness, "carried", {"topic": "durable"})

    assert output == "DURABLE"
    assert seen == [("durable", "running")]
    assert made == 0


async def test_a_large_input_is_read_over_the_api(harness: Harness) -> None:
    async def process(text: str) -> int:
        return len(text)

    async with harness.serve("read", process):
        output, made = await run_counting_reads(harness, "read", {"text": "x" * 4096})

    assert output == 4096
    assert made == 1
