"""`Dispatch`: what a kernel call's failure teaches the run (a signal to unwind with, a lease
lost, a kernel that did not answer), calls made from another thread's loop, and the heartbeats
that keep the lease until it is lost."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from harness.polling import wait_until
from harness.ports import free_port
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import KernelClient
from rebuno.sdk.errors import Blocked, LeaseSuperseded, NetworkError, Terminated
from tests.sdk.conftest import SECRET, Harness
from tests.sdk.context.conftest import AGENT

HEARTBEAT = "/v0/executions/{execution_id}/heartbeat"


async def test_a_terminal_execution_becomes_the_signal_the_run_unwinds_with(
    harness: Harness, dispatch: Dispatch
) -> None:
    await harness.client.cancel(dispatch.execution_id)

    with pytest.raises(Terminated) as raised:
        await dispatch.call(dispatch.kernel.suspend(dispatch.execution_id, dispatch.lease))

    assert dispatch.signal is raised.value
    assert dispatch.remember(Blocked()) is not dispatch.signal  # the first signal stays


async def test_a_lease_another_attempt_holds_marks_the_dispatch_superseded(
    dispatch: Dispatch,
) -> None:
    stale = replace(dispatch.lease, attempt=dispatch.lease.attempt + 1)

    with pytest.raises(LeaseSuperseded):
        await dispatch.call(dispatch.kernel.suspend(dispatch.execution_id, stale))

    assert dispatch.superseded
    assert dispatch.signal is None


async def test_a_kernel_that_does_not_answer_marks_the_kernel_unreachable(
    dispatch: Dispatch,
) -> None:
    gone = KernelClient(
        agent_id=AGENT, secret=SECRET, base_url=f"http://127.0.0.1:{free_port()}", timeout=5
    )
    away = Dispatch(gone, dispatch.execution_id, dispatch.lease)

    with pytest.raises(NetworkError):
        await away.call(gone.previous_state(dispatch.execution_id))

    await gone.aclose()
    assert away.kernel_unreachable
    assert not away.superseded and away.signal is None


async def test_a_call_from_another_threads_loop_is_made_on_the_owner_loop(
    dispatch: Dispatch,
) -> None:
    async def from_there() -> object:
        return await dispatch.call(dispatch.kernel.previous_state(dispatch.execution_id))

    # The pool belongs to the owner loop; the other thread's loop must not touch it.
    answer = await asyncio.to_thread(asyncio.run, from_there())

    assert answer is None


async def test_the_lease_is_renewed_until_it_is_lost_and_then_the_owner_is_cancelled(
    harness: Harness, dispatch: Dispatch
) -> None:
    brief = Dispatch(dispatch.kernel, dispatch.execution_id, replace(dispatch.lease, timeout=0.06))
    owner = asyncio.create_task(asyncio.Event().wait())
    before = await harness.answered("POST", HEARTBEAT)
    keeper = asyncio.create_task(brief.keep_lease(owner))

    async def renewed_twice() -> bool:
        return await harness.answered("POST", HEARTBEAT) - before >= 2

    await wait_until(renewed_twice, message="two renewals")
    await harness.client.cancel(dispatch.execution_id)
    await asyncio.wait_for(keeper, 10)
    await asyncio.gather(owner, return_exceptions=True)

    assert owner.cancelled()
    assert brief.superseded
