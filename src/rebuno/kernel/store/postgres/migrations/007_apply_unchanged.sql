-- An optimistic transaction in one statement: under the execution's lock, `rebuno_apply` only
-- while the execution is still at the `last_event_seq` its writes were built from; with a
-- dispatch, also only while that lease owns the live dispatch (renewed then) and the
-- dispatch has used no occurrence counter. Returns whether it applied; when it did not,
-- nothing was written and the caller does the use case the ordinary way.
CREATE FUNCTION rebuno_apply_unchanged(
    p_lock bigint, p_execution text, p_seq bigint, p_dispatch text, p_attempt integer,
    p_now timestamptz, ops jsonb
) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock);
    PERFORM 1 FROM executions WHERE id = p_execution AND last_event_seq = p_seq;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_dispatch IS NOT NULL THEN
        PERFORM 1 FROM dispatch_step_counters WHERE dispatch_id = p_dispatch LIMIT 1;
        IF FOUND THEN
            RETURN false;
        END IF;
        UPDATE dispatches SET locked_at = p_now
        WHERE id = p_dispatch AND execution_id = p_execution AND attempt = p_attempt
            AND status = 'in_flight';
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    END IF;
    PERFORM rebuno_apply(ops);
    RETURN true;
END
$$;
