-- An execution's origin (docs/protocol.md §27): the idempotency key it was created under (one
-- execution per agent and key), the completed execution it continues, who created it and for
-- whom, and the `state` its agent completed it with, which only the next execution reads.
-- Sessions (§24): the conversation it is a turn of, and when it was admitted; at most one
-- admitted execution of a session is live at a time, which the partial unique index backs.
-- Sub-agents (§25): the execution and step that started it (a step starts at most one), and
-- on the parent whether it has any, so that an end without children looks for none.
-- Forks (§26): the source and the event it was forked at, and the fork's own policy bundle,
-- which its steps are decided by instead of the agent's.
-- Rows older than these columns were created by someone no longer known: `unknown`.
-- The parent carries no foreign key: a dangling id is still informative, and retention keeps
-- every parent a retained execution names.
ALTER TABLE executions
    ADD COLUMN idempotency_key text,
    ADD COLUMN parent_execution_id text,
    ADD COLUMN created_by text NOT NULL DEFAULT 'unknown',
    ADD COLUMN on_behalf_of text,
    ADD COLUMN state text,
    ADD COLUMN session text,
    ADD COLUMN admitted_at timestamptz,
    ADD COLUMN spawned_by_execution_id text,
    ADD COLUMN spawned_by_step_id text,
    ADD COLUMN forked_from text,
    ADD COLUMN fork_seq bigint,
    ADD COLUMN policy_bundle text,
    ADD COLUMN has_children boolean NOT NULL DEFAULT false;
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
ALTER TABLE approvals ADD COLUMN asserted_by text;
