"""Execution lifecycle: complete, fail, cancel, deadlines, retention (§10.1, §17)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from harness.polling import wait_until
from rebuno.kernel import background
from rebuno.kernel.domain.errors import ExecutionTerminal, LeaseSuperseded, NotFound
from rebuno.kernel.service import queries
from rebuno.kernel.service.agents import SECRETS_REMEMBERED
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import ExecutionFilter, Store
from rebuno.kernel.stream.memory import MemoryBus
from rebuno.protocol.enums import Decision, ExecutionStatus, StepStatus
from tests.kernel.conftest import AGENT, Run, claim, settings
from tests.support import ManualClock, parked


async def test_complete_execution_stores_output_and_retires_the_lease(run: Run) -> None:
    await run.kernel.complete_execution(run.execution_id, AGENT, run.lease, '{"n":1.50}')

    execution = await run.execution()
    assert execution.status is ExecutionStatus.COMPLETED
    assert execution.output == '{"n":1.50}'
    with pytest.raises(ExecutionTerminal):
        await run.kernel.fail_execution(run.execution_id, AGENT, run.lease, "late")
    with pytest.raises(LeaseSuperseded):
        await run.kernel.heartbeat(run.execution_id, AGENT, run.lease)
    assert (await run.event_types())[-1] == "execution.completed"


async def test_fail_execution_records_the_reason(run: Run) -> None:
    await run.kernel.fail_execution(run.execution_id, AGENT, run.lease, "tool exploded")

    execution = await run.execution()
    assert execution.status is ExecutionStatus.FAILED
    assert execution.failure_reason == "tool exploded"


async def test_cancel_during_a_step_cancels_the_step(run: Run) -> None:
    decision = await run.submit()

    await run.kernel.cancel_execution(run.execution_id)

    execution = await run.execution()
    assert execution.status is ExecutionStatus.CANCELLED
    assert execution.failure_reason == "client_cancelled"
    step = await run.kernel.get_step(run.execution_id, decision.step_id or "")
    assert step.status is StepStatus.CANCELLED
    assert (await run.submit()).decision is Decision.EXECUTION_TERMINAL
    with pytest.raises(ExecutionTerminal):
        await run.kernel.cancel_execution(run.execution_id)
    with pytest.raises(ExecutionTerminal):
        await run.kernel.complete_execution(run.execution_id, AGENT, run.lease, "null")


async def test_create_for_unknown_agent_is_not_found(kernel: Kernel) -> None:
    with pytest.raises(NotFound, match="agent nobody not found"):
        await kernel.create_execution("nobody", "null", None)
    assert (await kernel.list_executions(ExecutionFilter(agent_id="nobody"))).items == []
    # The refusal left the store usable: the next creation commits.
    created = await kernel.create_execution(AGENT, "null", None)
    assert (await kernel.get_execution(created.id)).status is ExecutionStatus.PENDING


async def test_deadline_cancels_overdue_executions(
    kernel: Kernel, clock: ManualClock, run: Run
) -> None:
    kernel.settings = replace(kernel.settings, deadline_timeout=timedelta(minutes=1))
    late = await kernel.create_execution(AGENT, "null", None)
    assert late.origin.deadline_at is not None
    clock.advance(timedelta(minutes=2))

    assert await background.cancel_overdue(kernel) == 1

    cancelled = await kernel.get_execution(late.id)
    assert cancelled.status is ExecutionStatus.CANCELLED
    assert cancelled.failure_reason == "deadline_exceeded"
    assert (await run.execution()).status is ExecutionStatus.PENDING


async def test_retention_removes_old_terminal_executions_only(
    kernel: Kernel, clock: ManualClock, run: Run
) -> None:
    done = await kernel.create_execution(AGENT, "null", None)
    await kernel.cancel_execution(done.id)
    clock.advance(timedelta(hours=25))

    await background.sweep(kernel)

    with pytest.raises(NotFound):
        await kernel.get_execution(done.id)
    assert (await run.execution()).status is ExecutionStatus.PENDING


async def test_listing_is_newest_first_with_a_cursor(kernel: Kernel) -> None:
    ids = [(await kernel.create_execution(AGENT, "null", None)).id for _ in range(5)]

    first = await kernel.list_executions(ExecutionFilter(limit=3))
    rest = await kernel.list_executions(ExecutionFilter(limit=3, cursor=first.next_cursor))

    assert [e.id for e in first.items] == ids[::-1][:3]
    assert [e.id for e in rest.items] == ids[::-1][3:]
    assert rest.next_cursor is None


async def test_events_long_poll_answers_at_the_next_commit(kernel: Kernel, run: Run) -> None:
    seen = len(await kernel.list_events(run.execution_id, 0, 1000))
    waiting = asyncio.create_task(kernel.list_events(run.execution_id, seen, 1000, wait=10))
    await wait_until(lambda: parked(kernel.appended.get(run.execution_id)), message="poll held")
    assert not waiting.done()

    await kernel.heartbeat(run.execution_id, AGENT, run.lease)

    events = await asyncio.wait_for(waiting, 5)
    assert [e.type for e in events] == ["execution.started"]


async def test_execution_long_poll_answers_with_the_record_the_completion_wrote(
    run: Run,
) -> None:
    waiting = asyncio.create_task(run.kernel.get_execution(run.execution_id, wait=10))
    await wait_until(lambda: parked(run.kernel.ends.get(run.execution_id)), message="read held")
    assert not waiting.done()

    await run.kernel.complete_execution(run.execution_id, AGENT, run.lease, '{"answer":42}')

    held = await asyncio.wait_for(waiting, 5)
    assert held.status is ExecutionStatus.COMPLETED
    assert held.output == '{"answer":42}'
    assert held == await run.kernel.get_execution(run.execution_id)


async def test_execution_long_poll_answers_at_once_for_one_that_ended_here(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Created here, so known live until it ends here; once it has, the poll reads at once
    # instead of waiting (for up to an hour, with this look interval).
    monkeypatch.setattr(queries, "REPLICA_POLL_SECONDS", 3600)
    await run.kernel.cancel_execution(run.execution_id)

    done = await asyncio.wait_for(run.kernel.get_execution(run.execution_id, wait=30), 5)

    assert done.status is ExecutionStatus.CANCELLED


async def test_execution_long_poll_sees_an_end_on_another_replica(
    kernel: Kernel, store: Store, clock: ManualClock
) -> None:
    other = Kernel(store, settings(replica_id="replica-b"), clock=clock.now, bus=MemoryBus())
    execution = await kernel.create_execution(AGENT, "null", None)
    lease = await claim(other, execution.id)
    waiting = asyncio.create_task(kernel.get_execution(execution.id, wait=30))
    await wait_until(lambda: parked(kernel.ends.get(execution.id)), message="the read held")

    # Nothing tells this kernel; its look every REPLICA_POLL_SECONDS finds the end.
    await other.complete_execution(execution.id, AGENT, lease, "null")

    done = await asyncio.wait_for(waiting, 5)
    assert done.status is ExecutionStatus.COMPLETED


async def test_events_long_poll_returns_at_once_for_a_terminal_execution(run: Run) -> None:
    await run.kernel.cancel_execution(run.execution_id)
    seen = len(await run.kernel.list_events(run.execution_id, 0, 1000))

    events = await asyncio.wait_for(
        run.kernel.list_events(run.execution_id, seen, 1000, wait=30), 5
    )

    assert events == []


async def test_the_agent_secret_cache_stays_bounded_whatever_ids_are_asked(
    kernel: Kernel,
) -> None:
    for index in range(SECRETS_REMEMBERED + 500):
        assert await kernel.agent_secret(f"nobody-{index}") is None

    assert len(kernel.secrets) == SECRETS_REMEMBERED
    assert await kernel.agent_secret(AGENT) == "s3cret"
    assert len(kernel.secrets) == SECRETS_REMEMBERED
