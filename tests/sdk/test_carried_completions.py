"""Our SDK uses the kernel's `step-completions` extension: a `safe_to_retry` step's result
travels with the next kernel call (same transaction, so its events share `occurred_at`), and
waits no longer than a moment when the handler has no next call. The kernel here offers no
`step-records`, so every step is submitted before it runs (see test_step_records.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from harness.polling import wait_until
from rebuno import execution, step, tool
from rebuno.kernel.config import Settings
from tests.sdk.conftest import Harness


@pytest.fixture
def kernel_settings(kernel_settings: Settings) -> Settings:
    return replace(kernel_settings, step_records=False)


async def test_result_travels_with_the_next_submission(harness: Harness) -> None:
    async def handler() -> int:
        first: int = await step("first", lambda: 1)
        second: int = await step("second", lambda: 2)
        return first + second

    async with harness.serve("carrier", handler):
        done = await harness.run("carrier")

    assert done.status == "completed" and done.output == 3
    events = await harness.client.events(done.id, limit=1000)
    by_type = {(e.type, e.payload.get("step_id")): e for e in events}
    steps = await harness.client.list_steps(done.id)
    first, second = steps[0].step_id, steps[1].step_id
    assert by_type[("step.succeeded", first)].occurred_at == (
        by_type[("step.proposed", second)].occurred_at
    )
    assert by_type[("step.succeeded", second)].occurred_at == (
        next(e for e in events if e.type == "execution.completed").occurred_at
    )


async def test_result_is_sent_alone_when_the_handler_lingers(harness: Harness) -> None:
    release = asyncio.Event()

    @tool
    async def fetch() -> str:
        return "page"

    async def handler() -> str:
        page: str = await fetch()
        await release.wait()
        return page

    async with harness.serve("lingerer", handler):
        created = await harness.client.create("lingerer")

        async def recorded() -> bool:
            steps = await harness.client.list_steps(created.id)
            return bool(steps) and steps[0].status == "succeeded"

        await wait_until(recorded, timeout=5, message="the step recorded while the handler waits")
        release.set()
        done = await harness.client.wait(created.id, timeout=10)

    assert done.status == "completed" and done.output == "page"


async def test_at_most_once_results_are_recorded_before_the_body_returns(
    harness: Harness,
) -> None:
    seen: list[str] = []

    @tool(idempotency="at_most_once")
    async def charge() -> str:
        return "charged"

    async def handler() -> str:
        result: str = await charge()
        steps = await harness.client.list_steps(execution().id)
        seen.append(steps[0].status)
        return result

    async with harness.serve("charger", handler):
        done = await harness.run("charger")

    assert done.status == "completed"
    assert seen == ["succeeded"]
