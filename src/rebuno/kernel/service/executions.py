"""Execution use cases that write: create (§5.1, §24-§27), cancel (§10.1), heartbeat (§12.4),
and the agent's complete and fail (§5.2).

The agent's complete or fail takes a fast way first (the followed run, `followed.py`), else
the locked script here; every end is followed by `follow_ups`.
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rebuno.kernel.decision.ending import CLIENT_CANCELLED, EndRequest, completed, failed
from rebuno.kernel.domain.decision import Carried
from rebuno.kernel.domain.errors import Conflict, NotFound, ValidationFailed, lease_superseded
from rebuno.kernel.domain.event import EventBatch
from rebuno.kernel.domain.execution import check_owner, deadline_after, mark_started, pending
from rebuno.kernel.domain.principal import ANONYMOUS, Principal
from rebuno.kernel.domain.records import Execution, Lease, Origin, RawJson, SeenRequest, replace
from rebuno.kernel.service import follow_ups
from rebuno.kernel.service.context import Context, flush, new_id
from rebuno.kernel.service.ending import finish_execution, lock_live
from rebuno.kernel.service.followed import finish_followed
from rebuno.kernel.service.recording import NOTHING_READ, Carrying, record_carried, wanted_by
from rebuno.kernel.service.starting import admit_next, announce, let_run, record_new
from rebuno.kernel.store.base import Transaction, execution_lock, session_lock
from rebuno.protocol.enums import ExecutionStatus, StepStatus

MAX_ANCESTORS = 64
"""How far up a sub-agent's session is compared with its ancestors' (§25.2)."""
COPY_GRACE = timedelta(seconds=10)
"""How long after its first sighting a copy of a heartbeat still renews the lease (§2.3): the
timestamp is whole seconds, so an agent beating faster than once a second sends copies, and a
busy kernel may serve the last of them some seconds after the first. A replay gains at most
this much lease."""


@dataclass(frozen=True, slots=True)
class Labels:
    """Where a new execution comes from (§23, §27): the labels its creator gave and who that
    is."""

    principal: Principal = ANONYMOUS
    """Who asked for it (§34.5): its id is the execution's `created_by`."""
    idempotency_key: str | None = None
    parent_execution_id: str | None = None
    on_behalf_of: str | None = None
    session: str | None = None
    spawned_by: tuple[str, str] | None = None
    """`(execution_id, step_id)`: the executing step this sub-agent runs for (§25.2)."""


@dataclass(frozen=True, slots=True)
class Created:
    execution: Execution
    repeat: bool
    """An earlier create under the same idempotency key made it; nothing was written now."""


