"""Step use cases: submit (§8), complete and fail (§9), stream deltas (§16.1).

`submit_step` is split along its decisions: load under the lock, decide a recorded step
(R1-R6), or decide a new one (N0-N7: indeterminate retry, policy, rate limit, budget, record).
Must not import a concrete store backend, the API, or httpx.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cached_property

from rebuno.kernel import metrics
from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import (
    Carried,
    StepDecision,
    StepOutcome,
    StepRecord,
    StepRequest,
)
from rebuno.kernel.domain.dispatch import owns
from rebuno.kernel.domain.errors import (
    Conflict,
    KernelError,
    NotFound,
    ValidationFailed,
    lease_superseded,
)
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import check_owner, mark_started
from rebuno.kernel.domain.identity import policy_hash
from rebuno.kernel.domain.identity import step_id as compute_step_id
from rebuno.kernel.domain.ratelimit import park_wait
from rebuno.kernel.domain.records import Execution, Lease, RawJson, Step, replace
from rebuno.kernel.domain.resource import NO_CAPTURES, Captures
from rebuno.kernel.domain.usage import extract_usage
from rebuno.kernel.policy.engine import PERMISSIVE, PolicyResult, bundle_error
from rebuno.kernel.service.base import ServiceBase, flush, log, new_id
from rebuno.kernel.service.plan import (
    NO_FACTS,
    Facts,
    LeaseView,
    Plan,
    Rules,
    Slot,
    Submitted,
    admit,
    decide,
    has_budget,
    has_rate_limit,
    may_park,
    needs_verdict,
    new_step,
)
from rebuno.kernel.service.resources import apply_touch, settle
from rebuno.kernel.service.shortcuts import Run
from rebuno.kernel.store.base import (
    NOTHING_WANTED,
    Outcomes,
    Stale,
    StepIdFn,
    StepKey,
    Submission,
    Transaction,
    Unchanged,
    Wanted,
)
from rebuno.kernel.stream.bus import Delta
from rebuno.protocol.enums import (
    Decision,
    ExecutionStatus,
    Idempotency,
    PolicyAction,
    StepKind,
    StepStatus,
)
from rebuno.protocol.events import EventType

EMPTY_POLICY_HASH = policy_hash("")
"""What `Unchanged.policy_hash` holds for an execution without a policy bundle."""
# Recorded outcomes a submission replays; no later write changes them.
_SHORTEST_OWN_LEASE = timedelta(seconds=10)


class StepUseCases(ServiceBase):
    async def submit_step(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        request: StepRequest,
        outcomes: Sequence[Carried] = (),
        occurrence: int | None = None,
    ) -> StepDecision:
        """§8, decided by `plan.decide`. `occurrence`: the agent's own number for this
        submission (`step-occurrences`), which replaces the dispatch's counter; None to count
        as §7.3 does. A replay may first be answered from an unlocked read (`shortcuts`)."""
        key = _key(request)
        step_id_for = _StepIds(execution_id, request)
        if occurrence is not None and not request.resources:
            slot = Slot(occurrence, step_id_for(occurrence), None, kernel_counted=False)
            decided = await self._shortcut(execution_id, agent_id, lease, request, outcomes, slot)
            if decided is not None:
                return decided
        async with self.transaction(execution_id) as tx:
            now = self.clock()
            carried = [o.step_id for o in outcomes if isinstance(o, StepOutcome)]
            sub = await tx.load_submission(execution_id, lease, key, step_id_for, now, carried)
            execution = sub.execution
            refused = admit(execution, agent_id, LeaseView(lease, sub.lease_live))
            if refused is not None:
                metrics.step_decided(request.kind, refused.decision, recorded=False)
                return refused
            batch = EventBatch(execution, now)
            execution = mark_started(execution, batch)
            reported = await apply_outcomes(
                tx,
                execution_id,
                lease.dispatch_id,
                outcomes,
                batch,
                sub.completing,
                execution=execution,
            )
            slot = await _resolve_slot(tx, sub, key, occurrence, reported, step_id_for)
            submitted = Submitted(execution, agent_id, request, slot, LeaseView(lease, True))
            if execution.has_resources:
                resources = tuple(await tx.list_resources(execution_id))
                submitted = replace(submitted, resources=resources)
            policy_free = False
            if needs_verdict(execution, slot):
                bundle = sub.policy_bundle
                policy_free = not bundle
                verdict = self._evaluate_policy(execution, bundle, request)
                facts = await _facts(tx, execution, key, request, verdict, now)
                submitted = replace(submitted, verdict=verdict, facts=facts)
            plan = decide(submitted, batch, self.rules)
            await self._apply(tx, plan, batch, lease, key, slot)
            woke = any(e.type == EventType.DISPATCH_QUEUED for e in batch.events)
            written = await flush(tx, plan.execution, batch)
        if woke:
            self.wake()
        # Looked up after the commit: the acknowledgement may have been remembered meanwhile.
        if (run := self.shortcuts.run(execution_id, lease)) is not None:
            if any(isinstance(o, StepRecord) for o in outcomes):
                self.shortcuts.forget(execution_id)  # reported steps: not followed
            else:
                self._advanced(run, sub.execution, plan, written, sub.policy_bundle, outcomes)
        metrics.step_decided(request.kind, plan.decision.decision, slot.recorded is not None)
        if submitted.verdict is not None:
            metrics.new_step_decided(plan.decision)
        if policy_free:
            return replace(plan.decision, policy_free=True)
        return plan.decision

    async def _shortcut(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        request: StepRequest,
        outcomes: Sequence[Carried],
        slot: Slot,
    ) -> StepDecision | None:
        """A submission at the agent's own occurrence may first be decided without the lock:
        a replay from one unlocked read, or a new step on what this process knows of the run.
        None for the locked way."""
        if not outcomes and self.shortcuts.may_replay_unlocked(lease):
            replayed = await self._replay_unlocked(execution_id, agent_id, lease, request, slot)
            if replayed is not None:
                metrics.step_decided(request.kind, replayed.decision, recorded=True)
                return replayed
        # The acknowledgement would otherwise commit between this step and the next.
        await self.shortcuts.wait_recorded(execution_id)
        run = self.shortcuts.run(execution_id, lease)
        if run is None:
            return None
        return await self._submit_on_run(run, agent_id, request, outcomes, slot)

    async def _submit_on_run(
        self,
        run: Run,
        agent_id: str,
        request: StepRequest,
        outcomes: Sequence[Carried],
        slot: Slot,
    ) -> StepDecision | None:
        """The same decision on what this process knows of the run (`shortcuts.Run`), in one
        optimistic statement that applies only while that knowledge holds: a new step at the
        agent's own occurrence, allowed by policy with nothing more to read, carrying only
        completions. None otherwise, or when the execution moved, for the locked way."""
        execution, lease = run.execution, run.lease
        if (
            slot.step_id in run.recorded
            or execution.agent_id != agent_id
            or execution.status is not ExecutionStatus.RUNNING
            or execution.has_resources
            or request.idempotency is Idempotency.AT_MOST_ONCE
            or any(isinstance(o, StepRecord) for o in outcomes)
        ):
            return None
        verdict = self._evaluate_policy(execution, run.bundle, request)
        if (
            verdict.action is not PolicyAction.ALLOW
            or has_rate_limit(verdict)
            or has_budget(verdict)
        ):
            return None
        now = self.clock()
        hashed = verdict.policy_hash or EMPTY_POLICY_HASH  # set when a bundle gave it
        unchanged = Unchanged.on(execution, lease, now, policy_hash=hashed)
        batch = EventBatch(execution, now)
        executing = [
            run.executing[o.step_id]
            for o in outcomes
            if isinstance(o, StepOutcome) and o.step_id in run.executing
        ]
        submitted = Submitted(
            execution, agent_id, request, slot, LeaseView(lease, True), verdict=verdict
        )
        try:
            async with self.transaction(execution.id, unchanged) as tx:
                await apply_outcomes(
                    tx,
                    execution.id,
                    lease.dispatch_id,
                    outcomes,
                    batch,
                    executing,
                    Outcomes(consumed={}, steps=[]),
                    execution=execution,  # running already: nothing to start
                )
                plan = decide(submitted, batch, self.rules)
                await self._apply(tx, plan, batch, lease, _key(request), slot)
                written = await flush(tx, plan.execution, batch)
        except Stale:
            self.shortcuts.forget(execution.id)
            return None
        self._advanced(run, execution, plan, written, run.bundle, outcomes)
        metrics.step_decided(request.kind, plan.decision.decision, recorded=False)
        metrics.new_step_decided(plan.decision)
        if not run.bundle:
            return replace(plan.decision, policy_free=True)
        return plan.decision

    def _advanced(
        self,
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
        self.shortcuts.advanced(
            run.lease,
            before.last_event_seq,
            after,
            bundle,
            [o.step_id for o in outcomes if isinstance(o, StepOutcome)],
            recorded,
        )

    @cached_property
    def rules(self) -> Rules:
        """Built once: the settings never change."""
        return Rules(approval_timeout=self.settings.approval_timeout, new_id=new_id)

    async def _replay_unlocked(
        self, execution_id: str, agent_id: str, lease: Lease, request: StepRequest, slot: Slot
    ) -> StepDecision | None:
        """The same decision on one committed read, without the lock or a transaction, when
        it writes nothing: a recorded step that succeeded or failed never changes again, and
        a lease renewed within `_renewal_due` need not be renewed now. None otherwise, for
        the locked way. A step not recorded at all ends the replay of this delivery attempt:
        its later submissions skip this read."""
        loaded = await self.store.load_completion(execution_id, slot.step_id, lease.dispatch_id)
        step, dispatch = loaded.step, loaded.dispatch
        if step is None:
            self.shortcuts.past_history(lease)
            return None
        if loaded.execution.has_resources:
            return None  # a re-run touches them: the locked way reads them
        if step.status is StepStatus.AWAITING_APPROVAL:
            return None  # its pending approval is not part of this read
        now = self.clock()
        renewed_at = dispatch.locked_at if dispatch is not None else None
        view = LeaseView(
            lease,
            live=owns(dispatch, lease),
            renewed=renewed_at is not None and now - renewed_at < self._renewal_due,
        )
        batch = EventBatch(loaded.execution, now)
        submitted = Submitted(
            loaded.execution, agent_id, request, replace(slot, recorded=step), view
        )
        try:
            plan = decide(submitted, batch, self.rules)
        except KernelError:
            return None  # the locked way gives the refusal, with its checks
        return plan.decision if plan.writes_nothing(batch) else None

    @property
    def _renewal_due(self) -> timedelta:
        """A third of the shortest lease period (§12.3: an agent's own is at least 10 s)."""
        return min(self.settings.dispatch_lease_timeout, _SHORTEST_OWN_LEASE) / 3

    async def _apply(
        self, tx: Transaction, plan: Plan, batch: EventBatch, lease: Lease, key: StepKey, slot: Slot
    ) -> None:
        """The plan's writes, in the order its events tell them."""
        if plan.insert_step is not None:
            await tx.insert_step(plan.insert_step)
        if plan.update_step is not None:
            await tx.update_step(plan.update_step)
            if plan.update_step.status is StepStatus.FAILED and plan.execution.has_resources:
                await settle(tx, plan.execution, [plan.update_step])  # R5b's indeterminate
        if plan.touch.affected or plan.touch.touched:
            await apply_touch(tx, plan.execution.id, slot.step_id, plan.touch, plan.touch_seq)
        if plan.approval is not None:
            await tx.insert_approval(plan.approval)
        if plan.retire_dispatches:
            await tx.retire_dispatches(plan.execution.id, batch.now)
        if plan.park is not None:
            delay = park_wait(*plan.park, random.randint)
            await self.enqueue(tx, batch, self.new_dispatch(plan.execution.id, batch.now, delay))
        if plan.advance_occurrence:
            await tx.set_occurrence(lease.dispatch_id, key, slot.occurrence)

    def _evaluate_policy(
        self, execution: Execution, policy_bundle: str | None, request: StepRequest
    ) -> PolicyResult:
        """Fail closed: a stored bundle that no longer compiles denies rather than allows.
        A bundle's verdict names the bundle by its hash (§35.6)."""
        if not policy_bundle:
            return PERMISSIVE
        hashed = self.bundles.hash_of(policy_bundle)
        try:
            bundle = self.bundles.get(policy_bundle)
        except ValidationFailed:
            log.exception("stored policy bundle of agent %s no longer compiles", execution.agent_id)
            return replace(bundle_error("policy_bundle_invalid"), policy_hash=hashed)
        verdict = metrics.evaluate_policy(
            bundle, execution.agent_id, request.kind, request.target, request.args
        )
        return replace(verdict, policy_hash=hashed)

    async def complete_step(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease,
        result: RawJson,
        captures: Captures = NO_CAPTURES,
    ) -> StepDecision:
        return await self._finish_step(
            execution_id, agent_id, step_id, lease, result, None, captures
        )

    async def fail_step(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease,
        error: RawJson,
        captures: Captures = NO_CAPTURES,
    ) -> StepDecision:
        return await self._finish_step(
            execution_id, agent_id, step_id, lease, None, error, captures
        )

    async def _finish_step(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease,
        result: RawJson | None,
        error: RawJson | None,
        captures: Captures = NO_CAPTURES,
    ) -> StepDecision:
        """§9 in its order: step, terminal execution, weak lease, terminal step, status. An
        outcome recorded settles the step and takes the captures it carries (§33.6), which
        cover the boundary of its own event; a refused capture never changes the answer."""
        async with self.transaction(execution_id) as tx:
            loaded = await tx.load_completion(execution_id, step_id, lease.dispatch_id)
            step, execution = loaded.step, loaded.execution
            if step is None:
                raise NotFound(f"step {step_id} not found in execution {execution_id}")
            check_owner(execution, agent_id)
            if execution.status.is_terminal:
                return StepDecision(Decision.EXECUTION_TERMINAL)
            # The weak check (§9): the attempt must not have moved; its status may have.
            if loaded.dispatch is None or loaded.dispatch.attempt != lease.attempt:
                raise lease_superseded(execution_id, lease)
            if step.status.is_terminal:
                if result is not None:
                    return StepDecision(Decision.REPLAY, result=step.result or "null")
                return StepDecision(Decision.REPLAY, error=step.error or "{}")
            if step.status is not StepStatus.EXECUTING:
                raise Conflict(f"step {step_id} is {step.status}, not executing")
            batch = EventBatch(execution, self.clock())
            done = record_outcome(step, result, error, batch)
            await tx.update_step(done)
            await settle(tx, execution, [done], captures, batch.last_seq, batch)
            await flush(tx, execution, batch)
        return StepDecision(Decision.RECORDED)

    async def publish_delta(
        self,
        execution_id: str,
        agent_id: str,
        step_id: str,
        lease: Lease | None,
        seq: int,
        data: str,
    ) -> None:
        """Ephemeral: checked against recorded state, published best-effort, never stored.
        The execution, the step and the lease's dispatch come from one read."""
        async with self.transaction(execution_id) as tx:
            loaded = await tx.load_completion(
                execution_id, step_id, lease.dispatch_id if lease else ""
            )
        check_owner(loaded.execution, agent_id)
        step = loaded.step
        if step is None:
            raise NotFound(f"step {step_id} not found in execution {execution_id}")
        # The weak check (§16.1), and only when the agent sent a lease.
        if lease is not None and (
            loaded.dispatch is None or loaded.dispatch.attempt != lease.attempt
        ):
            raise lease_superseded(execution_id, lease)
        if step.status is not StepStatus.EXECUTING:
            raise Conflict(f"step {step_id} is {step.status}, not executing")
        self.bus.publish(execution_id, Delta(step_id=step_id, seq=seq, data=data))


async def _resolve_slot(
    tx: Transaction,
    sub: Submission,
    key: StepKey,
    occurrence: int | None,
    reported: dict[StepKey, int],
    step_id_for: StepIdFn,
) -> Slot:
    """The one place a submission's occurrence is chosen (§7.3): the agent's own number
    (`step-occurrences`), else past the steps of its key the same request reported, else the
    dispatch's counter as loaded. The step recorded there is read again only when the
    occurrence is not the loaded one; a step awaiting approval comes with its approval."""
    if occurrence is not None:
        chosen, counted = occurrence, False
    elif key in reported:
        chosen, counted = reported[key] + 1, True
    else:
        chosen, counted = sub.occurrence, True
    step_id = step_id_for(chosen)
    recorded = sub.existing if chosen == sub.occurrence else await tx.get_step(step_id)
    approval_id = None
    if recorded is not None and recorded.status is StepStatus.AWAITING_APPROVAL:
        approval = await tx.pending_approval_for_step(step_id)
        approval_id = approval.id if approval else None
    return Slot(chosen, step_id, recorded, counted, approval_id)


async def _facts(
    tx: Transaction,
    execution: Execution,
    key: StepKey,
    request: StepRequest,
    verdict: PolicyResult,
    now: datetime,
) -> Facts:
    """What deciding a new step reads, and only what its request and verdict need: an
    indeterminate earlier attempt (`at_most_once`), a rate token (taken here when one is
    free, §14.7), the tokens spent (§14.9)."""
    if request.idempotency is Idempotency.AT_MOST_ONCE and await tx.has_indeterminate_step(
        execution.id, key
    ):
        return Facts(indeterminate=True)
    limit = verdict.rate_limit
    if limit is not None and has_rate_limit(verdict):
        bucket = _bucket_key(verdict.rule_id, limit.per_what, execution)
        wait = await tx.take_rate_token(bucket, limit.max_calls, limit.window.total_seconds(), now)
        if wait is not None:
            before = may_park(verdict, wait) and await tx.has_event_of_type(
                execution.id, EventType.STEP_RATE_LIMITED
            )
            return Facts(rate_wait=wait, rate_limited_before=before)
    if has_budget(verdict):
        return Facts(spent_tokens=await tx.spent_tokens(execution.id))
    return NO_FACTS


async def apply_outcomes(
    tx: Transaction,
    execution_id: str,
    dispatch_id: str,
    outcomes: Sequence[Carried],
    batch: EventBatch,
    loaded: Sequence[Step] | None = None,
    recorded: Outcomes | None = None,
    *,
    counting: bool = True,
    execution: Execution | None = None,
) -> dict[StepKey, int]:
    """Records what an agent's request carries before its own business, in order: completions
    (`step-completions`) and steps that ran before they were submitted (`step-records`).

    A completion for a step that is no longer executing changes nothing: a terminal outcome is
    never overwritten, and the agent learns nothing new from a refusal here. A reported step
    takes the next occurrence of its key in this attempt and gets the events a submission and
    a completion would have written; one already recorded under that id is kept as it is.
    Returns the occurrence each reported key reached, which a submission in the same request
    continues from. `loaded`: the carried completions' steps, read already; `recorded`: what
    `wanted_by(outcomes)` loaded, read already. Without `counting`, the occurrences reached are
    not stored: for a request that ends the run, whose dispatch retires with it, they would
    be written for nothing: most of the writes of a long run's end. `execution`: as loaded, so
    completions settle the resources their steps affect (§33.6) when it has any."""
    if not outcomes:
        return {}
    if recorded is None:
        recorded = await tx.load_outcomes(execution_id, dispatch_id, wanted_by(outcomes, loaded))
    reported = _reported(execution_id, outcomes, recorded.consumed)
    found = {step.step_id: step for step in (*(loaded or ()), *recorded.steps)}
    consumed: dict[StepKey, int] = {}
    settled: list[Step] = []
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, StepRecord):
            step_id, key, occurrence = reported[index]
            consumed[key] = occurrence
            if step_id in found:
                log.info(
                    "ignored a reported step: execution_id=%s step_id=%s is recorded already",
                    execution_id,
                    step_id,
                )
                continue
            found[step_id] = await _record_reported(tx, outcome, step_id, occurrence, batch)
            continue
        step = found.get(outcome.step_id)
        if step is None or step.status is not StepStatus.EXECUTING:
            log.info(
                "ignored a carried completion: execution_id=%s step_id=%s is %s",
                execution_id,
                outcome.step_id,
                "unknown" if step is None else step.status,
            )
            continue
        done = record_outcome(step, outcome.result, outcome.error, batch)
        await tx.update_step(done)
        found[step.step_id] = done
        settled.append(done)
    if settled and execution is not None and execution.has_resources:
        await settle(tx, execution, settled)
    if counting:
        for key, occurrence in consumed.items():
            await tx.set_occurrence(dispatch_id, key, occurrence)
    return consumed


