"""What no request can carry never goes out and is never lost: outcomes that fit alone but
not together travel in separate requests, and a result or output that can never fit fails at
once with `payload_too_large`, recorded, so a redelivery replays the failure instead of
running the tool again. The limits are scaled down here (64 KiB bodies) to keep the test
small; the SDK's and the kernel's are 10 MiB by default."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rebuno import ToolError, step
from rebuno.kernel.config import Settings
from rebuno.sdk import _carried
from tests.sdk.conftest import Harness

BODY_LIMIT = 64 * 1024
RECORDED_LIMIT = BODY_LIMIT - 8 * 1024


@pytest.fixture(autouse=True)
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_carried, "MAX_REQUEST_BYTES", BODY_LIMIT)
    monkeypatch.setattr(_carried, "MAX_RECORDED_BYTES", RECORDED_LIMIT)


@pytest.fixture
def kernel_settings(kernel_settings: Settings) -> Settings:
    return replace(kernel_settings, max_body_bytes=BODY_LIMIT)


def blob(size: int) -> str:
    return "x" * size


@pytest.mark.parametrize("durability", ["durable", "batched"])
async def test_results_that_fit_alone_but_not_together_are_all_recorded(
    harness: Harness, durability: Any
) -> None:
    async def handler() -> int:
        first: str = await step("first", lambda: blob(RECORDED_LIMIT * 6 // 10))
        second: str = await step("second", lambda: blob(RECORDED_LIMIT * 6 // 10))
        return len(first) + len(second)

    async with harness.serve("big-results", handler, durability=durability):
        done = await harness.run("big-results")

    assert done.status == "completed", done
    steps = await harness.client.list_steps(done.id)
    assert [(s.target, s.status, len(s.result or "")) for s in steps] == [
        ("first", "succeeded", RECORDED_LIMIT * 6 // 10),
        ("second", "succeeded", RECORDED_LIMIT * 6 // 10),
    ]


@pytest.mark.parametrize("idempotency", ["safe_to_retry", "at_most_once"])
async def test_a_result_that_can_never_fit_fails_its_step_at_once_and_for_good(
    harness: Harness, idempotency: str
) -> None:
    runs: list[int] = []
    caught: list[str] = []

    async def huge() -> str:
        runs.append(1)
        return blob(RECORDED_LIMIT + 1)

    async def handler() -> str:
        try:
            await step("huge", huge, idempotency=idempotency)
        except ToolError as exc:
            caught.append(str(exc))
        return "handled"

    async with harness.serve("huge-result", handler):
        done = await harness.run("huge-result")

    assert (done.status, done.output) == ("completed", "handled")
    assert runs == [1]
    assert len(caught) == 1 and "payload_too_large" in caught[0]
    [recorded] = await harness.client.list_steps(done.id)
    assert recorded.status == "failed"
    assert "payload_too_large" in str(recorded.error)


async def test_an_output_that_can_never_fit_fails_the_execution_saying_why(
    harness: Harness,
) -> None:
    async def handler() -> str:
        return blob(RECORDED_LIMIT + 1)

    async with harness.serve("huge-output", handler):
        done = await harness.run("huge-output")

    assert done.status == "failed"
    assert "payload_too_large" in (done.failure_reason or "")
