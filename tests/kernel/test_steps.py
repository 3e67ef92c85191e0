"""Step submission, completion and replay through the service layer (§7, §8, §9, §13)."""

from __future__ import annotations

import asyncio

import pytest

from rebuno.kernel.domain.errors import Conflict, LeaseSuperseded, NotFound
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import Decision, ExecutionStatus, Idempotency, StepStatus
from tests.kernel.conftest import AGENT, Run, claim, redeliver, request
from tests.support import ManualClock


async def test_new_step_proceeds_and_completion_is_recorded(run: Run) -> None:
    decision = await run.submit()
    assert decision.decision is Decision.PROCEED
    assert decision.step_id is not None and len(decision.step_id) == 64

    recorded = await run.complete(decision.step_id, '{"hits":[1.0,2]}')

    assert recorded.decision is Decision.RECORDED
    step = await run.kernel.get_step(run.execution_id, decision.step_id)
    assert step.status is StepStatus.SUCCEEDED
    assert step.result == '{"hits":[1.0,2]}'
    assert await run.event_types() == [
        "execution.created",
        "dispatch.queued",
        "execution.started",
        "step.proposed",
        "step.allowed",
        "step.executing",
        "step.succeeded",
    ]


async def test_execution_stays_pending_until_the_agent_is_reached(run: Run) -> None:
    assert (await run.execution()).status is ExecutionStatus.PENDING

    await run.kernel.heartbeat(run.execution_id, AGENT, run.lease)
    await run.kernel.heartbeat(run.execution_id, AGENT, run.lease)

    assert (await run.execution()).status is ExecutionStatus.RUNNING
    assert (await run.event_types()).count("execution.started") == 1


async def test_submit_step_replays_recorded_result_after_redispatch(
    kernel: Kernel, clock: ManualClock, run: Run
) -> None:
    first = await run.submit()
    assert first.step_id is not None
    await run.complete(first.step_id, '{"answer":42}')
    seqs_before = len(await run.event_types())

    again = await (await redeliver(kernel, clock, run)).submit()

    assert again.decision is Decision.REPLAY
    assert again.step_id == first.step_id
    assert again.result == '{"answer":42}'
    assert len(await run.event_types()) == seqs_before


async def test_identical_calls_get_distinct_occurrences(run: Run) -> None:
    decisions = await asyncio.gather(*(run.submit() for _ in range(20)))

    step_ids = {d.step_id for d in decisions}
    assert len(step_ids) == 20
    steps = await run.kernel.list_steps(run.execution_id, None)
    assert sorted(s.occurrence for s in steps) == list(range(20))


async def test_event_seq_is_contiguous_under_concurrent_writes(run: Run) -> None:
    await asyncio.gather(*(run.submit(request(args=f'{{"n":{i}}}')) for i in range(15)))

    events = await run.kernel.list_events(run.execution_id, 0, 1000)
    assert [e.event_seq for e in events] == list(range(1, len(events) + 1))


async def test_stale_attempt_is_refused_with_lease_superseded(
    kernel: Kernel, clock: ManualClock, run: Run
) -> None:
    started = await run.submit()
    assert started.step_id is not None
    await redeliver(kernel, clock, run)
    events_before = await run.event_types()

    with pytest.raises(LeaseSuperseded):
        await run.submit(request(target="other"))
    with pytest.raises(LeaseSuperseded):
        await run.complete(started.step_id)
    with pytest.raises(LeaseSuperseded):
        await kernel.heartbeat(run.execution_id, AGENT, run.lease)

    assert await run.event_types() == events_before


async def test_unknown_dispatch_in_lease_is_superseded(run: Run) -> None:
    stranger = Run(run.kernel, run.execution_id, Lease("01900000-0000-7000-8000-00000000ffff", 1))
    with pytest.raises(LeaseSuperseded):
        await stranger.submit()


async def test_orphaned_safe_to_retry_step_runs_again(
    kernel: Kernel, clock: ManualClock, run: Run
) -> None:
    first = await run.submit()

    again = await (await redeliver(kernel, clock, run)).submit()

    assert again.decision is Decision.PROCEED
    assert again.step_id == first.step_id


async def test_orphaned_at_most_once_step_becomes_indeterminate(
    kernel: Kernel, clock: ManualClock, run: Run
) -> None:
    charge = request("charge_card", '{"cents":500}', idempotency=Idempotency.AT_MOST_ONCE)
    first = await run.submit(charge)
    assert first.decision is Decision.PROCEED
    second_run = await redeliver(kernel, clock, run)

    replayed = await second_run.submit(charge)
    retried = await second_run.submit(charge)

    assert replayed.decision is Decision.REPLAY
    assert replayed.error is not None and '"reason":"indeterminate"' in replayed.error
    assert retried.decision is Decision.DENIED
    assert retried.rule_id == "__indeterminate_retry"
    assert retried.reason == "prior attempt outcome unknown; retry refused"
    step = await kernel.get_step(run.execution_id, first.step_id or "")
    assert step.status is StepStatus.FAILED


async def test_failed_step_replays_its_error(kernel: Kernel, clock: ManualClock, run: Run) -> None:
    first = await run.submit()
    assert first.step_id is not None
    await run.fail(first.step_id, '{"message":"quota"}')

    again = await (await redeliver(kernel, clock, run)).submit()

    assert again.decision is Decision.REPLAY
    assert again.error == '{"message":"quota"}'


async def test_terminal_step_is_never_overwritten(run: Run) -> None:
    decision = await run.submit()
    assert decision.step_id is not None
    await run.complete(decision.step_id, '"first"')

    second = await run.complete(decision.step_id, '"second"')
    failed = await run.fail(decision.step_id)

    assert second.decision is Decision.REPLAY and second.result == '"first"'
    assert failed.decision is Decision.REPLAY
    step = await run.kernel.get_step(run.execution_id, decision.step_id)
    assert step.result == '"first"' and step.status is StepStatus.SUCCEEDED


async def test_completing_an_unknown_step_is_not_found(run: Run) -> None:
    with pytest.raises(NotFound):
        await run.complete("0" * 64)


async def test_completing_a_step_of_another_execution_is_not_found(
    kernel: Kernel, run: Run
) -> None:
    decision = await run.submit()
    other = await kernel.create_execution(AGENT, "null", None)
    other_run = Run(kernel, other.id, await claim(kernel, other.id))
    with pytest.raises(NotFound):
        await other_run.complete(decision.step_id or "")


async def test_submit_on_terminal_execution_answers_execution_terminal(run: Run) -> None:
    await run.kernel.complete_execution(run.execution_id, AGENT, run.lease, '"done"')

    decision = await run.submit()

    assert decision.decision is Decision.EXECUTION_TERMINAL
    assert decision.step_id is None


async def test_completing_awaiting_step_is_a_conflict(kernel: Kernel, run: Run) -> None:
    await kernel.set_policy(
        AGENT,
        "rules:\n  - id: gate\n    then: {decision: require_approval}\n",
    )
    blocked = await run.submit()
    assert blocked.decision is Decision.BLOCKED

    with pytest.raises((Conflict, LeaseSuperseded)):
        await run.complete(blocked.step_id or "")
