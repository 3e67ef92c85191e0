"""`load_submission` and `load_completion`: everything a step submission, or a step's
completion, reads, each in one statement.

The statement renews the lease (strong check), reads the occurrence counter, the execution
and the step recorded under that occurrence together. It must run as its own statement
*after* the execution lock was taken: a statement's snapshot is fixed when it starts, so
fusing the lock into it would read what was committed before the lock was granted.
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

# The step is found by its unique key (execution, kind, target, args_hash, occurrence) rather
# than by the id that occurrence yields: the id is a hash of exactly that key, so both name
# the same row, and the key lets one statement do what would otherwise take two.
_LOAD = f"""
    WITH renewed AS ({dispatches.RENEW} RETURNING 1),
    next AS (
        SELECT COALESCE((
            SELECT consumed + 1 FROM dispatch_step_counters
            WHERE dispatch_id = %(dispatch_id)s AND kind = %(kind)s AND target = %(target)s
                AND args_hash = %(args_hash)s
        ), 0) AS occurrence
    )
    SELECT {executions.COLUMNS}, EXISTS (SELECT 1 FROM renewed), next.occurrence,
        a.policy_bundle, {steps.COLUMNS}
    FROM executions e
    CROSS JOIN next
    LEFT JOIN agents a ON a.id = e.agent_id
    LEFT JOIN steps s ON s.execution_id = e.id AND s.kind = %(kind)s
        AND s.target = %(target)s AND s.args_hash = %(args_hash)s
        AND s.occurrence = next.occurrence
    WHERE e.id = %(execution_id)s
"""


async def load(
    conn: Connection,
    execution_id: str,
    lease: Lease,
    key: StepKey,
    now: datetime,
    completing: Sequence[str] = (),
) -> Submission:
    params = dispatches.lease_params(execution_id, lease, now)
    params.update(kind=key.kind.value, target=key.target, args_hash=key.args_hash)
    cur = await conn.execute(_LOAD, params)
    # Queued behind the first read in the same pipeline: both answers come in one round trip.
    carried = await steps.query_many(conn, completing) if completing else None
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    width = executions.WIDTH
    step_row = row[width + 3 :]
    return Submission(
        execution=executions.from_row(row[:width]),
        lease_live=bool(row[width]),
        occurrence=int(row[width + 1]),
        existing=None if step_row[0] is None else steps.from_row(step_row),
        policy_bundle=row[width + 2],
        completing=() if carried is None else tuple(await steps.fetch_many(carried, execution_id)),
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
