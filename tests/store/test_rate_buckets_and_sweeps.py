"""The store contract for rate buckets, background sweeps, the leader lock and ping."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.store.base import Store, Wanted
from rebuno.protocol.enums import ApprovalStatus, ExecutionStatus
from tests.store.builders import (
    KEY,
    agent,
    approval,
    event,
    execution,
    seed_dispatch,
    seed_execution,
    seed_step,
)
from tests.support import START, ManualClock

CUTOFF = START + timedelta(hours=24)


async def _take(store: Store, clock: ManualClock, key: str = "r1:global") -> float | None:
    async with store.transaction() as tx:
        return await tx.take_rate_token(key, 2, 10.0, clock.now())


# -- rate buckets ----------------------------------------------------------------------------


async def test_a_new_bucket_starts_full(store: Store, clock: ManualClock) -> None:
    assert [await _take(store, clock), await _take(store, clock)] == [None, None]


async def test_an_empty_bucket_refuses_with_the_estimated_wait(
    store: Store, clock: ManualClock
) -> None:
    await _take(store, clock)
    await _take(store, clock)

    assert await _take(store, clock) == pytest.approx(5.0)


async def test_a_bucket_refills_over_time(store: Store, clock: ManualClock) -> None:
    await _take(store, clock)
    await _take(store, clock)
    clock.advance(timedelta(seconds=2.5))

    assert await _take(store, clock) == pytest.approx(2.5)
    clock.advance(timedelta(seconds=2.5))
    assert await _take(store, clock) is None


async def test_buckets_are_separate_per_key(store: Store, clock: ManualClock) -> None:
    await _take(store, clock, "r1:exec:a")
    await _take(store, clock, "r1:exec:a")

    assert await _take(store, clock, "r1:exec:b") is None


async def test_a_rolled_back_token_is_not_spent(store: Store, clock: ManualClock) -> None:
    for _ in range(2):
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                await tx.take_rate_token("k", 1, 10.0, clock.now())
                raise RuntimeError("roll back")

    assert await _take(store, clock, "k") is None


# -- sweeps ----------------------------------------------------------------------------------


async def test_expired_approvals_are_pending_ones_past_their_timeout(store: Store) -> None:
    created = await seed_execution(store)
    gated = await seed_step(store, created.id)
    now = START + timedelta(minutes=20)
    due = approval(created.id, gated.step_id, timeout_at=now)
    overdue = approval(created.id, gated.step_id, timeout_at=now - timedelta(minutes=1))
    future = approval(created.id, gated.step_id, timeout_at=now + timedelta(seconds=1))
    decided = approval(created.id, gated.step_id, status=ApprovalStatus.GRANTED, timeout_at=START)
    async with store.transaction(created.id) as tx:
        for record in (due, overdue, future, decided):
            await tx.insert_approval(record)

    expired = await store.list_expired_approvals(now, 10)

    assert expired == sorted([due.id, overdue.id])
    assert await store.list_expired_approvals(now, 1) == expired[:1]
    assert await store.list_expired_approvals(now, 10, after=expired[0]) == expired[1:]


async def test_overdue_executions_are_live_ones_past_their_deadline(store: Store) -> None:
    now = START + timedelta(hours=1)
    live = [
        await seed_execution(store, status=status, deadline_at=now)
        for status in (ExecutionStatus.PENDING, ExecutionStatus.RUNNING, ExecutionStatus.BLOCKED)
    ]
    await seed_execution(store, status=ExecutionStatus.COMPLETED, deadline_at=START)
    await seed_execution(store, deadline_at=now + timedelta(seconds=1))
    await seed_execution(store, deadline_at=None)

    overdue = await store.list_overdue_executions(now, 10)

    assert overdue == sorted(e.id for e in live)
    assert await store.list_overdue_executions(now, 2) == overdue[:2]
    assert await store.list_overdue_executions(now, 10, after=overdue[1]) == overdue[2:]


async def test_retention_deletes_old_terminal_executions_with_their_children(
    store: Store,
) -> None:
    old = await seed_execution(store, status=ExecutionStatus.COMPLETED, updated_at=START)
    gated = await seed_step(store, old.id)
    queued = await seed_dispatch(store, old.id)
    async with store.transaction(old.id) as tx:
        await tx.append_events([event(old.id, 1)])
        await tx.insert_approval(approval(old.id, gated.step_id))
        await tx.set_occurrence(queued.id, KEY, 3)

    assert await store.delete_terminal_before(CUTOFF) == 1

    with pytest.raises(NotFound):
        await store.get_execution(old.id)
    assert await store.list_events(old.id, 0, 10) == []
    assert await store.get_step(gated.step_id) is None
    assert await store.list_approvals(None, old.id) == []
    async with store.transaction() as tx:
        assert await tx.get_dispatch(queued.id) is None
        counted = await tx.load_outcomes(old.id, queued.id, Wanted({KEY: 1}, ()))
    assert counted.consumed == {}


async def test_retention_keeps_live_and_recent_executions(store: Store) -> None:
    running = await seed_execution(store, status=ExecutionStatus.RUNNING, updated_at=START)
    recent = await seed_execution(store, status=ExecutionStatus.FAILED, updated_at=CUTOFF)

    assert await store.delete_terminal_before(CUTOFF) == 0

    assert (await store.get_execution(running.id)).id == running.id
    assert (await store.get_execution(recent.id)).id == recent.id


async def test_retention_deletes_untouched_rate_buckets(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.take_rate_token("stale", 1, 10.0, START)
        await tx.take_rate_token("fresh", 1, 10.0, CUTOFF)

    await store.delete_terminal_before(CUTOFF)

    async with store.transaction() as tx:
        # A deleted bucket starts full again; the fresh one is still empty.
        assert await tx.take_rate_token("stale", 1, 10.0, CUTOFF) is None
        assert await tx.take_rate_token("fresh", 1, 10.0, CUTOFF) is not None


async def test_retention_deletes_more_than_a_page(store: Store) -> None:
    async with store.transaction() as tx:
        await tx.upsert_agent(agent(), keep_bundle=False)
        for _ in range(1100):
            await tx.insert_execution(execution(status=ExecutionStatus.CANCELLED, updated_at=START))

    assert await store.delete_terminal_before(CUTOFF) == 1100


# -- leader and ping -------------------------------------------------------------------------


async def test_leader_lock_is_exclusive_while_held(store: Store) -> None:
    async with (
        store.leader("sweeper") as first,
        store.leader("sweeper") as second,
        store.leader("other") as third,
    ):
        assert (first, second, third) == (True, False, True)
    async with store.leader("sweeper") as again:
        assert again is True


async def test_ping_answers_on_an_open_store(store: Store) -> None:
    await store.ping()
