"""Executions that continue one another through the SDK, against a real kernel on both stores:
a handler returns `Result(output, state)`, the next one reads it with `previous()`
(docs/protocol.md §24.5), and `Client.create` takes an idempotency key, a parent and the end
user (§27)."""

from __future__ import annotations

from typing import Any

import pytest

import rebuno
from rebuno import ConflictError, Result, ValidationError, execution
from rebuno.types import ExecutionStatus
from tests.sdk.conftest import Harness


async def chat(message: str) -> Result:
    before = await rebuno.previous() or {}
    turns = before.get("turns", 0) + 1
    return Result(output={"reply": message.upper(), "turns": turns}, state={"turns": turns})


async def test_a_conversation_carries_its_state_from_turn_to_turn(harness: Harness) -> None:
    async with harness.serve("chat", chat):
        first = await harness.run("chat", {"message": "hi"})
        second = await harness.client.create(
            "chat", {"message": "again"}, parent_execution_id=first.id
        )
        second = await harness.client.wait(second.id, timeout=20)

    assert first.output == {"reply": "HI", "turns": 1}
    assert second.status is ExecutionStatus.COMPLETED
    assert second.output == {"reply": "AGAIN", "turns": 2}
    assert second.parent_execution_id == first.id


async def test_without_a_state_the_next_turn_reads_the_output(harness: Harness) -> None:
    seen: list[Any] = []

    async def handler(n: int) -> dict[str, int]:
        seen.append(await execution().previous())
        return {"n": n}

    async with harness.serve("plain", handler):
        first = await harness.run("plain", {"n": 1})
        second = await harness.client.create("plain", {"n": 2}, parent_execution_id=first.id)
        await harness.client.wait(second.id, timeout=20)

    assert seen == [None, {"n": 1}]


async def test_create_is_idempotent_and_names_who_it_is_for(harness: Harness) -> None:
    await harness.register("idle", "http://127.0.0.1:9/webhook")
    first = await harness.client.create(
        "idle", {"n": 1}, idempotency_key="order-7", on_behalf_of="user:42"
    )
    again = await harness.client.create("idle", {"n": 2}, idempotency_key="order-7")

    assert again.id == first.id
    assert again.input == {"n": 1}
    assert first.idempotency_key == "order-7"
    assert first.on_behalf_of == "user:42"
    assert first.created_by == "anonymous"  # dev mode names no one
    assert first.subject_groups == []


async def test_bad_parents_and_labels_raise_the_sdks_errors(harness: Harness) -> None:
    async def refuse(n: int) -> None:
        raise RuntimeError(f"no {n}")

    async with harness.serve("plain2", refuse):
        failed_run = await harness.run("plain2", {"n": 1})
    assert failed_run.status is ExecutionStatus.FAILED

    with pytest.raises(ConflictError):
        await harness.client.create("plain2", parent_execution_id=failed_run.id)
    with pytest.raises(ValidationError):
        await harness.client.create("plain2", idempotency_key="x" * 257)


async def test_the_turns_of_a_session_run_in_order_and_carry_state(harness: Harness) -> None:
    async with harness.serve("talk", chat):
        ids = [
            (await harness.client.create("talk", {"message": m}, session="s-1")).id
            for m in ("a", "b", "c")
        ]
        done = [await harness.client.wait(i, timeout=20) for i in ids]

    assert [d.output for d in done] == [
        {"reply": "A", "turns": 1},
        {"reply": "B", "turns": 2},
        {"reply": "C", "turns": 3},
    ]
    assert [d.session for d in done] == ["s-1"] * 3
    assert all(d.admitted_at for d in done)
    page = await harness.client.list(session="s-1")
    assert [e.id for e in page.executions] == ids[::-1]


async def test_a_fork_replays_the_prefix_and_runs_the_rest(harness: Harness) -> None:
    runs: list[str] = []

    @rebuno.tool
    async def note(name: str) -> str:
        runs.append(name)
        return name

    async def handler() -> list[str]:
        return [await note("first"), await note("second")]

    async with harness.serve("forked", handler):
        source = await harness.run("forked")
        events = await harness.client.events(source.id)
        first_done = next(e.event_seq for e in events if e.type == "step.succeeded")
        fork = await harness.client.fork(source.id, at_seq=first_done)
        done = await harness.client.wait(fork.id, timeout=20)

    assert fork.forked_from == source.id and fork.fork_seq == first_done
    assert done.output == ["first", "second"]
    assert runs == ["first", "second", "second"]  # the fork replayed the first
