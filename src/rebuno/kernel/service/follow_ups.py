"""What follows an execution's end (§24.3, §25): its session's release, its parent step's
settlement, then the cascade to its children; and the cancel that runs them.

Every end of an execution is followed, after its commit and each in a transaction of its own,
by these. The lock order (§12.8) is why they are follow-ups: the ending transaction holds the
execution's lock, and a follow-up takes a session's lock or another execution's. Each is
idempotent, and a failure loses nothing: the lineage sweep (§25.7) repeats them.
A transaction fragment: it imports no use case. Must not import a concrete store backend, the
API, or httpx.
"""

from __future__ import annotations

from collections.abc import Awaitable

import orjson

from rebuno.kernel.decision.ending import PARENT_AGENT_TERMINAL
from rebuno.kernel.domain.errors import ExecutionTerminal, NotFound
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.blocking import resume_if_idle
from rebuno.kernel.service.context import Context, flush, log
from rebuno.kernel.service.ending import cancelled
from rebuno.kernel.service.recording import record_outcome, settle
from rebuno.kernel.service.starting import release_session
from rebuno.kernel.store.base import Transaction
from rebuno.protocol.enums import ExecutionStatus, StepStatus


async def follow_up(context: Context, record: Execution) -> None:
    """The follow-ups of the end `record` committed, in order; a failed one is logged and
    left to the sweep."""
    follow_ups: list[tuple[str, Awaitable[None]]] = []
    if record.origin.session is not None:
        follow_ups.append(("release", release_session(context, record.origin.session)))
    if record.origin.spawned_by_execution_id is not None:
        follow_ups.append(("settlement", settle_child(context, record.id)))
    if record.has_children:
        follow_ups.append(("cascade", cascade(context, record.id)))
    for name, follow in follow_ups:
        try:
            await follow
        except Exception:
            log.warning(
                "the %s after execution %s ended failed; the sweep will repeat it",
                name,
                record.id,
                exc_info=True,
            )


def ended(context: Context, record: Execution) -> Awaitable[None]:
    """After the commit of a use case that ended an execution here: its readers are woken
    with the record, then its follow-ups run."""
    context.ended(record.id, record)
    return follow_up(context, record)


async def cancel(context: Context, execution_id: str, reason: str) -> None:
    """§10.1's cancel (`ending.cancelled`), then its follow-ups. Refuses a terminal
    execution with `ExecutionTerminal`."""
    done = await cancelled(context, execution_id, reason)
    context.ended(execution_id)
    await follow_up(context, done)


async def cascade(context: Context, execution_id: str) -> None:
    """§25.6: every live child of an ended execution is cancelled as a client cancel would,
    with `parent_agent_terminal`; each cancel runs its own follow-ups, so the cascade walks
    the whole tree."""
    for child in await context.store.list_children(execution_id):
        if not child.status.is_terminal:
            await cancel_orphan(context, child.id)


async def cancel_orphan(context: Context, execution_id: str) -> None:
    """A live sub-agent of an ended parent is cancelled; one that ended or was deleted since
    it was listed is left alone."""
    try:
        await cancel(context, execution_id, PARENT_AGENT_TERMINAL)
    except (ExecutionTerminal, NotFound):
        return


async def settle_child(context: Context, child_id: str) -> None:
    """§25.4: an ended sub-agent's outcome becomes its step's, under the parent's lock; then
    the parent resumes if nothing else holds it up. Nothing happens when the parent ended or
    is gone, or the step was settled some other way meanwhile."""
    child = await context.store.get_execution(child_id)
    parent_id = child.origin.spawned_by_execution_id
    if parent_id is None or not child.status.is_terminal:
        return
    async with context.transaction(parent_id) as tx:
        try:
            parent = await tx.get_execution(parent_id)
        except NotFound:
            return
        if parent.status.is_terminal:
            return
        batch = EventBatch(parent, context.clock())
        if not await settle_step(tx, child, batch, parent):
            return
        parent = await resume_if_idle(context, tx, parent, batch)
        await flush(tx, parent, batch)
    context.wake()


async def settle_step(
    tx: Transaction, child: Execution, batch: EventBatch, parent: Execution
) -> bool:
    """The parent's step takes the ended child's outcome, through the one way a step's
    outcome is recorded, and counts toward the parent's resources it affects (§33.6); False
    when the step no longer executes (settled already)."""
    step_id = child.origin.spawned_by_step_id
    step = None if step_id is None else await tx.get_step(step_id)
    if step is None or step.status is not StepStatus.EXECUTING:
        return False
    if child.status is ExecutionStatus.COMPLETED:
        done = record_outcome(step, child.output or "null", None, batch)
    else:
        done = record_outcome(step, None, _child_error(child), batch)
    await tx.update_step(done)
    if parent.has_resources:
        await settle(tx, parent, [done])
    return True


def _child_error(child: Execution) -> str:
    """The error a step takes from a sub-agent that failed or was cancelled."""
    cancelled_child = child.status is ExecutionStatus.CANCELLED
    reason = "subagent_cancelled" if cancelled_child else "subagent_failed"
    error = {"reason": reason, "execution_id": child.id}
    if child.failure_reason:
        error["failure_reason"] = child.failure_reason
    return orjson.dumps(error).decode()
