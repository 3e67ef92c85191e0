"""`load_submission`, `load_completion`, `lock_execution` and `load_outcomes`: everything a
step submission, a step's completion, an execution's completion (or heartbeat, or webhook
acknowledgement) and the outcomes a request carries read, each in one statement.

A submission is one call of `rebuno_load_submission` (`functions.sql`): it takes the
execution's lock (unless the transaction holds it already), renews the lease (strong check),
reads the occurrence counter, the execution, its agent's bundle and the step recorded under
that occurrence, and the steps whose completions the request carries. `lock_execution` is
one call of `rebuno_lock_execution`, its counterpart without a step.
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Lease, Step
from rebuno.kernel.store.base import (
    Completion,
    Locked,
    Outcomes,
    StepIdFn,
    StepKey,
    Submission,
    Wanted,
)
from rebuno.kernel.store.columns import Layout, found, prefixed
from rebuno.kernel.store.postgres import dispatches, executions, steps
from rebuno.kernel.store.postgres.connection import Batch, Executor, Params

SUBMISSION = Layout(
    ("tag",),
    prefixed("e_", executions.COLUMNS),
    ("lease_live", "occurrence", "policy_bundle"),
    prefixed("s_", steps.COLUMNS),
)
"""A row of `rebuno_load_submission`."""
LOCKED = Layout(prefixed("e_", executions.COLUMNS), ("lease_live", "policy_bundle"))
"""A row of `rebuno_lock_execution`."""
# The functions' columns are selected by name: a function that does not return them fails
# here instead of handing a record another's values.
_LOAD = (
    f"SELECT {', '.join(SUBMISSION.names)}"
    " FROM rebuno_load_submission(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_CARRIED = 1


async def load(
    conn: Executor,
    lock: int | None,
    execution_id: str,
    lease: Lease,
    key: StepKey,
    step_id_for: StepIdFn,
    now: datetime,
    completing: Sequence[str] = (),
) -> Submission:
    """`lock`: the execution's advisory-lock key, or None when the transaction holds it."""
    params = (
        lock,
        execution_id,
        lease.dispatch_id,
        lease.attempt,
        now,
        key.kind.value,
        key.target,
        key.args_hash,
        list(completing),
    )
    cur = await conn.execute(_LOAD, params)
    main = None
    carried: list[Step] = []
    for row in await cur.fetchall():
        (tag,), execution, loaded, step = SUBMISSION.split(row)
        if tag == _CARRIED:
            carried.append(steps.to_record(step))
        else:
            main = execution, loaded, step
    if main is None:
        raise NotFound(f"execution {execution_id} not found")
    execution, (lease_live, occurrence, policy_bundle), step = main
    # Found by its identity (key and occurrence), which is what its id is made of; kept only
    # under the id that occurrence yields, as the embedded store finds it.
    existing = steps.to_record(step) if found(step) else None
    if existing is not None and existing.step_id != step_id_for(occurrence):
        existing = None
    return Submission(
        execution=executions.to_record(execution),
        lease_live=bool(lease_live),
        occurrence=int(occurrence),
        existing=existing,
        policy_bundle=policy_bundle,
        # Read by primary key alone; a step of another execution is no step of this one.
        completing=tuple(done for done in carried if done.execution_id == execution_id),
    )


_LOAD_COMPLETION = f"""
    SELECT {executions.SELECTED}, {steps.SELECTED}, {dispatches.SELECTED}
    FROM executions e
    LEFT JOIN steps s ON s.step_id = %(step_id)s
    LEFT JOIN dispatches d ON d.id = %(dispatch_id)s AND d.execution_id = e.id
    WHERE e.id = %(execution_id)s
"""
_COMPLETION = Layout(executions.COLUMNS, steps.COLUMNS, dispatches.COLUMNS)


async def load_completion(
    conn: Executor, execution_id: str, step_id: str, dispatch_id: str
) -> Completion:
    params = {"execution_id": execution_id, "step_id": step_id, "dispatch_id": dispatch_id}
    cur = await conn.execute(_LOAD_COMPLETION, params)
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    execution, step_part, dispatch = _COMPLETION.split(row)
    step = steps.to_record(step_part) if found(step_part) else None
    return Completion(
        execution=executions.to_record(execution),
        # Joined by primary key alone; a step of another execution is no step of this one.
        step=step if step is not None and step.execution_id == execution_id else None,
        dispatch=dispatches.to_record(dispatch) if found(dispatch) else None,
    )


