"""SQL for an execution's resources (§33) and the keys its steps affect; checkpoints are
`checkpoints.py`'s.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from rebuno.kernel.domain.records import Resource
from rebuno.kernel.store.columns import names

COLUMNS = names("""
    execution_id, key, driver_id, configuration, coverage_reuse, every_steps, on_completion,
    registered_seq, generation, count, binding, checkpoint_ref
""")
"""The columns of a `Resource`, in the order `to_record` takes them."""
_SELECTED = ", ".join(COLUMNS)


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
        every_steps=every_steps,
        on_completion=bool(on_completion),
        registered_seq=registered_seq,
        generation=generation,
        count=count,
        binding=binding,
        checkpoint_ref=checkpoint_ref,
    )


def list_resources(conn: sqlite3.Connection, execution_id: str) -> list[Resource]:
    rows = conn.execute(
        f"SELECT {_SELECTED} FROM resources WHERE execution_id = ? ORDER BY registered_seq, key",
        (execution_id,),
    )
    return [to_record(row) for row in rows]


def put_resource(conn: sqlite3.Connection, r: Resource) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO resources ({_SELECTED})"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            r.execution_id,
            r.key,
            r.driver_id,
            r.configuration,
            int(r.coverage_reuse),
            r.every_steps,
            int(r.on_completion),
            r.registered_seq,
            r.generation,
            r.count,
            r.binding,
            r.checkpoint_ref,
        ),
    )


def set_affected_keys(conn: sqlite3.Connection, step_id: str, keys: Sequence[str]) -> None:
    conn.execute(
        "UPDATE steps SET affected_keys = ? WHERE step_id = ?",
        (json.dumps(list(keys)) if keys else None, step_id),
    )


def affected_keys(conn: sqlite3.Connection, step_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    if not step_ids:
        return {}
    marks = ", ".join("?" for _ in step_ids)
    rows = conn.execute(
        f"SELECT step_id, affected_keys FROM steps WHERE step_id IN ({marks})"
        " AND affected_keys IS NOT NULL",
        tuple(step_ids),
    )
    return {step_id: tuple(json.loads(keys)) for step_id, keys in rows}


def writing_keys(conn: sqlite3.Connection, execution_id: str) -> set[str]:
    rows = conn.execute(
        "SELECT affected_keys FROM steps WHERE execution_id = ? AND status = 'executing'"
        " AND affected_keys IS NOT NULL",
        (execution_id,),
    )
    return {key for (keys,) in rows for key in json.loads(keys)}
