"""`load_submission`: everything a step submission reads, in one statement.

The statement renews the lease (strong check), reads the occurrence counter, the execution
and the step recorded under that occurrence together. It must run as its own statement
*after* the execution lock was taken: a statement's snapshot is fixed when it starts, so
fusing the lock into it would read what was committed before the lock was granted.
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from datetime import datetime

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.store.base import StepKey, Submission
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
        {steps.COLUMNS}
    FROM executions e
    CROSS JOIN next
    LEFT JOIN steps s ON s.execution_id = e.id AND s.kind = %(kind)s
        AND s.target = %(target)s AND s.args_hash = %(args_hash)s
        AND s.occurrence = next.occurrence
    WHERE e.id = %(execution_id)s
"""


async def load(
    conn: Connection, execution_id: str, lease: Lease, key: StepKey, now: datetime
) -> Submission:
    params = dispatches.lease_params(execution_id, lease, now)
    params.update(kind=key.kind.value, target=key.target, args_hash=key.args_hash)
    cur = await conn.execute(_LOAD, params)
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    width = executions.WIDTH
    step_row = row[width + 2 :]
    return Submission(
        execution=executions.from_row(row[:width]),
        lease_live=bool(row[width]),
        occurrence=int(row[width + 1]),
        existing=None if step_row[0] is None else steps.from_row(step_row),
    )
