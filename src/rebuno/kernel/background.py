"""Background work (§17): the dispatch loop and the lease reaper on every replica, and the
singleton sweeps (approval expiry, deadlines, the lineage sweep, retention) behind the leader
lock. Like the API, they drive the use cases of `Kernel`; the composition root starts them.

Each job is one tick function plus a loop that runs it on its cadence. A failed tick is
logged and retried on the next one: background work must outlive a database restart.
Must not import a concrete store backend, the API, or httpx: the deliverer is a protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any

from rebuno.kernel import metrics
from rebuno.kernel.decision.ending import DEADLINE_EXCEEDED
from rebuno.kernel.domain.dispatch import Deliverer
from rebuno.kernel.domain.errors import ExecutionTerminal, NotFound
from rebuno.kernel.service.context import log
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import ClaimedDispatch

PAGE = 100


async def expire_approvals(kernel: Kernel, page: int = PAGE) -> int:
    expired = 0
    after = ""
    while ids := await kernel.store.list_expired_approvals(kernel.clock(), page, after):
        for approval_id in ids:
            if await _each("approval expiry", "approval", approval_id, kernel.expire_approval):
                expired += 1
        if len(ids) < page:
            break
        after = ids[-1]
    return expired


async def cancel_overdue(kernel: Kernel, page: int = PAGE) -> int:
    cancelled = 0
    after = ""
    while ids := await kernel.store.list_overdue_executions(kernel.clock(), page, after):
        for execution_id in ids:
            if await _each("deadline", "execution", execution_id, _cancel_overdue(kernel)):
                cancelled += 1
        if len(ids) < page:
            break
        after = ids[-1]
    return cancelled


async def repair_lineage(kernel: Kernel) -> int:
    """The lineage sweep (§25.7): what lost follow-ups left, a page of each kind a tick (a
    session whose waiters are all past their deadline stays listed until the deadline job
    cancels them)."""
    return await kernel.repair_lineage(PAGE)


def _cancel_overdue(kernel: Kernel) -> Callable[[str], Awaitable[bool]]:
    async def cancel(execution_id: str) -> bool:
        try:
            await kernel.cancel(execution_id, DEADLINE_EXCEEDED)
        except (ExecutionTerminal, NotFound):
            return False  # ended or deleted since it was listed
        return True

    return cancel


async def _each(
    job: str, noun: str, record_id: str, handle: Callable[[str], Awaitable[bool]]
) -> bool:
    """One row of a sweep. A row the sweep cannot handle (say, a value an older version left
    that no longer reads back) is logged and passed over: the sweep pages on by id, so the
    rows after it are still handled, and the next tick tries it again."""
    try:
        return await handle(record_id)
    except Exception:
        log.exception("%s skipped %s %s; the others go on", job, noun, record_id)
        return False


async def sweep(kernel: Kernel) -> None:
    """The singleton sweep: expiry, deadlines, sessions and sub-agents, the digests of requests
    whose copies can no longer verify (§2.3), then retention."""
    await deadline_tick(kernel)
    await kernel.store.forget_requests(kernel.clock())
    retention = kernel.settings.retention
    if retention > timedelta(0):
        cutoff = kernel.clock() - retention
        deleted = await kernel.store.delete_terminal_before(cutoff)
        while removed := await kernel.delete_expired_sessions(cutoff, PAGE):
            deleted += removed
        if deleted:
            log.info("retention removed %d terminal executions", deleted)


async def deadline_tick(kernel: Kernel) -> None:
    await expire_approvals(kernel)
    await cancel_overdue(kernel)
    await repair_lineage(kernel)


async def every(
    interval: timedelta, tick: Callable[[], Awaitable[object]], name: str, worker: str
) -> None:
    """Runs `tick` now and then every `interval`; errors are logged and counted under
    `worker` (`dispatch` or `singletons`, §37), never fatal."""
    seconds = max(interval.total_seconds(), 0.001)
    while True:
        try:
            await tick()
        except Exception:
            metrics.worker_failed(worker)
            log.exception("background job %s failed; retrying in %.3fs", name, seconds)
        await asyncio.sleep(seconds)


def as_leader(
    kernel: Kernel, key: str, job: Callable[[Kernel], Awaitable[object]]
) -> Callable[[], Awaitable[None]]:
    """Wraps a singleton job: a replica that cannot take the lock skips the tick."""

    async def tick() -> None:
        async with kernel.store.leader(key) as leading:
            if leading:
                await job(kernel)

    return tick


def reaper_interval(kernel: Kernel) -> timedelta:
    return min(timedelta(seconds=2), kernel.settings.dispatch_lease_timeout / 4)


def jobs(kernel: Kernel) -> list[tuple[str, Coroutine[Any, Any, None]]]:
    """Every background loop of a replica, named, for the server's task group."""
    settings = kernel.settings
    key = settings.leader_lock_key
    loops: list[tuple[str, Coroutine[Any, Any, None]]] = [
        (
            "lease-reaper",
            every(
                reaper_interval(kernel),
                kernel.reclaim_expired_leases,
                "reaper",
                "dispatch",
            ),
        ),
        (
            "sweep",
            every(settings.cleanup_interval, as_leader(kernel, key, sweep), "sweep", "singletons"),
        ),
    ]
    if settings.deadline_check_interval > timedelta(0):
        deadlines = as_leader(kernel, f"{key}:deadlines", deadline_tick)
        interval = settings.deadline_check_interval
        loops.append(("deadlines", every(interval, deadlines, "deadlines", "singletons")))
    return loops


