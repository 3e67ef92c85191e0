"""Starting an execution: recording a new one (a create, a fork), letting one run (its first
dispatch), a session's turns (§24.3), and the agent's first answer that starts it (§10.1),
the one way each is done.

A create without a session, a fork, and a session's admission of its next waiter all start
the execution they let run through `let_run`. A transaction fragment: it imports no use case.
Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

from datetime import datetime

from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import mark_started, spawned_by
from rebuno.kernel.domain.records import Execution, replace
from rebuno.kernel.service.context import Context, flush
from rebuno.kernel.service.restoration import inherit
from rebuno.kernel.store.base import ClaimedDispatch, Transaction, execution_lock, session_lock
from rebuno.protocol.enums import ExecutionStatus
from rebuno.protocol.events import LEASE_EXPIRED, EventType
from rebuno.protocol.times import format_timestamp


async def record_new(
    tx: Transaction, execution: Execution, batch: EventBatch, policy_bundle: str | None = None
) -> None:
    """A new `pending` execution and its `execution.created`; `policy_bundle`: its own, which
    its steps are decided by instead of its agent's (a fork's, §26.4)."""
    deadline = execution.origin.deadline_at
    batch.execution(
        EventType.EXECUTION_CREATED,
        execution,
        deadline_at=format_timestamp(deadline) if deadline else None,
        created_by=execution.origin.created_by,
        on_behalf_of=execution.origin.on_behalf_of,
        spawned_by=spawned_by(execution),
    )
    await tx.insert_execution(execution, policy_bundle)


async def let_run(
    context: Context, tx: Transaction, execution: Execution, batch: EventBatch
) -> Execution:
    """Queues the execution's first delivery and writes the batch; returns the record as
    written."""
    await context.enqueue(tx, batch, context.new_dispatch(execution.id, batch.now))
    return await flush(tx, execution, batch)


def announce(context: Context, execution: Execution) -> None:
    """After the commit that let an execution run here: long polls may wait for it, the
    activity feed names it, and the dispatch loop looks for its delivery."""
    context.shortcuts.created(execution.id)
    context.activity.touched(execution.id)
    context.wake()


async def admit_next(
    context: Context, tx: Transaction, session: str, now: datetime
) -> Execution | None:
    """§24.3, under the session's lock: when no admitted execution of the session is live,
    its oldest waiter whose deadline has not passed is admitted, with the agent's latest
    completed execution in the session as its parent unless it has one, and let run.
    Returns the execution admitted."""
    if await tx.session_held(session):
        return None
    waiter = await tx.first_waiter(session, now)
    if waiter is None:
        return None
    await tx.take_lock(execution_lock(waiter.id))
    waiter = await tx.get_execution(waiter.id)  # as it is under its lock
    if waiter.admitted_at is not None or waiter.status is not ExecutionStatus.PENDING:
        return None
    parent = waiter.parent_execution_id or await tx.last_completed(waiter.agent_id, session)
    await tx.admit(waiter.id, now, parent)
    admitted = replace(waiter, admitted_at=now, parent_execution_id=parent)
    batch = EventBatch(admitted, now)
    if parent is not None and waiter.parent_execution_id is None:
        # §33.8.4: an implicit parent is completed, so its resources no longer change
        # and are read without its lock.
        inherited = await tx.list_resources(parent)
        await inherit(tx, admitted.id, inherited, batch)
        admitted = replace(admitted, has_resources=bool(inherited))
    return await let_run(context, tx, admitted, batch)


async def release_session(context: Context, session: str) -> None:
    """Admits the session's next waiter when nothing holds it: the follow-up of every end of
    a session's execution (§24.3), and the lineage sweep's repair."""
    async with context.transaction() as tx:
        await tx.take_lock(session_lock(session))
        admitted = await admit_next(context, tx, session, context.clock())
    if admitted is not None:
        announce(context, admitted)


async def acknowledge(
    tx: Transaction, claimed: ClaimedDispatch, execution: Execution, now: datetime
) -> Execution:
    """Records a delivery's 2xx answer; the first reached the agent, so a `pending`
    execution starts. Returns the record as written."""
    batch = EventBatch(execution, now)
    batch.dispatch(
        EventType.DISPATCH_ACKED, claimed.dispatch, "acked", redelivery=redelivery(claimed)
    )
    started = mark_started(execution, batch)
    return await flush(tx, started, batch)


def redelivery(claimed: ClaimedDispatch) -> str | None:
    """The `redelivery` member of the claim's dispatch events: set when the claim delivers
    the execution again because the previous attempt's lease was reclaimed."""
    return LEASE_EXPIRED if claimed.reclaimed else None
