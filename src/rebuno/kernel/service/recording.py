"""Recording what was decided, inside the caller's transaction: a submission's plan, a step's
outcome, the outcomes an agent's request carries, and what each does to the execution's
resources (§33.5, §33.6). Every way a step's record changes goes through here.

A transaction fragment: it imports no use case. Must not import a concrete store backend, the
API, or httpx.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rebuno.kernel import metrics
from rebuno.kernel.decision import outcome as outcomes_rules
from rebuno.kernel.decision.submission import Plan, Slot, new_step
from rebuno.kernel.domain import resource as rules
from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.decision import Carried, StepOutcome, StepRecord, StepRequest
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.identity import step_id as compute_step_id
from rebuno.kernel.domain.ratelimit import park_wait
from rebuno.kernel.domain.records import Checkpoint, Execution, Lease, RawJson, Resource, Step
from rebuno.kernel.domain.resource import (
    NO_CAPTURES,
    Captures,
    Touch,
    checkpoint_payload,
)
from rebuno.kernel.policy.engine import PERMISSIVE
from rebuno.kernel.service.context import Context, log
from rebuno.kernel.store.base import NOTHING_WANTED, Outcomes, StepKey, Transaction, Wanted
from rebuno.protocol.enums import StepStatus
from rebuno.protocol.events import EventType

NOTHING_READ = Outcomes(consumed={}, steps=[])


def step_key(request: StepRequest) -> StepKey:
    """What a step is counted by within one delivery attempt (§7.3)."""
    return StepKey(request.kind, request.target, request.args_hash)


def record_outcome(
    step: Step, result: RawJson | None, error: RawJson | None, batch: EventBatch
) -> Step:
    """`outcome.outcome`, counting an `llm_call` that reported no usage."""
    done = outcomes_rules.outcome(step, result, error, batch)
    if outcomes_rules.usage_missing(done):
        metrics.llm_usage_missing()
    return done


async def apply_plan(
    context: Context,
    tx: Transaction,
    plan: Plan,
    batch: EventBatch,
    lease: Lease,
    slot: Slot,
    key: StepKey,
) -> None:
    """A submission plan's writes, in the order its events tell them."""
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
        dispatch = context.new_dispatch(plan.execution.id, batch.now, delay)
        await context.enqueue(tx, batch, dispatch)
    if plan.advance_occurrence:
        await tx.set_occurrence(lease.dispatch_id, key, slot.occurrence)


# -- what a request carries (`step-completions`, `step-records`) ---------------------------


@dataclass(frozen=True, slots=True)
class Carrying:
    """The outcomes an agent's request carries before its own business, with what recording
    them reads, read already (`read_carried`)."""

    dispatch_id: str
    """The dispatch of the lease the request was made under."""
    outcomes: Sequence[Carried]
    read: Outcomes = NOTHING_READ
    counted: bool = True
    """The occurrences the reported steps reach are stored for the dispatch. A request that
    ends the run need not: its dispatch retires with it (most of the writes of a long run's
    end would be for nothing)."""


def wanted_by(outcomes: Sequence[Carried], loaded: Sequence[Step] | None = None) -> Wanted:
    """What recording `outcomes` reads: the counters and steps of the reported keys, and the
    steps of the carried completions unless they are `loaded` already."""
    if not outcomes:
        return NOTHING_WANTED
    reports = Counter(step_key(o.request) for o in outcomes if isinstance(o, StepRecord))
    completing = () if loaded is not None else outcomes
    step_ids = [o.step_id for o in completing if isinstance(o, StepOutcome)]
    return Wanted(reports=reports, step_ids=step_ids)


async def read_carried(
    tx: Transaction,
    execution_id: str,
    dispatch_id: str,
    outcomes: Sequence[Carried],
    loaded: Sequence[Step] | None = None,
) -> Outcomes:
    """What recording `outcomes` needs that `loaded` (the carried completions' steps, when
    the caller read them already) does not hold."""
    wanted = wanted_by(outcomes, loaded)
    found = await tx.load_outcomes(execution_id, dispatch_id, wanted) if wanted else NOTHING_READ
    if not loaded:
        return found
    return Outcomes(consumed=found.consumed, steps=[*loaded, *found.steps])


