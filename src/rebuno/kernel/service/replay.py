"""The unlocked replay read, a fast way to answer a step submission (§8.1): a step that
succeeded or failed never changes again, so its replay needs no lock, no transaction and, while
the lease was renewed recently enough, no renewal either.

`replay_unlocked` takes the locked script's input and answers with `submission.decide` on one
committed read, or None for the locked script. It answers only a plan that writes nothing.
Its eligibility is `decision.eligibility`'s; this process's knowledge (`shortcuts.py`) only
spares it the read for a delivery attempt with nothing left to replay.
Must not import a concrete store backend, the API, httpx or a use-case module.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rebuno.kernel import metrics
from rebuno.kernel.decision import eligibility
from rebuno.kernel.decision.submission import LeaseView, StepSubmission, Submitted, decide
from rebuno.kernel.domain.decision import StepDecision
from rebuno.kernel.domain.dispatch import owns
from rebuno.kernel.domain.errors import KernelError
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.records import Dispatch, replace
from rebuno.kernel.service.context import Context

_SHORTEST_OWN_LEASE = timedelta(seconds=10)


async def replay_unlocked(context: Context, submission: StepSubmission) -> StepDecision | None:
    """The decision on one committed read, when it writes nothing: a recorded step whose
    answer reads nothing more, under a lease renewed within `renewal_due`. A step not
    recorded at all ends the replay of this delivery attempt: its later submissions skip this
    read."""
    occurrence, lease = submission.occurrence, submission.lease
    if (
        occurrence is None
        or not eligibility.unlocked(occurrence, submission.request)
        or not eligibility.may_replay(submission.outcomes)
        or not context.shortcuts.may_replay_unlocked(lease)
    ):
        return None
    slot = submission.own_slot(occurrence)
    loaded = await context.store.load_completion(
        submission.execution_id, slot.step_id, lease.dispatch_id
    )
    if loaded.step is None:
        context.shortcuts.past_history(lease)
        return None
    if not eligibility.replayable(loaded.execution, loaded.step):
        return None
    now = context.clock()
    view = LeaseView(
        lease, live=owns(loaded.dispatch, lease), renewed=_fresh(context, loaded.dispatch, now)
    )
    recorded = replace(slot, recorded=loaded.step)
    submitted = Submitted(loaded.execution, submission.agent_id, submission.request, recorded, view)
    batch = EventBatch(loaded.execution, now)
    try:
        plan = decide(submitted, batch, context.rules)
    except KernelError:
        return None  # the locked script gives the refusal, with its checks
    if not plan.writes_nothing(batch):
        return None
    metrics.step_decided(submission.request.kind, plan.decision.decision, recorded=True)
    return plan.decision


def _fresh(context: Context, dispatch: Dispatch | None, now: datetime) -> bool:
    """The lease was renewed within `renewal_due`, so this answer need not renew it."""
    renewed_at = dispatch.locked_at if dispatch is not None else None
    return renewed_at is not None and now - renewed_at < renewal_due(context)


def renewal_due(context: Context) -> timedelta:
    """A third of the shortest lease period (§12.3: an agent's own is at least 10 s)."""
    return min(context.settings.dispatch_lease_timeout, _SHORTEST_OWN_LEASE) / 3
