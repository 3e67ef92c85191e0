"""The background jobs (§17) over rows they cannot handle: a value an older version left, read
back or computed with, fails that row alone. The others are still reclaimed, expired and
cancelled, and the job goes on with its next tick."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import pytest

from rebuno.kernel import background
from rebuno.kernel.domain.dispatch import MAX_AGENT_LEASE_SECONDS
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.store.sqlite import SqliteStore
from rebuno.protocol.enums import ApprovalStatus, DispatchStatus, ExecutionStatus
from tests.kernel.conftest import AGENT, LEASE
from tests.kernel.test_approvals import GATED, SHELL
from tests.rawsql import RawSql
from tests.support import ManualClock

OLD_AGENT = "old-agent"


def unreadable_time(store: Store) -> object:
    """A timestamp the column holds but no `datetime` can: past year 9999."""
    return 9_000_000_000_000_000_000 if isinstance(store, SqliteStore) else "infinity"


async def leased(kernel: Kernel, *agents: str) -> list[tuple[str, Lease]]:
    """One claimed execution per agent, in that order: its id and its lease."""
    ids = [(await kernel.create_execution(agent, "null", None)).id for agent in agents]
    claimed = {c.dispatch.execution_id: c.dispatch for c in await kernel.claim(10)}
    return [(one, Lease(claimed[one].id, claimed[one].attempt)) for one in ids]


async def status_of(kernel: Kernel, execution_id: str, lease: Lease) -> DispatchStatus:
    async with kernel.store.transaction(execution_id) as tx:
        dispatch = await tx.get_dispatch(lease.dispatch_id)
    assert dispatch is not None
    return dispatch.status


@pytest.mark.parametrize("stored", [1e12, math.inf], ids=["31700-years", "infinite"])
async def test_a_lease_out_of_range_counts_as_a_week_and_never_stops_the_reaper(
    kernel: Kernel, clock: ManualClock, raw_sql: RawSql, stored: float
) -> None:
    await kernel.register_agent(OLD_AGENT, "http://127.0.0.1:9/webhook", "s", 60, None)
    old, healthy = await leased(kernel, OLD_AGENT, AGENT)
    await raw_sql("UPDATE agents SET lease_timeout_seconds = %s WHERE id = %s", stored, OLD_AGENT)
    clock.advance(LEASE + timedelta(seconds=1))

    assert await kernel.reclaim_expired_leases() == 1

    assert await status_of(kernel, *healthy) is DispatchStatus.PENDING
    assert await status_of(kernel, *old) is DispatchStatus.IN_FLIGHT
    clock.advance(timedelta(seconds=MAX_AGENT_LEASE_SECONDS))
    assert await kernel.reclaim_expired_leases() == 1
    assert await status_of(kernel, *old) is DispatchStatus.PENDING


async def test_a_lease_that_is_not_a_number_counts_as_unset(
    kernel: Kernel, clock: ManualClock, store: Store, raw_sql: RawSql
) -> None:
    await kernel.register_agent(OLD_AGENT, "http://127.0.0.1:9/webhook", "s", 60, None)
    [old] = await leased(kernel, OLD_AGENT)
    # SQLite keeps whatever it is given; Postgres's double precision holds NaN.
    stored: object = "sixty" if isinstance(store, SqliteStore) else math.nan
    await raw_sql("UPDATE agents SET lease_timeout_seconds = %s WHERE id = %s", stored, OLD_AGENT)

    clock.advance(LEASE - timedelta(seconds=1))
    assert await kernel.reclaim_expired_leases() == 0
    clock.advance(timedelta(seconds=2))
    assert await kernel.reclaim_expired_leases() == 1
    assert await status_of(kernel, *old) is DispatchStatus.PENDING


async def test_approval_expiry_passes_over_a_row_it_cannot_read(
    kernel: Kernel, clock: ManualClock, store: Store, raw_sql: RawSql
) -> None:
    await kernel.set_policy(AGENT, GATED)
    leases = await leased(kernel, AGENT, AGENT, AGENT)
    approvals: list[str] = []
    for execution_id, lease in leases:
        decision = await kernel.submit_step(execution_id, AGENT, lease, SHELL)
        assert decision.approval_id
        approvals.append(decision.approval_id)
    broken = (await kernel.get_approval(approvals[1])).execution_id
    await raw_sql(
        "UPDATE executions SET created_at = %s WHERE id = %s", unreadable_time(store), broken
    )
    clock.advance(timedelta(minutes=6))

    assert await background.expire_approvals(kernel) == 2

    for approval_id in (approvals[0], approvals[2]):
        assert (await kernel.get_approval(approval_id)).status is ApprovalStatus.EXPIRED
    assert (await kernel.get_approval(approvals[1])).status is ApprovalStatus.PENDING


async def test_the_sweep_pages_past_a_full_page_of_rows_it_cannot_read(
    kernel: Kernel, clock: ManualClock, store: Store, raw_sql: RawSql
) -> None:
    kernel.settings = replace(kernel.settings, deadline_timeout=timedelta(minutes=1))
    created = [(await kernel.create_execution(AGENT, "null", None)).id for _ in range(4)]
    broken, healthy = sorted(created)[:3], sorted(created)[3]
    for execution_id in broken:
        await raw_sql(
            "UPDATE executions SET created_at = %s WHERE id = %s",
            unreadable_time(store),
            execution_id,
        )
    clock.advance(timedelta(minutes=2))

    # Pages of two: the broken rows fill the first page and half the second.
    assert await background.cancel_overdue(kernel, page=2) == 1

    assert (await kernel.get_execution(healthy)).status is ExecutionStatus.CANCELLED


async def test_the_singleton_sweep_still_reaches_retention_past_a_broken_row(
    kernel: Kernel, clock: ManualClock, store: Store, raw_sql: RawSql
) -> None:
    kernel.settings = replace(
        kernel.settings, retention=timedelta(days=1), deadline_timeout=timedelta(minutes=1)
    )
    done = await kernel.create_execution(AGENT, "null", None)
    await kernel.cancel_execution(done.id)
    overdue = await kernel.create_execution(AGENT, "null", None)
    await raw_sql(
        "UPDATE executions SET created_at = %s WHERE id = %s", unreadable_time(store), overdue.id
    )
    clock.advance(timedelta(days=2))

    await background.sweep(kernel)

    with pytest.raises(NotFound):
        await kernel.get_execution(done.id)
