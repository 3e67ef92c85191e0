-- An execution's origin (docs/protocol.md §27): the idempotency key it was created under (one
-- execution per agent and key), the completed execution it continues, who created it and for
-- whom, and the `state` its agent completed it with, which only the next execution reads.
-- Rows older than these columns were created by someone no longer known: `unknown`.
-- The parent carries no foreign key: a dangling id is still informative, and retention keeps
-- every parent a retained execution names.
ALTER TABLE executions
    ADD COLUMN idempotency_key text,
    ADD COLUMN parent_execution_id text,
    ADD COLUMN created_by text NOT NULL DEFAULT 'unknown',
    ADD COLUMN on_behalf_of text,
    ADD COLUMN state text;
CREATE UNIQUE INDEX executions_idempotency ON executions (agent_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX executions_parent ON executions (parent_execution_id)
    WHERE parent_execution_id IS NOT NULL;
ALTER TABLE approvals ADD COLUMN asserted_by text;
