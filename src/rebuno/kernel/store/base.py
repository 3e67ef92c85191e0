"""The Store and Transaction protocols every backend implements.

A use case opens exactly one transaction (`store.transaction(execution_id)`), which takes the
execution's lock first when an id is given, so every mutation of one execution is serialised
across coroutines, processes and replicas. Write methods return nothing: a backend may queue
them and send them together at commit (pipelining). Invariants the database itself enforces
(a terminal execution or step is never changed; `event_seq` is unique per execution) surface
as `ExecutionTerminal` / `Conflict` from the write or from the commit.

The strong lease check (`lease_live`, and the condition of an optimistic transaction): a lease
owns its execution's live dispatch when that dispatch belongs to the execution and is
`in_flight` at the lease's attempt; it is then renewed (`locked_at = now`). A lease past its
time stays live until the reaper returns its dispatch to the queue (`reclaim_expired`). Each
backend writes this check once (SQLite `dispatches.renew_lease`, PostgreSQL
`rebuno_renew_lease`).

Must import only `rebuno.kernel.domain` and `rebuno.protocol`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from rebuno.kernel.domain.api_key import ApiKey
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
)
from rebuno.protocol.enums import ApprovalStatus, ExecutionStatus, StepKind, StepStatus
from rebuno.protocol.extensions import AgentInstance

T = TypeVar("T")


def session_lock(session: str) -> str:
    """The name of a session's lock (`Transaction.take_lock`)."""
    return f"session:{session}"


def execution_lock(execution_id: str) -> str:
    """The name of an execution's lock, the one `Store.transaction(execution_id)` takes."""
    return f"execution:{execution_id}"


Omitted = tuple[tuple[str, int], ...]
"""The payloads a list left out of one item, each named with its size in bytes (§5.1)."""


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None
    omitted: Mapping[str, Omitted] = field(default_factory=dict)
    """On a page of executions, by id: the payloads (`input`, `output`) left out of each that
    has any; its record holds `null` and None in their place."""


LISTED_PAYLOAD_BYTES = 64 * 1024
"""The largest payload (an execution's input or output; a step's args, result or error; an
event's payload) a list carries; a larger one is left out and named in the item's `omitted`
(§5.1, §5.2)."""


@dataclass(frozen=True, slots=True)
class ExecutionFilter:
    agent_id: str | None = None
    status: ExecutionStatus | None = None
    cursor: str | None = None
    """Return executions whose id is strictly smaller than this one."""
    floor: str | None = None
    """Return executions whose id is this one or larger: with `cursor`, an id range, which is
    also a creation-time range since ids are UUIDv7 (§40.4)."""
    limit: int = 50
    session: str | None = None
    parent_execution_id: str | None = None
    spawned_by: str | None = None
    """Only the sub-agents of this execution (their `spawned_by_execution_id`)."""
    forked_from: str | None = None
    payload_limit: int = LISTED_PAYLOAD_BYTES
    """An input or output of more bytes than this is left out of the page (`omitted`)."""


@dataclass(frozen=True, slots=True)
class LineageRepairs:
    unsettled: list[str]
    orphans: list[str]
    stalled: list[str]


@dataclass(frozen=True, slots=True)
class StepKey:
    """What a step is counted by within one delivery attempt (§7.3)."""

    kind: StepKind
    target: str
    args_hash: str


@dataclass(frozen=True, slots=True)
class Submission:
    """Everything `submit_step` reads, fetched together under the execution lock. Both stores
    fill every field, whether or not the step is recorded already."""

    execution: Execution
    lease_live: bool
    """The lease owns the live dispatch (strong check); when true it was also renewed."""
    occurrence: int
    """The next occurrence for this step key in this dispatch (0 when none was used)."""
    existing: Step | None
    """The step already recorded under the id `step_id_for(occurrence)` yields, if any."""
    policy_bundle: str | None
    """The execution's agent's policy bundle (None when it has none), read in the same
    statement. Filled for a recorded step too, though policy is never consulted for one: it
    costs nothing there, and a caller that moves on to another occurrence where no step is
    recorded has the bundle without reading the agent again."""
    completing: tuple[Step, ...] = ()
    """The steps whose outcomes the submission carries (`step-completions`), if they exist
    in this execution, in no particular order."""


