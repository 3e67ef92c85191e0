-- What completing, failing or heart-beating an execution reads, and what recording a webhook's
-- acknowledgement reads, in one call: the execution's lock, the lease's strong check and
-- renewal (when a dispatch is given), the execution and its agent's policy bundle. Like
-- `rebuno_load_submission`, a VOLATILE function takes a fresh snapshot for each statement, so
-- what it reads after the lock includes everything committed before the lock was granted.
CREATE FUNCTION rebuno_lock_execution(
    p_lock bigint, p_execution text, p_dispatch text, p_attempt integer, p_now timestamptz
) RETURNS TABLE (
    e_id text, e_agent_id text, e_agent_version text, e_input text, e_status text,
    e_output text, e_failure_reason text, e_created_at timestamptz, e_updated_at timestamptz,
    e_deadline_at timestamptz, e_last_event_seq bigint,
    lease_live boolean, policy_bundle text
) LANGUAGE plpgsql AS $$
DECLARE
    live boolean := false;
BEGIN
    IF p_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(p_lock);
    END IF;
    IF p_dispatch IS NOT NULL THEN
        UPDATE dispatches SET locked_at = p_now
        WHERE id = p_dispatch AND execution_id = p_execution AND attempt = p_attempt
            AND status = 'in_flight';
        live := FOUND;
    END IF;
    RETURN QUERY
        SELECT e.id, e.agent_id, e.agent_version, e.input, e.status, e.output,
            e.failure_reason, e.created_at, e.updated_at, e.deadline_at, e.last_event_seq,
            live, a.policy_bundle
        FROM executions e
        LEFT JOIN agents a ON a.id = e.agent_id
        WHERE e.id = p_execution;
END
$$;

-- `rebuno_apply` for a transaction that inserts an execution: refuses (RB003, "agent <id> not
-- found") when its agent is not registered, so creating an execution is this one statement
-- instead of a read of the agent followed by the writes.
CREATE FUNCTION rebuno_apply_for_agent(p_agent text, ops jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM agents WHERE id = p_agent FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found', p_agent USING ERRCODE = 'RB003';
    END IF;
    PERFORM rebuno_apply(ops);
END
$$;
