"""The store contract for agents and approvals."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from rebuno.kernel.domain.errors import Conflict, NotFound
from rebuno.kernel.domain.records import NO_METADATA, AgentMetadata
from rebuno.kernel.store.base import Store
from rebuno.protocol.enums import ApprovalStatus
from tests.store.builders import agent, approval, seed_agent, seed_execution, seed_step
from tests.support import START

LATER = START + timedelta(hours=1)


# -- agents ----------------------------------------------------------------------------------


async def test_agent_round_trips(store: Store) -> None:
    stored = await seed_agent(store, "a1", policy_bundle="rules: []", lease_timeout_seconds=42.5)

    assert stored == agent("a1", policy_bundle="rules: []", lease_timeout_seconds=42.5)
    assert await store.get_agent("a1") == stored


async def test_upsert_replaces_an_agent_but_keeps_its_first_registration(store: Store) -> None:
    await seed_agent(store, "a1", policy_bundle="old")
    update = agent(
        "a1", webhook_url="http://new", secret="new", policy_bundle="new", registered_at=LATER
    )

    async with store.transaction() as tx:
        stored = await tx.upsert_agent(update, keep_bundle=False)

    assert stored == replace(update, registered_at=START)
    assert await store.get_agent("a1") == stored


async def test_upsert_with_keep_bundle_keeps_the_stored_bundle(store: Store) -> None:
    await seed_agent(store, "a1", policy_bundle="kept")

    async with store.transaction() as tx:
        stored = await tx.upsert_agent(agent("a1", webhook_url="http://new"), keep_bundle=True)

    assert (stored.policy_bundle, stored.webhook_url) == ("kept", "http://new")


async def test_upsert_with_keep_bundle_of_a_new_agent_stores_its_bundle(store: Store) -> None:
    async with store.transaction() as tx:
        stored = await tx.upsert_agent(agent("a1", policy_bundle="first"), keep_bundle=True)

    assert stored.policy_bundle == "first"


async def test_agent_metadata_round_trips_and_survives_a_re_registration(store: Store) -> None:
    await seed_agent(store, "a1")
    published = AgentMetadata("researches", '{"type":"object"}', '{"type":"string"}')

    async with store.transaction() as tx:
        await tx.update_agent_metadata("a1", published, LATER)
    async with store.transaction() as tx:
        upserted = await tx.upsert_agent(agent("a1", webhook_url="http://new"), keep_bundle=True)

    expected = replace(
        agent("a1", webhook_url="http://new"), metadata=published, metadata_updated_at=LATER
    )
    assert upserted == expected
    assert await store.get_agent("a1") == expected
    assert await store.list_agents() == [expected]
    lean = await store.get_agent("a1", metadata=False)
    assert (lean.metadata, lean.metadata_updated_at) == (NO_METADATA, None)


async def test_agent_metadata_is_replaced_whole(store: Store) -> None:
    await seed_agent(store, "a1")
    async with store.transaction() as tx:
        await tx.update_agent_metadata("a1", AgentMetadata("d", "{}", "{}"), START)
    async with store.transaction() as tx:
        await tx.update_agent_metadata("a1", NO_METADATA, LATER)

    stored = await store.get_agent("a1")
    assert (stored.metadata, stored.metadata_updated_at) == (NO_METADATA, LATER)


async def test_metadata_of_an_unknown_agent_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        async with store.transaction() as tx:
            await tx.update_agent_metadata("ghost", NO_METADATA, START)


async def test_list_agents_is_sorted_by_id(store: Store) -> None:
    for agent_id in ("b", "c", "a"):
        await seed_agent(store, agent_id)

    assert [a.id for a in await store.list_agents()] == ["a", "b", "c"]


async def test_unknown_agent_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="ghost"):
        await store.get_agent("ghost")
    with pytest.raises(NotFound, match="ghost"):
        async with store.transaction() as tx:
            await tx.get_agent("ghost")


async def test_delete_agent_removes_it(store: Store) -> None:
    await seed_agent(store, "a1")

    async with store.transaction() as tx:
        await tx.delete_agent("a1")

    assert await store.list_agents() == []


async def test_delete_agent_with_executions_is_a_conflict(store: Store) -> None:
    await seed_execution(store, "busy")

    with pytest.raises(Conflict, match="busy"):
        async with store.transaction() as tx:
            await tx.delete_agent("busy")

    assert (await store.get_agent("busy")).id == "busy"


async def test_delete_unknown_agent_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="ghost"):
        async with store.transaction() as tx:
            await tx.delete_agent("ghost")


async def test_set_policy_bundle_replaces_or_clears_it(store: Store) -> None:
    await seed_agent(store, "a1", policy_bundle="old")

    async with store.transaction() as tx:
        await tx.set_policy_bundle("a1", "new")
    replaced = (await store.get_agent("a1")).policy_bundle
    async with store.transaction() as tx:
        await tx.set_policy_bundle("a1", None)

    assert (replaced, (await store.get_agent("a1")).policy_bundle) == ("new", None)


async def test_set_policy_bundle_of_unknown_agent_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="ghost"):
        async with store.transaction() as tx:
            await tx.set_policy_bundle("ghost", "x")


# -- approvals -------------------------------------------------------------------------------


async def test_approval_round_trips(store: Store) -> None:
    created = await seed_execution(store)
    gated = await seed_step(store, created.id)
    record = approval(created.id, gated.step_id)
    no_approvers = approval(created.id, gated.step_id, approvers=None, message=None)

    async with store.transaction(created.id) as tx:
        await tx.insert_approval(record)
        await tx.insert_approval(no_approvers)
        assert await tx.get_approval(record.id) == record

    assert await store.get_approval(no_approvers.id) == no_approvers


async def test_update_approval_records_the_decision(store: Store) -> None:
    created = await seed_execution(store)
    gated = await seed_step(store, created.id)
    record = approval(created.id, gated.step_id)
    granted = replace(
        record,
        status=ApprovalStatus.GRANTED,
        decided_by="alice",
        decided_at=LATER,
        rationale="fine",
    )

    async with store.transaction(created.id) as tx:
        await tx.insert_approval(record)
    async with store.transaction(created.id) as tx:
        await tx.update_approval(granted)

    assert await store.get_approval(record.id) == granted


async def test_unknown_approval_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="no-such-approval"):
        await store.get_approval("no-such-approval")


async def test_pending_approval_for_step_ignores_decided_ones(store: Store) -> None:
    created = await seed_execution(store)
    gated = await seed_step(store, created.id)
    decided = approval(created.id, gated.step_id, status=ApprovalStatus.DENIED)
    pending = approval(created.id, gated.step_id, created_at=LATER)

    async with store.transaction(created.id) as tx:
        assert await tx.pending_approval_for_step(gated.step_id) is None
        await tx.insert_approval(decided)
        assert await tx.pending_approval_for_step(gated.step_id) is None
        await tx.insert_approval(pending)
        assert await tx.pending_approval_for_step(gated.step_id) == pending


async def test_approvals_list_by_status_and_execution_in_creation_order(store: Store) -> None:
    first = await seed_execution(store)
    second = await seed_execution(store)
    gated = await seed_step(store, first.id)
    other = await seed_step(store, second.id)
    late = approval(first.id, gated.step_id, created_at=LATER)
    early = approval(first.id, gated.step_id, created_at=START)
    done = approval(first.id, gated.step_id, status=ApprovalStatus.EXPIRED)
    elsewhere = approval(second.id, other.step_id)
    async with store.transaction() as tx:
        for record in (late, early, done, elsewhere):
            await tx.insert_approval(record)

    async with store.transaction(first.id) as tx:
        pending_here = await tx.list_pending_approvals(first.id)

    assert pending_here == [early, late]
    assert await store.list_approvals(ApprovalStatus.PENDING, first.id) == [early, late]
    assert await store.list_approvals(ApprovalStatus.EXPIRED, None) == [done]
    assert {a.id for a in await store.list_approvals(None, None)} == {
        late.id, early.id, done.id, elsewhere.id,
    }  # fmt: skip
    assert await store.list_approvals(None, second.id) == [elsewhere]