async def record_carried(
    tx: Transaction, execution: Execution, carrying: Carrying, batch: EventBatch
) -> dict[StepKey, int]:
    """Records, in order, the completions of steps the request carries and the steps that
    ran before they were submitted. A completion for a step that is no longer executing
    changes nothing: a terminal outcome is never overwritten, and the agent learns nothing new
    from a refusal here. A reported step takes the next occurrence of its key in this attempt
    and gets the events a submission and a completion would have written; one already
    recorded under that id is kept as it is. Returns the occurrence each reported key
    reached, which a submission in the same request continues from. `execution`: as loaded,
    so completions settle the resources their steps affect (§33.6) when it has any."""
    if not carrying.outcomes:
        return {}
    execution_id = execution.id
    reported = _reported(execution_id, carrying.outcomes, carrying.read.consumed)
    found = {step.step_id: step for step in carrying.read.steps}
    consumed: dict[StepKey, int] = {}
    settled: list[Step] = []
    for index, outcome in enumerate(carrying.outcomes):
        if isinstance(outcome, StepRecord):
            step_id, key, occurrence = reported[index]
            consumed[key] = occurrence
            if step_id not in found:
                found[step_id] = await _record_reported(tx, outcome, step_id, occurrence, batch)
            else:
                log.info(
                    "ignored a reported step: execution_id=%s step_id=%s is recorded already",
                    execution_id,
                    step_id,
                )
            continue
        done = await _complete(tx, found.get(outcome.step_id), outcome, batch, execution_id)
        if done is not None:
            found[done.step_id] = done
            settled.append(done)
    if settled and execution.has_resources:
        await settle(tx, execution, settled)
    if carrying.counted:
        for key, occurrence in consumed.items():
            await tx.set_occurrence(carrying.dispatch_id, key, occurrence)
    return consumed


async def _complete(
    tx: Transaction, step: Step | None, carried: StepOutcome, batch: EventBatch, execution_id: str
) -> Step | None:
    if step is None or step.status is not StepStatus.EXECUTING:
        log.info(
            "ignored a carried completion: execution_id=%s step_id=%s is %s",
            execution_id,
            carried.step_id,
            "unknown" if step is None else step.status,
        )
        return None
    done = record_outcome(step, carried.result, carried.error, batch)
    await tx.update_step(done)
    return done


def _reported(
    execution_id: str, outcomes: Sequence[Carried], consumed: dict[StepKey, int]
) -> dict[int, tuple[str, StepKey, int]]:
    """The id, key and occurrence of each reported step, by its index among `outcomes`."""
    counted = dict(consumed)
    reported: dict[int, tuple[str, StepKey, int]] = {}
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, StepRecord):
            key = step_key(outcome.request)
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


# -- resources (§33) ------------------------------------------------------------------------


async def apply_touch(
    tx: Transaction, execution_id: str, step_id: str, live: Touch, seq: int
) -> None:
    """A live step's writes (§33.5): its affected keys, each touched resource's new
    generation, and its open checkpoints closed at the `step.executing` (`seq`)."""
    await tx.set_affected_keys(step_id, live.affected)
    for touched in live.touched:
        await tx.put_resource(touched)
        await tx.close_checkpoints(execution_id, touched.key, seq)


async def settle(
    tx: Transaction,
    execution: Execution,
    settled: Sequence[Step],
    captures: Captures = NO_CAPTURES,
    covered_seq: int = 0,
    batch: EventBatch | None = None,
) -> None:
    """Steps that left `executing` in this transaction count toward the resources they
    affect (§33.6); then the captures that came with an outcome, covering `covered_seq`.
    Reads nothing for an execution without resources and no captures."""
    if not execution.has_resources:
        if captures and batch is not None:
            await record_captures(tx, execution, captures, batch, covered_seq)
        return
    affected = await tx.affected_keys([s.step_id for s in settled]) if settled else {}
    stored = {r.key: r for r in await tx.list_resources(execution.id)}
    by_key = dict(stored)
    for step in settled:
        for counted in rules.settle(list(by_key.values()), affected.get(step.step_id, ())):
            by_key[counted.key] = counted
    for key, counted in by_key.items():
        if counted is not stored[key]:
            await tx.put_resource(counted)
    if captures and batch is not None:
        await _judge(tx, execution, by_key, captures, batch, covered_seq)


async def record_captures(
    tx: Transaction, execution: Execution, captures: Captures, batch: EventBatch, seq: int
) -> None:
    """§33.4's processing, for a publish: failures first, then each capture in order."""
    if not captures:
        return
    stored = await tx.list_resources(execution.id) if execution.has_resources else []
    await _judge(tx, execution, {r.key: r for r in stored}, captures, batch, seq)


async def _judge(
    tx: Transaction,
    execution: Execution,
    resources: dict[str, Resource],
    captures: Captures,
    batch: EventBatch,
    covered_seq: int,
) -> None:
    for failure in captures.failures:
        _failed(batch, failure.key, failure.generation, failure.error)
    if not captures.captures:
        return
    writing = await tx.writing_keys(execution.id) if resources else set()
    for capture, reason in rules.judge(resources, writing, captures.captures):
        if reason is not None:
            _failed(batch, capture.key, capture.generation, reason)
            continue
        checkpoint = Checkpoint(
            execution.id, capture.key, capture.generation, capture.checkpoint_ref, covered_seq
        )
        await tx.insert_checkpoint(checkpoint)
        batch.add(EventType.RESOURCE_CHECKPOINTED, checkpoint_payload(checkpoint))


def _failed(batch: EventBatch, key: str, generation: int, error: str) -> None:
    batch.add(
        EventType.RESOURCE_CHECKPOINT_FAILED,
        {"key": key, "generation": generation, "error": error[: rules.MAX_ERROR_CHARS]},
    )
