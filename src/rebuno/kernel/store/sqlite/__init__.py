"""The SQLite backend: an embedded, single-process `Store` (`SqliteStore`).

Must not import `rebuno.kernel.store.postgres`, the service layer or the API.
"""

from rebuno.kernel.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
