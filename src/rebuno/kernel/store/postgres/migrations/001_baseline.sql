-- The schema: tables, keys and indexes. The store's functions, and the triggers that guard
-- terminal records, are in `functions.sql`, which every boot applies after the migrations.
-- JSON values are `text`, stored exactly as the kernel encoded them (never jsonb, which would
-- reorder keys and normalise numbers); only `api_keys.scopes` and `steps.affected_keys`, which
-- the kernel writes and reads as data, are jsonb. Tables whose rows are updated in place many
-- times keep free space in each page (fillfactor), so those updates can stay on the page (HOT).

CREATE TABLE agents (
    id text PRIMARY KEY,
    webhook_url text NOT NULL,
    secret text NOT NULL,
    policy_bundle text,
    lease_timeout_seconds double precision,
    registered_at timestamptz NOT NULL,
    -- What the agent publishes about itself (docs/protocol.md §36): a description and the JSON
    -- Schemas of its input and output, kept as the canonical JSON text received, and when it
    -- last published. A re-registration keeps them.
    description text,
    input_schema text,
    output_schema text,
    metadata_updated_at timestamptz
);

-- An execution's origin (§27) follows its state: the idempotency key it was created under,
-- the completed execution it continues (no foreign key: a dangling id still informs, and
-- retention keeps every parent a retained execution names), who created it and for whom, and
-- the `state` its agent completed it with; the session it is a turn of and when it was
-- admitted (§24); the execution and step that started it as a sub-agent, and whether it has
-- started any (§25), so that an end without children looks for none; a fork's source, the
-- event it was forked at and its own policy bundle (§26). Then whether any resource is
-- registered, so a step of one without reads nothing more, and what a fork restored (§33).
CREATE TABLE executions (
    id text PRIMARY KEY,
    agent_id text NOT NULL REFERENCES agents (id),
    agent_version text,
    input text NOT NULL,
    status text NOT NULL,
    output text,
    failure_reason text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    deadline_at timestamptz,
    last_event_seq bigint NOT NULL,
    idempotency_key text,
    parent_execution_id text,
    created_by text NOT NULL DEFAULT 'unknown',
    on_behalf_of text,
    state text,
    session text,
    admitted_at timestamptz,
    spawned_by_execution_id text,
    spawned_by_step_id text,
    forked_from text,
    fork_seq bigint,
    policy_bundle text,
    has_children boolean NOT NULL DEFAULT false,
    has_resources boolean NOT NULL DEFAULT false,
    restoration text
) WITH (fillfactor = 80);

