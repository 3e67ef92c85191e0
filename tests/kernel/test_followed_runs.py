"""A run this process has followed since its first claim decides a new step, at the agent's own
occurrence, in one optimistic statement on what the process last wrote (docs/protocol.md §7.3
and §8): the same `plan.decide` as the locked way, with the same outcome.
Whatever moved meanwhile (a write of another replica, a cancel, a policy change, a replaced
lease) sends the submission the locked way. Each test checks the outcome, and the cost where
it is the point, with shortcuts on and off."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from rebuno.kernel.config import Settings
from rebuno.kernel.domain.decision import StepDecision, StepOutcome, StepRequest
from rebuno.kernel.domain.errors import LeaseSuperseded
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.executions import Labels
from rebuno.kernel.service.forks import ForkRequest
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.stream.memory import MemoryBus
from rebuno.protocol.enums import Decision, ExecutionStatus, StepStatus
from tests.counting import Counting
from tests.kernel.conftest import AGENT, Answering, Run, redeliver, request
from tests.support import ManualClock

ALLOW_ALL = "default_action: allow\n"
DENY_ALL = "default_action: deny\n"


async def followed(kernel: Kernel) -> Run:
    """An execution whose first delivery this kernel acknowledged."""
    execution = await kernel.create_execution(AGENT, '{"topic":"x"}', None)
    [claim] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution.id]
    await kernel.deliver(claim, Answering())
    return Run(kernel, execution.id, Lease(claim.dispatch.id, claim.dispatch.attempt))


async def submit(
    run: Run, n: int, done: StepDecision | None = None, result: str = '{"ok":1}'
) -> StepDecision:
    """Step `n` (its own key, occurrence 0), carrying the completion of `done`."""
    carried = () if done is None else (StepOutcome(done.step_id or "", result=result),)
    req: StepRequest = request("work", f'{{"n":{n}}}')
    return await run.kernel.submit_step(
        run.execution_id, AGENT, run.lease, req, carried, occurrence=0
    )


async def test_a_new_step_of_a_followed_run_is_one_optimistic_transaction(
    kernel: Kernel, counts: Counting
) -> None:
    run = await followed(kernel)
    counts.reset()

    first = await submit(run, 1)  # on the policy bundle the claim read
    second = await submit(run, 2, first)

    assert second.decision is Decision.PROCEED
    expected = {"optimistic": 2} if kernel.shortcuts.enabled else {"locked": 2}
    assert counts.transactions == expected
    steps = {s.step_id: s for s in await kernel.list_steps(run.execution_id, None)}
    assert (steps[first.step_id or ""].status, steps[first.step_id or ""].result) == (
        StepStatus.SUCCEEDED,
        '{"ok":1}',
    )
    assert steps[second.step_id or ""].status is StepStatus.EXECUTING
    types = await run.event_types()
    assert types[-4:] == ["step.succeeded", "step.proposed", "step.allowed", "step.executing"]
    assert (await run.execution()).last_event_seq == len(types)


async def test_a_followed_run_records_what_the_locked_way_records(kernel: Kernel) -> None:
    run = await followed(kernel)
    decided = [await submit(run, 1)]
    for n in range(2, 6):
        decided.append(await submit(run, n, decided[-1]))
    await kernel.complete_execution(
        run.execution_id,
        AGENT,
        run.lease,
        '{"all":1}',
        (StepOutcome(decided[-1].step_id or "", "5"),),
    )

    steps = await kernel.list_steps(run.execution_id, None)
    assert [s.status for s in steps] == [StepStatus.SUCCEEDED] * 5
    types = await run.event_types()
    assert types.count("step.executing") == types.count("step.succeeded") == 5
    assert [e.event_seq for e in await kernel.list_events(run.execution_id, 0, 1000)] == list(
        range(1, len(types) + 1)
    )
    assert (await run.execution()).status is ExecutionStatus.COMPLETED


async def test_a_policy_changed_meanwhile_decides_the_next_step(kernel: Kernel) -> None:
    await kernel.set_policy(AGENT, ALLOW_ALL)
    run = await followed(kernel)
    first = await submit(run, 1)
    second = await submit(run, 2, first)
    await kernel.set_policy(AGENT, DENY_ALL)  # moves no execution

    third = await submit(run, 3, second)

    assert (first.decision, second.decision) == (Decision.PROCEED, Decision.PROCEED)
    assert third.decision is Decision.DENIED
    steps = {s.step_id: s.status for s in await kernel.list_steps(run.execution_id, None)}
    assert steps[second.step_id or ""] is StepStatus.SUCCEEDED


async def test_a_policy_changed_since_the_claim_decides_the_first_step(kernel: Kernel) -> None:
    await kernel.set_policy(AGENT, ALLOW_ALL)
    run = await followed(kernel)
    await kernel.set_policy(AGENT, DENY_ALL)  # after the claim read the bundle

    first = await submit(run, 1)

    assert first.decision is Decision.DENIED


async def test_a_write_of_another_replica_sends_the_run_the_locked_way(
    kernel: Kernel, store: Store, clock: ManualClock, kernel_settings: Settings
) -> None:
    other = Kernel(store, kernel_settings, clock=clock.now, bus=MemoryBus())
    run = await followed(kernel)
    first = await submit(run, 1)
    await other.cancel_execution(run.execution_id)

    answer = await submit(run, 2, first)

    assert answer.decision is Decision.EXECUTION_TERMINAL
    assert (await run.execution()).status is ExecutionStatus.CANCELLED
    assert len(await kernel.list_steps(run.execution_id, None)) == 1


async def test_a_step_another_replica_recorded_is_replayed(
    kernel: Kernel, store: Store, clock: ManualClock, kernel_settings: Settings
) -> None:
    other = Kernel(store, kernel_settings, clock=clock.now, bus=MemoryBus())
    run = await followed(kernel)
    first = await submit(run, 1)
    # The agent's request went to the other replica, which recorded the step and its result.
    second = await submit(Run(other, run.execution_id, run.lease), 2, first)
    await other.complete_step(run.execution_id, AGENT, second.step_id or "", run.lease, "2")

    again = await submit(run, 2)

    assert again.decision is Decision.REPLAY
    assert (again.step_id, again.result) == (second.step_id, "2")
    assert len(await kernel.list_steps(run.execution_id, None)) == 2


async def test_a_resubmitted_step_of_a_followed_run_is_replayed(kernel: Kernel) -> None:
    run = await followed(kernel)
    first = await submit(run, 1)
    second = await submit(run, 2, first)

    again = await submit(run, 2)

    assert again.decision is Decision.PROCEED  # still executing: it runs on (§8 R3)
    assert again.step_id == second.step_id
    assert len(await kernel.list_steps(run.execution_id, None)) == 2


async def test_a_replaced_lease_cannot_take_a_step_of_a_followed_run(
    kernel: Kernel, clock: ManualClock
) -> None:
    run = await followed(kernel)
    first = await submit(run, 1)
    again = await redeliver(kernel, clock, run)

    with pytest.raises(LeaseSuperseded):
        await submit(run, 2, first)

    assert len(await kernel.list_steps(run.execution_id, None)) == 1
    assert (await submit(again, 1)).step_id == first.step_id


@pytest.mark.parametrize("shortcuts", [True], ids=["shortcuts"])
async def test_a_cold_replica_takes_the_locked_way_with_the_same_answer(
    kernel: Kernel, store: Store, clock: ManualClock, kernel_settings: Settings
) -> None:
    cold_store = Counting(store)
    cold = Kernel(cast(Store, cold_store), kernel_settings, clock=clock.now, bus=MemoryBus())
    run = await followed(kernel)
    first = await submit(run, 1)

    second = await submit(Run(cold, run.execution_id, run.lease), 2, first)

    assert second.decision is Decision.PROCEED
    assert cold_store.transactions == {"locked": 1}
    third = await submit(run, 3, second)  # the warm replica's record is behind now
    assert third.decision is Decision.PROCEED
    assert [s.status for s in await kernel.list_steps(run.execution_id, None)] == [
        StepStatus.SUCCEEDED,
        StepStatus.SUCCEEDED,
        StepStatus.EXECUTING,
    ]


async def test_a_run_whose_first_step_came_before_the_acknowledgement_is_followed(
    kernel: Kernel, counts: Counting
) -> None:
    execution = await kernel.create_execution(AGENT, '{"topic":"x"}', None)
    [claim] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution.id]
    run = Run(kernel, execution.id, Lease(claim.dispatch.id, claim.dispatch.attempt))
    first: list[StepDecision] = []

    class SubmittingFirst(Answering):
        """An agent whose first step reaches the kernel before its acknowledgement."""

        async def answer(self, execution_id: str) -> None:
            first.append(await submit(run, 1))

    await kernel.deliver(claim, SubmittingFirst())
    counts.reset()

    second = await submit(run, 2, first[0])

    assert second.decision is Decision.PROCEED
    expected = {"optimistic": 1} if kernel.shortcuts.enabled else {"locked": 1}
    assert counts.transactions == expected
    types = await run.event_types()
    assert types.count("dispatch.acked") == types.count("execution.started") == 1
    assert (await run.execution()).last_event_seq == len(types)


async def test_a_step_submitted_while_the_acknowledgement_is_recorded_keeps_the_run_followed(
    kernel: Kernel, counts: Counting
) -> None:
    """The first step commits before the acknowledgement, and the second is submitted while
    the acknowledgement is being recorded: it waits for that record, so neither finds the run
    moved by the other, and the run stays followed."""
    execution = await kernel.create_execution(AGENT, '{"topic":"x"}', None)
    [claim] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution.id]
    run = Run(kernel, execution.id, Lease(claim.dispatch.id, claim.dispatch.attempt))
    second: list[asyncio.Task[StepDecision]] = []

    class SubmittingAround(Answering):
        """An agent whose first step precedes its answer and whose second follows it."""

        async def answer(self, execution_id: str) -> None:
            first = await submit(run, 1)
            # Runs once the kernel, having this answer, starts to record the acknowledgement.
            second.append(asyncio.create_task(submit(run, 2, first)))

    await kernel.deliver(claim, SubmittingAround())
    done = await second[0]
    counts.reset()

    third = await submit(run, 3, done)

    assert (done.decision, third.decision) == (Decision.PROCEED, Decision.PROCEED)
    expected = {"optimistic": 1} if kernel.shortcuts.enabled else {"locked": 1}
    assert counts.transactions == expected
    types = await run.event_types()
    assert types.count("dispatch.acked") == 1
    assert types[-4:] == ["step.succeeded", "step.proposed", "step.allowed", "step.executing"]
    assert (await run.execution()).last_event_seq == len(types)


async def test_a_fork_replays_every_step_it_copied(kernel: Kernel) -> None:
    """A fork is pending with the steps it copied (§26.2): its first run is not followed as
    one with nothing recorded, so each copied step replays."""
    source = await followed(kernel)
    one = await submit(source, 1)
    two = await submit(source, 2, one)
    await kernel.complete_execution(
        source.execution_id, AGENT, source.lease, "null", (StepOutcome(two.step_id or "", "1"),)
    )
    at_seq = (await source.execution()).last_event_seq
    fork = await kernel.fork(source.execution_id, ForkRequest(at_seq=at_seq))
    [claim] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == fork.id]
    await kernel.deliver(claim, Answering())
    run = Run(kernel, fork.id, Lease(claim.dispatch.id, claim.dispatch.attempt))

    first = await submit(run, 1)
    second = await submit(run, 2)
    third = await submit(run, 3, second)

    assert [d.decision for d in (first, second, third)] == [
        Decision.REPLAY,
        Decision.REPLAY,
        Decision.PROCEED,
    ]
    assert (first.result, second.result) == ('{"ok":1}', "1")


async def test_the_end_of_a_followed_run_is_one_optimistic_transaction(
    kernel: Kernel, counts: Counting
) -> None:
    run = await followed(kernel)
    first = await submit(run, 1)
    second = await submit(run, 2, first)
    counts.reset()

    await kernel.complete_execution(
        run.execution_id, AGENT, run.lease, '"done"', (StepOutcome(second.step_id or "", "2"),)
    )

    expected = {"optimistic": 1} if kernel.shortcuts.enabled else {"locked": 1}
    assert counts.transactions == expected
    done = await run.execution()
    assert (done.status, done.output) == (ExecutionStatus.COMPLETED, '"done"')
    steps = {s.step_id: (s.status, s.result) for s in await kernel.list_steps(done.id, None)}
    assert steps[second.step_id or ""] == (StepStatus.SUCCEEDED, "2")
    types = await run.event_types()
    assert types[-2:] == ["step.succeeded", "execution.completed"]
    assert done.last_event_seq == len(types)


async def test_a_sub_agent_started_meanwhile_is_cancelled_with_its_parent(kernel: Kernel) -> None:
    """A child's create marks its parent without moving it: the end, optimistic or not, sees
    the child and cancels it (§25.6)."""
    run = await followed(kernel)
    tool = await submit(run, 1)
    child = await kernel.create_execution(
        AGENT, "null", None, Labels(spawned_by=(run.execution_id, tool.step_id or ""))
    )

    await kernel.fail_execution(
        run.execution_id, AGENT, run.lease, "gave up", (StepOutcome(tool.step_id or "", "1"),)
    )

    assert (await run.execution()).status is ExecutionStatus.FAILED
    assert (await kernel.get_execution(child.id)).status is ExecutionStatus.CANCELLED


async def test_a_completion_the_run_does_not_know_sends_the_end_the_locked_way(
    kernel: Kernel, counts: Counting
) -> None:
    run = await followed(kernel)
    first = await submit(run, 1)
    counts.reset()

    await kernel.complete_execution(
        run.execution_id, AGENT, run.lease, "null", (StepOutcome("no-such-step", "1"),)
    )

    assert counts.transactions == {"locked": 1}
    assert (await run.execution()).status is ExecutionStatus.COMPLETED
    steps = {s.step_id: s.status for s in await kernel.list_steps(run.execution_id, None)}
    assert steps[first.step_id or ""] is StepStatus.EXECUTING
