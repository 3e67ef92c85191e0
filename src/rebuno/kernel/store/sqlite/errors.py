"""Translation of sqlite3 exceptions into domain errors, at the edge of the SQLite store.

A trigger refusal or a constraint violation means something to the domain (`ExecutionTerminal`,
`Conflict`); anything else from the driver is `Unavailable` or an internal `KernelError`, so no
sqlite3 exception type ever leaves this package.
Must import only the standard library and `rebuno.kernel.domain`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from rebuno.kernel.domain.errors import Conflict, ExecutionTerminal, KernelError, Unavailable


@contextmanager
def refusals(subject: str) -> Iterator[None]:
    """Turns an integrity violation raised while writing `subject` (for example
    `"execution 0190…"`) into the domain error it stands for."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        raise _refusal(exc, subject) from exc


def _refusal(exc: sqlite3.IntegrityError, subject: str) -> KernelError:
    text = str(exc)
    if text.startswith("execution_terminal"):
        return ExecutionTerminal(f"{subject} is terminal; its status and outcome are final")
    if text.startswith("step_terminal"):
        return Conflict(f"{subject} is terminal; its status and outcome are final")
    if text.startswith(("UNIQUE constraint failed", "PRIMARY KEY")):
        return Conflict(f"{subject} already exists")
    if text.startswith("FOREIGN KEY constraint failed"):
        return Conflict(f"{subject} refers to a record that does not exist")
    return KernelError(f"{subject} violates a database constraint: {text}")


@contextmanager
def driver_errors(path: str) -> Iterator[None]:
    """The catch-all around every store call: no sqlite3 exception escapes."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        raise KernelError(f"SQLite database {path}: constraint violated: {exc}") from exc
    except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
        raise Unavailable(f"SQLite database {path} is unavailable: {exc}") from exc
    except sqlite3.Error as exc:
        raise KernelError(f"SQLite database {path}: {exc}") from exc
