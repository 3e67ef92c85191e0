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
from rebuno.kernel.store.columns import names, qualified
from rebuno.kernel.store.postgres.connection import Executor

COLUMNS = names("id, webhook_url, secret, policy_bundle, lease_timeout_seconds, registered_at")
"""The columns of an `Agent`, in the order `to_record` takes them."""
METADATA_COLUMNS = names("description, input_schema, output_schema, metadata_updated_at")
"""Its metadata (§36), which `to_record` takes after `COLUMNS` when the row has them. Read
only where the agent is shown (§36.2), never with a claimed dispatch: schemas can be large,
and delivering needs none of it."""
SELECTED = qualified("a", COLUMNS)
_ALL = qualified("a", COLUMNS + METADATA_COLUMNS)

_GET = f"SELECT {_ALL} FROM agents a WHERE a.id = %s"
_GET_LEAN = f"SELECT {SELECTED} FROM agents a WHERE a.id = %s"
_LIST = f"SELECT {_ALL} FROM agents a ORDER BY a.id"
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
    RETURNING {_ALL}
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


def to_record(row: Sequence[Any]) -> Agent:
    """An agent from `COLUMNS`, followed by `METADATA_COLUMNS` when the row has them."""
    id, webhook_url, secret, policy_bundle, lease_timeout_seconds, registered_at, *rest = row
    agent = Agent(
        id=id,
        webhook_url=webhook_url,
        secret=secret,
        policy_bundle=policy_bundle,
        lease_timeout_seconds=lease_timeout_seconds,
        registered_at=registered_at,
    )
    if not rest:
        return agent
    description, input_schema, output_schema, metadata_updated_at = rest
    return replace(
        agent,
        metadata=AgentMetadata(description, input_schema, output_schema),
        metadata_updated_at=metadata_updated_at,
    )


async def get(conn: Executor, agent_id: str, metadata: bool = True) -> Agent:
    cur = await conn.execute(_GET if metadata else _GET_LEAN, (agent_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"agent {agent_id} not found")
    return to_record(row)


async def list_all(conn: Executor) -> list[Agent]:
    cur = await conn.execute(_LIST)
    return [to_record(row) for row in await cur.fetchall()]


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
    return to_record(row)


async def delete(conn: Executor, agent_id: str) -> None:
    cur = await conn.execute(_DELETE, {"id": agent_id})
    row = await cur.fetchone()
    referenced, deleted = row or (False, False)
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
