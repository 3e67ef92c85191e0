"""The physical floor of one durable write, measured in the same run: a single client doing a
one-row INSERT and COMMIT in a loop, on a fresh PostgreSQL database (fsync on, default
settings), and for comparison on an SQLite file with the kernel's settings (WAL,
`synchronous = NORMAL`, which does not sync on commit).

Imports psycopg, sqlite3 and the bench's own modules only.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg

from bench.outcome import Context, Outcome
from bench.processes import fresh_store
from bench.stats import median

US = 1_000_000.0


def commit_floor(ctx: Context) -> Outcome:
    """`floor.<store>_commit`: the median INSERT+COMMIT time of each repetition. PostgreSQL's
    is measured when `ctx.store` is `postgres` (a run that benchmarks it)."""
    outcome = Outcome()
    workdir = ctx.workdir / "floor"
    workdir.mkdir(parents=True, exist_ok=True)
    commits = ctx.sizes.floor_commits
    if ctx.store == "postgres":
        with fresh_store("postgres", workdir) as store:
            reps = [_postgres(store.url, commits) for _ in range(ctx.sizes.reps)]
        outcome.add("floor.postgres_commit", "us", reps)
    sqlite = [_sqlite(workdir / f"floor-{rep}.db", commits) for rep in range(ctx.sizes.reps)]
    outcome.add("floor.sqlite_commit", "us", sqlite)
    return outcome


def _postgres(url: str, commits: int) -> float:
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id bigserial PRIMARY KEY, body text)")
        conn.commit()
        times = []
        for i in range(commits):
            started = time.perf_counter()
            conn.execute("INSERT INTO floor (body) VALUES (%s)", (f"row {i}",))
            conn.commit()
            times.append(time.perf_counter() - started)
    return median(times) * US


def _sqlite(path: Path, commits: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, body TEXT)")
        times = []
        for i in range(commits):
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (body) VALUES (?)", (f"row {i}",))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - started)
    finally:
        conn.close()
    return median(times) * US
