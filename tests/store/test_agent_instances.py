"""The store contract for `agent-instances`: who acknowledged a dispatch's attempt is kept while
that attempt is live, the next claim forgets it, the listing finds an instance's other
incarnations, and ending a lease hands the attempt to the reaper."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from rebuno.kernel.store.base import Store
from rebuno.protocol.enums import DispatchStatus
from rebuno.protocol.extensions import AgentInstance
from tests.store.builders import seed_dispatch, seed_execution, seed_in_flight
from tests.support import START

NOW = START + timedelta(minutes=10)
LEASE = timedelta(minutes=2)
OLD = AgentInstance("worker-1:5000", "0192f4c1-7a2b-7c3d-8e4f-a1b2c3d4e5f6")
NEW = AgentInstance("worker-1:5000", "0192f4c1-7a2b-7c3d-8e4f-000000000002")


async def test_listing_finds_the_attempts_other_incarnations_of_the_name_acknowledged(
    store: Store,
) -> None:
    mine = await seed_execution(store)
    theirs = await seed_execution(store, "agent-2")
    dead = await seed_in_flight(store, mine.id, locked_at=NOW)
    alive = await seed_in_flight(store, mine.id, locked_at=NOW)
    elsewhere = await seed_in_flight(store, mine.id, locked_at=NOW)
    other_agent = await seed_in_flight(store, theirs.id, locked_at=NOW)
    await store.set_dispatch_instance(dead.id, dead.attempt, OLD)
    await store.set_dispatch_instance(alive.id, alive.attempt, NEW)
    await store.set_dispatch_instance(elsewhere.id, elsewhere.attempt, replace(OLD, name="w-2"))
    await store.set_dispatch_instance(other_agent.id, other_agent.attempt, OLD)

    listed = await store.list_superseded_dispatches("agent-1", NEW, 10)

    assert listed == [dead]


async def test_an_instance_is_kept_only_for_the_live_attempt(store: Store) -> None:
    created = await seed_execution(store)
    live = await seed_in_flight(store, created.id, locked_at=NOW, attempt=2)
    queued = await seed_dispatch(store, created.id)

    await store.set_dispatch_instance(live.id, 1, OLD)  # an older attempt's answer
    await store.set_dispatch_instance(queued.id, queued.attempt, OLD)  # not in flight

    assert await store.list_superseded_dispatches("agent-1", NEW, 10) == []


async def test_the_next_claim_forgets_who_acknowledged(store: Store) -> None:
    created = await seed_execution(store)
    held = await seed_in_flight(store, created.id, locked_at=NOW - LEASE - timedelta(seconds=1))
    await store.set_dispatch_instance(held.id, held.attempt, OLD)
    assert await store.reclaim_expired(NOW, LEASE) == 1

    [claimed] = await store.claim_dispatches("r2", 1, NOW)

    assert claimed.dispatch.attempt == held.attempt + 1
    assert await store.list_superseded_dispatches("agent-1", NEW, 10) == []


async def test_an_ended_lease_is_reclaimed_as_an_expired_one(store: Store) -> None:
    created = await seed_execution(store)
    held = await seed_in_flight(store, created.id, locked_at=NOW)
    other = await seed_in_flight(store, created.id, locked_at=NOW)

    async with store.transaction(created.id) as tx:
        await tx.expire_lease(held.id, held.attempt)
        await tx.expire_lease(other.id, other.attempt + 1)  # not its live attempt
    returned = await store.reclaim_expired(NOW, LEASE)

    assert returned == 1
    async with store.transaction(created.id) as tx:
        assert (await tx.get_dispatch(held.id)) == replace(
            held,
            status=DispatchStatus.PENDING,
            next_attempt_at=NOW,
            locked_by=None,
            locked_at=None,
            updated_at=NOW,
        )
        assert await tx.get_dispatch(other.id) == other
