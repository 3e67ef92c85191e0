"""SQL for an execution's resources and checkpoints (§33) and the keys its steps affect.

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from rebuno.kernel.domain.records import Checkpoint, Resource

_RESOURCE_COLUMNS = (
    "execution_id, key, driver_id, configuration, coverage_reuse, every_steps, on_completion,"
    " registered_seq, generation, count, binding, checkpoint_ref"
)
_CHECKPOINT_COLUMNS = "execution_id, key, generation, checkpoint_ref, covered_seq, invalidated_seq"


def _resource(row: tuple[Any, ...]) -> Resource:
    return Resource(
        execution_id=row[0],
        key=row[1],
        driver_id=row[2],
        configuration=row[3],
        coverage_reuse=bool(row[4]),
        every_steps=row[5],
        on_completion=bool(row[6]),
        registered_seq=row[7],
        generation=row[8],
        count=row[9],
        binding=row[10],
        checkpoint_ref=row[11],
    )


def list_resources(conn: sqlite3.Connection, execution_id: str) -> list[Resource]:
    rows = conn.execute(
        f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE execution_id = ?"
        " ORDER BY registered_seq, key",
        (execution_id,),
    )
    return [_resource(row) for row in rows]


def list_checkpoints(conn: sqlite3.Connection, execution_id: str) -> list[Checkpoint]:
    rows = conn.execute(
        f"SELECT {_CHECKPOINT_COLUMNS} FROM resource_checkpoints WHERE execution_id = ?"
        " ORDER BY covered_seq, id",
        (execution_id,),
    )
    return [Checkpoint(*row) for row in rows]


def put_resource(conn: sqlite3.Connection, r: Resource) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO resources ({_RESOURCE_COLUMNS})"
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


def insert_checkpoint(conn: sqlite3.Connection, c: Checkpoint) -> None:
    conn.execute(
        f"INSERT INTO resource_checkpoints ({_CHECKPOINT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
        (c.execution_id, c.key, c.generation, c.checkpoint_ref, c.covered_seq, c.invalidated_seq),
    )


def close_checkpoints(conn: sqlite3.Connection, execution_id: str, key: str, seq: int) -> None:
    conn.execute(
        "UPDATE resource_checkpoints SET invalidated_seq = ?"
        " WHERE execution_id = ? AND key = ? AND invalidated_seq IS NULL",
        (seq, execution_id, key),
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
    return {row[0]: tuple(json.loads(row[1])) for row in rows}


def writing_keys(conn: sqlite3.Connection, execution_id: str) -> set[str]:
    rows = conn.execute(
        "SELECT affected_keys FROM steps WHERE execution_id = ? AND status = 'executing'"
        " AND affected_keys IS NOT NULL",
        (execution_id,),
    )
    return {key for row in rows for key in json.loads(row[0])}
