"""`Numbering` (`step-occurrences`): each submission carries the occurrence the kernel would have
counted (docs/protocol.md §7.3); identical ones go one at a time in the order they started, a
submission the kernel did not count leaves the count, and other keys never wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import pytest

from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import encode_json
from rebuno.sdk._numbering import Answer, Numbering, counted
from rebuno.types import StepDecision
from tests.sdk.conftest import Harness
from tests.sdk.context.conftest import Webhook, delivered

ONCE_AN_HOUR = """
default_action: allow
rules:
  - id: once
    when: {target: search}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1h}
"""
ARGS = encode_json({"query": "durable agents"})


def sender(dispatch: Dispatch, target: str, sent: list[int]) -> Callable[..., Awaitable[Answer]]:
    """The kernel's submission of `target` with `ARGS`, noting each occurrence it sends."""
    submit = partial(
        dispatch.kernel.submit_step,
        dispatch.execution_id,
        dispatch.lease,
        kind="tool_call",
        target=target,
        args=ARGS,
        idempotency="safe_to_retry",
    )

    async def send(*, occurrence: int) -> Answer:
        sent.append(occurrence)
        return await submit(occurrence=occurrence)

    return send


@pytest.fixture
async def limited(harness: Harness, webhook: Webhook) -> AsyncIterator[Dispatch]:
    """A dispatch of an agent whose policy lets `search` proceed once an hour."""
    await harness.register("limited", webhook.url, policy=ONCE_AN_HOUR)
    dispatch = await delivered(harness, webhook, "limited")
    try:
        yield dispatch
    finally:
        await dispatch.kernel.aclose()


async def test_identical_submissions_started_together_take_successive_occurrences(
    harness: Harness, limited: Dispatch
) -> None:
    numbering, sent = Numbering(), list[int]()
    send = sender(limited, "fetch", sent)

    answers = await asyncio.gather(
        *(numbering.submit("tool_call", "fetch", ARGS, send) for _ in range(3))
    )

    assert sent == [0, 1, 2]
    steps = await harness.client.list_steps(limited.execution_id)
    assert [(s.occurrence, s.step_id) for s in steps] == [
        (0, answers[0][0].step_id),
        (1, answers[1][0].step_id),
        (2, answers[2][0].step_id),
    ]


async def test_a_submission_the_kernel_did_not_count_leaves_the_count(limited: Dispatch) -> None:
    numbering, sent = Numbering(), list[int]()
    send = sender(limited, "search", sent)

    decisions = [
        (await numbering.submit("tool_call", "search", ARGS, send))[0].decision for _ in range(3)
    ]

    assert decisions == ["proceed", "rate_limited", "rate_limited"]
    assert sent == [0, 1, 1]


async def test_other_keys_do_not_wait_for_a_key_in_flight(limited: Dispatch) -> None:
    numbering, sent = Numbering(), list[int]()
    release = asyncio.Event()
    fetch = sender(limited, "fetch", sent)

    async def held(*, occurrence: int) -> Answer:
        await release.wait()
        return await fetch(occurrence=occurrence)

    first = asyncio.create_task(numbering.submit("tool_call", "fetch", ARGS, held))
    again = asyncio.create_task(numbering.submit("tool_call", "fetch", ARGS, fetch))
    other = await numbering.submit("tool_call", "other", ARGS, sender(limited, "other", sent))
    waited = again.done()
    release.set()
    await asyncio.gather(first, again)

    assert other[0].decision == "proceed"
    assert not waited  # the identical one waits for the first's answer
    assert sent == [0, 0, 1]


@pytest.mark.parametrize(
    ("decision", "approval_id", "expected"),
    [
        ("proceed", None, True),
        ("replay", None, True),
        ("denied", None, True),
        ("blocked", "approval-1", True),
        ("rate_limited", None, False),
        ("blocked", None, False),
        ("execution_blocked", None, False),
    ],
)
def test_the_kernel_counts_what_it_decided_from_the_step_or_holds_for_approval(
    decision: str, approval_id: str | None, expected: bool
) -> None:
    answer = StepDecision(decision=decision, step_id="s" * 64, approval_id=approval_id)

    assert counted(answer) is expected


def test_an_answer_naming_no_step_is_never_counted() -> None:
    assert not counted(StepDecision(decision="execution_terminal", step_id=""))
