"""The SQLite schema: tables, indexes and the triggers that guard terminal records.

Versioned with `PRAGMA user_version`: `apply_schema` creates the schema in a new file and
records `BASELINE`. Timestamps are INTEGER microseconds since the epoch (UTC); JSON values are
TEXT kept verbatim.
Must import only the standard library and `rebuno.kernel.domain`.
"""

from __future__ import annotations

import sqlite3

from rebuno.kernel.domain.errors import Unavailable

BASELINE = 8
"""The version of `SCHEMA`, which a new file is created at. The versions before it were
written by kernels before the first release; a file at one of them is refused, and created
anew."""

# Each statement's text is exactly what `sqlite_master` holds for it in every file at
# `BASELINE` (SQLite stores the text it was given, and columns it added later on the last
# line), so a new file is the same as any other at this version. The order of the statements
# is the order of their pages in a new file.
#
# `events` is clustered on its key (rows are small, always read in key order). `steps` keeps a
# rowid: results can be large. Its identity (execution, kind, target, args hash, occurrence)
# needs no index of its own: the step id is a hash of exactly that tuple. An execution's
# origin (§27) follows its state: its idempotency key (one execution per agent and key), the
# completed execution it continues, who created it and for whom, and the `state` it was
# completed with; the session it is a turn of and when it was admitted (§24); the execution
# and step that started it as a sub-agent (§25); a fork's source, seq and own bundle (§26);
# whether a resource is registered in it and what a fork restored (§33). An agent's metadata
# (§36) is kept across re-registrations and goes with the row. A dispatch names the agent
# instance that acknowledged its current attempt (`agent-instances`; set with the
# acknowledgement, cleared by the next claim), so a new incarnation of that instance can have
# it reclaimed.
_TABLES = (
    """CREATE TABLE agents (
        id TEXT PRIMARY KEY,
        webhook_url TEXT NOT NULL,
        secret TEXT NOT NULL,
        policy_bundle TEXT,
        lease_timeout_seconds REAL,
        registered_at INTEGER NOT NULL
    , description TEXT, input_schema TEXT, output_schema TEXT, metadata_updated_at INTEGER)""",
    """CREATE TABLE executions (
        id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL REFERENCES agents (id),
        agent_version TEXT,
        input TEXT NOT NULL,
        status TEXT NOT NULL,
        output TEXT,
        failure_reason TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        deadline_at INTEGER,
        last_event_seq INTEGER NOT NULL
    , idempotency_key TEXT, parent_execution_id TEXT, created_by TEXT NOT NULL DEFAULT 'unknown',"""
    " on_behalf_of TEXT, state TEXT, session TEXT, admitted_at INTEGER,"
    " spawned_by_execution_id TEXT, spawned_by_step_id TEXT, forked_from TEXT, fork_seq INTEGER,"
    " policy_bundle TEXT, has_children INTEGER NOT NULL DEFAULT 0,"
    " has_resources INTEGER NOT NULL DEFAULT 0, restoration TEXT)",
    """CREATE TABLE events (
        execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        event_seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        payload TEXT NOT NULL,
        occurred_at INTEGER NOT NULL,
        PRIMARY KEY (execution_id, event_seq)
    ) WITHOUT ROWID""",
    """CREATE TABLE steps (
        step_id TEXT PRIMARY KEY,
        execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        args_hash TEXT NOT NULL,
        occurrence INTEGER NOT NULL,
        status TEXT NOT NULL,
        idempotency TEXT NOT NULL,
        args TEXT,
        result TEXT,
        error TEXT,
        usage_input INTEGER,
        usage_output INTEGER,
        proposed_seq INTEGER NOT NULL,
        started_at INTEGER,
        completed_at INTEGER
    , affected_keys TEXT)""",
    """CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        step_id TEXT NOT NULL,
        execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        status TEXT NOT NULL,
        approvers TEXT,
        message TEXT,
        timeout_at INTEGER NOT NULL,
        decided_by TEXT,
        decided_at INTEGER,
        rationale TEXT,
        created_at INTEGER NOT NULL
    , asserted_by TEXT)""",
    """CREATE TABLE dispatches (
        id TEXT PRIMARY KEY,
        execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        status TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        next_attempt_at INTEGER NOT NULL,
        locked_by TEXT,
        locked_at INTEGER,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    , instance_name TEXT, instance_incarnation TEXT)""",
    """CREATE TABLE dispatch_step_counters (
        dispatch_id TEXT NOT NULL REFERENCES dispatches (id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        args_hash TEXT NOT NULL,
        consumed INTEGER NOT NULL,
        PRIMARY KEY (dispatch_id, kind, target, args_hash)
    ) WITHOUT ROWID""",
    """CREATE TABLE rate_buckets (
        key TEXT PRIMARY KEY,
        tokens REAL NOT NULL,
        max_tokens REAL NOT NULL,
        window_seconds REAL NOT NULL,
        updated_at INTEGER NOT NULL
    )""",
)

