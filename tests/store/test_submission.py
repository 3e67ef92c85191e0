"""The store contract for `load_submission`, occurrence counters and lease renewal."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.store.base import StepKey, Store, Submission
from rebuno.protocol.enums import DispatchStatus, StepKind
from tests.store.builders import (
    KEY,
    hex_id,
    seed_dispatch,
    seed_execution,
    seed_in_flight,
    seed_step,
    step_id_for,
)
from tests.support import START

LATER = START + timedelta(seconds=30)


async def _load(store: Store, execution_id: str, lease: Lease, key: StepKey = KEY) -> Submission:
    async with store.transaction(execution_id) as tx:
        return await tx.load_submission(
            execution_id, lease, key, step_id_for(execution_id, key), LATER
        )


async def _lease_of(store: Store, execution_id: str) -> Lease:
    live = await seed_in_flight(store, execution_id)
    return Lease(dispatch_id=live.id, attempt=live.attempt)


async def test_first_submission_gets_occurrence_zero_and_no_step(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease_of(store, created.id)

    loaded = await _load(store, created.id, lease)

    assert loaded == Submission(
        execution=created, lease_live=True, occurrence=0, existing=None, policy_bundle=None
    )


async def test_occurrence_follows_the_counter_and_finds_the_recorded_step(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease_of(store, created.id)
    recorded = await seed_step(store, created.id, 3)
    async with store.transaction(created.id) as tx:
        await tx.set_occurrence(lease.dispatch_id, KEY, 2)

    loaded = await _load(store, created.id, lease)

    assert (loaded.occurrence, loaded.existing) == (3, recorded)


async def test_counters_are_per_step_key(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease_of(store, created.id)
    other = StepKey(kind=StepKind.LLM_CALL, target="gpt", args_hash=hex_id("other"))
    async with store.transaction(created.id) as tx:
        await tx.set_occurrence(lease.dispatch_id, KEY, 4)

    assert (await _load(store, created.id, lease, other)).occurrence == 0


async def test_set_occurrence_never_moves_the_counter_back(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease_of(store, created.id)
    async with store.transaction(created.id) as tx:
        await tx.set_occurrence(lease.dispatch_id, KEY, 5)
        await tx.set_occurrence(lease.dispatch_id, KEY, 1)

    assert (await _load(store, created.id, lease)).occurrence == 6


async def test_load_submission_renews_a_live_lease(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease_of(store, created.id)

    await _load(store, created.id, lease)

    async with store.transaction(created.id) as tx:
        renewed = await tx.get_dispatch(lease.dispatch_id)
    assert renewed is not None
    assert renewed.locked_at == LATER


@pytest.mark.parametrize("case", ["wrong_attempt", "not_in_flight", "unknown", "other_execution"])
async def test_lease_is_not_live_when_it_does_not_own_the_dispatch(store: Store, case: str) -> None:
    created = await seed_execution(store)
    other = await seed_execution(store)
    pending = await seed_dispatch(store, created.id, status=DispatchStatus.PENDING, attempt=1)
    foreign = await seed_in_flight(store, other.id)
    live = await seed_in_flight(store, created.id, attempt=2)
    lease = {
        "wrong_attempt": Lease(dispatch_id=live.id, attempt=1),
        "not_in_flight": Lease(dispatch_id=pending.id, attempt=1),
        "unknown": Lease(dispatch_id="01900000-0000-7000-8000-ffffffffffff", attempt=1),
        "other_execution": Lease(dispatch_id=foreign.id, attempt=foreign.attempt),
    }[case]

    loaded = await _load(store, created.id, lease)

    assert loaded.lease_live is False
    async with store.transaction(created.id) as tx:
        untouched = await tx.get_dispatch(live.id)
    assert untouched is not None
    assert untouched.locked_at == START


async def test_load_submission_of_an_unknown_execution_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="missing-execution"):
        await _load(store, "missing-execution", Lease(dispatch_id="d", attempt=1))


async def test_lock_execution_renews_the_lease_only_for_the_owner(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease_of(store, created.id)

    async with store.transaction(created.id) as tx:
        other = Lease(lease.dispatch_id, lease.attempt + 1)
        stale = (await tx.lock_execution(created.id, other, LATER)).lease_live
        owner = (await tx.lock_execution(created.id, lease, LATER)).lease_live
        renewed = await tx.get_dispatch(lease.dispatch_id)

    assert (stale, owner) == (False, True)
    assert renewed is not None
    assert renewed.locked_at == LATER


async def test_submission_carries_the_agents_policy_bundle(store: Store) -> None:
    created = await seed_execution(store)
    async with store.transaction() as tx:
        await tx.set_policy_bundle(created.agent_id, "default_action: allow\n")
    lease = await _lease_of(store, created.id)

    loaded = await _load(store, created.id, lease)

    assert loaded.policy_bundle == "default_action: allow\n"


async def test_completion_reads_execution_step_and_dispatch_together(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease_of(store, created.id)

    async with store.transaction(created.id) as tx:
        loaded = await tx.load_completion(created.id, "f" * 64, lease.dispatch_id)
        foreign = await tx.load_completion(
            created.id, "f" * 64, "01900000-0000-7000-8000-0000000fffff"
        )

    assert loaded.execution == created
    assert loaded.step is None
    assert loaded.dispatch is not None and loaded.dispatch.attempt == lease.attempt
    assert foreign.dispatch is None
