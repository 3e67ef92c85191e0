"""Translation of sqlite3 exceptions into domain errors, at the edge of the SQLite store.

A trigger refusal or a constraint violation means something to the domain (`ExecutionTerminal`,
`Conflict`); anything else from the driver is `Unavailable` or an internal `KernelError`, so no
sqlite3 exception type ever leaves this package.
Must import only the standard library and `rebuno.kernel.domain`.
"""

from __future__ import annotations

import sqlite3

from rebuno.kernel.domain.errors import (
    Conflict,
    ExecutionTerminal,
    KernelError,
    NotFound,
    Unavailable,
)


class refusals:
    """Turns an integrity violation raised while writing `subject` (for example
    `"execution 0190…"`) into the domain error it stands for. `missing`, when given, is what a
    failed foreign key means for this write (`"agent a-1 not found"`): a `NotFound`.

    A plain class rather than a generator context manager: it wraps every write of every
    step, where a generator's setup costs more than the statement it guards."""

    __slots__ = ("_missing", "_subject")

    def __init__(self, subject: str, missing: str = "") -> None:
        self._subject = subject
        self._missing = missing

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, sqlite3.IntegrityError):
            raise _refusal(exc, self._subject, self._missing) from exc


def _refusal(exc: sqlite3.IntegrityError, subject: str, missing: str) -> KernelError:
    text = str(exc)
    if missing and text.startswith("FOREIGN KEY constraint failed"):
        return NotFound(missing)
    if text.startswith("execution_terminal"):
        return ExecutionTerminal(f"{subject} is terminal; its status and outcome are final")
    if text.startswith("step_terminal"):
        return Conflict(f"{subject} is terminal; its status and outcome are final")
    if text.startswith(("UNIQUE constraint failed", "PRIMARY KEY")):
        return Conflict(f"{subject} already exists")
    if text.startswith("FOREIGN KEY constraint failed"):
        return Conflict(f"{subject} refers to a record that does not exist")
    return KernelError(f"{subject} violates a database constraint: {text}")


class driver_errors:
    """The catch-all around every store call: no sqlite3 exception escapes."""

    __slots__ = ("_path",)

    def __init__(self, path: str) -> None:
        self._path = path

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, sqlite3.Error):
            raise _driver_error(exc, self._path) from exc


def _driver_error(exc: sqlite3.Error, path: str) -> KernelError:
    if isinstance(exc, sqlite3.IntegrityError):
        return KernelError(f"SQLite database {path}: constraint violated: {exc}")
    if isinstance(exc, sqlite3.DatabaseError):
        return Unavailable(f"SQLite database {path} is unavailable: {exc}")
    return KernelError(f"SQLite database {path}: {exc}")
