"""SQL for the `approvals` table and its row mapping.

`approvers` is stored as a JSON array (TEXT) or NULL.
Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, the domain and this package.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import Approval
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.sqlite.errors import refusals
from rebuno.kernel.store.sqlite.timestamps import (
    from_micros,
    from_micros_or_none,
    to_micros,
    to_micros_or_none,
)
from rebuno.protocol.enums import ApprovalStatus

COLUMNS = names("""
    id, step_id, execution_id, status, approvers, message, timeout_at, decided_by, decided_at,
    rationale, created_at, asserted_by
""")
"""The columns of an `Approval`, in the order `to_record` takes them."""
_SELECTED = ", ".join(COLUMNS)


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
        approvers=None if approvers is None else tuple(json.loads(approvers)),
        message=message,
        timeout_at=from_micros(timeout_at),
        decided_by=decided_by,
        decided_at=from_micros_or_none(decided_at),
        rationale=rationale,
        created_at=from_micros(created_at),
        asserted_by=asserted_by,
    )


def get(conn: sqlite3.Connection, approval_id: str) -> Approval:
    row = conn.execute(f"SELECT {_SELECTED} FROM approvals WHERE id = ?", (approval_id,))
    found = row.fetchone()
    if found is None:
        raise NotFound(f"approval {approval_id} not found")
    return to_record(found)


def insert(conn: sqlite3.Connection, approval: Approval) -> None:
    approvers = None if approval.approvers is None else json.dumps(list(approval.approvers))
    with refusals(f"approval {approval.id}"):
        conn.execute(
            f"INSERT INTO approvals ({_SELECTED}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                approval.id,
                approval.step_id,
                approval.execution_id,
                approval.status.value,
                approvers,
                approval.message,
                to_micros(approval.timeout_at),
                approval.decided_by,
                to_micros_or_none(approval.decided_at),
                approval.rationale,
                to_micros(approval.created_at),
                approval.asserted_by,
            ),
        )


def update(conn: sqlite3.Connection, approval: Approval) -> None:
    cursor = conn.execute(
        """UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?, rationale = ?,
               asserted_by = ?
           WHERE id = ?""",
        (
            approval.status.value,
            approval.decided_by,
            to_micros_or_none(approval.decided_at),
            approval.rationale,
            approval.asserted_by,
            approval.id,
        ),
    )
    if cursor.rowcount == 0:
        raise NotFound(f"approval {approval.id} not found")


def pending_for_step(conn: sqlite3.Connection, step_id: str) -> Approval | None:
    row = conn.execute(
        f"""SELECT {_SELECTED} FROM approvals WHERE step_id = ? AND status = 'pending'
            ORDER BY created_at LIMIT 1""",
        (step_id,),
    ).fetchone()
    return None if row is None else to_record(row)


def list_matching(
    conn: sqlite3.Connection, status: ApprovalStatus | None, execution_id: str | None
) -> list[Approval]:
    clauses: list[str] = []
    params: list[str] = []
    if status is not None:
        clauses.append("status = ?")
        params.append(status.value)
    if execution_id is not None:
        clauses.append("execution_id = ?")
        params.append(execution_id)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute(
        f"SELECT {_SELECTED} FROM approvals {where} ORDER BY created_at, id", params
    ).fetchall()
    return [to_record(row) for row in rows]


def list_expired(conn: sqlite3.Connection, now: datetime, limit: int, after: str) -> list[str]:
    # Ids only: a row that would not read back fails its own expiry, not the listing.
    rows = conn.execute(
        """SELECT id FROM approvals WHERE status = 'pending' AND timeout_at <= ? AND id > ?
           ORDER BY id LIMIT ?""",
        (to_micros(now), after, limit),
    ).fetchall()
    return [approval_id for (approval_id,) in rows]
