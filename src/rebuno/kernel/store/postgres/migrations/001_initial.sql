-- The initial schema: tables and indexes. The triggers that guard terminal records, and the
-- functions they run, are in `functions.sql`.
-- JSON values are `text`, stored exactly as the kernel encoded them (never jsonb, which would
-- reorder keys and normalise numbers). Tables whose rows are updated in place many times keep
-- free space in each page (fillfactor), so those updates can stay on the page (HOT).

CREATE TABLE agents (
    id text PRIMARY KEY,
    webhook_url text NOT NULL,
    secret text NOT NULL,
    policy_bundle text,
    lease_timeout_seconds double precision,
    registered_at timestamptz NOT NULL
);

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
    last_event_seq bigint NOT NULL
) WITH (fillfactor = 80);

CREATE TABLE events (
    execution_id text NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    event_seq bigint NOT NULL,
    type text NOT NULL,
    payload text NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (execution_id, event_seq)
);

CREATE TABLE steps (
    step_id text PRIMARY KEY,
    execution_id text NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
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
    created_at timestamptz NOT NULL
);

CREATE TABLE dispatches (
    id text PRIMARY KEY,
    execution_id text NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    status text NOT NULL,
    attempt integer NOT NULL,
    max_attempts integer NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    locked_by text,
    locked_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
) WITH (fillfactor = 80);

CREATE TABLE dispatch_step_counters (
    dispatch_id text NOT NULL REFERENCES dispatches (id) ON DELETE CASCADE,
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

-- No index names `updated_at`, `locked_at` or `last_event_seq`: those move on every step and
-- every lease renewal, and leaving them unindexed keeps those updates HOT (no index writes).
-- The claim scans due rows in due order; the reaper scans the live leases only.
CREATE INDEX dispatches_due ON dispatches (next_attempt_at) WHERE status IN ('pending', 'failed');
CREATE INDEX dispatches_in_flight ON dispatches (id) WHERE status = 'in_flight';
CREATE INDEX dispatches_execution ON dispatches (execution_id);
CREATE INDEX steps_execution ON steps (execution_id, proposed_seq);
CREATE INDEX approvals_status ON approvals (status, timeout_at);
CREATE INDEX approvals_execution ON approvals (execution_id, created_at);
CREATE INDEX approvals_step ON approvals (step_id);
CREATE INDEX executions_status ON executions (status, deadline_at);
CREATE INDEX executions_agent ON executions (agent_id, id);

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