@dataclass(frozen=True, slots=True)
class Wanted:
    """What `load_outcomes` looks up for the outcomes a request carries."""

    reports: Mapping[StepKey, int]
    """How many reported steps (`step-records`) the request carries under each key."""
    step_ids: Sequence[str]
    """The steps whose completions (`step-completions`) it carries."""

    def __bool__(self) -> bool:
        return bool(self.reports or self.step_ids)


NOTHING_WANTED = Wanted(reports={}, step_ids=())


@dataclass(frozen=True, slots=True)
class Outcomes:
    """What `load_outcomes` reads for the outcomes a request carries."""

    consumed: dict[StepKey, int]
    """The occurrences the dispatch has consumed for each reported key it has used."""
    steps: list[Step]
    """The steps of this execution named by id, and those recorded under a reported key at
    the occurrences the reports are about to take; each once, in no particular order."""


@dataclass(frozen=True, slots=True)
class Locked:
    """What `lock_execution` reads under the execution lock, in one round trip."""

    execution: Execution
    lease_live: bool
    """The lease owns the live dispatch (strong check); when true it was also renewed. False
    when no lease was given."""
    policy_bundle: str | None
    """The execution's agent's policy bundle."""
    outcomes: Outcomes | None = None
    """What `load_outcomes` reads for the outcomes wanted, when some were."""


@dataclass(frozen=True, slots=True)
class Completion:
    """Everything completing or failing a step reads, fetched together under the lock."""

    execution: Execution
    step: Step | None
    """The step with that id, if it exists and belongs to this execution."""
    dispatch: Dispatch | None
    """The dispatch the lease names, if it exists and belongs to this execution."""


DECISION_TYPES = ("step.allowed", "step.denied", "step.awaiting_approval")
"""The event types `StepHistory.decisions` holds."""


@dataclass(frozen=True, slots=True)
class StepHistory:
    """What replaying an execution through a policy reads (§35.3), from one snapshot."""

    execution: Execution
    steps: list[Step]
    """Every step, whole, in proposal order."""
    decisions: list[Event]
    """Its `step.allowed`, `step.denied` and `step.awaiting_approval` events, in log order."""


@dataclass(frozen=True, slots=True)
class ClaimedDispatch:
    """A dispatch this replica has just claimed, with what delivering it needs."""

    dispatch: Dispatch
    execution: Execution
    """The execution as the claim read it."""
    agent: Agent
    reclaimed: bool = False
    """The claim redelivers an attempt whose lease was reclaimed (it expired, or a restarted
    agent instance ended it): the row was `pending` again with an attempt already made."""

    @property
    def execution_status(self) -> ExecutionStatus:
        return self.execution.status


@dataclass(frozen=True, slots=True)
class Unchanged:
    """The condition of an optimistic transaction (`Store.transaction(unchanged=...)`): its
    writes were built from a record of the execution read earlier, so they apply only while
    the execution is still at that record's `last_event_seq`. With a lease, also only while
    it owns the live dispatch (renewed then, `locked_at = now`) and its dispatch has used no
    occurrence counter yet. With `policy_hash`, also only while the execution's policy bundle
    (its own, else its agent's) still has that hash (§35.6; the hash of the empty text when
    it has none): policy changes without moving the execution. With `childless`, also only
    while no sub-agent has been started from it (`has_children`): a child's create marks its
    parent without moving it (§25.6). `status` is that record's status, when the writer
    knows it: an update that keeps it is then not announced to the other replicas (§40.5),
    as it would not be from a transaction that read it under the lock. `on` takes both from
    the record.

    Each backend evaluates the condition in one place, clause for clause: PostgreSQL's
    `rebuno_unchanged` (`functions.sql`), which receives this value whole as a JSON object
    under its field names, and SQLite's `transaction.still_unchanged`. A new clause is a field
    here, its clause in both, and its test in `tests/store/test_optimistic_condition.py`."""

    last_event_seq: int
    lease: Lease | None = None
    now: datetime | None = None
    policy_hash: str | None = None
    childless: bool = False
    status: ExecutionStatus | None = None

    @classmethod
    def on(
        cls,
        record: Execution,
        lease: Lease | None = None,
        now: datetime | None = None,
        *,
        policy_hash: str | None = None,
        childless: bool = False,
    ) -> Unchanged:
        """The condition of writes built from `record`: its `last_event_seq` and status."""
        return cls(record.last_event_seq, lease, now, policy_hash, childless, record.status)


