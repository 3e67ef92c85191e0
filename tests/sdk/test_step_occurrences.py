"""Our SDK numbers its own submissions when the kernel offers `step-occurrences` (every delivery
but a first one without policy): identical steps in flight at once each get their own
occurrence, in the order the handler started them, so a later delivery replays each one's
recorded outcome to the same call, and a failed one as a failure."""

from __future__ import annotations

import asyncio
from itertools import count

from harness.polling import wait_until
from rebuno import ToolError, step, tool
from rebuno.types import ExecutionStatus
from tests.sdk.conftest import Harness
from tests.sdk.test_agent import APPROVE_SEND


async def test_identical_steps_at_once_replay_to_the_same_calls(harness: Harness) -> None:
    draws = count(1)
    seen: list[list[int | str]] = []

    def draw() -> int:
        number = next(draws)
        if number == 3:
            raise ValueError("unlucky")
        return number

    async def one() -> int | str:
        try:
            return int(await step("draw", draw))
        except ToolError as exc:
            return str(exc)

    @tool
    async def send(text: str) -> str:
        return text

    async def process() -> str:
        numbers = list(await asyncio.gather(*(one() for _ in range(5))))
        seen.append(numbers)
        return str(await send(str(numbers)))

    async with harness.serve("lottery", process, policy=APPROVE_SEND):
        created = await harness.client.create("lottery")

        async def blocked() -> bool:
            return (await harness.client.get(created.id)).status is ExecutionStatus.BLOCKED

        await wait_until(blocked, timeout=20, message="the execution blocked on its approval")
        [approval] = await harness.client.list_approvals(execution_id=created.id)
        await harness.client.grant_approval(approval.id, decided_by="alice")
        done = await harness.client.wait(created.id, timeout=20)

    first = [1, 2, "draw: unlucky", 4, 5]
    assert seen == [first, first]
    assert done.output == str(first)
    assert next(draws) == 6
    steps = [s for s in await harness.client.list_steps(done.id) if s.target == "draw"]
    assert sorted((s.occurrence, s.status) for s in steps) == [
        (0, "succeeded"),
        (1, "succeeded"),
        (2, "failed"),
        (3, "succeeded"),
        (4, "succeeded"),
    ]