_INDEXES = (
    # Partial indexes: the claim and the reaper scan only live rows, in the order they need.
    """CREATE INDEX dispatches_due ON dispatches (next_attempt_at)
        WHERE status IN ('pending', 'failed')""",
    # Not on `locked_at`: every submission renews the lease, and an index on it would be
    # rewritten each time. The reaper reads the (few) in-flight rows and filters.
    """CREATE INDEX dispatches_in_flight ON dispatches (status) WHERE status = 'in_flight'""",
    "CREATE INDEX dispatches_execution ON dispatches (execution_id)",
    "CREATE INDEX steps_execution ON steps (execution_id, proposed_seq)",
    "CREATE INDEX approvals_status ON approvals (status, timeout_at)",
    "CREATE INDEX approvals_execution ON approvals (execution_id, created_at)",
    "CREATE INDEX approvals_step ON approvals (step_id)",
    "CREATE INDEX executions_status ON executions (status, deadline_at)",
    "CREATE INDEX executions_agent ON executions (agent_id, id)",
    """CREATE INDEX executions_retention ON executions (updated_at)
        WHERE status IN ('completed', 'failed', 'cancelled')""",
    "CREATE INDEX rate_buckets_updated ON rate_buckets (updated_at)",
)

# The guards hold against any writer, not just a careful service. Their messages start with a
# marker the store's edge turns into a domain error (see `errors.py`).
_TRIGGERS = (
    """CREATE TRIGGER executions_terminal_guard
        BEFORE UPDATE OF status, output, failure_reason ON executions
        WHEN OLD.status IN ('completed', 'failed', 'cancelled')
            AND (NEW.status IS NOT OLD.status
                 OR NEW.output IS NOT OLD.output
                 OR NEW.failure_reason IS NOT OLD.failure_reason)
        BEGIN SELECT RAISE(ABORT, 'execution_terminal'); END""",
    """CREATE TRIGGER steps_terminal_guard
        BEFORE UPDATE OF status, result, error, completed_at ON steps
        WHEN OLD.status IN ('succeeded', 'failed', 'denied', 'cancelled')
            AND (NEW.status IS NOT OLD.status
                 OR NEW.result IS NOT OLD.result
                 OR NEW.error IS NOT OLD.error
                 OR NEW.completed_at IS NOT OLD.completed_at)
        BEGIN SELECT RAISE(ABORT, 'step_terminal'); END""",
)

# Replay protection of `v1=` agent requests (§2.3): digests of accepted ones, until a copy's
# timestamp would be refused anyway; the sweep deletes the rows past `expires_at`.
_SEEN_REQUESTS = (
    """CREATE TABLE seen_requests (
        digest BLOB PRIMARY KEY,
        seen_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
    ) WITHOUT ROWID""",
    "CREATE INDEX seen_requests_expiry ON seen_requests (expires_at)",
)

