-- External resources (docs/protocol.md §33): their metadata, one row per execution and key,
-- and their checkpoints, which cover the event boundaries from `covered_seq` up to (not
-- including) `invalidated_seq`. Both are child rows of their execution: retention deletes
-- them with it (`executions.py`). On steps, the keys each affects; on executions, whether any
-- resource is registered (so a step of one without reads nothing more) and what a fork
-- restored.
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
CREATE INDEX resource_checkpoints_execution ON resource_checkpoints (execution_id, key);
ALTER TABLE steps ADD COLUMN affected_keys jsonb;
ALTER TABLE executions
    ADD COLUMN has_resources boolean NOT NULL DEFAULT false,
    ADD COLUMN restoration text;
