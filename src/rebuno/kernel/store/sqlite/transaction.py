"""`SqliteTransaction`: the `Transaction` protocol over the writer connection.

Every method runs inside the store's open `BEGIN IMMEDIATE` transaction, so reads here see
this transaction's own writes. Calls run directly on the event loop thread (see `store.py`).
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Concatenate, ParamSpec, TypeVar

from rebuno.kernel.domain import identity
from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.errors import NotFound
from rebuno.kernel.domain.records import (
    Agent,
    AgentMetadata,
    Approval,
    Checkpoint,
    Dispatch,
    Event,
    Execution,
    Lease,
    RawJson,
    Resource,
    Step,
    replace,
)
from rebuno.kernel.store.base import (
    NOTHING_WANTED,
    Completion,
    Locked,
    Outcomes,
    StepIdFn,
    StepKey,
    Submission,
    Unchanged,
    Wanted,
)
from rebuno.kernel.store.columns import Layout, qualified
from rebuno.kernel.store.sqlite import (
    agents,
    api_keys,
    approvals,
    checkpoints,
    dispatches,
    executions,
    rate_buckets,
    resources,
    seen_requests,
    steps,
)
from rebuno.kernel.store.sqlite import events as event_log
from rebuno.kernel.store.sqlite.errors import driver_errors
from rebuno.protocol.enums import ApprovalStatus, StepStatus

P = ParamSpec("P")
T = TypeVar("T")


class SqliteTransaction:
    """One unit of work on the single writer connection; the store commits or rolls back."""

    __slots__ = ("_conn", "_path", "_read")

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self._path = path
        self._read: dict[str, Execution] = {}
        """Each execution as this transaction last read or wrote it: what its row holds, as
        the single writer lets no one else change it meanwhile (`update_execution`)."""

    def _seen(self, execution: Execution) -> Execution:
        self._read[execution.id] = execution
        return execution

    def _run(
        self,
        query: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        with driver_errors(self._path):
            return query(self._conn, *args, **kwargs)

    # -- reads under the lock ------------------------------------------------------------
    async def get_execution(self, execution_id: str) -> Execution:
        return self._seen(self._run(executions.get, execution_id))

    async def find_execution(self, agent_id: str, idempotency_key: str) -> Execution | None:
        return self._run(executions.find, agent_id, idempotency_key)

    async def hold_execution(self, execution_id: str) -> Execution:
        # The single writer holds everything until the transaction ends.
        return self._seen(self._run(executions.get, execution_id))

    async def take_lock(self, key: str) -> None:
        return None  # the single writer serialises every transaction

    async def session_held(self, session: str) -> bool:
        return self._run(executions.session_held, session)

    async def session_used(self, session: str) -> bool:
        return self._run(executions.session_used, session)

    async def first_waiter(self, session: str, now: datetime) -> Execution | None:
        return self._run(executions.first_waiter, session, now)

    async def last_completed(self, agent_id: str, session: str) -> str | None:
        return self._run(executions.last_completed, agent_id, session)

    async def admit(self, execution_id: str, now: datetime, parent: str | None) -> None:
        self._run(executions.admit, execution_id, now, parent)

    async def list_children(self, execution_id: str) -> list[Execution]:
        return self._run(executions.children, execution_id)

    async def delete_expired_session(self, session: str, cutoff: datetime) -> int:
        return self._run(executions.delete_session, session, cutoff)

    async def lock_execution(
        self,
        execution_id: str,
        lease: Lease | None = None,
        now: datetime | None = None,
        wanted: Wanted = NOTHING_WANTED,
    ) -> Locked:
        locked = self._run(_lock_execution, execution_id, lease, now)
        self._seen(locked.execution)
        if not wanted or lease is None:
            return locked
        outcomes = self._run(_load_outcomes, execution_id, lease.dispatch_id, wanted)
        return replace(locked, outcomes=outcomes)

    async def load_submission(
        self,
        execution_id: str,
        lease: Lease,
        key: StepKey,
        step_id_for: StepIdFn,
        now: datetime,
        completing: Sequence[str] = (),
    ) -> Submission:
        loaded = self._run(_load_submission, execution_id, lease, key, step_id_for, now, completing)
        self._seen(loaded.execution)
        return loaded

    async def load_completion(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> Completion:
        return self._run(load_completion, execution_id, step_id, dispatch_id)

    async def get_step(self, step_id: str) -> Step | None:
        return self._run(steps.find, step_id)

    async def load_outcomes(self, execution_id: str, dispatch_id: str, wanted: Wanted) -> Outcomes:
        return self._run(_load_outcomes, execution_id, dispatch_id, wanted)

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        return self._run(dispatches.find, dispatch_id)

    async def get_agent(self, agent_id: str) -> Agent:
        return self._run(agents.get, agent_id)

    async def get_approval(self, approval_id: str) -> Approval:
        return self._run(approvals.get, approval_id)

    async def pending_approval_for_step(self, step_id: str) -> Approval | None:
        return self._run(approvals.pending_for_step, step_id)

    async def list_pending_approvals(self, execution_id: str) -> list[Approval]:
        return self._run(approvals.list_matching, ApprovalStatus.PENDING, execution_id)

    async def list_steps_with_status(self, execution_id: str, status: StepStatus) -> list[Step]:
        return self._run(steps.list_for, execution_id, status.value)

    async def has_indeterminate_step(self, execution_id: str, key: StepKey) -> bool:
        return self._run(steps.has_indeterminate, execution_id, key)

    async def has_event_of_type(self, execution_id: str, event_type: str) -> bool:
        return self._run(event_log.has_type, execution_id, event_type)

    async def spent_tokens(self, execution_id: str) -> int:
        return self._run(steps.spent_tokens, execution_id)

    async def take_rate_token(
        self, key: str, max_calls: int, window_seconds: float, now: datetime
    ) -> float | None:
        return self._run(rate_buckets.take, key, max_calls, window_seconds, now)

    async def remember_request(
        self, digest: bytes, now: datetime, until: datetime
    ) -> datetime | None:
        return self._run(seen_requests.remember, digest, now, until)

    async def list_resources(self, execution_id: str) -> list[Resource]:
        return self._run(resources.list_resources, execution_id)

    async def list_checkpoints(self, execution_id: str) -> list[Checkpoint]:
        return self._run(checkpoints.list_for, execution_id)

    async def affected_keys(self, step_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        return self._run(resources.affected_keys, step_ids)

    async def writing_keys(self, execution_id: str) -> set[str]:
        return self._run(resources.writing_keys, execution_id)

    # -- writes --------------------------------------------------------------------------
    async def insert_execution(
        self, execution: Execution, policy_bundle: str | None = None
    ) -> None:
        self._run(executions.insert, execution, policy_bundle)
        self._seen(execution)

    async def update_execution(self, execution: Execution) -> None:
        self._run(executions.update, execution, self._read.get(execution.id))
        self._seen(execution)

    async def mark_parent(self, execution_id: str) -> None:
        self._run(executions.mark_parent, execution_id)

    async def set_state(self, execution_id: str, state: RawJson) -> None:
        self._run(executions.set_state, execution_id, state)

    async def mark_resources(self, execution_id: str) -> None:
        self._run(executions.mark_resources, execution_id)

    async def set_restoration(self, execution_id: str, restoration: RawJson) -> None:
        self._run(executions.set_restoration, execution_id, restoration)

    async def put_resource(self, resource: Resource) -> None:
        self._run(resources.put_resource, resource)

    async def insert_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._run(checkpoints.insert, checkpoint)

    async def close_checkpoints(self, execution_id: str, key: str, seq: int) -> None:
        self._run(checkpoints.close, execution_id, key, seq)

    async def set_affected_keys(self, step_id: str, keys: Sequence[str]) -> None:
        self._run(resources.set_affected_keys, step_id, keys)

    async def append_events(self, events: Sequence[Event]) -> None:
        self._run(event_log.append, events)

    async def insert_step(self, step: Step) -> None:
        self._run(steps.insert, step)

    async def update_step(self, step: Step) -> None:
        self._run(steps.update, step)

    async def set_occurrence(self, dispatch_id: str, key: StepKey, consumed: int) -> None:
        self._run(dispatches.set_occurrence, dispatch_id, key, consumed)

    async def insert_dispatch(self, dispatch: Dispatch) -> None:
        # One process holds every dispatch loop, so the service's own wake-up suffices.
        self._run(dispatches.insert, dispatch)

    async def retire_dispatches(self, execution_id: str, now: datetime) -> None:
        self._run(dispatches.retire, execution_id, now)

    async def update_dispatch(self, dispatch: Dispatch) -> None:
        self._run(dispatches.update, dispatch)

    async def expire_lease(self, dispatch_id: str, attempt: int) -> None:
        self._run(dispatches.expire_lease, dispatch_id, attempt)

    async def insert_approval(self, approval: Approval) -> None:
        self._run(approvals.insert, approval)

    async def update_approval(self, approval: Approval) -> None:
        self._run(approvals.update, approval)

    async def upsert_agent(self, agent: Agent, keep_bundle: bool) -> Agent:
        return self._run(agents.upsert, agent, keep_bundle)

    async def delete_agent(self, agent_id: str) -> None:
        self._run(agents.delete, agent_id)

    async def set_policy_bundle(self, agent_id: str, bundle: str | None) -> None:
        self._run(agents.set_policy_bundle, agent_id, bundle)

    async def insert_api_key(self, key: ApiKey) -> None:
        self._run(api_keys.insert, key)

    async def rotate_api_key(self, key_id: str, old_hash: bytes, new_hash: bytes) -> bool:
        return self._run(api_keys.rotate, key_id, old_hash, new_hash)

    async def revoke_api_key(self, key_id: str, now: datetime) -> None:
        self._run(api_keys.revoke, key_id, now)

    async def update_agent_metadata(
        self, agent_id: str, metadata: AgentMetadata, now: datetime
    ) -> None:
        self._run(agents.update_metadata, agent_id, metadata, now)


def _lock_execution(
    conn: sqlite3.Connection, execution_id: str, lease: Lease | None, now: datetime | None
) -> Locked:
    row = conn.execute(_LOCKED, (execution_id,)).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    live = False
    if lease is not None and now is not None:
        live = dispatches.renew_lease(conn, execution_id, lease, now)
    execution, (policy_bundle,) = _LOCKED_ROW.split(row)
    return Locked(
        execution=executions.to_record(execution), lease_live=live, policy_bundle=policy_bundle
    )


_LOCKED = f"""
    SELECT {qualified("e", executions.COLUMNS)}, COALESCE(e.policy_bundle, a.policy_bundle)
    FROM executions e LEFT JOIN agents a ON a.id = e.agent_id
    WHERE e.id = ?
