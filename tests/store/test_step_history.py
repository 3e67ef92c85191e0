"""`Store.load_step_history` (§35.3): the execution, every step whole in proposal order, and
only its decision events in log order, filled the same way by both stores."""

from __future__ import annotations

import pytest

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.store.base import StepHistory, Store
from tests.store.builders import event, seed_execution, seed_step

LARGE_ARGS = '{"blob":"' + "x" * 100_000 + '"}'


async def test_a_history_holds_the_steps_and_only_the_decision_events(store: Store) -> None:
    created = await seed_execution(store, "a1", last_event_seq=0)
    later = await seed_step(store, created.id, 1, proposed_seq=4, args=LARGE_ARGS)
    first = await seed_step(store, created.id, 0, proposed_seq=1)
    logged = [
        event(created.id, 1, type="step.proposed", payload='{"step_id":"a"}'),
        event(created.id, 2, type="step.awaiting_approval", payload='{"step_id":"a"}'),
        event(created.id, 3, type="approval.granted", payload='{"step_id":"a"}'),
        event(created.id, 4, type="step.allowed", payload='{"step_id":"a"}'),
        event(created.id, 5, type="step.denied", payload='{"step_id":"b","rule_id":"r"}'),
    ]
    async with store.transaction(created.id) as tx:
        await tx.append_events(logged)
    stored = await store.get_execution(created.id)

    history = await store.load_step_history(created.id)

    assert history == StepHistory(
        execution=stored, steps=[first, later], decisions=[logged[1], logged[3], logged[4]]
    )


async def test_a_history_carries_no_step_of_another_execution(store: Store) -> None:
    mine = await seed_execution(store, "a1")
    theirs = await seed_execution(store, "a1")
    await seed_step(store, theirs.id, 0)

    history = await store.load_step_history(mine.id)

    assert (history.steps, history.decisions) == ([], [])


async def test_the_history_of_an_unknown_execution_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.load_step_history("01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f")
