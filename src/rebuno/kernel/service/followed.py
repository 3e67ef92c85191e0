"""The followed run, a fast way for a first delivery's steps, its end and its acknowledgement:
what this process committed of the run (`shortcuts.Run`) stands in for the reads under the
lock, and each write is one optimistic statement that applies only while the execution is
still as this process last wrote it (`store.base.Unchanged`).

Each function takes the locked script's input and answers what the script would, or None
(False) for the script: when the run is not followed here, when `decision.eligibility` says
the knowledge does not suffice, or when the statement finds the execution moved. The
bookkeeping that keeps a run followed after each commit lives here too.
Must not import a concrete store backend, the API, httpx or a use-case module.
"""

from __future__ import annotations

from collections.abc import Sequence

from rebuno.kernel import metrics
from rebuno.kernel.decision import eligibility
from rebuno.kernel.decision.ending import EndRequest
from rebuno.kernel.decision.submission import LeaseView, Plan, StepSubmission, Submitted, decide
from rebuno.kernel.domain.decision import Carried, StepDecision, StepOutcome, StepRecord
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import check_owner
from rebuno.kernel.domain.identity import policy_hash
from rebuno.kernel.domain.records import Execution, Lease, Step, replace
from rebuno.kernel.service.context import Context, flush
from rebuno.kernel.service.ending import finish_execution
from rebuno.kernel.service.recording import Carrying, apply_plan, record_carried, step_key
from rebuno.kernel.service.shortcuts import Run
from rebuno.kernel.service.starting import acknowledge
from rebuno.kernel.store.base import ClaimedDispatch, Outcomes, Stale, Unchanged

EMPTY_POLICY_HASH = policy_hash("")
"""What `Unchanged.policy_hash` holds for an execution without a policy bundle."""


async def submit_followed(context: Context, submission: StepSubmission) -> StepDecision | None:
    """A new step at the agent's own occurrence, decided on the followed run and recorded
    in one optimistic statement, when it is plainly allowed by policy."""
    occurrence, lease = submission.occurrence, submission.lease
    if occurrence is None or not eligibility.unlocked(occurrence, submission.request):
        return None
    # The acknowledgement would otherwise commit between this step and the next.
    await context.shortcuts.wait_recorded(submission.execution_id)
    run = context.shortcuts.run(submission.execution_id, lease)
    if run is None:
        return None
    slot = submission.own_slot(occurrence)
    execution, request = run.execution, submission.request
    if not eligibility.may_follow(
        execution, run.recorded, submission.agent_id, request, submission.outcomes, slot.step_id
    ):
        return None
    verdict = context.verdict(execution, run.bundle, request)
    if not eligibility.plainly_allowed(verdict):
        return None
    now = context.clock()
    # `policy_hash` is set on a verdict a bundle gave.
    unchanged = Unchanged.on(
        execution, lease, now, policy_hash=verdict.policy_hash or EMPTY_POLICY_HASH
    )
    view = LeaseView(lease, True)
    submitted = Submitted(execution, submission.agent_id, request, slot, view, verdict=verdict)
    batch = EventBatch(execution, now)
    executing = _completing(run, submission.outcomes)
    carrying = Carrying(lease.dispatch_id, submission.outcomes, Outcomes({}, executing))
    try:
        async with context.transaction(execution.id, unchanged) as tx:
            await record_carried(tx, execution, carrying, batch)  # running: nothing to start
            plan = decide(submitted, batch, context.rules)
            await apply_plan(context, tx, plan, batch, lease, slot, step_key(request))
            written = await flush(tx, plan.execution, batch)
    except Stale:
        context.shortcuts.forget(execution.id)
        return None
    advanced(context, run, execution, plan, written, run.bundle, submission.outcomes)
    metrics.step_decided(request.kind, plan.decision.decision, recorded=False)
    metrics.new_step_decided(plan.decision)
    return replace(plan.decision, policy_free=True) if not run.bundle else plan.decision


def _completing(run: Run, outcomes: Sequence[Carried]) -> list[Step]:
    """The steps the run knows executing whose completions the request carries."""
    return [
        run.executing[o.step_id]
        for o in outcomes
        if isinstance(o, StepOutcome) and o.step_id in run.executing
    ]


async def finish_followed(context: Context, end: EndRequest) -> Execution | None:
    """Ends a followed run on the record this process last wrote, in one statement that
    applies only while nothing changed since: the record is the execution's, the lease is
    live, no occurrence counter was used and no sub-agent was started from it. Returns the
    record written. The run is forgotten either way: its end is on its way."""
    await context.shortcuts.wait_acknowledged(end.execution_id)
    run = context.shortcuts.take_run(end.execution_id, end.lease)
    if run is None:
        return None
    completing = eligibility.followed_completions(end.outcomes, run.recorded, run.executing)
    if completing is None:
        return None
    execution = run.execution
    check_owner(execution, end.agent_id)
    now = context.clock()
    unchanged = Unchanged.on(execution, end.lease, now, childless=True)
    carrying = Carrying(end.lease.dispatch_id, end.outcomes, Outcomes({}, completing))
    try:
        async with context.transaction(execution.id, unchanged) as tx:
            return await finish_execution(tx, execution, end.ending, now, carrying)
    except Stale:
        return None


async def acknowledge_followed(context: Context, claimed: ClaimedDispatch) -> bool:
    """Records a delivery's answer on the record the claim read, in one optimistic
    statement; False when the execution changed since (the agent wrote first, say)."""
    seen = claimed.execution
    if not eligibility.acknowledged_optimistically(seen):
        return False
    try:
        async with context.transaction(seen.id, Unchanged.on(seen)) as tx:
            acked = await acknowledge(tx, claimed, seen, context.clock())
    except Stale:
        return False
    acknowledged(context, claimed, seen.last_event_seq, acked)
    return True


# -- keeping a run followed after each commit here --------------------------------------------


def acknowledged(context: Context, claimed: ClaimedDispatch, before: int, after: Execution) -> None:
    """The acknowledgement of `claimed` committed here, moving the execution from
    `last_event_seq` `before` to the record `after`."""
    dispatch = claimed.dispatch
    context.shortcuts.acknowledged(Lease(dispatch.id, dispatch.attempt), before, after)


def after_locked(
    context: Context,
    submission: StepSubmission,
    before: Execution,
    plan: Plan,
    after: Execution,
    bundle: str | None,
) -> None:
    """A submission the locked script committed on the record `before`: a followed run
    learns it (looked up after the commit: the acknowledgement may have been remembered
    meanwhile), or is forgotten when the request reported steps."""
    run = context.shortcuts.run(submission.execution_id, submission.lease)
    if run is None:
        return
    if any(isinstance(o, StepRecord) for o in submission.outcomes):
        context.shortcuts.forget(submission.execution_id)  # reported steps: not followed
        return
    advanced(context, run, before, plan, after, bundle, submission.outcomes)


def advanced(
    context: Context,
    run: Run,
    before: Execution,
    plan: Plan,
    after: Execution,
    bundle: str | None,
    outcomes: Sequence[Carried],
) -> None:
    """Tells the run what a submission on the record `before` committed (`after`, as
    `flush` wrote it)."""
    recorded = [s for s in (plan.insert_step, plan.update_step) if s is not None]
    context.shortcuts.advanced(
        run.lease,
        before.last_event_seq,
        after,
        bundle,
        [o.step_id for o in outcomes if isinstance(o, StepOutcome)],
        recorded,
    )
