-- `rebuno_apply` inserts consecutive steps in one statement: `insert_steps` carries a list of
-- rows, each the values of one `insert_step` without its name, so the ten steps an end of a run
-- reports cost one INSERT instead of ten. `insert_step` stays for kernels not yet upgraded
-- during a rolling deploy. Otherwise the function is 005's.
CREATE OR REPLACE FUNCTION rebuno_apply(ops jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
BEGIN
    FOR op IN SELECT jsonb_array_elements(ops) LOOP
        CASE op->>0
        WHEN 'append_events' THEN
            INSERT INTO events (execution_id, event_seq, type, payload, occurred_at)
            SELECT e->>0, (e->>1)::bigint, e->>2, e->>3, (e->>4)::timestamptz
            FROM jsonb_array_elements(op->1) AS e;
        WHEN 'update_step' THEN
            UPDATE steps SET status = op->>2, result = op->>3, error = op->>4,
                usage_input = (op->>5)::bigint, usage_output = (op->>6)::bigint,
                started_at = (op->>7)::timestamptz, completed_at = (op->>8)::timestamptz
            WHERE step_id = op->>1;
        WHEN 'insert_steps' THEN
            INSERT INTO steps (step_id, execution_id, kind, target, args_hash, occurrence,
                status, idempotency, args, result, error, usage_input, usage_output,
                proposed_seq, started_at, completed_at)
            SELECT s->>0, s->>1, s->>2, s->>3, s->>4, (s->>5)::integer, s->>6, s->>7, s->>8,
                s->>9, s->>10, (s->>11)::bigint, (s->>12)::bigint, (s->>13)::bigint,
                (s->>14)::timestamptz, (s->>15)::timestamptz
            FROM jsonb_array_elements(op->1) AS s;
        WHEN 'insert_step' THEN
            INSERT INTO steps (step_id, execution_id, kind, target, args_hash, occurrence,
                status, idempotency, args, result, error, usage_input, usage_output,
                proposed_seq, started_at, completed_at)
            VALUES (op->>1, op->>2, op->>3, op->>4, op->>5, (op->>6)::integer, op->>7,
                op->>8, op->>9, op->>10, op->>11, (op->>12)::bigint, (op->>13)::bigint,
                (op->>14)::bigint, (op->>15)::timestamptz, (op->>16)::timestamptz);
        WHEN 'update_execution' THEN
            UPDATE executions SET status = op->>2, output = op->>3, failure_reason = op->>4,
                updated_at = (op->>5)::timestamptz, last_event_seq = (op->>6)::bigint
            WHERE id = op->>1;
            IF op->>2 IN ('completed', 'failed', 'cancelled') THEN
                PERFORM pg_notify('rebuno_execution', op->>1);
            END IF;
        WHEN 'insert_execution' THEN
            INSERT INTO executions (id, agent_id, agent_version, input, status, output,
                failure_reason, created_at, updated_at, deadline_at, last_event_seq)
            VALUES (op->>1, op->>2, op->>3, op->>4, op->>5, op->>6, op->>7,
                (op->>8)::timestamptz, (op->>9)::timestamptz, (op->>10)::timestamptz,
                (op->>11)::bigint);
        WHEN 'set_occurrence' THEN
            INSERT INTO dispatch_step_counters AS c (dispatch_id, kind, target, args_hash,
                consumed)
            VALUES (op->>1, op->>2, op->>3, op->>4, (op->>5)::integer)
            ON CONFLICT (dispatch_id, kind, target, args_hash)
            DO UPDATE SET consumed = greatest(c.consumed, EXCLUDED.consumed);
        WHEN 'insert_dispatch' THEN
            INSERT INTO dispatches (id, execution_id, status, attempt, max_attempts,
                next_attempt_at, locked_by, locked_at, created_at, updated_at)
            VALUES (op->>1, op->>2, op->>3, (op->>4)::integer, (op->>5)::integer,
                (op->>6)::timestamptz, op->>7, (op->>8)::timestamptz, (op->>9)::timestamptz,
                (op->>10)::timestamptz);
            -- Delivered when (and only if) the transaction commits; the payload names the
            -- store that enqueued it, which has woken its own dispatch loop already.
            PERFORM pg_notify('rebuno_dispatch', COALESCE(op->>11, ''));
        WHEN 'update_dispatch' THEN
            UPDATE dispatches SET status = op->>2, attempt = (op->>3)::integer,
                next_attempt_at = (op->>4)::timestamptz, locked_by = op->>5,
                locked_at = (op->>6)::timestamptz, updated_at = (op->>7)::timestamptz
            WHERE id = op->>1;
        WHEN 'retire_dispatches' THEN
            UPDATE dispatches SET status = 'exhausted', locked_by = NULL, locked_at = NULL,
                updated_at = (op->>2)::timestamptz
            WHERE execution_id = op->>1 AND status <> 'exhausted';
        ELSE
            RAISE EXCEPTION 'rebuno_apply: unknown operation %', op->>0;
        END CASE;
    END LOOP;
END
$$;
