"""`load_submission` and `load_completion`: everything a step submission, or a step's
completion, reads, each in one statement.

A submission is one call of `rebuno_load_submission` (migration 004): it takes the execution's
lock (unless the transaction holds it already), renews the lease (strong check), reads the
occurrence counter, the execution, its agent's bundle and the step recorded under that
occurrence, and the steps whose completions the request carries.
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.store.base import Completion, StepKey, Submission
from rebuno.kernel.store.postgres import dispatches, executions, steps
from rebuno.kernel.store.postgres.connection import Connection

_LOAD = "SELECT * FROM rebuno_load_submission(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_MAIN, _CARRIED = 0, 1


async def load(
    conn: Connection,
    lock: int | None,
    execution_id: str,
    lease: Lease,
    key: StepKey,
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
    rows = await cur.fetchall()
    main = [row for row in rows if row[0] == _MAIN]
    if not main:
        raise NotFound(f"execution {execution_id} not found")
    row = main[0]
    width = executions.WIDTH + 1
    step_row = row[width + 3 :]
    carried = [steps.from_row(r[width + 3 :]) for r in rows if r[0] == _CARRIED]
    return Submission(
        execution=executions.from_row(row[1:width]),
        lease_live=bool(row[width]),
        occurrence=int(row[width + 1]),
        existing=None if step_row[0] is None else steps.from_row(step_row),
        policy_bundle=row[width + 2],
        completing=tuple(step for step in carried if step.execution_id == execution_id),
    )


_LOAD_COMPLETION = f"""
    SELECT {executions.COLUMNS}, {steps.COLUMNS}, {dispatches.COLUMNS}
    FROM executions e
    LEFT JOIN steps s ON s.step_id = %(step_id)s
    LEFT JOIN dispatches d ON d.id = %(dispatch_id)s AND d.execution_id = e.id
    WHERE e.id = %(execution_id)s
"""


async def load_completion(
    conn: Connection, execution_id: str, step_id: str, dispatch_id: str
) -> Completion:
    params = {"execution_id": execution_id, "step_id": step_id, "dispatch_id": dispatch_id}
    cur = await conn.execute(_LOAD_COMPLETION, params)
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    width, step_width = executions.WIDTH, steps.WIDTH
    step_row = row[width : width + step_width]
    dispatch_row = row[width + step_width :]
    step = None if step_row[0] is None else steps.from_row(step_row)
    return Completion(
        execution=executions.from_row(row[:width]),
        # Joined by primary key alone (see steps._GET_MANY); a step of another execution is
        # no step of this one.
        step=step if step is not None and step.execution_id == execution_id else None,
        dispatch=None if dispatch_row[0] is None else dispatches.from_row(dispatch_row),
    )
