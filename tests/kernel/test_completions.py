"""The `step-completions` extension: a step's outcome carried by the agent's next request is
recorded in that request's transaction, before what the request itself asks for."""

from __future__ import annotations

from rebuno.kernel.domain.decision import StepOutcome
from rebuno.protocol.enums import Decision, ExecutionStatus, StepStatus
from tests.kernel.conftest import AGENT, Run, request


async def test_next_submission_records_the_carried_completion_first(run: Run) -> None:
    first = await run.submit(request(args='{"n":1}'))
    assert first.step_id is not None

    second = await run.kernel.submit_step(
        run.execution_id,
        AGENT,
        run.lease,
        request(args='{"n":2}'),
        (StepOutcome(first.step_id, result='{"i":1}'),),
    )

    assert second.decision is Decision.PROCEED
    step = await run.kernel.get_step(run.execution_id, first.step_id)
    assert step.status is StepStatus.SUCCEEDED and step.result == '{"i":1}'
    assert (await run.event_types())[-4:] == [
        "step.succeeded",
        "step.proposed",
        "step.allowed",
        "step.executing",
    ]


async def test_completing_the_execution_records_carried_outcomes(run: Run) -> None:
    ok = await run.submit(request(args='{"n":1}'))
    bad = await run.submit(request(args='{"n":2}'))

    await run.kernel.complete_execution(
        run.execution_id,
        AGENT,
        run.lease,
        '"done"',
        (
            StepOutcome(ok.step_id or "", result="1"),
            StepOutcome(bad.step_id or "", error='{"message":"no"}'),
        ),
    )

    assert (await run.execution()).status is ExecutionStatus.COMPLETED
    steps = {s.step_id: s for s in await run.kernel.list_steps(run.execution_id, None)}
    assert steps[ok.step_id or ""].status is StepStatus.SUCCEEDED
    assert steps[bad.step_id or ""].status is StepStatus.FAILED
    assert (await run.event_types())[-3:] == [
        "step.succeeded",
        "step.failed",
        "execution.completed",
    ]


async def test_carried_outcome_never_overwrites_a_terminal_step(run: Run) -> None:
    first = await run.submit()
    assert first.step_id is not None
    await run.complete(first.step_id, '"kept"')

    await run.kernel.submit_step(
        run.execution_id,
        AGENT,
        run.lease,
        request(args='{"n":9}'),
        (StepOutcome(first.step_id, result='"lost"'), StepOutcome("0" * 64, result="1")),
    )

    step = await run.kernel.get_step(run.execution_id, first.step_id)
    assert step.result == '"kept"'
    assert (await run.event_types()).count("step.succeeded") == 1