def wanted_by(outcomes: Sequence[Carried], loaded: Sequence[Step] | None = None) -> Wanted:
    """What recording `outcomes` reads: the counters and steps of the reported keys, and the
    steps of the carried completions unless they are `loaded` already."""
    if not outcomes:
        return NOTHING_WANTED
    reports = Counter(_key(o.request) for o in outcomes if isinstance(o, StepRecord))
    completing = () if loaded is not None else outcomes
    step_ids = [o.step_id for o in completing if isinstance(o, StepOutcome)]
    return Wanted(reports=reports, step_ids=step_ids)


def _reported(
    execution_id: str, outcomes: Sequence[Carried], consumed: dict[StepKey, int]
) -> dict[int, tuple[str, StepKey, int]]:
    """The id, key and occurrence of each reported step, by its index among `outcomes`."""
    counted = dict(consumed)
    reported: dict[int, tuple[str, StepKey, int]] = {}
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, StepRecord):
            key = _key(outcome.request)
            occurrence = counted.get(key, -1) + 1
            counted[key] = occurrence
            step_id = compute_step_id(
                execution_id, key.kind.value, key.target, key.args_hash, occurrence
            )
            reported[index] = (step_id, key, occurrence)
    return reported


async def _record_reported(
    tx: Transaction, report: StepRecord, step_id: str, occurrence: int, batch: EventBatch
) -> Step:
    """A step that ran before it was submitted, with the events of both in turn."""
    step = new_step(batch.execution_id, Slot(occurrence, step_id, None), report.request, batch)
    batch.step(EventType.STEP_PROPOSED, step)
    # The grant stands for the permissive policy it was given under.
    batch.step(EventType.STEP_ALLOWED, step, rule_id=PERMISSIVE.rule_id)
    executing = steps.start(step, batch.now)
    batch.step(EventType.STEP_EXECUTING, executing)
    done = record_outcome(executing, report.result, report.error, batch)
    await tx.insert_step(done)
    return done


