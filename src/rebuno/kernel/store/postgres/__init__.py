"""The PostgreSQL backend of the `Store` protocol; `server.py` is its only importer.

Must import only psycopg, psycopg_pool, `rebuno.kernel.store.base`, the domain and this
package (never the SQLite backend, the services or the API).
"""

from rebuno.kernel.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
