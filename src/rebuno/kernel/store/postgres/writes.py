"""A transaction's writes, queued as operations of `rebuno_apply` (`functions.sql`) and
sent as one statement: the driver's cost is per statement, and a step writes five to seven rows.
Consecutive step inserts travel as one `insert_steps`, one INSERT for all of them; an update of
an execution inserted in the same batch is folded into its insert.
A transaction that inserts an execution sends them through `rebuno_apply_for_agent`, an
optimistic one through `rebuno_apply_unchanged`.

Each function here turns a record into the operation's JSON object, keyed by the names of the
columns the SQL function writes. `Writes.take` hands over what is queued, encoded.
Must import only orjson, the domain, `store.base` and the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from rebuno.kernel.domain.records import (
    Checkpoint,
    Dispatch,
    Event,
    Execution,
    RawJson,
    Resource,
    Step,
)
from rebuno.kernel.store.base import StepKey

APPLY = "SELECT rebuno_apply(%s::jsonb)"
APPLY_FOR_AGENT = "SELECT rebuno_apply_for_agent(%s, %s::jsonb)"
"""The same, refusing when the agent of an execution being inserted is not registered."""
APPLY_UNCHANGED = "SELECT rebuno_apply_unchanged(%s::jsonb)"
"""The same, only while the execution is unchanged (`group.Member`); returns whether it did."""
APPLY_UNCHANGED_ALL = "SELECT rebuno_apply_unchanged_all(%s::jsonb)"
"""Several of those in one transaction (a group commit, `group.py`)."""

Op = dict[str, Any]
"""One operation: `op` names it, the other keys are the columns of its row (`rows` for
several)."""


class Writes:
    """The operations queued since the last `take`, in the order they were made."""

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: list[Op] = []

    def __bool__(self) -> bool:
        return bool(self._ops)

    def add(self, op: Op) -> None:
        ops = self._ops
        if op["op"] == "insert_steps" and ops and ops[-1]["op"] == "insert_steps":
            ops[-1]["rows"].extend(op["rows"])
        elif op["op"] != "update_execution" or not _folded(ops, op):
            ops.append(op)

    def take(self) -> str:
        """The queued operations as the argument of `rebuno_apply`; the queue is left empty."""
        ops, self._ops = self._ops, []
        return orjson.dumps(ops).decode()

    def clear(self) -> None:
        self._ops.clear()


_TERMINAL = frozenset(("completed", "failed", "cancelled"))


def _folded(ops: list[Op], update: Op) -> bool:
    """Writes `update` into the insert of its execution queued before it, if there is one: the
    row is then written once. Not an update to a terminal status, which notifies on its own."""
    if update["status"] in _TERMINAL:
        return False
    for op in ops:
        if op["op"] == "insert_execution" and op["id"] == update["id"]:
            op.update(update, op="insert_execution")  # its columns, under the same names
            return True
    return False


def append_events(events: Sequence[Event]) -> Op:
    return {
        "op": "append_events",
        "rows": [
            {
                "execution_id": e.execution_id,
                "event_seq": e.event_seq,
                "type": str(e.type),
                "payload": e.payload,
                "occurred_at": e.occurred_at,
            }
            for e in events
        ],
    }


def insert_step(s: Step) -> Op:
    row = {
        "step_id": s.step_id,
        "execution_id": s.execution_id,
        "kind": s.kind.value,
        "target": s.target,
        "args_hash": s.args_hash,
        "occurrence": s.occurrence,
        "status": s.status.value,
        "idempotency": s.idempotency.value,
        "args": s.args,
        "result": s.result,
        "error": s.error,
        "usage_input": s.usage_input,
        "usage_output": s.usage_output,
        "proposed_seq": s.proposed_seq,
        "started_at": s.started_at,
        "completed_at": s.completed_at,
    }
    return {"op": "insert_steps", "rows": [row]}


def update_step(s: Step) -> Op:
    return {
        "op": "update_step",
        "step_id": s.step_id,
        "status": s.status.value,
        "result": s.result,
        "error": s.error,
        "usage_input": s.usage_input,
        "usage_output": s.usage_output,
        "started_at": s.started_at,
        "completed_at": s.completed_at,
    }


def insert_execution(e: Execution, policy_bundle: str | None = None, tag: str | None = None) -> Op:
    """`tag`: the inserting store's, announced on `rebuno_activity` (§40.5) when given."""
    op: Op = {
        "op": "insert_execution",
        "id": e.id,
        "agent_id": e.agent_id,
        "agent_version": e.origin.agent_version,
        "input": e.origin.input,
        "status": e.status.value,
        "output": e.output,
        "failure_reason": e.failure_reason,
        "created_at": e.origin.created_at,
        "updated_at": e.updated_at,
        "deadline_at": e.origin.deadline_at,
        "last_event_seq": e.last_event_seq,
        "idempotency_key": e.origin.idempotency_key,
        "parent_execution_id": e.parent_execution_id,
        "created_by": e.origin.created_by,
        "on_behalf_of": e.origin.on_behalf_of,
        "session": e.origin.session,
        "admitted_at": e.admitted_at,
        "spawned_by_execution_id": e.origin.spawned_by_execution_id,
        "spawned_by_step_id": e.origin.spawned_by_step_id,
        "forked_from": e.origin.forked_from,
        "fork_seq": e.origin.fork_seq,
        "policy_bundle": policy_bundle,
    }
    if tag is not None:
        op["announce"] = tag
    return op


