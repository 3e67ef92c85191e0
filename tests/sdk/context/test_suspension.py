"""`Suspension` (docs/protocol.md §25.8): a body waiting for its sub-agent suspends the
execution only once every body in flight waits, with one suspend for all of them; suspended,
each raises `Blocked`; not suspended, each gets its step's recorded outcome."""

from __future__ import annotations

import asyncio

import pytest

from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._suspension import Suspension
from rebuno.sdk.errors import Blocked, ToolError
from rebuno.types import SpawnedBy
from tests.sdk.conftest import Harness
from tests.sdk.context.conftest import Webhook, proceeding

CHILD = "child"
SUSPEND = "/v0/executions/{execution_id}/suspend"


@pytest.fixture
async def parent(harness: Harness, webhook: Webhook, dispatch: Dispatch) -> Dispatch:
    """The dispatch, with a child agent whose executions stay live (nothing runs them)."""
    await harness.register(CHILD, webhook.url)
    return dispatch


async def waiting_steps(harness: Harness, parent: Dispatch, count: int) -> list[str]:
    """`count` executing steps, each waiting for a live child."""
    step_ids = await proceeding(parent, count)
    for step_id in step_ids:
        spawned = SpawnedBy(execution_id=parent.execution_id, step_id=step_id)
        await harness.client.create(CHILD, spawned_by=spawned)
    return step_ids


async def test_one_suspend_speaks_for_every_waiting_body(
    harness: Harness, parent: Dispatch
) -> None:
    step_ids = await waiting_steps(harness, parent, 2)
    suspension = Suspension(parent)
    before = await harness.answered("POST", SUSPEND)

    for _ in step_ids:
        suspension.started()
    outcomes = await asyncio.gather(
        *(suspension.await_subagent(step_id) for step_id in step_ids), return_exceptions=True
    )

    assert [type(outcome) for outcome in outcomes] == [Blocked, Blocked]
    assert isinstance(parent.signal, Blocked)
    assert await harness.answered("POST", SUSPEND) - before == 1
    assert (await harness.client.get(parent.execution_id)).status == "blocked"


async def test_no_suspend_is_asked_while_another_body_still_runs(
    harness: Harness, parent: Dispatch
) -> None:
    [step_id] = await waiting_steps(harness, parent, 1)
    suspension = Suspension(parent)
    before = await harness.answered("POST", SUSPEND)
    suspension.started()
    suspension.started()

    waiting = asyncio.create_task(suspension.await_subagent(step_id))
    # A round trip of the kernel's: a suspend asked too soon would be answered by then.
    meanwhile = (await harness.client.get(parent.execution_id)).status
    asked_meanwhile = await harness.answered("POST", SUSPEND) - before
    suspension.ended()  # the other body ends without waiting for a child

    with pytest.raises(Blocked):
        await waiting
    assert (meanwhile, asked_meanwhile) == ("running", 0)
    assert await harness.answered("POST", SUSPEND) - before == 1


async def test_children_that_ended_already_give_each_step_its_recorded_outcome(
    harness: Harness, parent: Dispatch
) -> None:
    done, failed = await proceeding(parent, 2)
    kernel, execution_id, lease = parent.kernel, parent.execution_id, parent.lease
    await kernel.complete_step(execution_id, done, lease, b'{"answer": 42}')
    await kernel.fail_step(execution_id, failed, lease, {"message": "the child failed"})
    suspension = Suspension(parent)

    suspension.started()
    suspension.started()
    outcomes = await asyncio.gather(
        suspension.await_subagent(done), suspension.await_subagent(failed), return_exceptions=True
    )

    assert outcomes[0] == {"answer": 42}
    assert isinstance(outcomes[1], ToolError)
    assert (outcomes[1].message, outcomes[1].step_id) == ("the child failed", failed)
    assert parent.signal is None


async def test_a_dispatch_that_unwinds_already_asks_nothing(
    harness: Harness, parent: Dispatch
) -> None:
    [step_id] = await waiting_steps(harness, parent, 1)
    suspension = Suspension(parent)
    before = await harness.answered("POST", SUSPEND)
    parent.remember(Blocked())

    suspension.started()
    with pytest.raises(Blocked):
        await suspension.await_subagent(step_id)

    assert await harness.answered("POST", SUSPEND) == before
