"""The store contract for resources and checkpoints (docs/protocol.md §33), on every backend:
every field written comes back, in the order the seam promises."""

from __future__ import annotations

from dataclasses import replace

from rebuno.kernel.domain.records import Checkpoint, Resource
from rebuno.kernel.store.base import Store
from rebuno.protocol.enums import StepStatus
from tests.store.builders import seed_execution, seed_step

RAW = '{"n":1.0,"z":12345678901234567890}'


def resource(execution_id: str, key: str, seq: int, **changes: object) -> Resource:
    base = Resource(
        execution_id=execution_id,
        key=key,
        driver_id="test.v1",
        configuration=RAW,
        coverage_reuse=True,
        every_steps=2,
        on_completion=True,
        registered_seq=seq,
        generation=3,
        count=1,
        binding='{"sandbox":"sbx-1"}',
        checkpoint_ref="snap-0",
    )
    return replace(base, **changes)  # type: ignore[arg-type]  # the test's own fields


async def test_resources_round_trip_in_registration_order(store: Store) -> None:
    created = await seed_execution(store)
    later = resource(created.id, "a", 9, configuration=None, binding=None, checkpoint_ref=None)
    first = resource(created.id, "b", 4)
    async with store.transaction(created.id) as tx:
        await tx.put_resource(later)
        await tx.put_resource(first)
        await tx.mark_resources(created.id)
        await tx.set_restoration(created.id, '{"b":{"covered":true}}')

    assert await store.list_resources(created.id) == [first, later]
    assert (await store.get_execution(created.id)).has_resources is True
    assert await store.get_restoration(created.id) == '{"b":{"covered":true}}'
    async with store.transaction(created.id) as tx:
        assert await tx.list_resources(created.id) == [first, later]
        await tx.put_resource(replace(first, generation=4, count=2, every_steps=3))
    assert (await store.list_resources(created.id))[0].generation == 4


async def test_checkpoints_close_at_a_seq_and_list_by_covered_seq(store: Store) -> None:
    created = await seed_execution(store)
    late = Checkpoint(created.id, "a", 1, "s1", covered_seq=8)
    early = Checkpoint(created.id, "a", 0, "s0", covered_seq=3)
    other = Checkpoint(created.id, "b", 0, "t0", covered_seq=5)
    async with store.transaction(created.id) as tx:
        for checkpoint in (late, early, other):
            await tx.insert_checkpoint(checkpoint)
        await tx.close_checkpoints(created.id, "a", 10)

    assert await store.list_checkpoints(created.id) == [
        replace(early, invalidated_seq=10),
        other,
        replace(late, invalidated_seq=10),
    ]


async def test_affected_keys_name_what_executing_steps_write(store: Store) -> None:
    created = await seed_execution(store)
    running = await seed_step(store, created.id, 0, status=StepStatus.EXECUTING)
    done = await seed_step(store, created.id, 1, status=StepStatus.SUCCEEDED)
    plain = await seed_step(store, created.id, 2, status=StepStatus.EXECUTING)
    async with store.transaction(created.id) as tx:
        await tx.set_affected_keys(running.step_id, ["a", "b"])
        await tx.set_affected_keys(done.step_id, ["c"])
        await tx.set_affected_keys(plain.step_id, [])
        assert await tx.writing_keys(created.id) == {"a", "b"}
        assert await tx.affected_keys([running.step_id, done.step_id, plain.step_id]) == {
            running.step_id: ("a", "b"),
            done.step_id: ("c",),
        }