_LOCK_EXECUTION = f"SELECT {', '.join(LOCKED.names)} FROM rebuno_lock_execution(%s, %s, %s, %s, %s)"


async def lock_execution(
    conn: Batch,
    lock: int | None,
    execution_id: str,
    lease: Lease | None,
    now: datetime | None,
    wanted: Wanted,
) -> Locked:
    """`lock`: the execution's advisory-lock key, or None when the transaction holds it. When
    outcomes are `wanted` (with a lease), their statement goes in the same round trip."""
    dispatch_id: str | None = None
    attempt: int | None = None
    if lease is not None and now is not None:  # a lease is renewed at `now`, or not at all
        dispatch_id, attempt = lease.dispatch_id, lease.attempt
    statements: list[tuple[str, Params]] = [
        (_LOCK_EXECUTION, (lock, execution_id, dispatch_id, attempt, now))
    ]
    if wanted and lease is not None:
        statements.append(_outcomes_statement(execution_id, lease.dispatch_id, wanted))
    cursors = await conn.execute_many(statements)
    row = await cursors[0].fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    outcomes = None
    if len(cursors) > 1:
        outcomes = _outcomes(await cursors[1].fetchall(), wanted)
    execution, (lease_live, policy_bundle) = LOCKED.split(row)
    return Locked(
        execution=executions.to_record(execution),
        lease_live=bool(lease_live),
        policy_bundle=policy_bundle,
        outcomes=outcomes,
    )


# Per reported key: the dispatch's counter (NULL when unused) and each step recorded at one
# of the next `n` occurrences; then the steps named by id. A key with no step still gives
# one row (the LEFT JOIN), so its counter is seen.
_LOAD_OUTCOMES = f"""
    WITH k AS (
        SELECT * FROM unnest(%(kinds)s::text[], %(targets)s::text[], %(hashes)s::text[],
            %(counts)s::integer[]) AS k(kind, target, args_hash, n)
    ), c AS (
        SELECT k.kind, k.target, k.args_hash, k.n, COALESCE(c.consumed, -1) AS consumed,
            c.consumed IS NOT NULL AS used
        FROM k LEFT JOIN dispatch_step_counters c ON c.dispatch_id = %(dispatch_id)s
            AND c.kind = k.kind AND c.target = k.target AND c.args_hash = k.args_hash
    )
    SELECT c.kind, c.target, c.args_hash, CASE WHEN c.used THEN c.consumed END, {steps.SELECTED}
    FROM c LEFT JOIN steps s ON s.execution_id = %(execution_id)s AND s.kind = c.kind
        AND s.target = c.target AND s.args_hash = c.args_hash
        AND s.occurrence > c.consumed AND s.occurrence <= c.consumed + c.n
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, {steps.SELECTED} FROM steps s
    WHERE s.step_id = ANY(%(step_ids)s::text[]) AND s.execution_id = %(execution_id)s
"""


_OUTCOME = Layout(("kind", "target", "args_hash", "consumed"), steps.COLUMNS)


async def load_outcomes(
    conn: Executor, execution_id: str, dispatch_id: str, wanted: Wanted
) -> Outcomes:
    cur = await conn.execute(*_outcomes_statement(execution_id, dispatch_id, wanted))
    return _outcomes(await cur.fetchall(), wanted)


def _outcomes_statement(
    execution_id: str, dispatch_id: str, wanted: Wanted
) -> tuple[str, dict[str, Any]]:
    keys = list(wanted.reports)
    return _LOAD_OUTCOMES, {
        "execution_id": execution_id,
        "dispatch_id": dispatch_id,
        "kinds": [key.kind.value for key in keys],
        "targets": [key.target for key in keys],
        "hashes": [key.args_hash for key in keys],
        "counts": [wanted.reports[key] for key in keys],
        "step_ids": list(wanted.step_ids),
    }


def _outcomes(rows: Sequence[Sequence[Any]], wanted: Wanted) -> Outcomes:
    keys = {(key.kind.value, key.target, key.args_hash): key for key in wanted.reports}
    consumed: dict[StepKey, int] = {}
    recorded: dict[str, Step] = {}
    for row in rows:
        (kind, target, args_hash, used), step_part = _OUTCOME.split(row)
        if used is not None:
            consumed[keys[(kind, target, args_hash)]] = int(used)
        if found(step_part):
            step = steps.to_record(step_part)
            recorded[step.step_id] = step
    return Outcomes(consumed=consumed, steps=list(recorded.values()))