"""
_LOCKED_ROW = Layout(executions.COLUMNS, ("policy_bundle",))


def _load_outcomes(
    conn: sqlite3.Connection, execution_id: str, dispatch_id: str, wanted: Wanted
) -> Outcomes:
    """By primary key: the ids of the occurrences the reports are about to take are known
    once the counters are read."""
    reports = wanted.reports
    consumed = dispatches.counters(conn, dispatch_id, list(reports)) if reports else {}
    ids = list(wanted.step_ids)
    for key, count in reports.items():
        first = consumed.get(key, -1) + 1
        ids.extend(
            identity.step_id(execution_id, key.kind.value, key.target, key.args_hash, occurrence)
            for occurrence in range(first, first + count)
        )
    found = steps.find_many(conn, execution_id, ids) if ids else []
    return Outcomes(consumed=consumed, steps=found)


def _load_submission(
    conn: sqlite3.Connection,
    execution_id: str,
    lease: Lease,
    key: StepKey,
    step_id_for: StepIdFn,
    now: datetime,
    completing: Sequence[str],
) -> Submission:
    row = conn.execute(
        _SUBMISSION,
        (lease.dispatch_id, key.kind.value, key.target, key.args_hash, execution_id),
    ).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    lease_live = dispatches.renew_lease(conn, execution_id, lease, now)
    execution, (consumed, policy_bundle) = _SUBMISSION_ROW.split(row)
    occurrence = 0 if consumed is None else int(consumed) + 1
    step_id = step_id_for(occurrence)
    existing: Step | None = None
    carried: list[Step] = []
    if not completing:
        existing = steps.find(conn, step_id)
    else:  # the step at this occurrence and the carried ones in one read
        for found in steps.find_many(conn, execution_id, (step_id, *completing)):
            if found.step_id == step_id:
                existing = found
            if found.step_id in completing:
                carried.append(found)
    return Submission(
        execution=executions.to_record(execution),
        lease_live=lease_live,
        occurrence=occurrence,
        existing=existing,
        policy_bundle=policy_bundle,
        completing=tuple(carried),
    )


# The execution, the lease's occurrence counter for the key and the agent's bundle in one
# statement. The step is then found by the id its occurrence yields (its primary key).
_SUBMISSION = f"""
    SELECT {qualified("e", executions.COLUMNS)}, c.consumed,
        COALESCE(e.policy_bundle, a.policy_bundle)
    FROM executions e
    LEFT JOIN dispatch_step_counters c ON c.dispatch_id = ? AND c.kind = ? AND c.target = ?
        AND c.args_hash = ?
    LEFT JOIN agents a ON a.id = e.agent_id
    WHERE e.id = ?
