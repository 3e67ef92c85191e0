"""`Client` against a real kernel: executions, paging and filters, cancellation, steps,
approvals, waiting."""

from __future__ import annotations

import asyncio

import pytest

from harness.polling import wait_until
from rebuno import Client, NotFoundError, Terminated, ValidationError, tool
from rebuno.types import ExecutionStatus
from tests.sdk.conftest import Harness

NOWHERE = "http://127.0.0.1:9/webhook"
# Characters that break a query or a path when sent unescaped.
AWKWARD = "ops & co=1 +100% é?#"
GATE = """
rules:
  - id: gate-publish
    when: {step_kind: tool_call, target: publish}
    then:
      decision: require_approval
      approval_config: {message: publish needs a human, approvers: [alice]}
default_action: allow
"""


@tool
async def publish(text: str) -> str:
    return f"published {text}"


async def test_create_returns_pending_execution_with_its_input(harness: Harness) -> None:
    await harness.register("unserved", NOWHERE)

    created = await harness.client.create("unserved", {"x": [1, 2]})
    fetched = await harness.client.get(created.id)

    assert created.status is ExecutionStatus.PENDING
    assert (fetched.id, fetched.agent_id, fetched.input) == (created.id, "unserved", {"x": [1, 2]})


async def test_list_pages_newest_first(harness: Harness) -> None:
    await harness.register("unserved", NOWHERE)
    ids = [(await harness.client.create("unserved")).id for _ in range(3)]

    first = await harness.client.list(agent_id="unserved", limit=2)
    second = await harness.client.list(agent_id="unserved", limit=2, cursor=first.next_cursor)

    assert [e.id for e in first.executions] == ids[:0:-1]
    assert [e.id for e in second.executions] == ids[:1]
    assert second.next_cursor == ""


async def test_list_filters_by_an_agent_id_that_needs_escaping(harness: Harness) -> None:
    await harness.register(AWKWARD, NOWHERE)
    await harness.register("ops ", NOWHERE)
    created = await harness.client.create(AWKWARD)
    await harness.client.create("ops ")

    page = await harness.client.list(agent_id=AWKWARD)

    assert [(e.id, e.agent_id) for e in page.executions] == [(created.id, AWKWARD)]


async def test_invalid_status_filter_is_a_validation_error_naming_it_intact(
    harness: Harness,
) -> None:
    with pytest.raises(ValidationError) as raised:
        await harness.client.list(status="running & status=failed")

    assert raised.value.status_code == 400
    assert "'running & status=failed'" in raised.value.message


async def test_unknown_execution_is_not_found(harness: Harness) -> None:
    with pytest.raises(NotFoundError):
        await harness.client.get("01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f")


async def test_cancel_ends_execution_and_a_second_cancel_is_terminated(harness: Harness) -> None:
    await harness.register("unserved", NOWHERE)
    created = await harness.client.create("unserved")

    await harness.client.cancel(created.id)
    cancelled = await harness.client.wait(created.id, timeout=10)

    assert cancelled.status is ExecutionStatus.CANCELLED
    with pytest.raises(Terminated):
        await harness.client.cancel(created.id)


async def test_wait_times_out_on_an_execution_that_does_not_end(harness: Harness) -> None:
    await harness.register("unserved", NOWHERE)
    created = await harness.client.create("unserved")

    with pytest.raises(TimeoutError):
        await harness.client.wait(created.id, timeout=0.3)


async def test_wait_holds_its_reads_inside_a_short_request_timeout(harness: Harness) -> None:
    release = asyncio.Event()

    async def process() -> str:
        await release.wait()
        return "slow"

    async with harness.serve("slow", process):
        created = await harness.client.create("slow")
        before = await harness.answered("GET", "/v0/executions/{execution_id}")
        # Each held read must end before the 1.5 s request timeout, or waiting would fail.
        async with Client(base_url=harness.kernel_url, timeout=1.5) as impatient:
            waiting = asyncio.create_task(impatient.wait(created.id, timeout=20))

            async def held_twice() -> bool:
                answered = await harness.answered("GET", "/v0/executions/{execution_id}")
                return waiting.done() or answered - before >= 2

            await wait_until(held_twice, timeout=20, message="two held reads answered")
            release.set()
            done = await waiting

    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == "slow"


async def test_events_are_paged_by_after_seq(harness: Harness) -> None:
    async def process() -> str:
        return str(await publish("a"))

    async with harness.serve("publisher", process):
        done = await harness.run("publisher")

    every = await harness.client.events(done.id)
    later = await harness.client.events(done.id, after_seq=3, limit=2)

    assert [e.event_seq for e in every] == list(range(1, len(every) + 1))
    assert later == every[3:5]
    assert every[-1].type == "execution.completed"


async def test_steps_are_listed_filtered_and_fetched(harness: Harness) -> None:
    async def process() -> str:
        return str(await publish("b"))

    async with harness.serve("stepper", process):
        done = await harness.run("stepper")

    [listed] = await harness.client.list_steps(done.id, status="terminal")
    fetched = await harness.client.get_step(done.id, listed.step_id)

    assert fetched == listed
    assert (fetched.kind, fetched.target, fetched.args, fetched.result) == (
        "tool_call",
        "publish",
        {"text": "b"},
        "published b",
    )


async def test_approval_is_listed_fetched_and_granted(harness: Harness) -> None:
    async def process() -> str:
        return str(await publish("c"))

    async with harness.serve("careful", process, policy=GATE):
        created = await harness.client.create("careful")

        async def pending() -> bool:
            return bool(await harness.client.list_approvals(execution_id=created.id))

        await wait_until(pending, timeout=20)
        [approval] = await harness.client.list_approvals()
        fetched = await harness.client.get_approval(approval.id)
        await harness.client.grant_approval(approval.id, decided_by="alice", rationale="fine")
        done = await harness.client.wait(created.id, timeout=20)
        decided = await harness.client.get_approval(approval.id)

    assert (fetched.status, fetched.message, fetched.approvers) == (
        "pending",
        "publish needs a human",
        ["alice"],
    )
    assert (decided.status, decided.decided_by, decided.rationale) == ("granted", "alice", "fine")
    assert done.output == "published c"
    assert await harness.client.list_approvals() == []
    assert [a.id for a in await harness.client.list_approvals(status="all")] == [approval.id]
