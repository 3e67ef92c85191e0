"""SQL for the `approvals` table: human decisions that gate steps.

`approvers` is a `text[]` (NULL when the rule names nobody).
Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Approval
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import ApprovalStatus

COLUMNS = (
    "ap.id, ap.step_id, ap.execution_id, ap.status, ap.approvers, ap.message, ap.timeout_at,"
    " ap.decided_by, ap.decided_at, ap.rationale, ap.created_at, ap.asserted_by"
)

_INSERT = """
    INSERT INTO approvals (id, step_id, execution_id, status, approvers, message, timeout_at,
        decided_by, decided_at, rationale, created_at, asserted_by)
    VALUES (%s, %s, %s, %s, %s::text[], %s, %s, %s, %s, %s, %s, %s)
"""
_UPDATE = """
    UPDATE approvals SET status = %s, decided_by = %s, decided_at = %s, rationale = %s,
        asserted_by = %s
    WHERE id = %s
"""
_GET = f"SELECT {COLUMNS} FROM approvals ap WHERE ap.id = %s"
_PENDING_FOR_STEP = f"""
    SELECT {COLUMNS} FROM approvals ap WHERE ap.step_id = %s AND ap.status = 'pending'
    ORDER BY ap.created_at, ap.id LIMIT 1
"""
_PENDING_FOR_EXECUTION = f"""
    SELECT {COLUMNS} FROM approvals ap WHERE ap.execution_id = %s AND ap.status = 'pending'
    ORDER BY ap.created_at, ap.id
"""
# Ids only: a row that would not read back fails its own expiry, not the listing.
_EXPIRED = """
    SELECT id FROM approvals WHERE status = 'pending' AND timeout_at <= %s AND id > %s
    ORDER BY id LIMIT %s
"""


def from_row(row: Sequence[Any]) -> Approval:
    return Approval(
        id=row[0],
        step_id=row[1],
        execution_id=row[2],
        status=ApprovalStatus(row[3]),
        approvers=None if row[4] is None else tuple(row[4]),
        message=row[5],
        timeout_at=row[6],
        decided_by=row[7],
        decided_at=row[8],
        rationale=row[9],
        created_at=row[10],
        asserted_by=row[11],
    )


async def get(conn: Executor, approval_id: str) -> Approval:
    cur = await conn.execute(_GET, (approval_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"approval {approval_id} not found")
    return from_row(row)


async def insert(conn: Executor, a: Approval) -> None:
    await conn.execute(
        _INSERT,
        (
            a.id,
            a.step_id,
            a.execution_id,
            a.status.value,
            None if a.approvers is None else list(a.approvers),
            a.message,
            a.timeout_at,
            a.decided_by,
            a.decided_at,
            a.rationale,
            a.created_at,
            a.asserted_by,
        ),
    )


async def update(conn: Executor, a: Approval) -> None:
    await conn.execute(
        _UPDATE, (a.status.value, a.decided_by, a.decided_at, a.rationale, a.asserted_by, a.id)
    )


async def pending_for_step(conn: Executor, step_id: str) -> Approval | None:
    cur = await conn.execute(_PENDING_FOR_STEP, (step_id,))
    row = await cur.fetchone()
    return None if row is None else from_row(row)


async def pending_for_execution(conn: Executor, execution_id: str) -> list[Approval]:
    cur = await conn.execute(_PENDING_FOR_EXECUTION, (execution_id,))
    return [from_row(row) for row in await cur.fetchall()]


async def list_where(
    conn: Executor, status: ApprovalStatus | None, execution_id: str | None
) -> list[Approval]:
    conditions: list[str] = []
    params: list[Any] = []
    if status is not None:
        conditions.append("ap.status = %s")
        params.append(status.value)
    if execution_id is not None:
        conditions.append("ap.execution_id = %s")
        params.append(execution_id)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    cur = await conn.execute(
        f"SELECT {COLUMNS} FROM approvals ap {where} ORDER BY ap.created_at, ap.id", params
    )
    return [from_row(row) for row in await cur.fetchall()]


async def list_expired(conn: Executor, now: datetime, limit: int, after: str) -> list[str]:
    cur = await conn.execute(_EXPIRED, (now, after, limit))
    return [row[0] for row in await cur.fetchall()]
