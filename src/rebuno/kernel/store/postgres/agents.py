"""SQL for the `agents` table: registrations, their secrets and policy bundles.

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from rebuno.kernel.domain.errors import Conflict, NotFound
from rebuno.kernel.domain.records import Agent, AgentMetadata
from rebuno.kernel.store.postgres.connection import Executor

COLUMNS = "a.id, a.webhook_url, a.secret, a.policy_bundle, a.lease_timeout_seconds, a.registered_at"
# Read only where the agent is shown (§36.2), never with a claimed dispatch: schemas can be
# large, and delivering needs none of it.
METADATA_COLUMNS = "a.description, a.input_schema, a.output_schema, a.metadata_updated_at"
_ALL_COLUMNS = f"{COLUMNS}, {METADATA_COLUMNS}"

_GET = f"SELECT {_ALL_COLUMNS} FROM agents a WHERE a.id = %s"
_GET_LEAN = f"SELECT {COLUMNS} FROM agents a WHERE a.id = %s"
_LIST = f"SELECT {_ALL_COLUMNS} FROM agents a ORDER BY a.id"
# `registered_at` is the first registration's; a re-registration only replaces the rest.
_UPSERT = f"""
    INSERT INTO agents AS a (id, webhook_url, secret, policy_bundle, lease_timeout_seconds,
        registered_at)
    VALUES (%(id)s, %(webhook_url)s, %(secret)s, %(policy_bundle)s, %(lease)s,
        %(registered_at)s)
    ON CONFLICT (id) DO UPDATE SET
        webhook_url = EXCLUDED.webhook_url,
        secret = EXCLUDED.secret,
        policy_bundle = CASE WHEN %(keep_bundle)s THEN a.policy_bundle
            ELSE EXCLUDED.policy_bundle END,
        lease_timeout_seconds = EXCLUDED.lease_timeout_seconds
    RETURNING {_ALL_COLUMNS}
"""
# One statement decides both outcomes, so the referencing check and the delete see the same
# snapshot; an execution committed in between still trips the foreign key (a `Conflict`).
_DELETE = """
    WITH referenced AS (
        SELECT EXISTS (SELECT 1 FROM executions WHERE agent_id = %(id)s) AS yes
    ), deleted AS (
        DELETE FROM agents WHERE id = %(id)s AND NOT (SELECT yes FROM referenced)
        RETURNING 1
    )
    SELECT (SELECT yes FROM referenced), EXISTS (SELECT 1 FROM deleted)
"""
_SET_BUNDLE = "UPDATE agents SET policy_bundle = %s WHERE id = %s RETURNING 1"
_SET_METADATA = """
    UPDATE agents SET description = %(description)s, input_schema = %(input_schema)s,
        output_schema = %(output_schema)s, metadata_updated_at = %(now)s
    WHERE id = %(id)s
    RETURNING 1
"""


def from_row(row: Sequence[Any]) -> Agent:
    """An agent from `COLUMNS`, followed by `METADATA_COLUMNS` when the row has them."""
    agent = Agent(
        id=row[0],
        webhook_url=row[1],
        secret=row[2],
        policy_bundle=row[3],
        lease_timeout_seconds=row[4],
        registered_at=row[5],
    )
    if len(row) == 6:
        return agent
    return replace(
        agent, metadata=AgentMetadata(row[6], row[7], row[8]), metadata_updated_at=row[9]
    )


async def get(conn: Executor, agent_id: str, metadata: bool = True) -> Agent:
    cur = await conn.execute(_GET if metadata else _GET_LEAN, (agent_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"agent {agent_id} not found")
    return from_row(row)


async def list_all(conn: Executor) -> list[Agent]:
    cur = await conn.execute(_LIST)
    return [from_row(row) for row in await cur.fetchall()]


async def upsert(conn: Executor, agent: Agent, keep_bundle: bool) -> Agent:
    cur = await conn.execute(
        _UPSERT,
        {
            "id": agent.id,
            "webhook_url": agent.webhook_url,
            "secret": agent.secret,
            "policy_bundle": agent.policy_bundle,
            "lease": agent.lease_timeout_seconds,
            "registered_at": agent.registered_at,
            "keep_bundle": keep_bundle,
        },
    )
    row = await cur.fetchone()
    assert row is not None  # INSERT ... ON CONFLICT DO UPDATE always returns its row
    return from_row(row)


async def delete(conn: Executor, agent_id: str) -> None:
    cur = await conn.execute(_DELETE, {"id": agent_id})
    row = await cur.fetchone()
    referenced, deleted = (row[0], row[1]) if row else (False, False)
    if referenced:
        raise Conflict(f"agent {agent_id} still has executions")
    if not deleted:
        raise NotFound(f"agent {agent_id} not found")


async def set_policy_bundle(conn: Executor, agent_id: str, bundle: str | None) -> None:
    cur = await conn.execute(_SET_BUNDLE, (bundle, agent_id))
    if await cur.fetchone() is None:
        raise NotFound(f"agent {agent_id} not found")


async def update_metadata(
    conn: Executor, agent_id: str, metadata: AgentMetadata, now: datetime
) -> None:
    cur = await conn.execute(
        _SET_METADATA,
        {
            "id": agent_id,
            "description": metadata.description,
            "input_schema": metadata.input_schema,
            "output_schema": metadata.output_schema,
            "now": now,
        },
    )
    if await cur.fetchone() is None:
        raise NotFound(f"agent {agent_id} not found")