# What an execution's origin is looked up by, and what it may hold once: one execution per
# agent and idempotency key, one sub-agent per step, one admitted live execution per session.
_ORIGIN_INDEXES = (
    """CREATE UNIQUE INDEX executions_spawned_by_step ON executions (spawned_by_step_id)
        WHERE spawned_by_step_id IS NOT NULL""",
    """CREATE INDEX executions_spawned_by ON executions (spawned_by_execution_id)
        WHERE spawned_by_execution_id IS NOT NULL""",
    "CREATE INDEX executions_session ON executions (session, id) WHERE session IS NOT NULL",
    """CREATE UNIQUE INDEX executions_session_holder ON executions (session)
        WHERE session IS NOT NULL AND admitted_at IS NOT NULL
            AND status IN ('pending', 'running', 'blocked')""",
    """CREATE UNIQUE INDEX executions_idempotency ON executions (agent_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL""",
    """CREATE INDEX executions_parent ON executions (parent_execution_id)
        WHERE parent_execution_id IS NOT NULL""",
)

_API_KEYS = (
    # Scoped API keys (§34): the SHA-256 of each whole token, never the token; keys are never
    # deleted, and their scopes (a JSON array) never change.
    """CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        scopes TEXT NOT NULL,
        secret_hash BLOB NOT NULL,
        created_at INTEGER NOT NULL,
        revoked_at INTEGER,
        created_by TEXT
    )""",
)

# External resources (§33): their metadata and checkpoints, child rows of their execution.
_RESOURCES = (
    """CREATE TABLE resources (
        execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        driver_id TEXT NOT NULL,
        configuration TEXT,
        coverage_reuse INTEGER NOT NULL,
        every_steps INTEGER NOT NULL,
        on_completion INTEGER NOT NULL,
        registered_seq INTEGER NOT NULL,
        generation INTEGER NOT NULL,
        count INTEGER NOT NULL,
        binding TEXT,
        checkpoint_ref TEXT,
        PRIMARY KEY (execution_id, key)
    ) WITHOUT ROWID""",
    """CREATE TABLE resource_checkpoints (
        id INTEGER PRIMARY KEY,
        execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        generation INTEGER NOT NULL,
        checkpoint_ref TEXT NOT NULL,
        covered_seq INTEGER NOT NULL,
        invalidated_seq INTEGER,
        CHECK (invalidated_seq IS NULL OR covered_seq < invalidated_seq)
    )""",
    "CREATE INDEX resource_checkpoints_execution ON resource_checkpoints (execution_id, key)",
    # An execution's forks, listed by their source (§5.1) as the indexes of its origin list
    # its continuations and sub-agents.
    """CREATE INDEX executions_forked_from ON executions (forked_from)
        WHERE forked_from IS NOT NULL""",
)

SCHEMA: tuple[str, ...] = (
    _TABLES + _INDEXES + _TRIGGERS + _SEEN_REQUESTS + _ORIGIN_INDEXES + _API_KEYS + _RESOURCES
)
"""The statements that create the schema of `BASELINE` in a new file, in order."""

MIGRATIONS: tuple[tuple[str, ...], ...] = ()
"""The changes since `BASELINE`: the n-th (from 1) takes a file from version `BASELINE + n - 1`
to `BASELINE + n`."""
LATEST = BASELINE + len(MIGRATIONS)


def apply_schema(conn: sqlite3.Connection, path: str) -> None:
    """Creates the schema in a new file and applies the missing migrations, in one immediate
    transaction (so two processes opening the same new file cannot both create it). Refuses a
    file at a version this kernel does not know, saying what to do."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _user_version(conn)
        _refuse_unknown(version, path)
        if version == 0:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {BASELINE}")
            version = BASELINE
        for number in range(version + 1, LATEST + 1):
            for statement in MIGRATIONS[number - BASELINE - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _refuse_unknown(version: int, path: str) -> None:
    if version > LATEST:
        raise Unavailable(
            f"SQLite database {path} has schema version {version}; "
            f"this kernel knows versions up to {LATEST}"
        )
    if 0 < version < BASELINE:
        raise Unavailable(
            f"SQLite database {path} has schema version {version}, written by a pre-release"
            " kernel, which this kernel cannot upgrade: move the file aside (or give --db-url"
            " a new path) and start again"
        )


def _user_version(conn: sqlite3.Connection) -> int:
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    return int(version)