def admit_execution(execution_id: str, now: datetime, parent_execution_id: str | None) -> Op:
    return {
        "op": "admit_execution",
        "id": execution_id,
        "admitted_at": now,
        "parent_execution_id": parent_execution_id,
    }


def mark_parent(execution_id: str) -> Op:
    return {"op": "mark_parent", "id": execution_id}


def mark_resources(execution_id: str) -> Op:
    return {"op": "mark_resources", "id": execution_id}


def set_restoration(execution_id: str, restoration: RawJson) -> Op:
    return {"op": "set_restoration", "id": execution_id, "restoration": restoration}


def put_resource(r: Resource) -> Op:
    return {
        "op": "put_resource",
        "execution_id": r.execution_id,
        "key": r.key,
        "driver_id": r.driver_id,
        "configuration": r.configuration,
        "coverage_reuse": r.coverage_reuse,
        "every_steps": r.every_steps,
        "on_completion": r.on_completion,
        "registered_seq": r.registered_seq,
        "generation": r.generation,
        "count": r.count,
        "binding": r.binding,
        "checkpoint_ref": r.checkpoint_ref,
    }


def insert_checkpoint(c: Checkpoint) -> Op:
    return {
        "op": "insert_checkpoint",
        "execution_id": c.execution_id,
        "key": c.key,
        "generation": c.generation,
        "checkpoint_ref": c.checkpoint_ref,
        "covered_seq": c.covered_seq,
        "invalidated_seq": c.invalidated_seq,
    }


def close_checkpoints(execution_id: str, key: str, seq: int) -> Op:
    return {"op": "close_checkpoints", "execution_id": execution_id, "key": key, "seq": seq}


def set_affected_keys(step_id: str, keys: Sequence[str]) -> Op:
    return {"op": "set_affected_keys", "step_id": step_id, "keys": list(keys) if keys else None}


def set_state(execution_id: str, state: RawJson) -> Op:
    return {"op": "set_state", "id": execution_id, "state": state}


def update_execution(e: Execution, announce: str | None = None) -> Op:
    """`announce`: the writing store's tag, when the update changes the execution's status
    (the writer knows from its read; a step does not): `rebuno_apply` then notifies the
    other replicas' activity feeds (§40.5). Left out otherwise, so folding the update into
    its execution's insert keeps the insert's."""
    op: Op = {
        "op": "update_execution",
        "id": e.id,
        "status": e.status.value,
        "output": e.output,
        "failure_reason": e.failure_reason,
        "updated_at": e.updated_at,
        "last_event_seq": e.last_event_seq,
    }
    if announce is not None:
        op["announce"] = announce
    return op


def set_occurrence(dispatch_id: str, key: StepKey, consumed: int) -> Op:
    return {
        "op": "set_occurrence",
        "dispatch_id": dispatch_id,
        "kind": key.kind.value,
        "target": key.target,
        "args_hash": key.args_hash,
        "consumed": consumed,
    }


def insert_dispatch(d: Dispatch, tag: str) -> Op:
    """`tag` names the enqueuing store in the dispatch notification."""
    return {
        "op": "insert_dispatch",
        "id": d.id,
        "execution_id": d.execution_id,
        "status": d.status.value,
        "attempt": d.attempt,
        "max_attempts": d.max_attempts,
        "next_attempt_at": d.next_attempt_at,
        "locked_by": d.locked_by,
        "locked_at": d.locked_at,
        "created_at": d.created_at,
        "updated_at": d.updated_at,
        "tag": tag,
    }


def update_dispatch(d: Dispatch) -> Op:
    return {
        "op": "update_dispatch",
        "id": d.id,
        "status": d.status.value,
        "attempt": d.attempt,
        "next_attempt_at": d.next_attempt_at,
        "locked_by": d.locked_by,
        "locked_at": d.locked_at,
        "updated_at": d.updated_at,
    }


def retire_dispatches(execution_id: str, now: datetime) -> Op:
    return {"op": "retire_dispatches", "execution_id": execution_id, "updated_at": now}