class Stale(Exception):
    """An optimistic transaction's condition did not hold: nothing was written."""


@dataclass(frozen=True, slots=True)
class RateBucket:
    key: str
    tokens: float
    max_tokens: float
    window_seconds: float
    updated_at: datetime


class Transaction(Protocol):
    """One unit of work. Commits when the `async with` block exits normally."""

    # -- reads under the lock ------------------------------------------------------------
    async def get_execution(self, execution_id: str) -> Execution:
        """Raises `NotFound`."""
        ...

    async def find_execution(self, agent_id: str, idempotency_key: str) -> Execution | None:
        """`Store.find_execution`, seeing what this transaction and the ones committed with
        it wrote."""
        ...

    async def take_lock(self, key: str) -> None:
        """Takes the named lock until the transaction ends (PostgreSQL: an advisory lock;
        the embedded store's single writer holds everything already). Lock order: a
        session's lock first, then executions' (docs/protocol.md §24.3)."""
        ...

    async def session_held(self, session: str) -> bool:
        """Whether an admitted execution of the session is live (pending, running, blocked)."""
        ...

    async def session_used(self, session: str) -> bool:
        """Whether any execution is in the session."""
        ...

    async def first_waiter(self, session: str, now: datetime) -> Execution | None:
        """The session's oldest execution not admitted yet whose deadline has not passed."""
        ...

    async def last_completed(self, agent_id: str, session: str) -> str | None:
        """The id of the agent's most recently created completed execution in the session."""
        ...

    async def admit(self, execution_id: str, now: datetime, parent: str | None) -> None:
        """Sets `admitted_at`, and the parent unless it has one."""
        ...

    async def list_children(self, execution_id: str) -> list[Execution]:
        """The executions this one's steps started as sub-agents (§25), oldest first."""
        ...

    async def delete_expired_session(self, session: str, cutoff: datetime) -> int:
        """Deletes every execution of the session, with their children, when all are
        terminal and older than `cutoff` and no execution of another session names one as
        its parent (§24.6); how many it deleted."""
        ...

    async def hold_execution(self, execution_id: str) -> Execution:
        """Reads an execution this transaction does not lock and keeps retention from
        deleting it until the transaction ends (the parent a new execution names, §24.6).
        Raises `NotFound`."""
        ...

    async def lock_execution(
        self,
        execution_id: str,
        lease: Lease | None = None,
        now: datetime | None = None,
        wanted: Wanted = NOTHING_WANTED,
    ) -> Locked:
        """Reads the execution and its agent's bundle; with a lease, also checks and renews it
        (`locked_at = now`) and, when outcomes are `wanted`, loads them as `load_outcomes`
        does for the lease's dispatch. Raises `NotFound`."""
        ...

    async def load_submission(
        self,
        execution_id: str,
        lease: Lease,
        key: StepKey,
        step_id_for: StepIdFn,
        now: datetime,
        completing: Sequence[str] = (),
    ) -> Submission:
        """Reads the execution, checks and renews the lease, finds the next occurrence and
        the step recorded under the id `step_id_for` gives it, and the steps named in
        `completing`. Raises `NotFound` for an unknown execution."""
        ...

    async def load_completion(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> Completion:
        """Reads the execution, the step and the lease's dispatch together. Raises
        `NotFound` for an unknown execution."""
        ...

    async def get_step(self, step_id: str) -> Step | None: ...

    async def load_outcomes(self, execution_id: str, dispatch_id: str, wanted: Wanted) -> Outcomes:
        """For the outcomes a request carries: the occurrences the dispatch has consumed for
        each reported key (§7.3; a key it has not used is absent), and the steps of this
        execution among `wanted.step_ids` or recorded under a reported key at one of its next
        `wanted.reports[key]` occurrences."""
        ...

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None: ...

    async def get_agent(self, agent_id: str) -> Agent:
        """Raises `NotFound`."""
        ...

    async def get_approval(self, approval_id: str) -> Approval:
        """Raises `NotFound`."""
        ...

    async def pending_approval_for_step(self, step_id: str) -> Approval | None: ...

    async def list_pending_approvals(self, execution_id: str) -> list[Approval]: ...

    async def list_steps_with_status(self, execution_id: str, status: StepStatus) -> list[Step]: ...

    async def has_indeterminate_step(self, execution_id: str, key: StepKey) -> bool:
        """Whether a step with this key failed with `error.reason = indeterminate`."""
        ...

    async def has_event_of_type(self, execution_id: str, event_type: str) -> bool: ...

    async def spent_tokens(self, execution_id: str) -> int: ...

    async def take_rate_token(
        self, key: str, max_calls: int, window_seconds: float, now: datetime
    ) -> float | None:
        """Token bucket of §14.7: consumes a token and returns None when one is available,
        otherwise returns the estimated wait in seconds."""
        ...

    async def remember_request(
        self, digest: bytes, now: datetime, until: datetime
    ) -> datetime | None:
        """Records the digest of a signed request accepted `now` (§2.3), kept at least until
        `until`, as a write of this transaction. None when it is new; for a copy, when the
        digest was first recorded."""
        ...

    # -- resources (§33): read only for an execution that `has_resources` ----------------
    async def list_resources(self, execution_id: str) -> list[Resource]:
        """The execution's resources in registration order (`registered_seq`)."""
        ...

    async def list_checkpoints(self, execution_id: str) -> list[Checkpoint]:
        """The execution's checkpoints, by `covered_seq`, then insertion."""
        ...

    async def affected_keys(self, step_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The keys each of these steps affects, for the steps that affect any."""
        ...

    async def writing_keys(self, execution_id: str) -> set[str]:
        """The keys some `executing` step of the execution affects."""
        ...

    # -- writes --------------------------------------------------------------------------
    async def insert_execution(
        self, execution: Execution, policy_bundle: str | None = None
    ) -> None:
        """Raises `NotFound` when the execution's agent is not registered, from this call or
        from the commit. `policy_bundle`: the execution's own, which its steps are decided
        by instead of the agent's (a fork's, §26.4)."""
        ...

    async def update_execution(self, execution: Execution) -> None:
        """Writes status, output, failure_reason, updated_at and last_event_seq."""
        ...

    async def mark_parent(self, execution_id: str) -> None:
        """Records that a step of the execution started a sub-agent (`has_children`)."""
        ...

    async def set_state(self, execution_id: str, state: RawJson) -> None:
        """Stores the `state` an execution was completed with (§24.5)."""
        ...

    async def mark_resources(self, execution_id: str) -> None:
        """Records that a resource is registered in the execution (`has_resources`)."""
        ...

    async def set_restoration(self, execution_id: str, restoration: RawJson) -> None:
        """Stores what a fork restored (§33.8.2)."""
        ...

    async def put_resource(self, resource: Resource) -> None:
        """Inserts the resource, or replaces the stored one of its execution and key."""
        ...

    async def insert_checkpoint(self, checkpoint: Checkpoint) -> None: ...

    async def close_checkpoints(self, execution_id: str, key: str, seq: int) -> None:
        """Sets `invalidated_seq = seq` on the key's open checkpoints."""
        ...

    async def set_affected_keys(self, step_id: str, keys: Sequence[str]) -> None:
        """Stores the keys the step affects (replacing what an earlier run stored)."""
        ...

    async def append_events(self, events: Sequence[Event]) -> None: ...

    async def insert_step(self, step: Step) -> None: ...

    async def update_step(self, step: Step) -> None:
        """Writes status, result, error, usage, started_at and completed_at."""
        ...

    async def set_occurrence(self, dispatch_id: str, key: StepKey, consumed: int) -> None:
        """Advances the counter monotonically: `consumed = max(old, consumed)`."""
        ...

    async def insert_dispatch(self, dispatch: Dispatch) -> None:
        """Also wakes every replica's dispatch loop once the transaction commits."""
        ...

    async def retire_dispatches(self, execution_id: str, now: datetime) -> None:
        """Sets every non-exhausted dispatch of the execution to `exhausted`."""
        ...

    async def update_dispatch(self, dispatch: Dispatch) -> None: ...

    async def expire_lease(self, dispatch_id: str, attempt: int) -> None:
        """Ends this attempt's lease now, while it is the live one: its `locked_at` goes back
        to the epoch, so the next `reclaim_expired` returns it to the queue."""
        ...

    async def insert_approval(self, approval: Approval) -> None: ...

    async def update_approval(self, approval: Approval) -> None: ...

    async def upsert_agent(self, agent: Agent, keep_bundle: bool) -> Agent:
        """Inserts or replaces an agent; with `keep_bundle` an existing bundle survives."""
        ...

    async def delete_agent(self, agent_id: str) -> None:
        """Raises `NotFound`, or `Conflict` while executions reference the agent."""
        ...

    async def set_policy_bundle(self, agent_id: str, bundle: str | None) -> None:
        """Raises `NotFound`."""
        ...

    async def insert_api_key(self, key: ApiKey) -> None: ...

    async def rotate_api_key(self, key_id: str, old_hash: bytes, new_hash: bytes) -> bool:
        """Replaces the hash only while it is `old_hash` and the key is not revoked (a
        compare-and-swap); False when nothing changed."""
        ...

    async def revoke_api_key(self, key_id: str, now: datetime) -> None:
        """Sets `revoked_at` unless it is set already; raises `NotFound`."""
        ...

    async def update_agent_metadata(
        self, agent_id: str, metadata: AgentMetadata, now: datetime
    ) -> None:
        """Replaces the agent's metadata whole and sets `metadata_updated_at` to `now`, in
        one statement (§36.1). Raises `NotFound`."""
        ...


class StepIdFn(Protocol):
    def __call__(self, occurrence: int) -> str: ...


class Store(Protocol):
    """A durable backend. Reads outside a transaction see committed data only."""

    async def open(self) -> None:
        """Connects and applies the schema (safe when several replicas boot at once)."""
        ...

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raises when the database cannot answer."""
        ...

    def transaction(
        self, execution_id: str | None = None, unchanged: Unchanged | None = None
    ) -> AbstractAsyncContextManager[Transaction]:
        """A transaction; with an id it first takes that execution's lock. With `unchanged`
        (and an id) it is optimistic: the block only writes, and the writes commit only
        while the condition holds; otherwise nothing is written and `Stale` is raised, from
        entering the block or from leaving it."""
        ...

    def leader(self, key: str) -> AbstractAsyncContextManager[bool]:
        """Try-lock for singleton work: yields False at once when another holder has it."""
        ...

    # -- committed reads -----------------------------------------------------------------
    async def get_execution(self, execution_id: str) -> Execution: ...

    async def find_execution(self, agent_id: str, idempotency_key: str) -> Execution | None:
        """The agent's execution created under this idempotency key, if any (§27.1)."""
        ...

    async def get_own_policy(self, execution_id: str) -> str | None:
        """The execution's own policy bundle (§26.4), None when its agent's applies."""
        ...

    async def list_resources(self, execution_id: str) -> list[Resource]:
        """`Transaction.list_resources` as a committed read."""
        ...

    async def list_checkpoints(self, execution_id: str) -> list[Checkpoint]:
        """`Transaction.list_checkpoints` as a committed read."""
        ...

    async def get_restoration(self, execution_id: str) -> RawJson | None:
        """What a fork restored (§33.8.2); None when nothing."""
        ...

    async def get_state(self, execution_id: str) -> RawJson | None:
        """The `state` the execution was completed with; None when it has none. Raises
        `NotFound`."""
        ...

    async def list_executions(self, flt: ExecutionFilter) -> Page[Execution]: ...

    async def list_events(
        self,
        execution_id: str,
        after_seq: int,
        limit: int,
        payload_limit: int = LISTED_PAYLOAD_BYTES,
    ) -> list[Event]:
        """A payload of more than `payload_limit` bytes is left out (`Event.omitted`)."""
        ...

    async def list_steps(
        self, execution_id: str, status: str | None, payload_limit: int = LISTED_PAYLOAD_BYTES
    ) -> list[Step]:
        """`status`: `terminal`, a step status name, or None for all; proposal order. A
        payload of more than `payload_limit` bytes is left out (`Step.omitted`)."""
        ...

    async def get_step(self, step_id: str) -> Step | None: ...

    async def load_completion(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> Completion:
        """`Transaction.load_completion` as one committed read, without the execution lock.
        Raises `NotFound` for an unknown execution."""
        ...

    async def load_step_history(self, execution_id: str) -> StepHistory:
        """The execution, its steps and its decision events, read together (one snapshot).
        Raises `NotFound`."""
        ...

    async def get_agent(self, agent_id: str, *, metadata: bool = True) -> Agent:
        """Raises `NotFound`. Without `metadata`, the record's metadata is left unread
        (`NO_METADATA`): the secret lookup behind every signed request needs none of it."""
        ...

    async def list_agents(self) -> list[Agent]: ...

    async def get_approval(self, approval_id: str) -> Approval: ...

    async def list_approvals(
        self, status: ApprovalStatus | None, execution_id: str | None
    ) -> list[Approval]: ...

    async def find_api_key(self, key_id: str) -> ApiKey | None:
        """The key, revoked or not, as committed: read on every request a key makes, so a
        revocation or rotation holds on every replica from its commit (§34.7)."""
        ...

    async def list_api_keys(self) -> list[ApiKey]:
        """Every key, revoked ones included, in id (creation) order."""
        ...

    # -- dispatch queue ------------------------------------------------------------------
    async def claim_dispatches(
        self, replica_id: str, limit: int, now: datetime
    ) -> list[ClaimedDispatch]:
        """Claims up to `limit` due dispatches: `in_flight`, `attempt + 1`, counters reset."""
        ...

    async def dispatch_queue(self, now: datetime) -> tuple[int, datetime | None]:
        """The queue's depth (pending or failed dispatches due at `now`) and when the earliest
        of all pending or failed dispatches became or becomes due, if any."""
        ...

    async def watch_dispatches(
        self,
        wake: Callable[[], None],
        ended: Callable[[str], None] | None = None,
        touched: Callable[[str], None] | None = None,
    ) -> None:
        """Runs until cancelled, calling `wake` whenever another process enqueued a
        dispatch, `ended(execution_id)` whenever another process ended an execution, and
        `touched(execution_id)` whenever another process created one or changed its status
        short of an end (Postgres: LISTEN; §40.5). A single-process backend returns at
        once."""
        ...

    async def reclaim_expired(self, now: datetime, default_lease: timedelta) -> int:
        """Returns expired `in_flight` dispatches to `pending`; how many it returned."""
        ...

    async def set_dispatch_instance(
        self, dispatch_id: str, attempt: int, instance: AgentInstance
    ) -> None:
        """Records which agent instance acknowledged this attempt, while it is in flight (one
        committed statement). A claim clears it."""
        ...

    async def list_superseded_dispatches(
        self, agent_id: str, instance: AgentInstance, limit: int
    ) -> list[Dispatch]:
        """The agent's in-flight dispatches whose attempt an instance of this name with
        another incarnation acknowledged; at most `limit`, by id."""
        ...

    # -- background sweeps (ids to act on; each is then handled in its own transaction) --
    async def list_expired_approvals(self, now: datetime, limit: int, after: str = "") -> list[str]:
        """Ids of pending approvals whose `timeout_at` has come, above `after`, in id order:
        a sweep pages on past one it could not handle."""
        ...

    async def list_overdue_executions(
        self, now: datetime, limit: int, after: str = ""
    ) -> list[str]:
        """Ids of live executions past their deadline, above `after`, in id order."""
        ...

    async def list_sessions_to_admit(self, limit: int) -> list[str]:
        """Sessions with a waiter and no live admitted execution (a release lost in a crash)."""
        ...

    async def list_expired_sessions(self, cutoff: datetime, limit: int) -> list[str]:
        """Sessions `Transaction.delete_expired_session` would delete now."""
        ...

    async def list_children(self, execution_id: str) -> list[Execution]:
        """`Transaction.list_children` as a committed read."""
        ...

    async def list_lineage_repairs(self, limit: int) -> LineageRepairs:
        """What lost follow-ups left (§25.7): ended sub-agents whose step still executes in
        a live parent, live sub-agents of an ended or missing parent, and blocked executions
        nothing holds up any more; at most `limit` of each."""
        ...

    async def delete_terminal_before(self, cutoff: datetime) -> int:
        """Retention: deletes terminal executions without a session last updated before
        `cutoff` that no stored execution names as parent, with their children, and rate
        buckets untouched since then. Returns executions deleted. Sessions go whole, one
        transaction each (`delete_expired_session`)."""
        ...

    # -- replay protection (§2.3) --------------------------------------------------------
    async def remember_request(
        self, digest: bytes, now: datetime, until: datetime
    ) -> datetime | None:
        """`Transaction.remember_request` as one committed statement."""
        ...

    async def forget_requests(self, now: datetime) -> int:
        """Deletes the digests kept until before `now`; how many it deleted."""
        ...
