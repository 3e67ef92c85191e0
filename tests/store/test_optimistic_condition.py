"""The condition of an optimistic transaction (`Unchanged`), clause by clause, on both stores.

Each backend evaluates the condition in one place (PostgreSQL `rebuno_unchanged` in
`functions.sql`, SQLite `transaction.still_unchanged`); each clause has its test here, and a
clause added there adds its test here. When the condition does not hold the transaction is
`Stale` and writes nothing: no event, no record, no lease renewed. `status` does not decide
whether the writes apply, only what they announce to other replicas, which only PostgreSQL
does (`test_watch_dispatches_reports_creations_and_status_changes_of_another_replica`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from rebuno.kernel.domain.identity import policy_hash
from rebuno.kernel.domain.records import Dispatch, Execution, Lease
from rebuno.kernel.store.base import Store, Unchanged
from rebuno.protocol.enums import DispatchStatus
from tests.store.builders import (
    KEY,
    append_optimistically,
    execution,
    seed_agent,
    seed_execution,
    seed_in_flight,
)
from tests.support import START

NOW = START + timedelta(seconds=30)


async def _written(store: Store, seen: Execution) -> bool:
    """Whether an optimistic write on `seen` left its event and its record."""
    logged = await store.list_events(seen.id, 0, 10)
    record = await store.get_execution(seen.id)
    return bool(logged) and record.last_event_seq == seen.last_event_seq + 1


async def _lease_renewed_at(store: Store, dispatch: Dispatch) -> object:
    async with store.transaction(dispatch.execution_id) as tx:
        found = await tx.get_dispatch(dispatch.id)
    assert found is not None
    return found.locked_at


async def test_an_optimistic_write_applies_on_the_record_it_was_read_as_and_renews_its_lease(
    store: Store,
) -> None:
    seen = await seed_execution(store)
    live = await seed_in_flight(store, seen.id)
    lease = Lease(live.id, live.attempt)

    assert await append_optimistically(store, seen, Unchanged.on(seen, lease, NOW))
    assert await _written(store, seen)
    assert await _lease_renewed_at(store, live) == NOW


async def test_an_optimistic_write_is_stale_once_the_execution_moved(store: Store) -> None:
    seen = await seed_execution(store)

    assert not await append_optimistically(store, seen, Unchanged(seen.last_event_seq + 1))
    assert not await _written(store, seen)


@pytest.mark.parametrize(
    ("status", "attempt"),
    [(DispatchStatus.PENDING, 1), (DispatchStatus.EXHAUSTED, 1), (DispatchStatus.IN_FLIGHT, 2)],
    ids=["returned-to-the-queue", "retired", "superseded-attempt"],
)
async def test_an_optimistic_write_is_stale_once_its_lease_no_longer_owns_the_dispatch(
    store: Store, status: DispatchStatus, attempt: int
) -> None:
    seen = await seed_execution(store)
    live = await seed_in_flight(store, seen.id)
    async with store.transaction(seen.id) as tx:
        await tx.update_dispatch(replace(live, status=status, attempt=attempt))

    stale = Unchanged.on(seen, Lease(live.id, live.attempt), NOW)
    assert not await append_optimistically(store, seen, stale)
    assert not await _written(store, seen)


async def test_an_optimistic_write_is_stale_once_its_dispatch_used_an_occurrence_counter(
    store: Store,
) -> None:
    seen = await seed_execution(store)
    live = await seed_in_flight(store, seen.id)
    async with store.transaction(seen.id) as tx:
        await tx.set_occurrence(live.id, KEY, 0)  # a step numbered by the kernel (§7.3)

    stale = Unchanged.on(seen, Lease(live.id, live.attempt), NOW)
    assert not await append_optimistically(store, seen, stale)
    assert not await _written(store, seen)
    assert await _lease_renewed_at(store, live) == live.locked_at


async def test_an_optimistic_write_without_a_lease_looks_at_no_dispatch(store: Store) -> None:
    seen = await seed_execution(store)
    live = await seed_in_flight(store, seen.id)
    async with store.transaction(seen.id) as tx:
        await tx.set_occurrence(live.id, KEY, 0)

    assert await append_optimistically(store, seen, Unchanged.on(seen))
    assert await _lease_renewed_at(store, live) == live.locked_at


async def test_an_optimistic_write_is_stale_once_the_agents_policy_changed(store: Store) -> None:
    await seed_agent(store, policy_bundle="rules: []")
    seen = await seed_execution(store)
    async with store.transaction() as tx:
        await tx.set_policy_bundle(seen.agent_id, "rules: [deny]")

    stale = Unchanged.on(seen, policy_hash=policy_hash("rules: []"))
    assert not await append_optimistically(store, seen, stale)
    assert not await _written(store, seen)
    assert await append_optimistically(
        store, seen, Unchanged.on(seen, policy_hash=policy_hash("rules: [deny]"))
    )


async def test_an_optimistic_write_is_held_to_the_executions_own_policy_over_its_agents(
    store: Store,
) -> None:
    await seed_agent(store, policy_bundle="agent's")
    seen = execution()
    async with store.transaction(seen.id) as tx:
        await tx.insert_execution(seen, policy_bundle="its own")  # a fork's (§26.4)

    assert not await append_optimistically(
        store, seen, Unchanged.on(seen, policy_hash=policy_hash("agent's"))
    )
    assert await append_optimistically(
        store, seen, Unchanged.on(seen, policy_hash=policy_hash("its own"))
    )


async def test_an_optimistic_write_holds_an_execution_without_a_policy_to_the_empty_texts_hash(
    store: Store,
) -> None:
    seen = await seed_execution(store)

    assert await append_optimistically(store, seen, Unchanged.on(seen, policy_hash=policy_hash("")))


async def test_a_childless_optimistic_write_is_stale_once_a_child_was_started(
    store: Store,
) -> None:
    seen = await seed_execution(store)
    async with store.transaction(seen.id) as tx:
        await tx.mark_parent(seen.id)  # as a child's create does: the record does not move

    assert not await append_optimistically(store, seen, Unchanged.on(seen, childless=True))
    assert not await _written(store, seen)
    assert await append_optimistically(store, seen, Unchanged.on(seen))