-- The rows every step writes (events, steps, dispatches and a dispatch's occurrence counters)
-- carry no foreign key: PostgreSQL checks each with a query that also locks the parent row,
-- once per inserted row, about a sixth of the database's work for a run of ten steps. Only the
-- kernel writes these rows, in the transaction that holds their execution's lock and read or
-- inserted the execution there; the embedded store keeps the same keys enforced, and the
-- behavioural tests run on both. Retention deletes the children itself (`executions.py`).
-- Approvals (one per human decision) keep theirs.
CREATE TABLE events (
    execution_id text NOT NULL,
    event_seq bigint NOT NULL,
    type text NOT NULL,
    payload text NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (execution_id, event_seq)
);

-- `affected_keys`: the keys of the execution's resources the step affects (§33).
CREATE TABLE steps (
    step_id text PRIMARY KEY,
    execution_id text NOT NULL,
    kind text NOT NULL,
    target text NOT NULL,
    args_hash text NOT NULL,
    occurrence integer NOT NULL,
    status text NOT NULL,
    idempotency text NOT NULL,
    args text,
    result text,
    error text,
    usage_input bigint,
    usage_output bigint,
    proposed_seq bigint NOT NULL,
    started_at timestamptz,
    completed_at timestamptz,
    affected_keys jsonb,
    UNIQUE (execution_id, kind, target, args_hash, occurrence)
) WITH (fillfactor = 80);

CREATE TABLE approvals (
    id text PRIMARY KEY,
    step_id text NOT NULL,
    execution_id text NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    status text NOT NULL,
    approvers text[],
    message text,
    timeout_at timestamptz NOT NULL,
    decided_by text,
    decided_at timestamptz,
    rationale text,
    created_at timestamptz NOT NULL,
    asserted_by text
);

-- `instance_name`, `instance_incarnation` (`agent-instances`): who acknowledged the current
-- attempt, as the agent named itself (its instance name, stable across restarts of one process
-- slot, and the incarnation, fresh per start). Set when the acknowledgement is recorded,
-- cleared by the next claim; when a new incarnation of that name announces itself, the
-- attempts the older ones held are reclaimed at once. Not indexed: the announcement reads the
-- in-flight rows only, through `dispatches_in_flight`, and they change on every delivery.
CREATE TABLE dispatches (
    id text PRIMARY KEY,
    execution_id text NOT NULL,
    status text NOT NULL,
    attempt integer NOT NULL,
    max_attempts integer NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    locked_by text,
    locked_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    instance_name text,
    instance_incarnation text
) WITH (fillfactor = 80);

CREATE TABLE dispatch_step_counters (
    dispatch_id text NOT NULL,
    kind text NOT NULL,
    target text NOT NULL,
    args_hash text NOT NULL,
    consumed integer NOT NULL,
    PRIMARY KEY (dispatch_id, kind, target, args_hash)
) WITH (fillfactor = 80);

CREATE TABLE rate_buckets (
    key text PRIMARY KEY,
    tokens double precision NOT NULL,
    max_tokens double precision NOT NULL,
    window_seconds double precision NOT NULL,
    updated_at timestamptz NOT NULL
) WITH (fillfactor = 80);

-- Replay protection of `v1=` agent requests (§2.3): a digest of each accepted request whose
-- copy must not act again, when it was first accepted, and until when a copy's timestamp could
-- still verify. The sweep deletes the rows past `expires_at`.
CREATE TABLE seen_requests (
    digest bytea PRIMARY KEY,
    seen_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Scoped API keys (§34): a key's name and scopes, and the SHA-256 of its whole token; the
-- token itself is never stored. A key is never deleted (revoked ones stay, so every
-- `key:<id>` the log records keeps its name), and its scopes never change.
CREATE TABLE api_keys (
    id text PRIMARY KEY,
    name text NOT NULL,
    scopes jsonb NOT NULL,
    secret_hash bytea NOT NULL,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz,
    created_by text
);

-- External resources (§33): their metadata, one row per execution and key, and their
-- checkpoints, which cover the event boundaries from `covered_seq` up to (not including)
-- `invalidated_seq`. Both are child rows of their execution: retention deletes them with it.
CREATE TABLE resources (
    execution_id text NOT NULL,
    key text NOT NULL,
    driver_id text NOT NULL,
    configuration text,
    coverage_reuse boolean NOT NULL,
    every_steps integer NOT NULL,
    on_completion boolean NOT NULL,
    registered_seq bigint NOT NULL,
    generation bigint NOT NULL,
    count bigint NOT NULL,
    binding text,
    checkpoint_ref text,
    PRIMARY KEY (execution_id, key)
);

CREATE TABLE resource_checkpoints (
    id bigserial PRIMARY KEY,
    execution_id text NOT NULL,
    key text NOT NULL,
    generation bigint NOT NULL,
    checkpoint_ref text NOT NULL,
    covered_seq bigint NOT NULL,
    invalidated_seq bigint,
    CHECK (invalidated_seq IS NULL OR covered_seq < invalidated_seq)
);

-- No index names `updated_at`, `locked_at` or `last_event_seq`: those move on every step and
-- every lease renewal, and leaving them unindexed keeps those updates HOT (no index writes).
-- The claim scans due rows in due order; the reaper scans the live leases only.
CREATE INDEX dispatches_due ON dispatches (next_attempt_at) WHERE status IN ('pending', 'failed');
CREATE INDEX dispatches_in_flight ON dispatches (id) WHERE status = 'in_flight';
CREATE INDEX dispatches_execution ON dispatches (execution_id);
-- Steps are found by their identity (the unique key) or their id, and by nothing else: an
-- index on (execution_id, proposed_seq) let a plan cached while the table was small take it
-- for those lookups too, and then scan every step of the execution on each submission. Listing
-- an execution's steps in proposal order reads them through the unique key's leading column
-- and sorts; listings are rare, submissions are not.
CREATE INDEX approvals_status ON approvals (status, timeout_at);
CREATE INDEX approvals_execution ON approvals (execution_id, created_at);
CREATE INDEX approvals_step ON approvals (step_id);
CREATE INDEX executions_status ON executions (status, deadline_at);
CREATE INDEX executions_agent ON executions (agent_id, id);
CREATE INDEX seen_requests_expiry ON seen_requests (expires_at);
-- One execution per agent and idempotency key; at most one admitted execution of a session
-- live at a time; a step starts at most one sub-agent. The others list an execution's
-- continuations, session, sub-agents and forks; only the rows that have one have an entry.
CREATE UNIQUE INDEX executions_idempotency ON executions (agent_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX executions_parent ON executions (parent_execution_id)
    WHERE parent_execution_id IS NOT NULL;
CREATE INDEX executions_session ON executions (session, id) WHERE session IS NOT NULL;
CREATE UNIQUE INDEX executions_session_holder ON executions (session)
    WHERE session IS NOT NULL AND admitted_at IS NOT NULL
        AND status IN ('pending', 'running', 'blocked');
CREATE UNIQUE INDEX executions_spawned_by_step ON executions (spawned_by_step_id)
    WHERE spawned_by_step_id IS NOT NULL;
CREATE INDEX executions_spawned_by ON executions (spawned_by_execution_id)
    WHERE spawned_by_execution_id IS NOT NULL;
CREATE INDEX resource_checkpoints_execution ON resource_checkpoints (execution_id, key);
CREATE INDEX executions_forked_from ON executions (forked_from)
    WHERE forked_from IS NOT NULL;

-- lz4 decompresses several times faster than the default pglz. Dynamic SQL, so that a server
-- built without lz4 (or older than 14) reaches the handler and keeps its default.
DO $$
DECLARE
    col text;
BEGIN
    FOREACH col IN ARRAY ARRAY[
        'executions.input', 'executions.output', 'events.payload', 'steps.args',
        'steps.result', 'steps.error', 'agents.policy_bundle'
    ] LOOP
        EXECUTE format(
            'ALTER TABLE %I ALTER COLUMN %I SET COMPRESSION lz4',
            split_part(col, '.', 1), split_part(col, '.', 2)
        );
    END LOOP;
EXCEPTION
    WHEN feature_not_supported OR syntax_error OR invalid_parameter_value THEN
        RAISE NOTICE 'lz4 compression unavailable; JSON columns keep the server default';
END
$$;
