"""SQL for the `resource_checkpoints` table: the accepted captures of an execution's resources
(§33).

Synchronous functions over a `sqlite3.Connection`; the store decides which connection.
Must import only sqlite3, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from rebuno.kernel.domain.records import Checkpoint
from rebuno.kernel.store.columns import names

COLUMNS = names("execution_id, key, generation, checkpoint_ref, covered_seq, invalidated_seq")
"""The columns of a `Checkpoint`, in the order `to_record` takes them."""
APART = names("id")
"""The table's other column: the insertion order, which breaks ties, never part of the record."""
_SELECTED = ", ".join(COLUMNS)


def to_record(row: Sequence[Any]) -> Checkpoint:
    execution_id, key, generation, checkpoint_ref, covered_seq, invalidated_seq = row
    return Checkpoint(
        execution_id=execution_id,
        key=key,
        generation=generation,
        checkpoint_ref=checkpoint_ref,
        covered_seq=covered_seq,
        invalidated_seq=invalidated_seq,
    )


def list_for(conn: sqlite3.Connection, execution_id: str) -> list[Checkpoint]:
    """The execution's checkpoints, by `covered_seq`, then insertion."""
    rows = conn.execute(
        f"SELECT {_SELECTED} FROM resource_checkpoints WHERE execution_id = ?"
        " ORDER BY covered_seq, id",
        (execution_id,),
    )
    return [to_record(row) for row in rows]


def insert(conn: sqlite3.Connection, c: Checkpoint) -> None:
    conn.execute(
        f"INSERT INTO resource_checkpoints ({_SELECTED}) VALUES (?, ?, ?, ?, ?, ?)",
        (c.execution_id, c.key, c.generation, c.checkpoint_ref, c.covered_seq, c.invalidated_seq),
    )


def close(conn: sqlite3.Connection, execution_id: str, key: str, seq: int) -> None:
    """Sets `invalidated_seq = seq` on the key's open checkpoints."""
    conn.execute(
        "UPDATE resource_checkpoints SET invalidated_seq = ?"
        " WHERE execution_id = ? AND key = ? AND invalidated_seq IS NULL",
        (seq, execution_id, key),
    )
