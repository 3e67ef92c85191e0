"""Every field of every record the store seam returns, filled the same way by both stores.

Each test writes records whose every field is set (or, where it matters, left empty) and
compares what comes back as whole records, so a field one backend forgets or fills
differently fails here: the submission (a new step and one already recorded), what
`lock_execution` and `load_outcomes` read, the completion load, claims, and the plain
records through each read that returns them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from rebuno.kernel.domain.records import Agent, Execution, Lease, Step
from rebuno.kernel.store.base import (
    ClaimedDispatch,
    Completion,
    ExecutionFilter,
    Locked,
    Outcomes,
    Page,
    Store,
    Submission,
    Wanted,
)
from rebuno.protocol.enums import ApprovalStatus, DispatchStatus, ExecutionStatus, StepStatus
from tests.store.builders import (
    KEY,
    approval,
    hex_id,
    seed_agent,
    seed_dispatch,
    seed_execution,
    seed_in_flight,
    seed_step,
    step_id_for,
)
from tests.support import START

LATER = START + timedelta(seconds=30)
BUNDLE = "default_action: allow\n"


async def _with_bundle(store: Store) -> Execution:
    """A running execution of an agent with every field set, a bundle among them."""
    await seed_agent(store, "a1", policy_bundle=BUNDLE, lease_timeout_seconds=42.5)
    return await seed_execution(
        store,
        "a1",
        agent_version="v3",
        output='{"partial":true}',
        failure_reason="none yet",
        deadline_at=START + timedelta(hours=1),
        last_event_seq=7,
    )


async def _finished_step(store: Store, execution_id: str, occurrence: int = 0) -> Step:
    """A step with every field set."""
    return await seed_step(
        store,
        execution_id,
        occurrence,
        status=StepStatus.SUCCEEDED,
        result='{"hits":[1, 2]}',
        error='{"reason":"none"}',
        usage_input=120,
        usage_output=34,
        proposed_seq=5,
        completed_at=START + timedelta(seconds=2),
    )


async def _lease(store: Store, execution_id: str) -> Lease:
    live = await seed_in_flight(store, execution_id)
    return Lease(dispatch_id=live.id, attempt=live.attempt)


async def _submission(
    store: Store, execution_id: str, lease: Lease, completing: tuple[str, ...] = ()
) -> Submission:
    async with store.transaction(execution_id) as tx:
        return await tx.load_submission(
            execution_id, lease, KEY, step_id_for(execution_id), LATER, completing
        )


# -- the submission --------------------------------------------------------------------------


async def test_a_submission_of_a_new_step_fills_every_field(store: Store) -> None:
    created = await _with_bundle(store)
    lease = await _lease(store, created.id)
    carried = await _finished_step(store, created.id, 4)

    loaded = await _submission(store, created.id, lease, (carried.step_id, hex_id("unknown")))

    assert loaded == Submission(
        execution=created,
        lease_live=True,
        occurrence=0,
        existing=None,
        policy_bundle=BUNDLE,
        completing=(carried,),
    )


async def test_a_submission_of_a_recorded_step_fills_every_field_with_the_bundle_too(
    store: Store,
) -> None:
    created = await _with_bundle(store)
    lease = await _lease(store, created.id)
    recorded = await _finished_step(store, created.id, 2)
    async with store.transaction(created.id) as tx:
        await tx.set_occurrence(lease.dispatch_id, KEY, 1)

    loaded = await _submission(store, created.id, lease, (recorded.step_id,))

    assert loaded == Submission(
        execution=created,
        lease_live=True,
        occurrence=2,
        existing=recorded,
        policy_bundle=BUNDLE,
        completing=(recorded,),
    )


async def test_a_submission_with_a_dead_lease_still_reads_the_rest(store: Store) -> None:
    created = await _with_bundle(store)
    live = await _lease(store, created.id)
    recorded = await _finished_step(store, created.id, 0)

    loaded = await _submission(store, created.id, Lease(live.dispatch_id, live.attempt + 1))

    assert loaded == Submission(
        execution=created,
        lease_live=False,
        occurrence=0,
        existing=recorded,
        policy_bundle=BUNDLE,
    )


async def test_a_submission_finds_the_step_under_the_id_its_occurrence_yields(
    store: Store,
) -> None:
    created = await seed_execution(store)
    lease = await _lease(store, created.id)
    await seed_step(store, created.id, 0)

    async with store.transaction(created.id) as tx:
        loaded = await tx.load_submission(
            created.id, lease, KEY, lambda n: hex_id("another id", n), LATER
        )

    assert (loaded.occurrence, loaded.existing, loaded.policy_bundle) == (0, None, None)


async def test_a_submission_carries_only_the_steps_of_its_own_execution(store: Store) -> None:
    created = await seed_execution(store)
    other = await seed_execution(store)
    lease = await _lease(store, created.id)
    foreign = await _finished_step(store, other.id)

    loaded = await _submission(store, created.id, lease, (foreign.step_id,))

    assert loaded.completing == ()


# -- lock_execution and load_outcomes --------------------------------------------------------


async def test_lock_execution_with_a_lease_and_outcomes_fills_every_field(store: Store) -> None:
    created = await _with_bundle(store)
    lease = await _lease(store, created.id)
    next_one = await _finished_step(store, created.id, 3)
    await _finished_step(store, created.id, 5)  # past the two reported occurrences
    named = await seed_step(store, created.id, 9)
    async with store.transaction(created.id) as tx:
        await tx.set_occurrence(lease.dispatch_id, KEY, 2)
    wanted = Wanted(reports={KEY: 2}, step_ids=(named.step_id,))

    async with store.transaction(created.id) as tx:
        locked = await tx.lock_execution(created.id, lease, LATER, wanted)
        renewed = await tx.get_dispatch(lease.dispatch_id)

    assert locked.outcomes is not None
    assert sorted(locked.outcomes.steps, key=_occurrence) == [next_one, named]
    assert replace(locked, outcomes=replace(locked.outcomes, steps=[])) == Locked(
        execution=created,
        lease_live=True,
        policy_bundle=BUNDLE,
        outcomes=Outcomes(consumed={KEY: 2}, steps=[]),
    )
    assert renewed is not None and renewed.locked_at == LATER


async def test_lock_execution_without_a_lease_reads_no_lease_and_no_outcomes(
    store: Store,
) -> None:
    created = await _with_bundle(store)
    lease = await _lease(store, created.id)

    async with store.transaction(created.id) as tx:
        bare = await tx.lock_execution(created.id)
        unrenewed = await tx.lock_execution(created.id, lease, None, Wanted({KEY: 1}, ()))
        untouched = await tx.get_dispatch(lease.dispatch_id)

    assert bare == Locked(execution=created, lease_live=False, policy_bundle=BUNDLE)
    assert unrenewed == Locked(
        execution=created,
        lease_live=False,
        policy_bundle=BUNDLE,
        outcomes=Outcomes(consumed={}, steps=[]),
    )
    assert untouched is not None and untouched.locked_at == START


async def test_load_outcomes_reads_counters_used_and_the_steps_named(store: Store) -> None:
    created = await seed_execution(store)
    lease = await _lease(store, created.id)
    first = await _finished_step(store, created.id, 0)
    named = await seed_step(store, created.id, 7)

    async with store.transaction(created.id) as tx:
        fresh = await tx.load_outcomes(
            created.id, lease.dispatch_id, Wanted({KEY: 1}, (named.step_id, first.step_id))
        )

    assert fresh.consumed == {}
    assert sorted(fresh.steps, key=_occurrence) == [first, named]


def _occurrence(found: Step) -> int:
    return found.occurrence


# -- the completion load ---------------------------------------------------------------------


async def test_a_completion_load_fills_every_field_locked_and_committed(store: Store) -> None:
    created = await _with_bundle(store)
    live = await seed_in_flight(store, created.id)
    recorded = await _finished_step(store, created.id)
    expected = Completion(execution=created, step=recorded, dispatch=live)

    async with store.transaction(created.id) as tx:
        locked = await tx.load_completion(created.id, recorded.step_id, live.id)
    committed = await store.load_completion(created.id, recorded.step_id, live.id)

    assert (locked, committed) == (expected, expected)


async def test_a_completion_load_leaves_out_records_of_another_execution(store: Store) -> None:
    created = await seed_execution(store)
    other = await seed_execution(store)
    foreign_step = await _finished_step(store, other.id)
    foreign_dispatch = await seed_in_flight(store, other.id)
    expected = Completion(execution=created, step=None, dispatch=None)

    async with store.transaction(created.id) as tx:
        locked = await tx.load_completion(created.id, foreign_step.step_id, foreign_dispatch.id)
    committed = await store.load_completion(created.id, foreign_step.step_id, foreign_dispatch.id)

    assert (locked, committed) == (expected, expected)


# -- claims ----------------------------------------------------------------------------------


async def test_a_claim_returns_the_claimed_dispatch_its_execution_and_its_agent(
    store: Store,
) -> None:
    created = await _with_bundle(store)
    queued = await seed_dispatch(store, created.id, max_attempts=9)
    owner = await store.get_agent("a1")
    later = START + timedelta(minutes=1)

    [claimed] = await store.claim_dispatches("replica-2", 1, later)

    assert claimed == ClaimedDispatch(
        dispatch=replace(
            queued,
            status=DispatchStatus.IN_FLIGHT,
            attempt=1,
            locked_by="replica-2",
            locked_at=later,
            updated_at=later,
        ),
        execution=created,
        agent=owner,
    )
    assert owner == Agent(
        id="a1",
        webhook_url="http://127.0.0.1:9/a1",
        secret="s3cret",
        policy_bundle=BUNDLE,
        lease_timeout_seconds=42.5,
        registered_at=START,
    )


# -- plain records through every read that returns them -------------------------------------


async def test_an_execution_with_every_field_set_comes_back_whole_from_every_read(
    store: Store,
) -> None:
    created = await _with_bundle(store)

    async with store.transaction(created.id) as tx:
        in_transaction = await tx.get_execution(created.id)
    listed = await store.list_executions(ExecutionFilter(agent_id="a1"))

    assert await store.get_execution(created.id) == created
    assert in_transaction == created
    assert listed == Page(items=[created], next_cursor=None)


async def test_a_step_with_every_field_set_comes_back_whole_from_every_read(
    store: Store,
) -> None:
    created = await seed_execution(store)
    recorded = await _finished_step(store, created.id)

    async with store.transaction(created.id) as tx:
        in_transaction = await tx.get_step(recorded.step_id)
        with_status = await tx.list_steps_with_status(created.id, StepStatus.SUCCEEDED)

    assert await store.get_step(recorded.step_id) == recorded
    assert in_transaction == recorded
    assert with_status == [recorded]
    assert await store.list_steps(created.id, "terminal") == [recorded]


async def test_a_dispatch_with_every_field_set_comes_back_whole(store: Store) -> None:
    created = await seed_execution(store)
    record = await seed_dispatch(
        store,
        created.id,
        status=DispatchStatus.FAILED,
        attempt=3,
        max_attempts=7,
        next_attempt_at=START + timedelta(seconds=40),
        locked_by="replica-9",
        locked_at=START + timedelta(seconds=5),
        updated_at=START + timedelta(seconds=6),
    )

    async with store.transaction(created.id) as tx:
        assert await tx.get_dispatch(record.id) == record


async def test_an_approval_comes_back_whole_from_every_read(store: Store) -> None:
    created = await seed_execution(store)
    gated = await seed_step(store, created.id)
    decided = approval(
        created.id,
        gated.step_id,
        status=ApprovalStatus.GRANTED,
        decided_by="alice",
        decided_at=START + timedelta(minutes=1),
        rationale="looks fine",
    )
    pending = approval(
        created.id, gated.step_id, timeout_at=START, created_at=START + timedelta(seconds=1)
    )
    async with store.transaction(created.id) as tx:
        await tx.insert_approval(decided)
        await tx.insert_approval(pending)

    async with store.transaction(created.id) as tx:
        for_step = await tx.pending_approval_for_step(gated.step_id)
        pending_here = await tx.list_pending_approvals(created.id)

    assert await store.get_approval(decided.id) == decided
    assert await store.list_approvals(None, created.id) == [decided, pending]
    assert await store.list_expired_approvals(LATER, 10) == [pending.id]
    assert (for_step, pending_here) == (pending, [pending])


async def test_an_agent_comes_back_whole_from_every_read(store: Store) -> None:
    stored = await seed_agent(store, "a1", policy_bundle=BUNDLE, lease_timeout_seconds=12.25)

    async with store.transaction() as tx:
        in_transaction = await tx.get_agent("a1")

    assert await store.get_agent("a1") == stored
    assert in_transaction == stored
    assert await store.list_agents() == [stored]


async def test_a_finished_execution_comes_back_whole(store: Store) -> None:
    created = await seed_execution(store)
    ended = replace(
        created,
        status=ExecutionStatus.FAILED,
        output=None,
        failure_reason="dispatch_exhausted",
        updated_at=LATER,
        last_event_seq=4,
    )
    async with store.transaction(created.id) as tx:
        await tx.update_execution(ended)

    async with store.transaction(created.id) as tx:
        locked = await tx.lock_execution(created.id)

    assert locked == Locked(execution=ended, lease_live=False, policy_bundle=None)
    assert await store.get_execution(created.id) == ended