"""
_SUBMISSION_ROW = Layout(executions.COLUMNS, ("consumed", "policy_bundle"))


def load_completion(
    conn: sqlite3.Connection, execution_id: str, step_id: str, dispatch_id: str
) -> Completion:
    """Three reads, one snapshot: they run on the event loop thread with no await between
    them, and every commit does too."""
    execution = executions.get(conn, execution_id)
    step = steps.find(conn, step_id)
    dispatch = dispatches.find(conn, dispatch_id)
    return Completion(
        execution=execution,
        step=step if step is not None and step.execution_id == execution_id else None,
        dispatch=(
            dispatch if dispatch is not None and dispatch.execution_id == execution_id else None
        ),
    )


# What the condition of an optimistic transaction reads: the bundle only when a hash is given,
# as the join costs a lookup in `agents`.
_UNCHANGED = "SELECT last_event_seq, has_children, NULL FROM executions WHERE id = ?"
_UNCHANGED_HASHED = """
    SELECT e.last_event_seq, e.has_children, COALESCE(e.policy_bundle, a.policy_bundle)
    FROM executions e LEFT JOIN agents a ON a.id = e.agent_id WHERE e.id = ?
"""
_COUNTER_USED = "SELECT 1 FROM dispatch_step_counters WHERE dispatch_id = ? LIMIT 1"


def still_unchanged(conn: sqlite3.Connection, execution_id: str, unchanged: Unchanged) -> bool:
    """The condition of an optimistic transaction (`Unchanged`), the one place this store
    evaluates it; PostgreSQL's is `rebuno_unchanged` (`functions.sql`), clause for clause:
    the execution is still at `last_event_seq`; with `childless`, no sub-agent was started
    from it; with `policy_hash`, its bundle (its own, else its agent's; the empty text when it
    has none) still hashes to it; with a lease and `now`, the lease's dispatch has used no
    occurrence counter and the lease owns it (renewed then). A clause added here is added
    there too, with its test in `tests/store/test_optimistic_condition.py`."""
    hashed = unchanged.policy_hash
    query = _UNCHANGED if hashed is None else _UNCHANGED_HASHED
    row = conn.execute(query, (execution_id,)).fetchone()
    if row is None:
        return False
    last_event_seq, has_children, policy_bundle = row
    if last_event_seq != unchanged.last_event_seq:
        return False
    if unchanged.childless and has_children:
        return False
    if hashed is not None and identity.policy_hash(policy_bundle or "") != hashed:
        return False
    lease, now = unchanged.lease, unchanged.now
    if lease is None or now is None:
        return True
    used = conn.execute(_COUNTER_USED, (lease.dispatch_id,)).fetchone()
    return used is None and dispatches.renew_lease(conn, execution_id, lease, now)
