"""`agent-instances` through the service layer, on both stores: an acknowledgement records
which instance holds the attempt, and an announced new incarnation of that instance has what
the earlier ones held reclaimed at once, with the clock standing still (no lease expired)."""

from __future__ import annotations

import asyncio
import uuid

from rebuno.kernel.domain.errors import LeaseSuperseded
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import ExecutionStatus
from rebuno.protocol.extensions import AgentInstance
from tests.kernel.conftest import AGENT, delivered, redeliver
from tests.support import ManualClock

OTHER_AGENT = "summariser"


def incarnation_of(name: str) -> AgentInstance:
    """A start of the process slot `name`."""
    return AgentInstance(name, str(uuid.uuid4()))


async def due(kernel: Kernel) -> dict[str, int]:
    """The executions whose dispatch is due now, with the attempt a claim gives them."""
    return {c.dispatch.execution_id: c.dispatch.attempt for c in await kernel.claim(100)}


async def test_a_new_incarnation_has_what_the_previous_one_held_redelivered_at_once(
    kernel: Kernel,
) -> None:
    before = incarnation_of("worker-1:5000")
    run = await delivered(kernel, before)

    reclaimed = await kernel.announce_instance(AGENT, incarnation_of(before.name))

    assert reclaimed == 1
    assert await due(kernel) == {run.execution_id: 2}
    assert (await run.execution()).status is ExecutionStatus.RUNNING


async def test_only_the_same_name_with_another_incarnation_of_this_agent_is_reclaimed(
    kernel: Kernel,
) -> None:
    await kernel.register_agent(OTHER_AGENT, "http://127.0.0.1:9/webhook", "s3cret", None, None)
    announced = incarnation_of("worker-1:5000")
    dead = await delivered(kernel, incarnation_of(announced.name))
    await delivered(kernel, announced)  # the announcing incarnation itself
    await delivered(kernel, incarnation_of("worker-2:5000"))  # another process slot
    await delivered(kernel, incarnation_of(announced.name), OTHER_AGENT)  # another agent
    await delivered(kernel, None)  # acknowledged without naming an instance

    assert await kernel.announce_instance(AGENT, announced) == 1

    assert await due(kernel) == {dead.execution_id: 2}


async def test_an_announcement_is_idempotent(kernel: Kernel) -> None:
    before = incarnation_of("worker-1:5000")
    run = await delivered(kernel, before)
    after = incarnation_of(before.name)

    assert await kernel.announce_instance(AGENT, after) == 1
    assert await kernel.announce_instance(AGENT, after) == 0

    assert await due(kernel) == {run.execution_id: 2}
    assert await due(kernel) == {}


async def test_a_terminal_execution_is_left_alone(kernel: Kernel) -> None:
    before = incarnation_of("worker-1:5000")
    run = await delivered(kernel, before)
    await kernel.complete_execution(run.execution_id, AGENT, run.lease, '{"done":true}')
    events = await run.event_types()

    assert await kernel.announce_instance(AGENT, incarnation_of(before.name)) == 0

    assert (await run.execution()).status is ExecutionStatus.COMPLETED
    assert await run.event_types() == events
    assert await due(kernel) == {}


async def test_a_claim_forgets_who_held_the_previous_attempt(
    kernel: Kernel, clock: ManualClock
) -> None:
    before = incarnation_of("worker-1:5000")
    first = await delivered(kernel, before)
    second = await redeliver(kernel, clock, first)  # claimed, not yet acknowledged

    assert await kernel.announce_instance(AGENT, incarnation_of(before.name)) == 0

    assert await due(kernel) == {}
    assert (await second.submit()).decision.value == "proceed"


async def test_an_announcement_racing_a_completion_leaves_one_consistent_outcome(
    kernel: Kernel,
) -> None:
    before = incarnation_of("worker-1:5000")
    run = await delivered(kernel, before)

    completion, announcement = await asyncio.gather(
        kernel.complete_execution(run.execution_id, AGENT, run.lease, '{"done":true}'),
        kernel.announce_instance(AGENT, incarnation_of(before.name)),
        return_exceptions=True,
    )

    status = (await run.execution()).status
    if isinstance(completion, LeaseSuperseded):  # the announcement took the lease first
        assert (announcement, status) == (1, ExecutionStatus.RUNNING)
        assert await due(kernel) == {run.execution_id: 2}
    else:
        # Either the completion went first, or it came after the lease was ended but before
        # the reclaim returned it (as after an expired lease): the run is over either way.
        assert completion is None, completion
        assert announcement in (0, 1)
        assert status is ExecutionStatus.COMPLETED
        assert await due(kernel) == {}
