"""The store contract for the dispatch queue: claims, the reaper, retirement."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from rebuno.kernel.domain.records import Lease
from rebuno.kernel.store.base import Store
from rebuno.protocol.enums import DispatchStatus, ExecutionStatus
from tests.store.builders import (
    KEY,
    dispatch,
    seed_agent,
    seed_dispatch,
    seed_execution,
    seed_in_flight,
    step_id_for,
)
from tests.support import START

NOW = START + timedelta(minutes=10)
LEASE = timedelta(minutes=2)


async def test_claim_takes_due_rows_oldest_first_up_to_the_limit(store: Store) -> None:
    created = await seed_execution(store)
    late = await seed_dispatch(store, created.id, next_attempt_at=NOW - timedelta(seconds=1))
    early = await seed_dispatch(store, created.id, next_attempt_at=NOW - timedelta(seconds=9))
    middle = await seed_dispatch(store, created.id, next_attempt_at=NOW - timedelta(seconds=5))

    claimed = await store.claim_dispatches("r1", 2, NOW)

    assert [c.dispatch.id for c in claimed] == [early.id, middle.id]
    assert (await store.claim_dispatches("r1", 5, NOW))[0].dispatch.id == late.id


async def test_claim_leases_the_row_and_increments_the_attempt(store: Store) -> None:
    created = await seed_execution(store, status=ExecutionStatus.PENDING)
    queued = await seed_dispatch(store, created.id, status=DispatchStatus.FAILED, attempt=2)

    [claimed] = await store.claim_dispatches("replica-7", 1, NOW)

    assert claimed.dispatch == replace(
        queued,
        status=DispatchStatus.IN_FLIGHT,
        attempt=3,
        locked_by="replica-7",
        locked_at=NOW,
        updated_at=NOW,
    )
    assert claimed.execution_status is ExecutionStatus.PENDING
    assert claimed.agent.id == created.agent_id


async def test_claim_skips_rows_not_yet_due_or_not_claimable(store: Store) -> None:
    created = await seed_execution(store)
    await seed_dispatch(store, created.id, next_attempt_at=NOW + timedelta(microseconds=1))
    await seed_dispatch(store, created.id, status=DispatchStatus.EXHAUSTED)
    await seed_in_flight(store, created.id)

    assert await store.claim_dispatches("r1", 10, NOW) == []


async def test_claim_resets_the_occurrence_counters(store: Store) -> None:
    created = await seed_execution(store)
    queued = await seed_dispatch(store, created.id)
    async with store.transaction(created.id) as tx:
        await tx.set_occurrence(queued.id, KEY, 4)

    [claimed] = await store.claim_dispatches("r1", 1, NOW)

    lease = Lease(dispatch_id=queued.id, attempt=claimed.dispatch.attempt)
    async with store.transaction(created.id) as tx:
        loaded = await tx.load_submission(created.id, lease, KEY, step_id_for(created.id), NOW)
    assert (loaded.lease_live, loaded.occurrence) == (True, 0)


async def test_two_concurrent_claimers_never_get_the_same_dispatch(store: Store) -> None:
    created = await seed_execution(store)
    queued = {(await seed_dispatch(store, created.id)).id for _ in range(10)}

    first, second = await asyncio.gather(
        store.claim_dispatches("r1", 10, NOW), store.claim_dispatches("r2", 10, NOW)
    )

    ids = [c.dispatch.id for c in first + second]
    assert len(ids) == len(set(ids))
    assert set(ids) == queued


async def test_dispatch_queue_counts_due_rows_and_finds_the_earliest(store: Store) -> None:
    created = await seed_execution(store)
    assert await store.dispatch_queue(NOW) == (0, None)
    await seed_dispatch(store, created.id, next_attempt_at=NOW + timedelta(seconds=30))
    await seed_dispatch(store, created.id, status=DispatchStatus.FAILED, next_attempt_at=NOW)
    await seed_dispatch(store, created.id, status=DispatchStatus.EXHAUSTED, next_attempt_at=START)

    assert await store.dispatch_queue(NOW) == (1, NOW)


async def test_reclaim_returns_expired_leases_to_pending_keeping_the_attempt(
    store: Store,
) -> None:
    created = await seed_execution(store)
    expired = await seed_in_flight(store, created.id, locked_at=NOW - LEASE - timedelta(seconds=1))
    fresh = await seed_in_flight(store, created.id, locked_at=NOW - LEASE + timedelta(seconds=1))

    assert await store.reclaim_expired(NOW, LEASE) == 1

    async with store.transaction(created.id) as tx:
        returned = await tx.get_dispatch(expired.id)
        kept = await tx.get_dispatch(fresh.id)
    assert returned == replace(
        expired,
        status=DispatchStatus.PENDING,
        next_attempt_at=NOW,
        locked_by=None,
        locked_at=None,
        updated_at=NOW,
    )
    assert kept == fresh


async def test_reclaim_uses_the_agent_lease_when_at_least_ten_seconds(store: Store) -> None:
    await seed_agent(store, "patient", lease_timeout_seconds=600.0)
    await seed_agent(store, "tiny", lease_timeout_seconds=5.0)
    patient = await seed_execution(store, "patient")
    tiny = await seed_execution(store, "tiny")
    # Both are past the default lease; only the agent's own 10-minute lease keeps one.
    locked_at = NOW - LEASE - timedelta(seconds=1)
    kept = await seed_in_flight(store, patient.id, locked_at=locked_at)
    await seed_in_flight(store, tiny.id, locked_at=locked_at)

    assert await store.reclaim_expired(NOW, LEASE) == 1
    async with store.transaction(patient.id) as tx:
        assert await tx.get_dispatch(kept.id) == kept


async def test_reclaim_honours_a_short_agent_lease(store: Store) -> None:
    await seed_agent(store, "quick", lease_timeout_seconds=10.0)
    quick = await seed_execution(store, "quick")
    await seed_in_flight(store, quick.id, locked_at=NOW - timedelta(seconds=11))

    assert await store.reclaim_expired(NOW, LEASE) == 1


async def test_reclaim_works_through_more_than_one_page(store: Store) -> None:
    created = await seed_execution(store)
    expired_at = NOW - LEASE - timedelta(seconds=1)
    async with store.transaction(created.id) as tx:
        for _ in range(230):
            await tx.insert_dispatch(
                dispatch(created.id, status=DispatchStatus.IN_FLIGHT, attempt=1,
                         locked_by="r1", locked_at=expired_at)
            )  # fmt: skip

    assert await store.reclaim_expired(NOW, LEASE) == 230
    assert await store.reclaim_expired(NOW, LEASE) == 0


async def test_retire_exhausts_every_live_dispatch_of_the_execution(store: Store) -> None:
    created = await seed_execution(store)
    other = await seed_execution(store)
    live = await seed_in_flight(store, created.id)
    queued = await seed_dispatch(store, created.id, status=DispatchStatus.FAILED)
    elsewhere = await seed_in_flight(store, other.id)

    async with store.transaction(created.id) as tx:
        await tx.retire_dispatches(created.id, NOW)
        retired = [await tx.get_dispatch(d.id) for d in (live, queued)]
        untouched = await tx.get_dispatch(elsewhere.id)

    for before, after in zip((live, queued), retired, strict=True):
        assert after == replace(
            before, status=DispatchStatus.EXHAUSTED, locked_by=None, locked_at=None, updated_at=NOW
        )
    assert untouched == elsewhere


async def test_update_dispatch_writes_status_schedule_and_lock(store: Store) -> None:
    created = await seed_execution(store)
    live = await seed_in_flight(store, created.id)
    failed = replace(
        live,
        status=DispatchStatus.FAILED,
        next_attempt_at=NOW + timedelta(seconds=2),
        locked_by=None,
        locked_at=None,
        updated_at=NOW,
    )

    async with store.transaction(created.id) as tx:
        await tx.update_dispatch(failed)
        assert await tx.get_dispatch(live.id) == failed


async def test_an_unknown_dispatch_is_none(store: Store) -> None:
    async with store.transaction() as tx:
        assert await tx.get_dispatch("01900000-0000-7000-8000-fffffffffffe") is None
