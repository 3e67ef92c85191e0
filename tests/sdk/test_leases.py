"""Leases from the agent's side: heartbeats keep a long handler's dispatch, a lost lease cancels
the handler, and `close()` stops what is in flight."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from harness.polling import wait_until
from rebuno.kernel.config import Settings
from rebuno.types import ExecutionStatus
from tests.sdk.conftest import Harness

LEASE = timedelta(milliseconds=1500)
"""Short enough that two periods pass quickly, long enough that a loaded machine stalling the
agent for a few hundred milliseconds does not lose a lease its heartbeats keep."""
HEARTBEAT = "/v0/executions/{execution_id}/heartbeat"


@pytest.fixture
def kernel_settings(kernel_settings: Settings) -> Settings:
    return replace(kernel_settings, dispatch_lease_timeout=LEASE)


async def test_heartbeats_keep_the_lease_of_a_handler_that_outlives_it(harness: Harness) -> None:
    runs: list[int] = []
    outlived = asyncio.Event()

    async def process() -> str:
        runs.append(1)
        await outlived.wait()
        return "done"

    async with harness.serve("marathon", process):
        before = await harness.answered("POST", HEARTBEAT)
        created = await harness.client.create("marathon")

        async def renewed_for_two_leases() -> bool:
            # The agent renews every third of its lease: six renewals are two lease periods
            # of work, past where a lease left alone would have been reclaimed and redelivered.
            return await harness.answered("POST", HEARTBEAT) - before >= 6

        await wait_until(renewed_for_two_leases, timeout=20, message="six heartbeats answered")
        outlived.set()
        done = await harness.client.wait(created.id, timeout=10)

    acked = [e for e in await harness.client.events(done.id) if e.type == "dispatch.acked"]
    assert done.output == "done"
    assert runs == [1]
    assert len(acked) == 1


async def test_lost_lease_on_heartbeat_cancels_the_handler(harness: Harness) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def process() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with harness.serve("abandoned", process):
        created = await harness.client.create("abandoned")
        await asyncio.wait_for(started.wait(), 10)
        await harness.client.cancel(created.id)
        await asyncio.wait_for(cancelled.wait(), 10)
        final = await harness.client.get(created.id)

    assert final.status is ExecutionStatus.CANCELLED
    assert final.failure_reason == "client_cancelled"


async def test_close_cancels_handlers_in_flight(harness: Harness) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def process() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with harness.serve("closing", process) as agent:
        created = await harness.client.create("closing")
        await asyncio.wait_for(started.wait(), 10)
        await agent.close()

    assert cancelled.is_set()
    assert (await harness.client.get(created.id)).status is ExecutionStatus.RUNNING
