"""How the PostgreSQL store queues a transaction's writes for `rebuno_apply`: consecutive step
inserts become one operation, and an execution's update folds into its insert in the same
batch unless it ends the execution (that update notifies other replicas); a creation or an
update that changes the status carries the store's tag to announce it (§40.5)."""

from __future__ import annotations

import json
from dataclasses import replace

from rebuno.kernel.store.postgres import writes
from rebuno.protocol.enums import ExecutionStatus, StepStatus
from tests.store.builders import event, execution, step


def names(queued: writes.Writes) -> list[str]:
    return [op["op"] for op in json.loads(queued.take())]


def test_consecutive_step_inserts_go_as_one_operation() -> None:
    created = execution()
    queued = writes.Writes()
    queued.add(writes.insert_step(step(created.id, 0)))
    queued.add(writes.insert_step(step(created.id, 1)))
    queued.add(writes.update_step(replace(step(created.id, 0), status=StepStatus.SUCCEEDED)))
    queued.add(writes.insert_step(step(created.id, 2)))

    ops = json.loads(queued.take())

    assert [op["op"] for op in ops] == ["insert_steps", "update_step", "insert_steps"]
    assert [row["occurrence"] for row in ops[0]["rows"]] == [0, 1]
    assert [row["occurrence"] for row in ops[2]["rows"]] == [2]


def test_an_update_folds_into_the_insert_of_its_execution() -> None:
    created = execution(status=ExecutionStatus.PENDING)
    queued = writes.Writes()
    queued.add(writes.insert_execution(created))
    queued.add(writes.append_events([event(created.id, 1)]))
    queued.add(writes.update_execution(replace(created, last_event_seq=1)))

    ops = json.loads(queued.take())

    assert [op["op"] for op in ops] == ["insert_execution", "append_events"]
    assert (ops[0]["id"], ops[0]["last_event_seq"]) == (created.id, 1)


def test_an_update_that_ends_the_execution_is_kept_apart() -> None:
    created = execution(status=ExecutionStatus.PENDING)
    queued = writes.Writes()
    queued.add(writes.insert_execution(created))
    queued.add(writes.update_execution(replace(created, status=ExecutionStatus.FAILED)))
    queued.add(writes.update_execution(replace(execution(), last_event_seq=3)))

    assert names(queued) == ["insert_execution", "update_execution", "update_execution"]


def test_a_folded_update_keeps_the_announcement_of_its_insert() -> None:
    created = execution(status=ExecutionStatus.PENDING)
    queued = writes.Writes()
    queued.add(writes.insert_execution(created, tag="store-a"))
    queued.add(writes.update_execution(replace(created, last_event_seq=1)))
    queued.add(writes.update_execution(replace(execution(), last_event_seq=3)))

    inserted, updated = json.loads(queued.take())

    assert (inserted["op"], inserted["announce"], inserted["last_event_seq"]) == (
        "insert_execution",
        "store-a",
        1,
    )
    assert "announce" not in updated  # a kept status announces nothing
