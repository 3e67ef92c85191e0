"""A first delivery's acknowledgement and its execution's end are tried optimistically, each
as one statement on the record read before (the claim's, then the acknowledgement's); when
the execution changed in between they take the ordinary way, with the same outcome. Each
test checks the outcome against what the ordinary way records."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from harness.polling import wait_until
from rebuno.kernel.domain.errors import ExecutionTerminal, LeaseSuperseded
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.service.shortcuts import RUN_INPUT_LIMIT
from rebuno.kernel.store.base import ClaimedDispatch
from rebuno.protocol.enums import ExecutionStatus, StepKind, StepStatus
from tests.counting import Counting
from tests.kernel.conftest import AGENT, Answering, Run, redeliver, request
from tests.kernel.test_step_records import STEP_EVENTS, report
from tests.support import ManualClock, parked

FIRST_EVENTS = ["execution.created", "dispatch.queued", "dispatch.acked", "execution.started"]


async def claimed(kernel: Kernel) -> tuple[ClaimedDispatch, Run]:
    execution = await kernel.create_execution(AGENT, '{"topic":"x"}', None)
    [claim] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution.id]
    lease = Lease(claim.dispatch.id, claim.dispatch.attempt)
    return claim, Run(kernel, execution.id, lease)


async def delivered(kernel: Kernel) -> Run:
    claim, run = await claimed(kernel)
    await kernel.deliver(claim, Answering())
    return run


async def test_a_first_acknowledgement_starts_the_execution(kernel: Kernel) -> None:
    run = await delivered(kernel)

    assert await run.event_types() == FIRST_EVENTS
    stored = await run.execution()
    assert stored.status is ExecutionStatus.RUNNING


async def test_the_end_of_a_first_run_is_one_optimistic_transaction(
    kernel: Kernel, counts: Counting
) -> None:
    run = await delivered(kernel)
    counts.reset()

    await kernel.complete_execution(run.execution_id, AGENT, run.lease, "null", (report(1),))

    assert (await run.execution()).status is ExecutionStatus.COMPLETED
    if kernel.shortcuts.enabled:
        assert counts.transactions == {"optimistic": 1}
    else:
        assert counts.transactions == {"locked": 1}


async def test_an_acknowledgement_after_the_agent_wrote_takes_the_ordinary_way(
    kernel: Kernel,
) -> None:
    claim, run = await claimed(kernel)
    await run.submit()  # the agent's first write lands before the acknowledgement

    await kernel.deliver(claim, Answering())

    types = await run.event_types()
    assert types.count("execution.started") == 1
    assert types[-1] == "dispatch.acked"


async def test_an_acknowledgement_after_the_end_records_nothing(kernel: Kernel) -> None:
    claim, run = await claimed(kernel)
    await kernel.complete_execution(run.execution_id, AGENT, run.lease, "null")
    before = await run.event_types()

    await kernel.deliver(claim, Answering())

    assert await run.event_types() == before
    assert (await run.execution()).status is ExecutionStatus.COMPLETED


@dataclass
class EndingFirst(Answering):
    """An agent that ends the run (with one report) before its acknowledgement reaches the
    kernel, as a fast agent does when the webhook carries the input."""

    kernel: Kernel | None = None
    run: Run | None = None
    ending: list[asyncio.Task[None]] = field(default_factory=list)

    async def answer(self, execution_id: str) -> None:
        assert self.kernel is not None and self.run is not None
        end = self.kernel.complete_execution(
            execution_id, AGENT, self.run.lease, "null", (report(1, "1"),)
        )
        self.ending.append(asyncio.create_task(end))
        # The end gets as far as it can before the answer arrives: it waits on the event the
        # kernel's shortcuts keep while they record the acknowledgement. Private, since only
        # this test needs to know that a task waits there.
        acknowledging = self.kernel.shortcuts._acknowledging
        await wait_until(lambda: parked(acknowledging.get(execution_id)), message="the end waits")
        assert not self.ending[0].done()


@pytest.mark.parametrize("shortcuts", [True], ids=["shortcuts"])
async def test_an_end_before_the_acknowledgement_is_recorded_waits_for_it(
    kernel: Kernel,
) -> None:
    claim, run = await claimed(kernel)
    agent = EndingFirst(kernel=kernel, run=run)

    await kernel.deliver(claim, agent)
    await agent.ending[0]

    assert await run.event_types() == [*FIRST_EVENTS, *STEP_EVENTS, "execution.completed"]
    assert (await run.execution()).status is ExecutionStatus.COMPLETED


@dataclass
class EndingAtOnce(Answering):
    """An agent whose whole run ends before its acknowledgement reaches the kernel."""

    kernel: Kernel | None = None
    run: Run | None = None

    async def answer(self, execution_id: str) -> None:
        assert self.kernel is not None and self.run is not None
        end = (report(1, "1"),)
        await self.kernel.complete_execution(execution_id, AGENT, self.run.lease, "null", end)


@pytest.mark.parametrize("shortcuts", [False], ids=["no-shortcuts"])
async def test_without_shortcuts_an_end_before_the_acknowledgement_ends_the_run(
    kernel: Kernel,
) -> None:
    claim, run = await claimed(kernel)

    await kernel.deliver(claim, EndingAtOnce(kernel=kernel, run=run))

    types = await run.event_types()
    assert (await run.execution()).status is ExecutionStatus.COMPLETED
    assert types.count("execution.started") == 1
    assert types[-1] == "execution.completed"


async def test_a_first_run_ends_with_its_reports_at_their_first_occurrences(
    kernel: Kernel,
) -> None:
    run = await delivered(kernel)

    await kernel.complete_execution(
        run.execution_id, AGENT, run.lease, '{"done":1}', (report(1, "1"), report(1, "2"))
    )

    steps = await kernel.list_steps(run.execution_id, None)
    assert [(s.occurrence, s.status, s.result) for s in steps] == [
        (0, StepStatus.SUCCEEDED, "1"),
        (1, StepStatus.SUCCEEDED, "2"),
    ]
    assert await run.event_types() == [*FIRST_EVENTS, *STEP_EVENTS * 2, "execution.completed"]
    done = await run.execution()
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, '{"done":1}')


async def test_reports_after_a_submitted_step_continue_its_occurrences(kernel: Kernel) -> None:
    run = await delivered(kernel)
    first = await run.submit(request(target="work", args='{"n":1}', kind=StepKind.LOCAL))
    assert first.step_id is not None
    await run.complete(first.step_id, "0")

    await kernel.complete_execution(run.execution_id, AGENT, run.lease, "null", (report(1, "1"),))

    steps = await kernel.list_steps(run.execution_id, None)
    assert [(s.occurrence, s.result) for s in steps] == [(0, "0"), (1, "1")]
    assert (await run.execution()).status is ExecutionStatus.COMPLETED


async def test_a_replaced_lease_cannot_end_a_first_run(kernel: Kernel, clock: ManualClock) -> None:
    run = await delivered(kernel)
    again = await redeliver(kernel, clock, run)

    with pytest.raises(LeaseSuperseded):
        await kernel.complete_execution(run.execution_id, AGENT, run.lease, "null")

    await kernel.complete_execution(again.execution_id, AGENT, again.lease, "null")
    assert (await again.execution()).status is ExecutionStatus.COMPLETED


async def test_a_first_run_cancelled_meanwhile_stays_cancelled(kernel: Kernel) -> None:
    run = await delivered(kernel)
    await kernel.cancel_execution(run.execution_id)

    with pytest.raises(ExecutionTerminal):
        await kernel.complete_execution(run.execution_id, AGENT, run.lease, "null", (report(1),))

    assert (await run.execution()).status is ExecutionStatus.CANCELLED
    assert await kernel.list_steps(run.execution_id, None) == []


async def test_a_remembered_record_the_execution_moved_past_takes_the_ordinary_way(
    kernel: Kernel,
) -> None:
    claim, run = await claimed(kernel)
    await kernel.deliver(claim, Answering())
    # The record from before the acknowledgement, as a replica might have remembered it.
    kernel.shortcuts.claimed_first(run.lease, claim.execution, None)

    await kernel.complete_execution(run.execution_id, AGENT, run.lease, "null", (report(1),))

    types = await run.event_types()
    assert types == [*FIRST_EVENTS, *STEP_EVENTS, "execution.completed"]
    assert (await run.execution()).last_event_seq == len(types)


async def test_a_first_run_with_a_long_input_is_not_held_and_ends_the_ordinary_way(
    kernel: Kernel, counts: Counting
) -> None:
    long_input = '{"text":"' + "x" * RUN_INPUT_LIMIT + '"}'
    execution = await kernel.create_execution(AGENT, long_input, None)
    [claim] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution.id]
    await kernel.deliver(claim, Answering())
    counts.reset()

    lease = Lease(claim.dispatch.id, claim.dispatch.attempt)
    await kernel.complete_execution(execution.id, AGENT, lease, "null", (report(1),))

    assert counts.transactions == {"locked": 1}

    done = await kernel.get_execution(execution.id)
    assert (done.status, done.origin.input) == (ExecutionStatus.COMPLETED, long_input)
