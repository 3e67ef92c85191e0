"""SQL for an execution's resources (§33) and the keys its steps affect: the reads. Their
writes are operations of `rebuno_apply` (`writes.py`); checkpoints are `checkpoints.py`'s.

Functions take an `Executor`: a transaction's session or a pooled connection in autocommit.
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rebuno.kernel.domain.records import Resource
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.postgres.connection import Executor

COLUMNS = names("""
    execution_id, key, driver_id, configuration, coverage_reuse, every_steps, on_completion,
    registered_seq, generation, count, binding, checkpoint_ref
""")
"""The columns of a `Resource`, in the order `to_record` takes them."""

_RESOURCES = f"""
    SELECT {", ".join(COLUMNS)}
    FROM resources WHERE execution_id = %s ORDER BY registered_seq, key
"""
_AFFECTED = """
    SELECT step_id, affected_keys FROM steps
    WHERE step_id = ANY(%s::text[]) AND affected_keys IS NOT NULL
"""
_WRITING = """
    SELECT DISTINCT k.key FROM steps s, jsonb_array_elements_text(s.affected_keys) AS k(key)
    WHERE s.execution_id = %s AND s.status = 'executing' AND s.affected_keys IS NOT NULL
"""


def to_record(row: Sequence[Any]) -> Resource:
    (
        execution_id,
        key,
        driver_id,
        configuration,
        coverage_reuse,
        every_steps,
        on_completion,
        registered_seq,
        generation,
        count,
        binding,
        checkpoint_ref,
    ) = row
    return Resource(
        execution_id=execution_id,
        key=key,
        driver_id=driver_id,
        configuration=configuration,
        coverage_reuse=bool(coverage_reuse),
        every_steps=int(every_steps),
        on_completion=bool(on_completion),
        registered_seq=int(registered_seq),
        generation=int(generation),
        count=int(count),
        binding=binding,
        checkpoint_ref=checkpoint_ref,
    )


async def list_resources(conn: Executor, execution_id: str) -> list[Resource]:
    cur = await conn.execute(_RESOURCES, (execution_id,))
    return [to_record(row) for row in await cur.fetchall()]


async def affected_keys(conn: Executor, step_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    if not step_ids:
        return {}
    cur = await conn.execute(_AFFECTED, (list(step_ids),))
    return {step_id: tuple(keys) for step_id, keys in await cur.fetchall()}


async def writing_keys(conn: Executor, execution_id: str) -> set[str]:
    cur = await conn.execute(_WRITING, (execution_id,))
    return {str(key) for (key,) in await cur.fetchall()}