class _StepIds:
    """The step id of each occurrence of one request, each computed once: a store that looks
    the step up by id and the use case ask for the same one (a plain dict, cheaper than a
    `functools.cache` wrapper built per submission)."""

    __slots__ = ("_execution_id", "_ids", "_request")

    def __init__(self, execution_id: str, request: StepRequest) -> None:
        self._execution_id = execution_id
        self._request = request
        self._ids: dict[int, str] = {}

    def __call__(self, occurrence: int) -> str:
        found = self._ids.get(occurrence)
        if found is None:
            request = self._request
            found = self._ids[occurrence] = compute_step_id(
                self._execution_id,
                request.kind.value,
                request.target,
                request.args_hash,
                occurrence,
            )
        return found


def _key(request: StepRequest) -> StepKey:
    return StepKey(request.kind, request.target, request.args_hash)


def record_outcome(
    step: Step, result: RawJson | None, error: RawJson | None, batch: EventBatch
) -> Step:
    if result is not None:
        usage = extract_usage(result) if step.kind is StepKind.LLM_CALL else None
        if usage is None and step.kind is StepKind.LLM_CALL:
            metrics.llm_usage_missing()
        done = steps.finish(step, StepStatus.SUCCEEDED, batch.now, result=result, usage=usage)
        usage_fields = {"input_tokens": usage[0], "output_tokens": usage[1]} if usage else None
        batch.step(EventType.STEP_SUCCEEDED, done, usage=usage_fields)
    else:
        done = steps.finish(step, StepStatus.FAILED, batch.now, error=error)
        batch.step(EventType.STEP_FAILED, done, error=error)
    return done


def _bucket_key(rule_id: str, per_what: str, execution: Execution) -> str:
    if per_what == "agent":
        return f"{rule_id}:agent:{execution.agent_id}"
    if per_what == "global":
        return f"{rule_id}:global"
    return f"{rule_id}:exec:{execution.id}"
