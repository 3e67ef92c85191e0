"""Connection settings, the advisory-lock key hash and the driver-error edge.

Everything here is shared by the store, its transactions and the dispatch listener: how a URL
becomes libpq parameters, how a server is named in messages (host and database, never the
password), and how a psycopg exception that means something in the domain becomes the domain
error for it.
Must import only psycopg, the domain and the standard library.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from rebuno.kernel.domain.errors import Conflict, ExecutionTerminal, KernelError, Unavailable

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]

_CONNECT_TIMEOUT_SECONDS = 5
_TERMINAL_EXECUTION = "RB001"
_TERMINAL_STEP = "RB002"


class Server:
    """One PostgreSQL server and database, as given by a `postgres://` or `postgresql://` URL."""

    __slots__ = ("_conninfo", "_password", "name")

    def __init__(self, url: str) -> None:
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            # libpq quotes the whole URL in its message, password included.
            reason = _first_line(exc).replace(url, "<url>")
            raise Unavailable(f"invalid PostgreSQL URL: {reason}") from None
        self._password = str(params.get("password") or "")
        self.name = _describe(params)
        self._conninfo = make_conninfo(url, **_session_defaults(params))

    @property
    def conninfo(self) -> str:
        """libpq parameters, password included: never log this."""
        return self._conninfo

    def reason(self, exc: BaseException) -> str:
        """The driver's message for `exc`, first line only, with the password masked."""
        text = _first_line(exc)
        return text.replace(self._password, "***") if self._password else text

    def unavailable(self, exc: BaseException) -> Unavailable:
        """An `Unavailable` naming this server (host, port, database) and the reason."""
        return Unavailable(f"PostgreSQL {self.name} is unavailable: {self.reason(exc)}")


def _session_defaults(params: dict[str, Any]) -> dict[str, Any]:
    # Timestamps come back in UTC whatever the server's or role's default time zone is.
    options = f"{params.get('options') or ''} -c TimeZone=UTC".strip()
    defaults: dict[str, Any] = {"options": options}
    if not params.get("connect_timeout"):
        defaults["connect_timeout"] = _CONNECT_TIMEOUT_SECONDS
    if not params.get("application_name"):
        defaults["application_name"] = "rebuno"
    return defaults


def _describe(params: dict[str, Any]) -> str:
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or "5432")
    database = str(params.get("dbname") or params.get("user") or "postgres")
    return f"{host}:{port}/{database}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `pg_advisory_*lock(bigint)`, the same on every replica."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def execution_lock_key(execution_id: str) -> int:
    return lock_key(f"execution:{execution_id}")


def domain_error(exc: psycopg.Error, server: Server) -> Exception:
    """The domain error a driver error stands for; the driver error itself when it means
    nothing to the domain (a bug in a query is an internal error, not a conflict)."""
    if isinstance(exc, pg_errors.PipelineAborted):
        return KernelError(
            "the transaction was aborted by an earlier failed statement and cannot go on"
        )
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return server.unavailable(exc)
    message = exc.diag.message_primary or _first_line(exc)
    detail = exc.diag.message_detail
    if exc.sqlstate == _TERMINAL_EXECUTION:
        return ExecutionTerminal(message)
    if exc.sqlstate == _TERMINAL_STEP:
        return Conflict(message)
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