class ExecutionUseCases(Context):
    async def create_execution(
        self, agent_id: str, input: RawJson, agent_version: str | None, labels: Labels = Labels()
    ) -> Execution:
        """`create`'s execution, whether this call made it or an earlier one."""
        return (await self.create(agent_id, input, agent_version, labels)).execution

    async def create(
        self, agent_id: str, input: RawJson, agent_version: str | None, labels: Labels = Labels()
    ) -> Created:
        """§5.1, with §27.1: a create under an idempotency key the agent used before answers
        that execution as it is now, whatever else the request says; of racing creates under
        one key, the unique index lets one insert and the others answer it."""
        if labels.spawned_by is not None and labels.idempotency_key is None:
            # A rerun of the step finds its child, even after the step settled.
            labels = replace(labels, idempotency_key=labels.spawned_by[1])
        key = labels.idempotency_key
        if key is not None:
            earlier = await self.store.find_execution(agent_id, key)
            if earlier is not None:
                return Created(_same_spawn(earlier, labels), repeat=True)
        try:
            execution = await self._insert(agent_id, input, agent_version, labels)
        except Conflict:
            if key is None:
                raise
            # Read in a transaction: the winner may be committing in the same group as this
            # attempt (the embedded store), and a transaction sees it, then waits for it.
            async with self.transaction() as tx:
                earlier = await tx.find_execution(agent_id, key)
            if earlier is None:
                raise
            return Created(_same_spawn(earlier, labels), repeat=True)
        announce(self, execution)
        return Created(execution, repeat=False)

    async def _insert(
        self, agent_id: str, input: RawJson, agent_version: str | None, labels: Labels
    ) -> Execution:
        """The new execution, in one transaction with the checks of where it comes from;
        one without a session runs at once, one with a session when its turn comes
        (§24.3: first in, first admitted)."""
        session = labels.session
        async with self.transaction() as tx:
            if session is not None:
                await tx.take_lock(session_lock(session))  # first: §24.3 lock order
            on_behalf_of = await _check_labels(tx, agent_id, labels)
            now = self.clock()
            execution = self._new_execution(
                agent_id, input, agent_version, labels, on_behalf_of, now
            )
            batch = EventBatch(execution, now)
            await record_new(tx, execution, batch)
            if session is None:
                return await let_run(self, tx, execution, batch)
            execution = await flush(tx, execution, batch)
            admitted = await admit_next(self, tx, session, now)
        return admitted if admitted is not None and admitted.id == execution.id else execution

    def _new_execution(
        self,
        agent_id: str,
        input: RawJson,
        agent_version: str | None,
        labels: Labels,
        on_behalf_of: str | None,
        now: datetime,
    ) -> Execution:
        spawner = labels.spawned_by
        origin = Origin(
            agent_version=agent_version or None,
            input=input,
            created_at=now,
            deadline_at=deadline_after(now, self.settings.deadline_timeout),
            idempotency_key=labels.idempotency_key,
            created_by=labels.principal.id,
            on_behalf_of=on_behalf_of,
            session=labels.session,
            spawned_by_execution_id=spawner[0] if spawner else None,
            spawned_by_step_id=spawner[1] if spawner else None,
        )
        admitted_at = None if labels.session is not None else now
        return pending(
            new_id(),
            agent_id,
            origin,
            parent_execution_id=labels.parent_execution_id,
            admitted_at=admitted_at,
        )

    async def cancel_execution(self, execution_id: str) -> None:
        await self.cancel(execution_id, CLIENT_CANCELLED)

    async def cancel(self, execution_id: str, reason: str) -> None:
        """§10.1: cancelled, pending approvals expired, gated steps denied, running steps
        cancelled, dispatches retired; all in one transaction; then its follow-ups."""
        await follow_ups.cancel(self, execution_id, reason)

    async def heartbeat(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        outcomes: Sequence[Carried] = (),
        *,
        policy: bool = False,
        seen: SeenRequest | None = None,
    ) -> bool:
        """Renews the lease and records what the heartbeat carries. With `policy`, also
        answers whether the agent is still without a policy (`step-records`).

        A copy of a heartbeat already accepted (`seen`, §2.3) more than `COPY_GRACE` ago
        gets the same answer and changes nothing: the lease is not renewed again, so
        replaying a captured heartbeat cannot keep a dead run's lease alive. An agent that
        beats more than once a second sends identical heartbeats within that grace, and each
        renews as it should."""
        async with self.transaction(execution_id) as tx:
            now = self.clock()
            if seen is not None and await _stale_copy(tx, seen, now):
                locked = await tx.lock_execution(execution_id)
                check_owner(locked.execution, agent_id)
                return policy and not locked.policy_bundle
            locked = await tx.lock_execution(execution_id, lease, now, wanted_by(outcomes))
            execution = locked.execution
            check_owner(execution, agent_id)
            if not locked.lease_live:
                raise lease_superseded(execution_id, lease)
            batch = EventBatch(execution, now)
            execution = mark_started(execution, batch)
            carrying = Carrying(lease.dispatch_id, outcomes, locked.outcomes or NOTHING_READ)
            await record_carried(tx, execution, carrying, batch)
            await flush(tx, execution, batch)
            return policy and not locked.policy_bundle

    async def complete_execution(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        output: RawJson,
        outcomes: Sequence[Carried] = (),
        state: RawJson | None = None,
    ) -> None:
        """`state` (§24.5) is kept for the executions that continue this one; `null` is none."""
        ending = completed(output, state)
        await self._end(EndRequest(execution_id, agent_id, lease, ending, outcomes))

    async def fail_execution(
        self,
        execution_id: str,
        agent_id: str,
        lease: Lease,
        reason: str,
        outcomes: Sequence[Carried] = (),
    ) -> None:
        await self._end(EndRequest(execution_id, agent_id, lease, failed(reason), outcomes))

    async def _end(self, end: EndRequest) -> None:
        """A fast way (the followed run), else the locked script; then the follow-ups."""
        done = await finish_followed(self, end)
        if done is None:
            done = await self._end_locked(end)
        await follow_ups.ended(self, done)

    async def _end_locked(self, end: EndRequest) -> Execution:
        """Terminal is checked before the lease (§5.2), then the strong lease check. A
        refusal rolls the transaction back, the lease's renewal with it."""
        lease = end.lease
        async with self.transaction(end.execution_id) as tx:
            now = self.clock()
            wanted = wanted_by(end.outcomes)
            locked = await lock_live(tx, end.execution_id, end.agent_id, lease, now, wanted)
            read = locked.outcomes or NOTHING_READ
            carrying = Carrying(lease.dispatch_id, end.outcomes, read)
            return await finish_execution(tx, locked.execution, end.ending, now, carrying)


