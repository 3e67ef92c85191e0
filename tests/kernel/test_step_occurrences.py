"""The `step-occurrences` extension: a submission that carries the agent's own occurrence is
decided at that occurrence, and a recorded success or failure is replayed from one read that
writes nothing (no counter, no lease renewal) while the lease is fresh; anything else takes the
locked way, with its checks and its renewal, and so does every submission of a dispatch past
its recorded history (until its next attempt)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebuno.kernel.domain.decision import StepDecision, StepRequest
from rebuno.kernel.domain.errors import Forbidden, LeaseSuperseded
from rebuno.kernel.domain.records import Dispatch, Lease
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import StepKey, Wanted
from rebuno.protocol.enums import Decision, Idempotency, StepStatus
from tests.counting import Counting
from tests.kernel.conftest import AGENT, Answering, Run, redeliver, request
from tests.support import ManualClock

SEARCH = request()
KEY = StepKey(SEARCH.kind, SEARCH.target, SEARCH.args_hash)


async def numbered(run: Run, occurrence: int, req: StepRequest = SEARCH) -> StepDecision:
    return await run.kernel.submit_step(run.execution_id, AGENT, run.lease, req, (), occurrence)


async def counted(run: Run) -> dict[StepKey, int]:
    """The occurrences the run's dispatch has counted for `KEY`."""
    async with run.kernel.store.transaction(run.execution_id) as tx:
        outcomes = await tx.load_outcomes(
            run.execution_id, run.lease.dispatch_id, Wanted(reports={KEY: 1}, step_ids=())
        )
    return outcomes.consumed


async def dispatch(run: Run) -> Dispatch:
    async with run.kernel.store.transaction(run.execution_id) as tx:
        found = await tx.get_dispatch(run.lease.dispatch_id)
    assert found is not None
    return found


async def recorded_twice(run: Run, clock: ManualClock) -> Run:
    """Two identical steps, the first succeeded and the second failed; then the next delivery."""
    first = await numbered(run, 0)
    second = await numbered(run, 1)
    assert first.step_id and second.step_id and first.step_id != second.step_id
    await run.complete(first.step_id, '"page"')
    await run.fail(second.step_id, '{"message":"timeout"}')
    return await redeliver(run.kernel, clock, run)


async def test_a_recorded_outcome_replays_at_the_agents_occurrence_from_one_read(
    run: Run, clock: ManualClock, counts: Counting
) -> None:
    again = await recorded_twice(run, clock)
    renewed = (await dispatch(again)).locked_at
    events = await again.event_types()
    clock.advance(timedelta(seconds=1))
    counts.reset()

    failed = await numbered(again, 1)
    succeeded = await numbered(again, 0)
    cost = (dict(counts.transactions), dict(counts.reads))

    assert (failed.decision, failed.error) == (Decision.REPLAY, '{"message":"timeout"}')
    assert (succeeded.decision, succeeded.result) == (Decision.REPLAY, '"page"')
    assert await counted(again) == {}
    assert await again.event_types() == events
    if run.kernel.shortcuts.enabled:
        assert cost == ({}, {"load_completion": 2})
        assert (await dispatch(again)).locked_at == renewed
    else:  # the ordinary way: locked, and it renews the lease
        assert cost == ({"locked": 2}, {})
        assert (await dispatch(again)).locked_at == clock.now()


async def test_a_new_step_is_recorded_at_the_agents_occurrence(
    run: Run, clock: ManualClock
) -> None:
    again = await recorded_twice(run, clock)

    decision = await numbered(again, 3)

    assert decision.decision is Decision.PROCEED
    steps = await again.kernel.list_steps(again.execution_id, None)
    assert [(s.occurrence, s.status) for s in steps] == [
        (0, StepStatus.SUCCEEDED),
        (1, StepStatus.FAILED),
        (3, StepStatus.EXECUTING),
    ]
    assert await counted(again) == {}  # the agent numbers its steps: no counter is kept


async def test_a_lease_due_for_renewal_replays_the_locked_way_and_is_renewed(
    run: Run, clock: ManualClock, counts: Counting
) -> None:
    """The kernel's lease here is 30 s: an answer from the record needs a renewal within a
    third of the shortest lease an agent may have (10 s)."""
    again = await recorded_twice(run, clock)
    clock.advance(timedelta(seconds=10) / 3)
    counts.reset()

    decision = await numbered(again, 0)

    assert (decision.decision, decision.result) == (Decision.REPLAY, '"page"')
    assert counts.transactions == {"locked": 1}
    assert (await dispatch(again)).locked_at == clock.now()


async def test_an_unfinished_safe_step_proceeds_again_as_the_locked_way_would(
    run: Run, clock: ManualClock
) -> None:
    executing = await numbered(run, 0)
    again = await redeliver(run.kernel, clock, run)
    events = await again.event_types()

    decision = await numbered(again, 0)

    assert (decision.decision, decision.step_id) == (Decision.PROCEED, executing.step_id)
    assert await again.event_types() == events


async def test_an_unfinished_at_most_once_step_is_failed_the_locked_way(
    run: Run, clock: ManualClock, counts: Counting
) -> None:
    once = request(idempotency=Idempotency.AT_MOST_ONCE)
    executing = await numbered(run, 0, once)
    again = await redeliver(run.kernel, clock, run)
    counts.reset()

    decision = await numbered(again, 0, once)

    assert (decision.decision, decision.step_id) == (Decision.REPLAY, executing.step_id)
    assert counts.transactions == {"locked": 1}
    [step] = await again.kernel.list_steps(again.execution_id, None)
    assert step.status is StepStatus.FAILED


async def test_a_superseded_lease_or_another_agent_is_refused(run: Run, clock: ManualClock) -> None:
    again = await recorded_twice(run, clock)

    with pytest.raises(LeaseSuperseded):
        await numbered(run, 0)
    with pytest.raises(Forbidden):
        await again.kernel.submit_step(again.execution_id, "intruder", again.lease, SEARCH, (), 0)


async def test_a_terminal_execution_answers_execution_terminal(
    run: Run, clock: ManualClock
) -> None:
    again = await recorded_twice(run, clock)
    await again.kernel.cancel_execution(again.execution_id)

    decision = await numbered(again, 0)

    assert decision.decision is Decision.EXECUTION_TERMINAL


async def test_a_step_not_recorded_ends_the_unlocked_replays_of_its_dispatch(
    run: Run, clock: ManualClock, counts: Counting
) -> None:
    again = await recorded_twice(run, clock)
    new = await numbered(again, 0, request(target="fetch"))
    assert new.decision is Decision.PROCEED
    counts.reset()

    decision = await numbered(again, 0)

    assert (decision.decision, decision.result) == (Decision.REPLAY, '"page"')
    assert (counts.transactions, counts.reads) == ({"locked": 1}, {})  # no read tried first


async def test_a_first_delivery_never_reads_unlocked(kernel: Kernel, counts: Counting) -> None:
    execution = await kernel.create_execution(AGENT, "null", None)
    [claimed] = await kernel.claim(10)
    await kernel.deliver(claimed, Answering())
    lease = Lease(claimed.dispatch.id, claimed.dispatch.attempt)
    counts.reset()

    decision = await kernel.submit_step(execution.id, AGENT, lease, SEARCH, (), 0)

    assert decision.decision is Decision.PROCEED
    # Followed from its claim, the run decides its first step on what the claim read.
    expected = {"optimistic": 1} if kernel.shortcuts.enabled else {"locked": 1}
    assert (counts.transactions, counts.reads) == (expected, {})
