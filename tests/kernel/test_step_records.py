"""The `step-records` extension: steps an agent ran before submitting them are recorded by its
next request, each with the next occurrence of its key and the events of a submission and a
completion, before what the request itself asks for; and the delivery offers it only where no
step can be recorded yet and no policy decides."""

from __future__ import annotations

from datetime import UTC, datetime

from rebuno.kernel.domain.decision import StepOutcome, StepRecord
from rebuno.kernel.domain.records import Agent, Dispatch, Execution, Origin
from rebuno.kernel.service.dispatches import offered
from rebuno.kernel.service.recording import wanted_by
from rebuno.kernel.store.base import ClaimedDispatch, StepKey
from rebuno.protocol.enums import Decision, DispatchStatus, ExecutionStatus, StepKind, StepStatus
from rebuno.protocol.extensions import (
    AGENT_INSTANCES,
    STEP_COMPLETIONS,
    STEP_OCCURRENCES,
    STEP_RECORDS,
)
from tests.kernel.conftest import AGENT, Run, redeliver, request
from tests.support import ManualClock

STEP_EVENTS = ["step.proposed", "step.allowed", "step.executing", "step.succeeded"]


def report(n: int, result: str = '{"ok":true}') -> StepRecord:
    return StepRecord(request(target="work", args=f'{{"n":{n}}}', kind=StepKind.LOCAL), result)


async def test_reported_steps_take_successive_occurrences_of_their_key(run: Run) -> None:
    await run.kernel.complete_execution(
        run.execution_id, AGENT, run.lease, "null", (report(1, "1"), report(1, "2"), report(2))
    )

    steps = await run.kernel.list_steps(run.execution_id, None)
    assert [(s.occurrence, s.status, s.result) for s in steps] == [
        (0, StepStatus.SUCCEEDED, "1"),
        (1, StepStatus.SUCCEEDED, "2"),
        (0, StepStatus.SUCCEEDED, '{"ok":true}'),
    ]
    assert (await run.event_types())[-13:] == [*STEP_EVENTS * 3, "execution.completed"]


async def test_an_end_stores_no_occurrences_and_a_heartbeat_does(run: Run) -> None:
    """The occurrences a request's reports reach are kept for the rest of its attempt; the
    request that ends the run retires the attempt, so it keeps none."""
    beat, ended = (report(1),), (report(2), report(2))

    await run.kernel.heartbeat(run.execution_id, AGENT, run.lease, beat)
    await run.kernel.complete_execution(run.execution_id, AGENT, run.lease, "null", ended)

    async with run.kernel.store.transaction(run.execution_id) as tx:
        kept = await tx.load_outcomes(
            run.execution_id, run.lease.dispatch_id, wanted_by((*beat, *ended))
        )
    first = beat[0].request
    assert kept.consumed == {StepKey(first.kind, first.target, first.args_hash): 0}
    assert len(await run.kernel.list_steps(run.execution_id, None)) == 3


async def test_a_submission_continues_after_the_steps_its_request_reported(run: Run) -> None:
    first = await run.submit(request(target="work", args='{"n":1}', kind=StepKind.LOCAL))
    assert first.decision is Decision.PROCEED and first.step_id is not None

    decision = await run.kernel.submit_step(
        run.execution_id,
        AGENT,
        run.lease,
        request(target="work", args='{"n":1}', kind=StepKind.LOCAL),
        (StepOutcome(first.step_id, result="1"), report(1, "2")),
    )

    assert decision.decision is Decision.PROCEED and decision.policy_free
    steps = await run.kernel.list_steps(run.execution_id, None)
    assert [(s.occurrence, s.status) for s in steps] == [
        (0, StepStatus.SUCCEEDED),
        (1, StepStatus.SUCCEEDED),
        (2, StepStatus.EXECUTING),
    ]
    assert steps[2].step_id == decision.step_id


async def test_a_heartbeat_records_what_it_carries_and_answers_the_grant(run: Run) -> None:
    granted = await run.kernel.heartbeat(
        run.execution_id, AGENT, run.lease, (report(1),), policy=True
    )
    assert granted is True
    await run.kernel.set_policy(AGENT, "default_action: allow\n")

    still = await run.kernel.heartbeat(
        run.execution_id, AGENT, run.lease, (report(2),), policy=True
    )
    submitted = await run.submit(request(args='{"n":3}'))

    assert still is False and not submitted.policy_free
    steps = await run.kernel.list_steps(run.execution_id, None)
    assert [s.status for s in steps] == [
        StepStatus.SUCCEEDED,
        StepStatus.SUCCEEDED,
        StepStatus.EXECUTING,
    ]
    assert (await run.execution()).status is ExecutionStatus.RUNNING


async def test_a_reported_step_recorded_already_keeps_its_outcome(
    run: Run, clock: ManualClock
) -> None:
    await run.kernel.heartbeat(run.execution_id, AGENT, run.lease, (report(1, "1"),))
    again = await redeliver(run.kernel, clock, run)

    await again.kernel.complete_execution(
        again.execution_id, AGENT, again.lease, "null", (report(1, "2"),)
    )

    [step] = await again.kernel.list_steps(again.execution_id, None)
    assert (step.status, step.result) == (StepStatus.SUCCEEDED, "1")
    assert (await again.event_types()).count("step.succeeded") == 1


def _claimed(status: ExecutionStatus, bundle: str | None) -> ClaimedDispatch:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    dispatch = Dispatch("d", "e", DispatchStatus.IN_FLIGHT, 1, 5, now, "r", now, now, now)
    agent = Agent(AGENT, "http://127.0.0.1:9/", "s", bundle, None, now)
    execution = Execution("e", AGENT, Origin(None, "null", now, None), status, None, None, now, 2)
    return ClaimedDispatch(dispatch, execution, agent)


def test_only_a_first_delivery_without_policy_is_offered_step_records() -> None:
    first = _claimed(ExecutionStatus.PENDING, None)
    always = (STEP_COMPLETIONS, AGENT_INSTANCES)
    numbered = (*always, STEP_OCCURRENCES)

    assert offered(first, step_records=True) == (*always, STEP_RECORDS, STEP_OCCURRENCES)
    assert offered(first, True, False) == (*always, STEP_RECORDS)
    assert offered(first, step_records=False) == numbered
    assert offered(_claimed(ExecutionStatus.RUNNING, None), True) == numbered
    assert offered(_claimed(ExecutionStatus.PENDING, "rules: []"), True) == numbered
    assert offered(_claimed(ExecutionStatus.BLOCKED, None), True) == numbered
    assert offered(_claimed(ExecutionStatus.RUNNING, None), True, False) == always
