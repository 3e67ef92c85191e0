"""SQL for the `resource_checkpoints` table: the accepted captures of an execution's resources
(§33), read here. Their writes are operations of `rebuno_apply` (`writes.py`).

Must import only psycopg, the domain and this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rebuno.kernel.domain.records import Checkpoint
from rebuno.kernel.store.columns import names
from rebuno.kernel.store.postgres.connection import Executor

COLUMNS = names("execution_id, key, generation, checkpoint_ref, covered_seq, invalidated_seq")
"""The columns of a `Checkpoint`, in the order `to_record` takes them."""
APART = names("id")
"""The table's other column: the insertion order, which breaks ties, never part of the record."""

_LIST = f"""
    SELECT {", ".join(COLUMNS)}
    FROM resource_checkpoints WHERE execution_id = %s ORDER BY covered_seq, id
"""


def to_record(row: Sequence[Any]) -> Checkpoint:
    execution_id, key, generation, checkpoint_ref, covered_seq, invalidated_seq = row
    return Checkpoint(
        execution_id=execution_id,
        key=key,
        generation=int(generation),
        checkpoint_ref=checkpoint_ref,
        covered_seq=int(covered_seq),
        invalidated_seq=invalidated_seq,
    )


async def list_for(conn: Executor, execution_id: str) -> list[Checkpoint]:
    """The execution's checkpoints, by `covered_seq`, then insertion."""
    cur = await conn.execute(_LIST, (execution_id,))
    return [to_record(row) for row in await cur.fetchall()]
