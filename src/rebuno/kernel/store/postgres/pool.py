"""`MostRecentFirstPool`: psycopg's connection pool, handing out the idle connection that was
returned last.

psycopg_pool keeps its idle connections in a queue: each request takes the one idle longest, so
a quiet kernel spreads a run of sequential statements over every pooled connection in turn. A
backend idle for seconds answers its next statement markedly slower than one in use (its caches
have gone cold): replaying a short history after a pause cost about 40 % more per step than a long
one. Taking the most recently returned connection instead, as PgBouncer does by default, keeps a
few backends busy and warm and lets the rest idle, however many the pool holds. The oldest idle
connections are still the first the pool closes when it shrinks.
Must import only psycopg_pool and this package.
"""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from rebuno.kernel.store.postgres.connection import Connection


class MostRecentFirstPool(AsyncConnectionPool[Connection]):
    # The signature is psycopg_pool's, timeout included.
    async def _get_ready_connection(self, timeout: float | None) -> Connection | None:  # noqa: ASYNC109
        # Connections come back on the right and are taken from the left: moving the newest
        # to the left makes the next take a stack's. The caller holds the pool's lock, and
        # nothing is awaited before the take.
        if len(self._pool) > 1:
            self._pool.rotate(1)
        return await super()._get_ready_connection(timeout)
