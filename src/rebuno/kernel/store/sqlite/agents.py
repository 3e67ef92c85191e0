"""SQL for the `agents` table and its row mapping.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import Conflict, NotFound
from rebuno.kernel.domain.records import Agent, AgentMetadata
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.sqlite.timestamps import from_micros, from_micros_or_none, to_micros

COLUMNS = names("id, webhook_url, secret, policy_bundle, lease_timeout_seconds, registered_at")
"""The columns of an `Agent`, in the order `to_record` takes them."""
METADATA_COLUMNS = names("description, input_schema, output_schema, metadata_updated_at")
"""Its metadata (§36), which `to_record` takes after `COLUMNS` when the row has them. Read
only where the agent is shown (§36.2), never with a claimed dispatch: schemas can be large,
and delivering needs none of it."""
_SELECTED = ", ".join(COLUMNS)
_ALL_COLUMNS = ", ".join(COLUMNS + METADATA_COLUMNS)


def to_record(row: Sequence[Any]) -> Agent:
    """An agent from `COLUMNS`, followed by `METADATA_COLUMNS` when the row has them."""
    id, webhook_url, secret, policy_bundle, lease_timeout_seconds, registered_at, *rest = row
    agent = Agent(
        id=id,
        webhook_url=webhook_url,
        secret=secret,
        policy_bundle=policy_bundle,
        # Anything but a number (SQLite keeps what it is given) counts as no lease of its own.
        lease_timeout_seconds=(
            lease_timeout_seconds if isinstance(lease_timeout_seconds, int | float) else None
        ),
        registered_at=from_micros(registered_at),
    )
    if not rest:
        return agent
    description, input_schema, output_schema, metadata_updated_at = rest
    return replace(
        agent,
        metadata=AgentMetadata(description, input_schema, output_schema),
        metadata_updated_at=from_micros_or_none(metadata_updated_at),
    )


def get(conn: sqlite3.Connection, agent_id: str, metadata: bool = True) -> Agent:
    columns = _ALL_COLUMNS if metadata else _SELECTED
    row = conn.execute(f"SELECT {columns} FROM agents WHERE id = ?", (agent_id,)).fetchone()
    if row is None:
        raise NotFound(f"agent {agent_id} not found")
    return to_record(row)


def list_all(conn: sqlite3.Connection) -> list[Agent]:
    rows = conn.execute(f"SELECT {_ALL_COLUMNS} FROM agents ORDER BY id").fetchall()
    return [to_record(row) for row in rows]


def upsert(conn: sqlite3.Connection, agent: Agent, keep_bundle: bool) -> Agent:
    # An UPSERT rather than INSERT OR REPLACE: replacing would delete the row, which the
    # executions referencing it forbid, and would lose `registered_at`.
    row = conn.execute(
        f"""INSERT INTO agents ({_SELECTED}) VALUES (?, ?, ?, ?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET
                webhook_url = excluded.webhook_url,
                secret = excluded.secret,
                lease_timeout_seconds = excluded.lease_timeout_seconds,
                policy_bundle = CASE WHEN ? THEN agents.policy_bundle
                                     ELSE excluded.policy_bundle END
            RETURNING {_ALL_COLUMNS}""",
        (
            agent.id,
            agent.webhook_url,
            agent.secret,
            agent.policy_bundle,
            agent.lease_timeout_seconds,
            to_micros(agent.registered_at),
            keep_bundle,
        ),
    ).fetchone()
    return to_record(row)


def delete(conn: sqlite3.Connection, agent_id: str) -> None:
    get(conn, agent_id)
    in_use = conn.execute(
        "SELECT 1 FROM executions WHERE agent_id = ? LIMIT 1", (agent_id,)
    ).fetchone()
    if in_use is not None:
        raise Conflict(f"agent {agent_id} still has executions")
    conn.execute("DELETE FROM agents WHERE id = ?", (agent_id,))


def set_policy_bundle(conn: sqlite3.Connection, agent_id: str, bundle: str | None) -> None:
    cursor = conn.execute("UPDATE agents SET policy_bundle = ? WHERE id = ?", (bundle, agent_id))
    if cursor.rowcount == 0:
        raise NotFound(f"agent {agent_id} not found")


def update_metadata(
    conn: sqlite3.Connection, agent_id: str, metadata: AgentMetadata, now: datetime
) -> None:
    cursor = conn.execute(
        """UPDATE agents SET description = ?, input_schema = ?, output_schema = ?,
               metadata_updated_at = ?
           WHERE id = ?""",
        (
            metadata.description,
            metadata.input_schema,
            metadata.output_schema,
            to_micros(now),
            agent_id,
        ),
    )
    if cursor.rowcount == 0:
        raise NotFound(f"agent {agent_id} not found")
