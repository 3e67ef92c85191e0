"""The store contract for executions, events, steps and transactions, on every backend."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from rebuno.kernel.domain.errors import Conflict, ExecutionTerminal, NotFound
from rebuno.kernel.store.base import ExecutionFilter, StepKey, Store
from rebuno.protocol.enums import ExecutionStatus, StepKind, StepStatus
from tests.store.builders import (
    KEY,
    event,
    execution,
    hex_id,
    seed_agent,
    seed_execution,
    seed_step,
    step,
)
from tests.support import START

RAW = '{"x":1.0,"z":12345678901234567890}'


class Boom(Exception):
    pass


# -- executions ------------------------------------------------------------------------------


async def test_execution_round_trips_with_raw_json_text_unchanged(store: Store) -> None:
    created = await seed_execution(
        store, input=RAW, agent_version="v2", deadline_at=START + timedelta(hours=1)
    )

    loaded = await store.get_execution(created.id)

    assert loaded == created
    assert loaded.origin.input == RAW


async def test_timestamps_keep_microseconds_and_come_back_aware_utc(store: Store) -> None:
    moment = START + timedelta(microseconds=123457)
    created = await seed_execution(store, created_at=moment, updated_at=moment)

    loaded = await store.get_execution(created.id)

    assert loaded.origin.created_at == moment
    assert loaded.origin.created_at.utcoffset() == timedelta(0)


async def test_unknown_execution_is_not_found_with_its_id(store: Store) -> None:
    with pytest.raises(NotFound, match="nope"):
        await store.get_execution("nope")
    with pytest.raises(NotFound, match="nope"):
        async with store.transaction("nope") as tx:
            await tx.get_execution("nope")


async def test_update_execution_writes_status_output_reason_and_sequence(store: Store) -> None:
    created = await seed_execution(store)
    changed = replace(
        created,
        status=ExecutionStatus.COMPLETED,
        output=RAW,
        updated_at=START + timedelta(seconds=5),
        last_event_seq=7,
    )

    async with store.transaction(created.id) as tx:
        await tx.update_execution(changed)

    assert await store.get_execution(created.id) == changed


async def test_terminal_execution_refuses_a_status_change(store: Store) -> None:
    done = await seed_execution(store, status=ExecutionStatus.COMPLETED, output="1")

    with pytest.raises(ExecutionTerminal, match=done.id):
        async with store.transaction(done.id) as tx:
            await tx.update_execution(replace(done, status=ExecutionStatus.FAILED))

    assert (await store.get_execution(done.id)).status is ExecutionStatus.COMPLETED


@pytest.mark.parametrize("field", ["output", "failure_reason"])
async def test_terminal_execution_refuses_an_outcome_change(store: Store, field: str) -> None:
    done = await seed_execution(store, status=ExecutionStatus.FAILED, failure_reason="boom")

    with pytest.raises(ExecutionTerminal):
        async with store.transaction(done.id) as tx:
            changes: dict[str, Any] = {field: '"other"'}
            await tx.update_execution(replace(done, **changes))


async def test_terminal_execution_still_moves_its_last_event_seq(store: Store) -> None:
    done = await seed_execution(store, status=ExecutionStatus.CANCELLED, last_event_seq=4)
    later = replace(done, last_event_seq=5, updated_at=START + timedelta(seconds=1))

    async with store.transaction(done.id) as tx:
        await tx.append_events([event(done.id, 5, type="dispatch.discarded")])
        await tx.update_execution(later)

    assert await store.get_execution(done.id) == later


async def test_inserting_an_execution_twice_is_a_conflict(store: Store) -> None:
    created = await seed_execution(store)

    with pytest.raises(Conflict):
        async with store.transaction(created.id) as tx:
            await tx.insert_execution(created)


async def test_list_executions_is_newest_first_and_pages_by_cursor(store: Store) -> None:
    ids = [(await seed_execution(store)).id for _ in range(5)]

    first = await store.list_executions(ExecutionFilter(limit=2))
    second = await store.list_executions(ExecutionFilter(limit=2, cursor=first.next_cursor))
    last = await store.list_executions(ExecutionFilter(limit=2, cursor=second.next_cursor))

    assert [e.id for e in first.items + second.items + last.items] == ids[::-1]
    assert first.next_cursor == ids[3]
    assert last.next_cursor is None


async def test_list_executions_without_more_rows_has_no_cursor(store: Store) -> None:
    for _ in range(2):
        await seed_execution(store)

    page = await store.list_executions(ExecutionFilter(limit=2))

    assert len(page.items) == 2
    assert page.next_cursor is None


async def test_list_executions_filters_by_agent_and_status(store: Store) -> None:
    wanted = await seed_execution(store, "agent-a", status=ExecutionStatus.BLOCKED)
    await seed_execution(store, "agent-a", status=ExecutionStatus.RUNNING)
    await seed_execution(store, "agent-b", status=ExecutionStatus.BLOCKED)

    page = await store.list_executions(
        ExecutionFilter(agent_id="agent-a", status=ExecutionStatus.BLOCKED)
    )

    assert [e.id for e in page.items] == [wanted.id]


# -- transactions ----------------------------------------------------------------------------


async def test_exception_in_a_transaction_rolls_back_every_write(store: Store) -> None:
    created = await seed_execution(store)

    with pytest.raises(Boom):
        async with store.transaction(created.id) as tx:
            await tx.append_events([event(created.id, 1)])
            await tx.insert_step(step(created.id))
            await tx.update_execution(replace(created, last_event_seq=1))
            raise Boom

    assert await store.list_events(created.id, 0, 10) == []
    assert await store.list_steps(created.id, None) == []
    assert (await store.get_execution(created.id)).last_event_seq == 0


async def test_writes_of_one_transaction_land_in_the_order_they_were_made(store: Store) -> None:
    """Steps inserted one after another, an update between them, and an execution updated in
    the transaction that inserted it: each reads back as last written."""
    await seed_agent(store)
    created = execution(status=ExecutionStatus.PENDING)
    first, second, third = (step(created.id, n, proposed_seq=n + 1) for n in range(3))
    async with store.transaction(created.id) as tx:
        await tx.insert_execution(created)
        await tx.append_events([event(created.id, 1)])
        await tx.insert_step(first)
        await tx.insert_step(second)
        await tx.update_step(replace(first, status=StepStatus.SUCCEEDED, result="1"))
        await tx.insert_step(third)
        await tx.update_execution(
            replace(created, status=ExecutionStatus.RUNNING, last_event_seq=1)
        )

    steps = await store.list_steps(created.id, None)
    assert [(s.occurrence, s.status, s.result) for s in steps] == [
        (0, StepStatus.SUCCEEDED, "1"),
        (1, StepStatus.EXECUTING, None),
        (2, StepStatus.EXECUTING, None),
    ]
    stored = await store.get_execution(created.id)
    assert (stored.status, stored.last_event_seq) == (ExecutionStatus.RUNNING, 1)


async def test_a_refused_write_rolls_back_the_whole_transaction(store: Store) -> None:
    created = await seed_execution(store)
    async with store.transaction(created.id) as tx:
        await tx.append_events([event(created.id, 1)])

    with pytest.raises(Conflict):
        async with store.transaction(created.id) as tx:
            await tx.insert_step(step(created.id))
            await tx.append_events([event(created.id, 1)])

    assert await store.list_steps(created.id, None) == []


async def test_a_cancelled_transaction_rolls_back_and_frees_the_lock(store: Store) -> None:
    created = await seed_execution(store)
    written = asyncio.Event()

    async def write_then_hang() -> None:
        async with store.transaction(created.id) as tx:
            await tx.append_events([event(created.id, 1)])
            written.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(write_then_hang())
    await written.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async with store.transaction(created.id) as tx:
        await tx.append_events([event(created.id, 1, type="execution.started")])
    assert [e.type for e in await store.list_events(created.id, 0, 10)] == ["execution.started"]


async def test_committed_reads_do_not_see_an_open_transaction(store: Store) -> None:
    created = await seed_execution(store)

    async with store.transaction(created.id) as tx:
        await tx.append_events([event(created.id, 1)])
        await tx.update_execution(replace(created, last_event_seq=1))
        seen_inside = await tx.get_execution(created.id)
        seen_outside = await store.get_execution(created.id)
        events_outside = await store.list_events(created.id, 0, 10)

    assert seen_inside.last_event_seq == 1
    assert seen_outside.last_event_seq == 0
    assert events_outside == []
    assert (await store.get_execution(created.id)).last_event_seq == 1


async def test_concurrent_appends_get_contiguous_sequence_numbers(store: Store) -> None:
    created = await seed_execution(store)

    async def append_one(n: int) -> None:
        async with store.transaction(created.id) as tx:
            current = await tx.get_execution(created.id)
            seq = current.last_event_seq + 1
            # Yield mid-transaction so the other appenders run now if the lock lets them.
            await asyncio.sleep(0)
            await tx.append_events([event(created.id, seq, payload=f'{{"n":{n}}}')])
            await tx.update_execution(replace(current, last_event_seq=seq))

    await asyncio.gather(*(append_one(n) for n in range(20)))

    logged = await store.list_events(created.id, 0, 100)
    assert [e.event_seq for e in logged] == list(range(1, 21))
    assert sorted(e.payload for e in logged) == sorted(f'{{"n":{n}}}' for n in range(20))
    assert (await store.get_execution(created.id)).last_event_seq == 20


# -- events ----------------------------------------------------------------------------------


async def test_events_round_trip_in_order_with_raw_payloads(store: Store) -> None:
    created = await seed_execution(store)
    written = [
        event(created.id, 1, payload=RAW),
        event(created.id, 2, type="execution.started", payload='{"status":"running"}'),
        event(created.id, 3, type="step.proposed", payload='{ "spaced" : [1, 2] }'),
    ]

    async with store.transaction(created.id) as tx:
        await tx.append_events(written)

    assert await store.list_events(created.id, 0, 10) == written


# Escapes, quotes, backslashes, a line separator, non-ASCII and a supplementary-plane character:
# text that a backend passing values through JSON of its own must hand back byte for byte.
AWKWARD = '{"s":"a\\"b\\\\c\\u2028 \u00e9\u2028\U0001f600","n":1e400,"t":"\\ud83d\\ude00"}'


async def test_json_text_comes_back_byte_for_byte_from_every_kind_of_write(store: Store) -> None:
    created = await seed_execution(store, input=AWKWARD)
    recorded = await seed_step(store, created.id, args=AWKWARD)
    done = replace(recorded, status=StepStatus.SUCCEEDED, result=AWKWARD, error=AWKWARD)
    ended = replace(created, status=ExecutionStatus.COMPLETED, output=AWKWARD, last_event_seq=1)

    async with store.transaction(created.id) as tx:
        await tx.update_step(done)
        await tx.append_events([event(created.id, 1, payload=AWKWARD)])
        await tx.update_execution(ended)

    assert await store.get_execution(created.id) == ended
    assert await store.get_step(recorded.step_id) == done
    assert [e.payload for e in await store.list_events(created.id, 0, 10)] == [AWKWARD]


async def test_list_events_reads_after_a_sequence_up_to_a_limit(store: Store) -> None:
    created = await seed_execution(store)
    async with store.transaction(created.id) as tx:
        await tx.append_events([event(created.id, seq) for seq in range(1, 8)])

    page = await store.list_events(created.id, 2, 3)

    assert [e.event_seq for e in page] == [3, 4, 5]


async def test_a_duplicate_event_seq_is_a_conflict(store: Store) -> None:
    created = await seed_execution(store)
    async with store.transaction(created.id) as tx:
        await tx.append_events([event(created.id, 1)])

    with pytest.raises(Conflict):
        async with store.transaction(created.id) as tx:
            await tx.append_events([event(created.id, 1, type="execution.started")])

    assert [e.type for e in await store.list_events(created.id, 0, 10)] == ["execution.created"]


async def test_has_event_of_type_looks_only_at_that_execution(store: Store) -> None:
    mine = await seed_execution(store)
    other = await seed_execution(store)
    async with store.transaction(other.id) as tx:
        await tx.append_events([event(other.id, 1, type="step.rate_limited")])

    async with store.transaction(mine.id) as tx:
        assert not await tx.has_event_of_type(mine.id, "step.rate_limited")
        await tx.append_events([event(mine.id, 1, type="step.rate_limited")])
        assert await tx.has_event_of_type(mine.id, "step.rate_limited")


# -- steps -----------------------------------------------------------------------------------


async def test_step_round_trips_with_raw_json_text_unchanged(store: Store) -> None:
    created = await seed_execution(store)
    recorded = await seed_step(
        store, created.id, args=RAW, status=StepStatus.SUCCEEDED, result=RAW,
        usage_input=3, usage_output=4, completed_at=START + timedelta(seconds=2),
    )  # fmt: skip

    assert await store.get_step(recorded.step_id) == recorded
    async with store.transaction(created.id) as tx:
        assert await tx.get_step(recorded.step_id) == recorded


async def test_an_unknown_step_is_none(store: Store) -> None:
    assert await store.get_step(hex_id("missing")) is None


async def test_update_step_writes_outcome_usage_and_times(store: Store) -> None:
    created = await seed_execution(store)
    recorded = await seed_step(store, created.id)
    done = replace(
        recorded,
        status=StepStatus.SUCCEEDED,
        result=RAW,
        usage_input=10,
        usage_output=20,
        completed_at=START + timedelta(seconds=3),
    )

    async with store.transaction(created.id) as tx:
        await tx.update_step(done)

    assert await store.get_step(recorded.step_id) == done


@pytest.mark.parametrize(
    "change",
    [
        {"status": StepStatus.EXECUTING},
        {"result": '"other"'},
        {"error": '{"reason":"late"}'},
        {"completed_at": START + timedelta(hours=1)},
    ],
    ids=["status", "result", "error", "completed_at"],
)
async def test_terminal_step_refuses_changes(store: Store, change: dict[str, Any]) -> None:
    created = await seed_execution(store)
    done = await seed_step(
        store, created.id, status=StepStatus.SUCCEEDED, result="1", completed_at=START
    )

    with pytest.raises(Conflict, match=done.step_id):
        async with store.transaction(created.id) as tx:
            await tx.update_step(replace(done, **change))

    assert await store.get_step(done.step_id) == done


async def test_a_step_id_is_recorded_once(store: Store) -> None:
    # The id is a hash of (execution, kind, target, args hash, occurrence), so a unique id
    # is also a unique key: the same id twice is the same effect twice.
    created = await seed_execution(store)
    first = await seed_step(store, created.id)

    with pytest.raises(Conflict):
        await seed_step(store, created.id, step_id=first.step_id, occurrence=1)

    assert await store.list_steps(created.id, None) == [first]


async def test_list_steps_filters_by_status_in_proposal_order(store: Store) -> None:
    created = await seed_execution(store)
    statuses = [StepStatus.SUCCEEDED, StepStatus.EXECUTING, StepStatus.DENIED, StepStatus.FAILED]
    # Inserted out of proposal order, to show the listing sorts by `proposed_seq`.
    for occurrence, status in reversed(list(enumerate(statuses))):
        await seed_step(store, created.id, occurrence, status=status, proposed_seq=occurrence + 1)

    everything = await store.list_steps(created.id, None)
    terminal = await store.list_steps(created.id, "terminal")
    executing = await store.list_steps(created.id, "executing")

    assert [s.occurrence for s in everything] == [0, 1, 2, 3]
    assert [s.occurrence for s in terminal] == [0, 2, 3]
    assert [s.occurrence for s in executing] == [1]


async def test_list_steps_with_status_in_a_transaction(store: Store) -> None:
    created = await seed_execution(store)
    await seed_step(store, created.id, 0, status=StepStatus.EXECUTING, proposed_seq=2)
    await seed_step(store, created.id, 1, status=StepStatus.SUCCEEDED, proposed_seq=3)
    await seed_step(store, created.id, 2, status=StepStatus.EXECUTING, proposed_seq=5)

    async with store.transaction(created.id) as tx:
        executing = await tx.list_steps_with_status(created.id, StepStatus.EXECUTING)

    assert [s.occurrence for s in executing] == [0, 2]


async def test_spent_tokens_sums_usage_of_the_execution_steps(store: Store) -> None:
    created = await seed_execution(store)
    other = await seed_execution(store)
    await seed_step(store, created.id, 0, usage_input=100, usage_output=20)
    await seed_step(store, created.id, 1, usage_input=5, usage_output=None)
    await seed_step(store, created.id, 2)
    await seed_step(store, other.id, 0, usage_input=1000, usage_output=1000)

    async with store.transaction(created.id) as tx:
        assert await tx.spent_tokens(created.id) == 125


async def test_spent_tokens_of_an_execution_without_steps_is_zero(store: Store) -> None:
    created = await seed_execution(store)

    async with store.transaction(created.id) as tx:
        assert await tx.spent_tokens(created.id) == 0


async def test_has_indeterminate_step_needs_same_key_failed_indeterminate(store: Store) -> None:
    created = await seed_execution(store)
    other_key = StepKey(kind=StepKind.LOCAL, target="search", args_hash=KEY.args_hash)
    await seed_step(store, created.id, 0, status=StepStatus.FAILED, error='{"reason":"boom"}')
    await seed_step(store, created.id, 1, status=StepStatus.SUCCEEDED, result="1")
    await seed_step(store, created.id, 0, key=other_key, status=StepStatus.FAILED,
                    error='{"reason":"indeterminate"}')  # fmt: skip

    async with store.transaction(created.id) as tx:
        before = await tx.has_indeterminate_step(created.id, KEY)
        await tx.insert_step(
            step(created.id, 2, status=StepStatus.FAILED, error='{"reason":"indeterminate"}')
        )
        after = await tx.has_indeterminate_step(created.id, KEY)

    assert (before, after) == (False, True)
