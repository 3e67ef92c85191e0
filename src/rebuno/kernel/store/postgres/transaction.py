"""`PostgresTransaction`: the `Transaction` protocol over one pooled connection in pipeline mode.

Writes are queued, not awaited: they travel with the next read or with the COMMIT, so a use
case costs one round trip per read it makes plus one for the commit. A trigger refusal or a
unique violation in a queued write therefore surfaces at that next read or at the commit; both
places translate it into the domain error it stands for.
Must import only psycopg, the domain, `store.base` and this package.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import TypeVar

from rebuno.kernel.domain.records import Agent, Approval, Dispatch, Event, Execution, Lease, Step
from rebuno.kernel.store.base import StepIdFn, StepKey, Submission
from rebuno.kernel.store.postgres import (
    agents,
    approvals,
    dispatches,
    events,
    executions,
    rate_buckets,
    steps,
    submissions,
)
from rebuno.kernel.store.postgres.connection import Connection, Server, translated
from rebuno.protocol.enums import StepStatus

T = TypeVar("T")


class PostgresTransaction:
    """One unit of work; `PostgresStore.transaction` begins, commits or rolls it back."""

    __slots__ = ("_conn", "_server")

    def __init__(self, conn: Connection, server: Server) -> None:
        self._conn = conn
        self._server = server

    async def _run(self, call: Awaitable[T]) -> T:
        with translated(self._server):
            return await call

    # -- reads under the lock ------------------------------------------------------------
    async def get_execution(self, execution_id: str) -> Execution:
        return await self._run(executions.get(self._conn, execution_id))

    async def load_submission(
        self, execution_id: str, lease: Lease, key: StepKey, step_id_for: StepIdFn, now: datetime
    ) -> Submission:
        # `step_id_for` is not needed: the statement finds the step by its unique key.
        return await self._run(submissions.load(self._conn, execution_id, lease, key, now))

    async def get_step(self, step_id: str) -> Step | None:
        return await self._run(steps.get(self._conn, step_id))

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        return await self._run(dispatches.get(self._conn, dispatch_id))

    async def get_agent(self, agent_id: str) -> Agent:
        return await self._run(agents.get(self._conn, agent_id))

    async def get_approval(self, approval_id: str) -> Approval:
        return await self._run(approvals.get(self._conn, approval_id))

    async def pending_approval_for_step(self, step_id: str) -> Approval | None:
        return await self._run(approvals.pending_for_step(self._conn, step_id))

    async def list_pending_approvals(self, execution_id: str) -> list[Approval]:
        return await self._run(approvals.pending_for_execution(self._conn, execution_id))

    async def list_steps_with_status(self, execution_id: str, status: StepStatus) -> list[Step]:
        return await self._run(steps.list_for(self._conn, execution_id, status.value))

    async def has_indeterminate_step(self, execution_id: str, key: StepKey) -> bool:
        return await self._run(steps.has_indeterminate(self._conn, execution_id, key))

    async def has_event_of_type(self, execution_id: str, event_type: str) -> bool:
        return await self._run(events.has_type(self._conn, execution_id, event_type))

    async def spent_tokens(self, execution_id: str) -> int:
        return await self._run(steps.spent_tokens(self._conn, execution_id))

    async def renew_lease(self, execution_id: str, lease: Lease, now: datetime) -> bool:
        return await self._run(dispatches.renew_lease(self._conn, execution_id, lease, now))

    async def take_rate_token(
        self, key: str, max_calls: int, window_seconds: float, now: datetime
    ) -> float | None:
        return await self._run(rate_buckets.take(self._conn, key, max_calls, window_seconds, now))

    # -- writes (queued) -----------------------------------------------------------------
    async def insert_execution(self, execution: Execution) -> None:
        await self._run(executions.insert(self._conn, execution))

    async def update_execution(self, execution: Execution) -> None:
        await self._run(executions.update(self._conn, execution))

    async def append_events(self, events_: Sequence[Event]) -> None:
        await self._run(events.append(self._conn, events_))

    async def insert_step(self, step: Step) -> None:
        await self._run(steps.insert(self._conn, step))

    async def update_step(self, step: Step) -> None:
        await self._run(steps.update(self._conn, step))

    async def set_occurrence(self, dispatch_id: str, key: StepKey, consumed: int) -> None:
        await self._run(dispatches.set_occurrence(self._conn, dispatch_id, key, consumed))

    async def insert_dispatch(self, dispatch: Dispatch) -> None:
        await self._run(dispatches.insert(self._conn, dispatch))

    async def retire_dispatches(self, execution_id: str, now: datetime) -> None:
        await self._run(dispatches.retire(self._conn, execution_id, now))

    async def update_dispatch(self, dispatch: Dispatch) -> None:
        await self._run(dispatches.update(self._conn, dispatch))

    async def insert_approval(self, approval: Approval) -> None:
        await self._run(approvals.insert(self._conn, approval))

    async def update_approval(self, approval: Approval) -> None:
        await self._run(approvals.update(self._conn, approval))

    async def upsert_agent(self, agent: Agent, keep_bundle: bool) -> Agent:
        return await self._run(agents.upsert(self._conn, agent, keep_bundle))

    async def delete_agent(self, agent_id: str) -> None:
        await self._run(agents.delete(self._conn, agent_id))

    async def set_policy_bundle(self, agent_id: str, bundle: str | None) -> None:
        await self._run(agents.set_policy_bundle(self._conn, agent_id, bundle))
