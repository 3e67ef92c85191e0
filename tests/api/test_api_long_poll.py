"""Our long poll on the event log: `GET …/events?after_seq=N&wait=DURATION` holds an empty
answer until the next commit on the execution; a malformed `wait` is refused."""

from __future__ import annotations

import asyncio

import httpx

from harness.polling import wait_until
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import assert_error
from tests.support import parked


async def test_empty_answer_is_held_until_the_next_event(
    kernel: Kernel, client: httpx.AsyncClient, execution: Execution
) -> None:
    path = f"/v0/executions/{execution.id}/events"
    seen = len((await client.get(path)).json())
    held = asyncio.create_task(client.get(path, params={"after_seq": seen, "wait": "10s"}))
    await wait_until(lambda: parked(kernel.appended.get(execution.id)), message="the poll held")
    assert not held.done()

    await kernel.cancel_execution(execution.id)

    events = (await asyncio.wait_for(held, 5)).json()
    assert [e["type"] for e in events] == ["execution.cancelled"]


async def test_malformed_wait_is_refused(client: httpx.AsyncClient, execution: Execution) -> None:
    response = await client.get(f"/v0/executions/{execution.id}/events", params={"wait": "soon"})
    assert_error(response, 400, "validation_error")


async def test_execution_read_is_held_until_it_ends(
    kernel: Kernel, client: httpx.AsyncClient, execution: Execution
) -> None:
    held = asyncio.create_task(client.get(f"/v0/executions/{execution.id}", params={"wait": "10s"}))
    await wait_until(lambda: parked(kernel.ends.get(execution.id)), message="the read held")
    assert not held.done()

    await kernel.cancel_execution(execution.id)

    answer = (await asyncio.wait_for(held, 5)).json()
    assert answer["status"] == "cancelled"
