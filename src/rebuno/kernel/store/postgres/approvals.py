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
from rebuno.kernel.store.columns import names, qualified
from rebuno.kernel.store.postgres.connection import Executor
from rebuno.protocol.enums import ApprovalStatus

COLUMNS = names("""
    id, step_id, execution_id, status, approvers, message, timeout_at, decided_by, decided_at,
    rationale, created_at, asserted_by
""")
"""The columns of an `Approval`, in the order `to_record` takes them."""
SELECTED = qualified("ap", COLUMNS)

_INSERT = f"""
    INSERT INTO approvals ({", ".join(COLUMNS)})
    VALUES (%s, %s, %s, %s, %s::text[], %s, %s, %s, %s, %s, %s, %s)
"""
_UPDATE = """
    UPDATE approvals SET status = %s, decided_by = %s, decided_at = %s, rationale = %s,
        asserted_by = %s
    WHERE id = %s
"""
_GET = f"SELECT {SELECTED} FROM approvals ap WHERE ap.id = %s"
_PENDING_FOR_STEP = f"""
    SELECT {SELECTED} FROM approvals ap WHERE ap.step_id = %s AND ap.status = 'pending'
    ORDER BY ap.created_at, ap.id LIMIT 1
"""
_PENDING_FOR_EXECUTION = f"""
    SELECT {SELECTED} FROM approvals ap WHERE ap.execution_id = %s AND ap.status = 'pending'
    ORDER BY ap.created_at, ap.id
"""
# Ids only: a row that would not read back fails its own expiry, not the listing.
_EXPIRED = """
    SELECT id FROM approvals WHERE status = 'pending' AND timeout_at <= %s AND id > %s
    ORDER BY id LIMIT %s
"""


def to_record(row: Sequence[Any]) -> Approval:
    (
        id,
        step_id,
        execution_id,
        status,
        approvers,
        message,
        timeout_at,
        decided_by,
        decided_at,
        rationale,
        created_at,
        asserted_by,
    ) = row
    return Approval(
        id=id,
        step_id=step_id,
        execution_id=execution_id,
        status=ApprovalStatus(status),
        approvers=None if approvers is None else tuple(approvers),
        message=message,
        timeout_at=timeout_at,
        decided_by=decided_by,
        decided_at=decided_at,
        rationale=rationale,
        created_at=created_at,
        asserted_by=asserted_by,
    )


async def get(conn: Executor, approval_id: str) -> Approval:
    cur = await conn.execute(_GET, (approval_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"approval {approval_id} not found")
    return to_record(row)


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
    return None if row is None else to_record(row)


async def pending_for_execution(conn: Executor, execution_id: str) -> list[Approval]:
    cur = await conn.execute(_PENDING_FOR_EXECUTION, (execution_id,))
    return [to_record(row) for row in await cur.fetchall()]


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
        f"SELECT {SELECTED} FROM approvals ap {where} ORDER BY ap.created_at, ap.id", params
    )
    return [to_record(row) for row in await cur.fetchall()]


async def list_expired(conn: Executor, now: datetime, limit: int, after: str) -> list[str]:
    cur = await conn.execute(_EXPIRED, (now, after, limit))
    return [approval_id for (approval_id,) in await cur.fetchall()]
