"""SQL for an execution's resources and checkpoints (§33) and the keys its steps affect: the
reads. Their writes are operations of `rebuno_apply` (`writes.py`).

Functions take an `Executor`: a transaction's session or a pooled connection in autocommit.
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rebuno.kernel.domain.records import Checkpoint, Resource
from rebuno.kernel.store.postgres.connection import Executor

_RESOURCES = """
    SELECT execution_id, key, driver_id, configuration, coverage_reuse, every_steps,
        on_completion, registered_seq, generation, count, binding, checkpoint_ref
    FROM resources WHERE execution_id = %s ORDER BY registered_seq, key
"""
_CHECKPOINTS = """
    SELECT execution_id, key, generation, checkpoint_ref, covered_seq, invalidated_seq
    FROM resource_checkpoints WHERE execution_id = %s ORDER BY covered_seq, id
"""
_AFFECTED = """
    SELECT step_id, affected_keys FROM steps
    WHERE step_id = ANY(%s::text[]) AND affected_keys IS NOT NULL
"""
_WRITING = """
    SELECT DISTINCT k.key FROM steps s, jsonb_array_elements_text(s.affected_keys) AS k(key)
    WHERE s.execution_id = %s AND s.status = 'executing' AND s.affected_keys IS NOT NULL
"""


def _resource(row: Sequence[Any]) -> Resource:
    return Resource(
        execution_id=row[0],
        key=row[1],
        driver_id=row[2],
        configuration=row[3],
        coverage_reuse=bool(row[4]),
        every_steps=int(row[5]),
        on_completion=bool(row[6]),
        registered_seq=int(row[7]),
        generation=int(row[8]),
        count=int(row[9]),
        binding=row[10],
        checkpoint_ref=row[11],
    )


async def list_resources(conn: Executor, execution_id: str) -> list[Resource]:
    cur = await conn.execute(_RESOURCES, (execution_id,))
    return [_resource(row) for row in await cur.fetchall()]


async def list_checkpoints(conn: Executor, execution_id: str) -> list[Checkpoint]:
    cur = await conn.execute(_CHECKPOINTS, (execution_id,))
    return [
        Checkpoint(row[0], row[1], int(row[2]), row[3], int(row[4]), row[5])
        for row in await cur.fetchall()
    ]


async def affected_keys(conn: Executor, step_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    if not step_ids:
        return {}
    cur = await conn.execute(_AFFECTED, (list(step_ids),))
    return {row[0]: tuple(row[1]) for row in await cur.fetchall()}


async def writing_keys(conn: Executor, execution_id: str) -> set[str]:
    cur = await conn.execute(_WRITING, (execution_id,))
    return {str(row[0]) for row in await cur.fetchall()}