class DispatchLoop:
    """Claims and delivers with at most `concurrency` deliveries in flight (§12.2).

    It claims only as many dispatches as it has idle delivery workers, so it never holds work
    another replica could start sooner. It sleeps until woken (a dispatch enqueued in this
    process, a NOTIFY from another replica, a worker finishing) or until the idle poll."""

    def __init__(self, kernel: Kernel, deliverer: Deliverer) -> None:
        self._kernel = kernel
        self._deliverer = deliverer
        self._idle = kernel.settings.dispatch_concurrency
        self._poll = kernel.settings.dispatch_poll_interval.total_seconds()
        self._wakeup = asyncio.Event()
        self._workers: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        try:
            while True:
                # Cleared before the claim: a wake-up that arrives during it is not lost. A claim
                # takes every due dispatch it has room for, so without one there is nothing to
                # claim again until a wake-up (an enqueue, a worker freed at full capacity) or
                # the poll interval (a retry coming due).
                self._wakeup.clear()
                await self._claim()
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races the wake-up, and the loop would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll):
                        await self._wakeup.wait()
        finally:
            workers = list(self._workers)
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _claim(self) -> None:
        if self._idle <= 0:
            return
        try:
            batch = await self._kernel.claim(self._idle)
        except Exception:
            metrics.worker_failed("dispatch")
            log.exception("claiming dispatches failed; retrying after the idle poll")
            return
        for claimed in batch:
            self._idle -= 1
            metrics.delivery_started()
            worker = asyncio.create_task(
                self._deliver(claimed), name=f"deliver-{claimed.dispatch.id}"
            )
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)

    async def _deliver(self, claimed: ClaimedDispatch) -> None:
        try:
            await self._kernel.deliver(claimed, self._deliverer)
        except Exception:
            metrics.worker_failed("dispatch")
            # The claim stays in flight and the reaper returns it after the lease.
            log.exception(
                "recording delivery failed: execution_id=%s dispatch_id=%s",
                claimed.dispatch.execution_id,
                claimed.dispatch.id,
            )
        finally:
            metrics.delivery_finished()
            self._idle += 1
            if self._idle == 1:  # a claim may have found no room: look again now
                self._wakeup.set()
