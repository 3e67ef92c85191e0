-- Everything a step submission reads, in one call: the execution's lock, the lease's strong
-- check and renewal, the next occurrence, the execution, its agent's policy bundle, the step
-- recorded under that occurrence, and the steps whose completions the request carries.
-- A VOLATILE function takes a fresh snapshot for each statement, so what it reads after the
-- lock includes everything committed before the lock was granted.
-- The first row (`tag` 0) is the submission; each carried step follows as a row with `tag` 1
-- that fills only the step columns.
CREATE TYPE rebuno_submission AS (
    tag integer,
    e_id text, e_agent_id text, e_agent_version text, e_input text, e_status text,
    e_output text, e_failure_reason text, e_created_at timestamptz, e_updated_at timestamptz,
    e_deadline_at timestamptz, e_last_event_seq bigint,
    lease_live boolean, occurrence integer, policy_bundle text,
    s_step_id text, s_execution_id text, s_kind text, s_target text, s_args_hash text,
    s_occurrence integer, s_status text, s_idempotency text, s_args text, s_result text,
    s_error text, s_usage_input bigint, s_usage_output bigint, s_proposed_seq bigint,
    s_started_at timestamptz, s_completed_at timestamptz
);

CREATE FUNCTION rebuno_load_submission(
    p_lock bigint, p_execution text, p_dispatch text, p_attempt integer, p_now timestamptz,
    p_kind text, p_target text, p_args_hash text, p_carried text[]
) RETURNS SETOF rebuno_submission LANGUAGE plpgsql AS $$
DECLARE
    live boolean;
    next_occurrence integer;
BEGIN
    IF p_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(p_lock);
    END IF;
    UPDATE dispatches SET locked_at = p_now
    WHERE id = p_dispatch AND execution_id = p_execution AND attempt = p_attempt
        AND status = 'in_flight';
    live := FOUND;
    SELECT c.consumed + 1 INTO next_occurrence FROM dispatch_step_counters c
    WHERE c.dispatch_id = p_dispatch AND c.kind = p_kind AND c.target = p_target
        AND c.args_hash = p_args_hash;
    next_occurrence := COALESCE(next_occurrence, 0);
    RETURN QUERY
        SELECT 0, e.id, e.agent_id, e.agent_version, e.input, e.status, e.output,
            e.failure_reason, e.created_at, e.updated_at, e.deadline_at, e.last_event_seq,
            live, next_occurrence, a.policy_bundle,
            s.step_id, s.execution_id, s.kind, s.target, s.args_hash, s.occurrence, s.status,
            s.idempotency, s.args, s.result, s.error, s.usage_input, s.usage_output,
            s.proposed_seq, s.started_at, s.completed_at
        FROM executions e
        LEFT JOIN agents a ON a.id = e.agent_id
        LEFT JOIN steps s ON s.execution_id = e.id AND s.kind = p_kind
            AND s.target = p_target AND s.args_hash = p_args_hash
            AND s.occurrence = next_occurrence
        WHERE e.id = p_execution;
    IF cardinality(p_carried) > 0 THEN
        -- By primary key alone; the caller keeps only the steps of this execution.
        RETURN QUERY
            SELECT 1, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text,
                NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                NULL::bigint, NULL::boolean, NULL::integer, NULL::text,
                s.step_id, s.execution_id, s.kind, s.target, s.args_hash, s.occurrence,
                s.status, s.idempotency, s.args, s.result, s.error, s.usage_input,
                s.usage_output, s.proposed_seq, s.started_at, s.completed_at
            FROM steps s WHERE s.step_id = ANY(p_carried);
    END IF;
END
$$;
