"""The connection types, the advisory-lock key hash and the driver-error edge.

Everything here is shared by the store, its transactions and the dispatch listener: the
`Server` a URL names (`rebuno.kernel.pgserver`), and how a psycopg exception that means
something in the domain becomes the domain error for it.
Must import only psycopg, the domain, `rebuno.kernel.pgserver` and the standard library.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeAlias

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import TupleRow

from rebuno.kernel.domain.errors import Conflict, ExecutionTerminal, KernelError, NotFound
from rebuno.kernel.pgserver import Server, first_line
from rebuno.kernel.store.base import execution_lock

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]
Params: TypeAlias = Sequence[Any] | Mapping[str, Any]


class Result(Protocol):
    """The rows of one statement: a psycopg cursor, or what a transaction's session hands
    back (its rows arrive with the message the statement went out in)."""

    @property
    def rowcount(self) -> int: ...

    async def fetchone(self) -> TupleRow | None: ...

    async def fetchall(self) -> list[TupleRow]: ...


class Executor(Protocol):
    """What the query functions run their statements on: a pooled connection in autocommit
    (one committed statement each) or a transaction's session (see `transaction.py`)."""

    async def execute(self, query: str, params: Params | None = None) -> Result: ...


class Batch(Executor, Protocol):
    """A transaction's session, which can also send several statements in one round trip."""

    async def execute_many(self, statements: Sequence[tuple[str, Params | None]]) -> list[Result]:
        """Sends the statements together; one cursor each, whose results arrive together."""
        ...


_TERMINAL_EXECUTION = "RB001"
_TERMINAL_STEP = "RB002"
_UNKNOWN_AGENT = "RB003"


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `pg_advisory_*lock(bigint)`, the same on every replica."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def execution_lock_key(execution_id: str) -> int:
    return lock_key(execution_lock(execution_id))


def domain_error(exc: psycopg.Error, server: Server) -> Exception:
    """The domain error a driver error stands for; the driver error itself when it means
    nothing to the domain (a bug in a query is an internal error, not a conflict)."""
    if isinstance(exc, pg_errors.PipelineAborted):
        return KernelError(
            "the transaction was aborted by an earlier failed statement and cannot go on"
        )
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return server.unavailable(exc)
    message = exc.diag.message_primary or first_line(exc)
    detail = exc.diag.message_detail
    if exc.sqlstate == _TERMINAL_EXECUTION:
        return ExecutionTerminal(message)
    if exc.sqlstate == _TERMINAL_STEP:
        return Conflict(message)
    if exc.sqlstate == _UNKNOWN_AGENT:
        return NotFound(message)
    if isinstance(exc, pg_errors.UniqueViolation | pg_errors.ForeignKeyViolation):
        # The detail names the key and its values, e.g. `Key (id)=(...) already exists.`
        return Conflict(f"{message}: {detail}" if detail else message)
    return exc


@contextmanager
def translated(server: Server) -> Iterator[None]:
    """Raises, in place of a psycopg error, the domain error it stands for."""
    try:
        yield
    except psycopg.Error as exc:
        error = domain_error(exc, server)
        if error is exc:
            raise
        raise error from exc