async def _check_labels(tx: Transaction, agent_id: str, labels: Labels) -> str | None:
    """The checks of where a new execution comes from, under the locks they need (the
    session's, taken by the caller first; a parent's); returns whom it acts for."""
    session = labels.session
    branching = labels.parent_execution_id is not None
    if session is not None and branching and await tx.session_used(session):
        raise Conflict(
            f"session {session!r} has executions already: a branch from a "
            "parent starts a new session"
        )
    on_behalf_of = labels.on_behalf_of
    if labels.spawned_by is not None:
        spawner = await check_spawn(tx, *labels.spawned_by, session)
        on_behalf_of = on_behalf_of or spawner.origin.on_behalf_of
        if not spawner.has_children:
            await tx.mark_parent(spawner.id)
    if labels.parent_execution_id is not None:
        await _check_parent(tx, agent_id, labels.parent_execution_id)
    return on_behalf_of


def _same_spawn(earlier: Execution, labels: Labels) -> Execution:
    """A repeat that names a step must find that step's child: a key shared with an
    execution another step (or no step) started would leave it waiting on nothing."""
    if labels.spawned_by is not None and (
        (earlier.origin.spawned_by_execution_id, earlier.origin.spawned_by_step_id)
        != labels.spawned_by
    ):
        raise Conflict(
            f"idempotency key {labels.idempotency_key!r} names execution {earlier.id}, "
            "which is not a sub-agent of that step"
        )
    return earlier


async def check_spawn(
    tx: Transaction, parent_id: str, step_id: str, session: str | None
) -> Execution:
    """§25.2, under the parent's lock (taken here, after any session lock): the parent
    exists (`NotFound`) and is live (`Conflict`); the step is one of its own (else
    `ValidationFailed`) and is executing (`Conflict`); and the child's session is neither
    the parent's nor an ancestor's. Returns the parent."""
    await tx.take_lock(execution_lock(parent_id))
    parent = await tx.get_execution(parent_id)
    if parent.status.is_terminal:
        raise Conflict(f"parent execution {parent_id} is already {parent.status}")
    step = await tx.get_step(step_id)
    if step is None or step.execution_id != parent_id:
        raise ValidationFailed(
            f"validation error: spawned_by: step {step_id} is not a step of {parent_id}"
        )
    if step.status is not StepStatus.EXECUTING:
        raise Conflict(f"step {step_id} is {step.status}, not executing")
    if session is not None:
        await _check_ancestors(tx, parent, session)
    return parent


async def _check_ancestors(tx: Transaction, parent: Execution, session: str) -> None:
    """`ValidationFailed` when the session is the parent's or an ancestor's: a child waiting
    for its own ancestor's turn would wait for ever."""
    ancestor: Execution | None = parent
    for _ in range(MAX_ANCESTORS):
        if ancestor is None:
            return
        if ancestor.origin.session == session:
            raise ValidationFailed(
                f"validation error: session {session!r} is an ancestor's: a sub-agent "
                "cannot wait for its own parent's turn"
            )
        above = ancestor.origin.spawned_by_execution_id
        ancestor = None if above is None else await _maybe(tx, above)


async def _maybe(tx: Transaction, execution_id: str) -> Execution | None:
    try:
        return await tx.get_execution(execution_id)
    except NotFound:  # deleted by retention meanwhile
        return None


async def _check_parent(tx: Transaction, agent_id: str, parent_id: str) -> None:
    """§24.2: an explicit parent exists (`NotFound`), is the same agent's and completed
    (`Conflict`). It is held until the transaction ends, so retention cannot delete it while
    its child is being recorded (the store's `hold_execution`)."""
    parent = await tx.hold_execution(parent_id)
    if parent.agent_id != agent_id:
        raise Conflict(f"parent execution {parent_id} belongs to another agent")
    if parent.status is not ExecutionStatus.COMPLETED:
        raise Conflict(f"parent execution {parent_id} is {parent.status}, not completed")


async def _stale_copy(tx: Transaction, seen: SeenRequest, now: datetime) -> bool:
    """Whether the request is a copy of one first accepted more than `COPY_GRACE` ago."""
    first = await tx.remember_request(seen.digest, now, seen.until)
    return first is not None and now - first > COPY_GRACE
