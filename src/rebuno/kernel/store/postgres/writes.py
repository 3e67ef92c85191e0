"""A transaction's writes, queued as operations of `rebuno_apply` (migrations 003, 005, 009) and
sent as one statement: the driver's cost is per statement, and a step writes five to seven rows.
Consecutive step inserts travel as one `insert_steps`, one INSERT for all of them; an update of
an execution inserted in the same batch is folded into its insert.
A transaction that inserts an execution sends them through `rebuno_apply_for_agent` (006), an
optimistic one through `rebuno_apply_unchanged` (007).

Each function here turns a record into the operation's JSON array, in the order of the values
the SQL function reads. `Writes.take` hands over what is queued, encoded.
Must import only orjson, the domain, `store.base` and the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from rebuno.kernel.domain.records import Dispatch, Event, Execution, Step
from rebuno.kernel.store.base import StepKey

APPLY = "SELECT rebuno_apply(%s::jsonb)"
APPLY_FOR_AGENT = "SELECT rebuno_apply_for_agent(%s, %s::jsonb)"
"""The same, refusing when the agent of an execution being inserted is not registered."""
APPLY_UNCHANGED = "SELECT rebuno_apply_unchanged(%s, %s, %s, %s, %s, %s, %s::jsonb)"
"""The same, only while the execution is unchanged (migration 007); returns whether it did."""

Op = list[Any]


class Writes:
    """The operations queued since the last `take`, in the order they were made."""

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: list[Op] = []

    def __bool__(self) -> bool:
        return bool(self._ops)

    def add(self, op: Op) -> None:
        ops = self._ops
        if op[0] == "insert_steps" and ops and ops[-1][0] == "insert_steps":
            ops[-1][1].extend(op[1])
        elif op[0] != "update_execution" or not _folded(ops, op):
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
    if update[2] in _TERMINAL:
        return False
    for op in ops:
        if op[0] == "insert_execution" and op[1] == update[1]:
            op[5:8] = update[2:5]  # status, output, failure_reason
            op[9] = update[5]  # updated_at
            op[11] = update[6]  # last_event_seq
            return True
    return False


def append_events(events: Sequence[Event]) -> Op:
    return [
        "append_events",
        [[e.execution_id, e.event_seq, str(e.type), e.payload, e.occurred_at] for e in events],
    ]


def insert_step(s: Step) -> Op:
    return [
        "insert_steps",
        [
            [
                s.step_id,
                s.execution_id,
                s.kind.value,
                s.target,
                s.args_hash,
                s.occurrence,
                s.status.value,
                s.idempotency.value,
                s.args,
                s.result,
                s.error,
                s.usage_input,
                s.usage_output,
                s.proposed_seq,
                s.started_at,
                s.completed_at,
            ]
        ],
    ]


def update_step(s: Step) -> Op:
    return [
        "update_step",
        s.step_id,
        s.status.value,
        s.result,
        s.error,
        s.usage_input,
        s.usage_output,
        s.started_at,
        s.completed_at,
    ]


def insert_execution(e: Execution) -> Op:
    return [
        "insert_execution",
        e.id,
        e.agent_id,
        e.agent_version,
        e.input,
        e.status.value,
        e.output,
        e.failure_reason,
        e.created_at,
        e.updated_at,
        e.deadline_at,
        e.last_event_seq,
    ]


def update_execution(e: Execution) -> Op:
    return [
        "update_execution",
        e.id,
        e.status.value,
        e.output,
        e.failure_reason,
        e.updated_at,
        e.last_event_seq,
    ]


def set_occurrence(dispatch_id: str, key: StepKey, consumed: int) -> Op:
    return ["set_occurrence", dispatch_id, key.kind.value, key.target, key.args_hash, consumed]


def insert_dispatch(d: Dispatch, tag: str) -> Op:
    """`tag` names the enqueuing store in the dispatch notification (migration 005)."""
    return [
        "insert_dispatch",
        d.id,
        d.execution_id,
        d.status.value,
        d.attempt,
        d.max_attempts,
        d.next_attempt_at,
        d.locked_by,
        d.locked_at,
        d.created_at,
        d.updated_at,
        tag,
    ]


def update_dispatch(d: Dispatch) -> Op:
    return [
        "update_dispatch",
        d.id,
        d.status.value,
        d.attempt,
        d.next_attempt_at,
        d.locked_by,
        d.locked_at,
        d.updated_at,
    ]


def retire_dispatches(execution_id: str, now: datetime) -> Op:
    return ["retire_dispatches", execution_id, now]
