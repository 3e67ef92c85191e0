"""`SqliteStore`: the embedded, single-process backend of the `Store` protocol.

One writer connection, guarded by an asyncio.Lock held for a whole `BEGIN IMMEDIATE` ...
`COMMIT`, serialises every mutation (so the per-execution lock is implied), and a separate
read-only connection serves committed reads: on the writer it would see the open
transaction's uncommitted rows. WAL with `synchronous=NORMAL` survives a process crash,
which is what the embedded store promises (not a power loss).

SQLite calls run directly on the event loop thread: a statement on a local WAL file takes
microseconds, less than a hop to a worker thread would cost. The one slow operation, the WAL
checkpoint (which copies pages back and syncs the file), is taken off the request path: the
writer never checkpoints by itself, and a worker thread does it on its own connection every
`CHECKPOINT_EVERY` commits.
Must import only sqlite3, `rebuno.kernel.store.base`, the domain and this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Concatenate, ParamSpec, TextIO, TypeVar

from rebuno.kernel.domain.api_key import ApiKey
from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.domain.records import (
    Agent,
    Approval,
    Checkpoint,
    Dispatch,
    Event,
    Execution,
    RawJson,
    Resource,
    Step,
)
from rebuno.kernel.store.base import (
    DECISION_TYPES,
    LISTED_PAYLOAD_BYTES,
    ClaimedDispatch,
    Completion,
    ExecutionFilter,
    LineageRepairs,
    Page,
    Stale,
    StepHistory,
    Store,
    Unchanged,
)
from rebuno.kernel.store.sqlite import (
    agents,
    api_keys,
    approvals,
    checkpoints,
    dispatches,
    events,
    executions,
    rate_buckets,
    resources,
    seen_requests,
    steps,
)
from rebuno.kernel.store.sqlite.errors import driver_errors
from rebuno.kernel.store.sqlite.schema import apply_schema
from rebuno.kernel.store.sqlite.transaction import (
    SqliteTransaction,
    load_completion,
    still_unchanged,
)
from rebuno.protocol.enums import ApprovalStatus
from rebuno.protocol.extensions import AgentInstance

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger(__name__)

_MEMORY = ":memory:"
CHECKPOINT_EVERY = 500
"""Commits between two background WAL checkpoints."""
_RETENTION_PAGE = 500
"""Executions deleted per write transaction, so retention never stalls the writer long."""
GROUP_LIMIT = 32
"""Writers one commit may cover at most, so the first of them never waits long."""


def _own(path: str) -> TextIO:
    """Takes `<path>.lock` for this process, or refuses naming the process that holds it: a
    second kernel on the same file would interleave its writes with the first's (SQLite would
    keep the file whole, but two dispatch loops and two sets of leases would not agree). The
    lock goes with the process, however it ends."""
    # Readable by the owner only, like the database beside it.
    lock = os.fdopen(os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600), "r+", encoding="ascii")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise Unavailable(
            f"SQLite database {path} is in use by process {holder}: one kernel per file"
            " (stop the other, or give this one its own --db-url)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


class _Group:
    """Writers sharing one transaction; `done` resolves when its COMMIT did (or failed)."""

    __slots__ = ("done", "members")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.members = 0


class SqliteStore:
    """A SQLite database file (or `":memory:"`: a private temporary file removed on close)."""

    def __init__(self, path: str) -> None:
        self._requested = path
        self._path = path
        self._tempdir: str | None = None
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._write_lock = asyncio.Lock()
        self._group: _Group | None = None
        self._leaders: set[str] = set()
        self._checkpointer: sqlite3.Connection | None = None
        self._checkpoint: asyncio.Future[None] | None = None
        self._owner: TextIO | None = None
        """The lock file held while open: one process writes an SQLite store at a time."""
        self._committed = 0
        self._checkpointed_at = 0
        """`_committed` when the last background checkpoint started."""

    @property
    def path(self) -> str:
        """The database file; for `":memory:"`, the temporary file once open."""
        return self._path

    # -- lifecycle -----------------------------------------------------------------------
    async def open(self) -> None:
        self._path = self._prepare_path()
        self._owner = _own(self._path)
        writer: sqlite3.Connection | None = None
        try:
            writer = _connect(self._path)
            apply_schema(writer, self._path)
            self._reader = _connect(self._path, read_only=True)
            # Used only from the checkpoint worker thread, one checkpoint at a time.
            self._checkpointer = _connect(self._path, check_same_thread=False)
        except BaseException as exc:
            if writer is not None:
                writer.close()
            self._disown()
            if isinstance(exc, sqlite3.Error):
                raise Unavailable(f"cannot open SQLite database {self._path}: {exc}") from exc
            raise
        self._writer = writer

    def _disown(self) -> None:
        if self._owner is not None:
            self._owner.close()  # closing the descriptor drops the lock
            self._owner = None

    def _prepare_path(self) -> str:
        if self._requested == _MEMORY:
            # A real file, not SQLite's in-memory mode: the reader must see the writer's data.
            self._tempdir = tempfile.mkdtemp(prefix="rebuno-")
            return str(Path(self._tempdir) / "kernel.db")
        try:
            Path(self._requested).parent.mkdir(parents=True, exist_ok=True)
            # The file holds agent secrets: readable by its owner only. SQLite gives the WAL
            # and shared-memory files the database file's permissions. An existing file keeps
            # the mode its owner chose.
            os.close(os.open(self._requested, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as exc:
            raise Unavailable(f"cannot create {self._requested}: {exc}") from exc
        return self._requested

    async def close(self) -> None:
        # A checkpoint takes the writer lock itself, so it is awaited before the lock.
        await self.checkpointed()
        # Taking the writer lock lets a transaction in progress finish (or roll back) first.
        async with self._write_lock:
            self._commit_open_group()
            if self._writer is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            for conn in (self._reader, self._writer, self._checkpointer):
                if conn is not None:
                    conn.close()
            self._checkpointer = None
            self._reader = self._writer = None
            self._disown()
            if self._tempdir is not None:
                shutil.rmtree(self._tempdir, ignore_errors=True)
                self._tempdir = None

    async def ping(self) -> None:
        self._read(_select_one)

    # -- transactions --------------------------------------------------------------------
    @asynccontextmanager
    async def transaction(
        self, execution_id: str | None = None, unchanged: Unchanged | None = None
    ) -> AsyncIterator[SqliteTransaction]:
        # The single writer serialises every transaction, so `execution_id` needs no lock
        # of its own here, and an optimistic one can check its condition first.
        async with self._write() as conn:
            if unchanged is not None and execution_id is not None:
                with driver_errors(self._path):
                    holds = still_unchanged(conn, execution_id, unchanged)
                if not holds:
                    raise Stale(f"execution {execution_id} changed since it was read")
            yield SqliteTransaction(conn, self._path)

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[sqlite3.Connection]:
        """One writer's unit of work, committed before the block's caller goes on.

        Group commit: a writer leaves the transaction open and the COMMIT is made at the
        event loop's next turn, so every writer that runs before then (each inside a savepoint
        of its own: its failure undoes only its own writes) shares it. Every member waits for
        that COMMIT before it returns, so nothing is acknowledged before it is written; under
        concurrent load the group saves the commits between its members, and alone a writer
        waits one turn of the loop."""
        await self._write_lock.acquire()
        held_open = False
        try:
            conn = self._connection(self._writer)
            group = self._join(conn)
            try:
                yield conn
            except BaseException:
                self._undo(conn, group)
                raise
            else:
                self._release(conn, group)
            finally:
                held_open = self._settle(conn, group)
        finally:
            self._write_lock.release()
            if held_open:
                asyncio.get_running_loop().call_soon(self._commit_if_idle)
        await asyncio.shield(group.done)

    def _join(self, conn: sqlite3.Connection) -> _Group:
        group = self._group
        with driver_errors(self._path):
            if group is None:
                conn.execute("BEGIN IMMEDIATE")
                group = self._group = _Group(asyncio.get_running_loop().create_future())
            else:
                conn.execute("SAVEPOINT member")
        group.members += 1
        return group

    def _undo(self, conn: sqlite3.Connection, group: _Group) -> None:
        """Rolls back the failed member's writes only; the whole transaction when it is the
        group's first member, or when SQLite already ended it."""
        if group.members > 1 and conn.in_transaction:
            try:
                conn.execute("ROLLBACK TO member")
                conn.execute("RELEASE member")
                return
            except sqlite3.Error as exc:
                log.warning("rollback to a savepoint failed on %s: %s", self._path, exc)
        self._end_group(group, lost=group.members > 1)
        self._rollback(conn)

    def _release(self, conn: sqlite3.Connection, group: _Group) -> None:
        """Folds a successful member's savepoint into the group's transaction."""
        if group.members > 1 and conn.in_transaction:
            try:
                conn.execute("RELEASE member")
            except sqlite3.Error as exc:
                log.warning("releasing a savepoint failed on %s: %s", self._path, exc)
                self._end_group(group, lost=True)
                self._rollback(conn)

    def _settle(self, conn: sqlite3.Connection, group: _Group) -> bool:
        """After a member: keep the transaction open for the writers of this turn of the
        loop (True), or commit the group now when it is full."""
        if self._group is not group:  # ended by `_undo`
            return False
        if not conn.in_transaction:  # SQLite ended it on its own: nothing of it is left
            self._end_group(group, lost=True)
            return False
        if group.members < GROUP_LIMIT:
            return True
        self._commit(conn, group)
        return False

    def _commit_open_group(self) -> None:
        """For a holder of the lock that is not a writer: a group left open is committed
        first, or it would wait for the next writer."""
        if self._group is not None and self._writer is not None:
            self._commit(self._writer, self._group)

    def _commit_if_idle(self) -> None:
        """Commits the open group, unless a writer holds the lock: that one settles the group
        itself when it is done."""
        group, conn = self._group, self._writer
        if group is not None and conn is not None and not self._write_lock.locked():
            self._commit(conn, group)

    def _commit(self, conn: sqlite3.Connection, group: _Group) -> None:
        try:
            with driver_errors(self._path):
                conn.execute("COMMIT")
        except Exception as exc:
            self._rollback(conn)
            self._end_group(group, error=exc)
            return
        self._end_group(group)
        self._after_commit()

    def _end_group(
        self, group: _Group, *, lost: bool = False, error: BaseException | None = None
    ) -> None:
        if self._group is group:
            self._group = None
        if group.done.done():
            return
        if lost:
            error = Unavailable(
                f"SQLite database {self._path}: the transaction was rolled back before it"
                " committed; nothing of it was written"
            )
        if error is None:
            group.done.set_result(None)
        else:
            group.done.set_exception(error)
            group.done.exception()  # retrieved here: a member may have stopped waiting

    @property
    def commits(self) -> int:
        """COMMITs made since the store opened (a group of writers makes one)."""
        return self._committed

    def _after_commit(self) -> None:
        self._committed += 1
        due = self._committed - self._checkpointed_at >= CHECKPOINT_EVERY
        if not due or self._checkpoint is not None:
            return
        self._checkpointed_at = self._committed
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        self._checkpoint = asyncio.ensure_future(self._run_checkpoint(checkpointer))
        self._checkpoint.add_done_callback(self._checkpointed)

    async def _run_checkpoint(self, checkpointer: sqlite3.Connection) -> None:
        """Copies the WAL back in a worker thread while writers go on, then catches up on
        the frames they added with writers held off for that short moment: only a WAL that
        is checkpointed to its end is restarted by the next writer instead of growing."""
        await asyncio.to_thread(_checkpoint, checkpointer)
        async with self._write_lock:
            self._commit_open_group()
            await asyncio.to_thread(_checkpoint, checkpointer)

    async def checkpointed(self) -> None:
        """Returns once no background checkpoint is running."""
        if self._checkpoint is not None:
            await asyncio.gather(self._checkpoint, return_exceptions=True)

    def _checkpointed(self, done: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if not done.cancelled() and done.exception() is not None:
            # Best-effort: the WAL only grows until the next checkpoint succeeds.
            log.warning("WAL checkpoint of %s failed: %s", self._path, done.exception())

    def _rollback(self, conn: sqlite3.Connection) -> None:
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            # The original exception is the one worth raising; the connection stays usable
            # because SQLite ends the transaction on a failed rollback anyway.
            log.warning("rollback failed on SQLite database %s: %s", self._path, exc)

    @asynccontextmanager
    async def leader(self, key: str) -> AsyncIterator[bool]:
        # One process is the only possible holder: a set of held keys is the whole lock.
        if key in self._leaders:
            yield False
            return
        self._leaders.add(key)
        try:
            yield True
        finally:
            self._leaders.discard(key)

    # -- committed reads -----------------------------------------------------------------
    def _connection(self, conn: sqlite3.Connection | None) -> sqlite3.Connection:
        if conn is None:
            raise Unavailable(f"SQLite database {self._path} is not open")
        return conn

    def _read(
        self,
        query: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        conn = self._connection(self._reader)
        with driver_errors(self._path):
            return query(conn, *args, **kwargs)

    async def get_execution(self, execution_id: str) -> Execution:
        return self._read(executions.get, execution_id)

    async def find_execution(self, agent_id: str, idempotency_key: str) -> Execution | None:
        return self._read(executions.find, agent_id, idempotency_key)

    async def get_own_policy(self, execution_id: str) -> str | None:
        return self._read(executions.get_own_policy, execution_id)

    async def get_state(self, execution_id: str) -> RawJson | None:
        return self._read(executions.get_state, execution_id)

    async def list_resources(self, execution_id: str) -> list[Resource]:
        return self._read(resources.list_resources, execution_id)

    async def list_checkpoints(self, execution_id: str) -> list[Checkpoint]:
        return self._read(checkpoints.list_for, execution_id)

    async def get_restoration(self, execution_id: str) -> RawJson | None:
        return self._read(executions.get_restoration, execution_id)

    async def list_executions(self, flt: ExecutionFilter) -> Page[Execution]:
        return self._read(executions.list_page, flt)

    async def list_events(
        self,
        execution_id: str,
        after_seq: int,
        limit: int,
        payload_limit: int = LISTED_PAYLOAD_BYTES,
    ) -> list[Event]:
        return self._read(events.list_after, execution_id, after_seq, limit, payload_limit)

    async def list_steps(
        self, execution_id: str, status: str | None, payload_limit: int = LISTED_PAYLOAD_BYTES
    ) -> list[Step]:
        return self._read(steps.list_for, execution_id, status, payload_limit)

    async def get_step(self, step_id: str) -> Step | None:
        return self._read(steps.find, step_id)

    async def load_completion(
        self, execution_id: str, step_id: str, dispatch_id: str
    ) -> Completion:
        return self._read(load_completion, execution_id, step_id, dispatch_id)

    async def load_step_history(self, execution_id: str) -> StepHistory:
        return self._read(_load_step_history, execution_id)

    async def get_agent(self, agent_id: str, *, metadata: bool = True) -> Agent:
        return self._read(agents.get, agent_id, metadata)

    async def list_agents(self) -> list[Agent]:
        return self._read(agents.list_all)

    async def find_api_key(self, key_id: str) -> ApiKey | None:
        return self._read(api_keys.find, key_id)

    async def list_api_keys(self) -> list[ApiKey]:
        return self._read(api_keys.list_all)

    async def get_approval(self, approval_id: str) -> Approval:
        return self._read(approvals.get, approval_id)

    async def list_approvals(
        self, status: ApprovalStatus | None, execution_id: str | None
    ) -> list[Approval]:
        return self._read(approvals.list_matching, status, execution_id)

    # -- dispatch queue ------------------------------------------------------------------
    async def claim_dispatches(
        self, replica_id: str, limit: int, now: datetime
    ) -> list[ClaimedDispatch]:
        if limit <= 0:
            return []
        async with self._write() as conn:
            with driver_errors(self._path):
                return dispatches.claim(conn, replica_id, limit, now)

    async def dispatch_queue(self, now: datetime) -> tuple[int, datetime | None]:
        return self._read(dispatches.queue, now)

    async def watch_dispatches(
        self,
        wake: Callable[[], None],
        ended: Callable[[str], None] | None = None,
        touched: Callable[[str], None] | None = None,
    ) -> None:
        # Every enqueuer lives in this process and wakes its own loop.
        return

    async def reclaim_expired(self, now: datetime, default_lease: timedelta) -> int:
        total = 0
        while True:
            # One page per transaction, so a large backlog never holds the writer for long.
            async with self._write() as conn:
                with driver_errors(self._path):
                    reclaimed = dispatches.reclaim_page(conn, now, default_lease)
            total += reclaimed
            if reclaimed < dispatches.RECLAIM_PAGE:
                return total

    async def set_dispatch_instance(
        self, dispatch_id: str, attempt: int, instance: AgentInstance
    ) -> None:
        async with self._write() as conn:
            with driver_errors(self._path):
                dispatches.set_instance(conn, dispatch_id, attempt, instance)

    async def list_superseded_dispatches(
        self, agent_id: str, instance: AgentInstance, limit: int
    ) -> list[Dispatch]:
        return self._read(dispatches.list_superseded, agent_id, instance, limit)

    # -- background sweeps ---------------------------------------------------------------
    async def list_expired_approvals(self, now: datetime, limit: int, after: str = "") -> list[str]:
        return self._read(approvals.list_expired, now, limit, after)

    async def list_overdue_executions(
        self, now: datetime, limit: int, after: str = ""
    ) -> list[str]:
        return self._read(executions.list_overdue, now, limit, after)

    async def list_sessions_to_admit(self, limit: int) -> list[str]:
        return self._read(executions.sessions_to_admit, limit)

    async def list_expired_sessions(self, cutoff: datetime, limit: int) -> list[str]:
        return self._read(executions.expired_sessions, cutoff, limit)

    async def list_children(self, execution_id: str) -> list[Execution]:
        return self._read(executions.children, execution_id)

    async def list_lineage_repairs(self, limit: int) -> LineageRepairs:
        return self._read(_lineage_repairs, limit)

    async def delete_terminal_before(self, cutoff: datetime) -> int:
        total = 0
        while True:
            async with self._write() as conn:
                with driver_errors(self._path):
                    deleted = executions.delete_terminal_before(conn, cutoff, _RETENTION_PAGE)
            total += deleted
            if deleted < _RETENTION_PAGE:
                break
        async with self._write() as conn:
            with driver_errors(self._path):
                rate_buckets.delete_before(conn, cutoff)
        return total

    async def remember_request(
        self, digest: bytes, now: datetime, until: datetime
    ) -> datetime | None:
        async with self._write() as conn:
            with driver_errors(self._path):
                return seen_requests.remember(conn, digest, now, until)

    async def forget_requests(self, now: datetime) -> int:
        async with self._write() as conn:
            with driver_errors(self._path):
                return seen_requests.forget_before(conn, now)


def _checkpoint(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()


def _connect(
    path: str, read_only: bool = False, check_same_thread: bool = True
) -> sqlite3.Connection:
    # isolation_level=None: the store issues BEGIN/COMMIT itself.
    conn = sqlite3.connect(
        path, isolation_level=None, cached_statements=256, check_same_thread=check_same_thread
    )
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.DatabaseError(f"WAL journal mode unavailable (got {mode})")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        if read_only:
            conn.execute("PRAGMA query_only = ON")
    except BaseException:
        conn.close()
        raise
    return conn


def _select_one(conn: sqlite3.Connection) -> None:
    conn.execute("SELECT 1").fetchone()


def _conforms(path: str) -> Store:
    """Never called: makes mypy check `SqliteStore` against the `Store` protocol."""
    return SqliteStore(path)


def _lineage_repairs(conn: sqlite3.Connection, limit: int) -> LineageRepairs:
    return LineageRepairs(
        unsettled=executions.unsettled_children(conn, limit),
        orphans=executions.orphans(conn, limit),
        stalled=executions.stalled(conn, limit),
    )


def _load_step_history(conn: sqlite3.Connection, execution_id: str) -> StepHistory:
    """Three reads, one snapshot: they run on the event loop thread with no await between
    them, and every commit does too."""
    return StepHistory(
        execution=executions.get(conn, execution_id),
        steps=steps.list_for(conn, execution_id, None),
        decisions=events.list_decisions(conn, execution_id, DECISION_TYPES),
    )
