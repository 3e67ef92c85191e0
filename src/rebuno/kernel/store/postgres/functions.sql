-- Every function of the PostgreSQL store, and the triggers that run the guards. A booting
-- kernel applies this file after the migrations, under the same advisory lock and in one
-- transaction. Each statement either replaces (CREATE OR REPLACE) or looks before it acts, so
-- applying the file again changes nothing, and a database migrated by an older kernel ends up
-- with exactly what a new database gets. Migrations change the schema only.
-- A function whose arguments or result change cannot be replaced: a release that changes one
-- drops its older form first, at the top of this file, while that form can still be there.
--
-- Rows travel as JSON objects whose keys are the columns' names, read with
-- `jsonb_populate_record(set)` into the table's own row type. Timestamps are ISO 8601 text with
-- their offset; the JSON values of the records are JSON strings, so a text column receives
-- their exact text.

-- == Guards ==================================================================================

-- The guards hold against any writer, not just a careful service. Their SQLSTATEs (class RB,
-- unused by PostgreSQL) are what the store's edge turns into domain errors.
CREATE OR REPLACE FUNCTION rebuno_guard_terminal_execution() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
        OR NEW.output IS DISTINCT FROM OLD.output
        OR NEW.failure_reason IS DISTINCT FROM OLD.failure_reason
    THEN
        RAISE EXCEPTION 'execution % is %; its status and outcome are final', OLD.id, OLD.status
            USING ERRCODE = 'RB001';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION rebuno_guard_terminal_step() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
        OR NEW.result IS DISTINCT FROM OLD.result
        OR NEW.error IS DISTINCT FROM OLD.error
        OR NEW.completed_at IS DISTINCT FROM OLD.completed_at
    THEN
        RAISE EXCEPTION 'step % is %; its status and outcome are final', OLD.step_id, OLD.status
            USING ERRCODE = 'RB002';
    END IF;
    RETURN NEW;
END
$$;

-- Created only when missing: creating a trigger locks its table against writes, and replicas
-- already serving must not wait on a booting one.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger
        WHERE tgrelid = 'executions'::regclass AND tgname = 'executions_terminal_guard')
    THEN
        CREATE TRIGGER executions_terminal_guard
            BEFORE UPDATE ON executions
            FOR EACH ROW
            WHEN (OLD.status IN ('completed', 'failed', 'cancelled'))
            EXECUTE FUNCTION rebuno_guard_terminal_execution();
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger
        WHERE tgrelid = 'steps'::regclass AND tgname = 'steps_terminal_guard')
    THEN
        CREATE TRIGGER steps_terminal_guard
            BEFORE UPDATE ON steps
            FOR EACH ROW
            WHEN (OLD.status IN ('succeeded', 'failed', 'denied', 'cancelled'))
            EXECUTE FUNCTION rebuno_guard_terminal_step();
    END IF;
END
$$;

-- == Leases ==================================================================================

-- The strong lease check, written here once: the lease (a dispatch and its attempt) owns the
-- execution's live dispatch, which is `in_flight` at that attempt. When it does, it is renewed
-- (`locked_at = now`), and the answer is true. Expiry is the reaper's business: a lease past
-- its time owns the dispatch until the reaper has returned the dispatch to the queue, which
-- moves its status away from `in_flight`.
CREATE OR REPLACE FUNCTION rebuno_renew_lease(
    p_execution text, p_dispatch text, p_attempt integer, p_now timestamptz
) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE dispatches SET locked_at = p_now
    WHERE id = p_dispatch AND execution_id = p_execution AND attempt = p_attempt
        AND status = 'in_flight';
    RETURN FOUND;
END
$$;

-- == Writes ==================================================================================

-- One statement for all the writes of a use case. The kernel queues a use case's writes as a
-- JSON array of operations and sends them as one call, in the order they were made: the
-- client pays for one statement instead of one per row, and the triggers, keys and
-- constraints see exactly what separate statements would have done. An operation is an
-- object: `op` names it, and the other keys are the columns of its row (`append_events` and
-- `insert_steps` carry their rows under `rows`; `insert_dispatch` adds the enqueuing store's
-- `tag`).
CREATE OR REPLACE FUNCTION rebuno_apply(ops jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    e executions;
    s steps;
    d dispatches;
BEGIN
    FOR op IN SELECT jsonb_array_elements(ops) LOOP
        CASE op->>'op'
        WHEN 'append_events' THEN
            INSERT INTO events (execution_id, event_seq, type, payload, occurred_at)
            SELECT execution_id, event_seq, type, payload, occurred_at
            FROM jsonb_populate_recordset(NULL::events, op->'rows');
        WHEN 'update_step' THEN
            s := jsonb_populate_record(NULL::steps, op);
            UPDATE steps SET status = s.status, result = s.result, error = s.error,
                usage_input = s.usage_input, usage_output = s.usage_output,
                started_at = s.started_at, completed_at = s.completed_at
            WHERE step_id = s.step_id;
        WHEN 'insert_steps' THEN
            INSERT INTO steps (step_id, execution_id, kind, target, args_hash, occurrence,
                status, idempotency, args, result, error, usage_input, usage_output,
                proposed_seq, started_at, completed_at)
            SELECT step_id, execution_id, kind, target, args_hash, occurrence,
                status, idempotency, args, result, error, usage_input, usage_output,
                proposed_seq, started_at, completed_at
            FROM jsonb_populate_recordset(NULL::steps, op->'rows');
        WHEN 'update_execution' THEN
            e := jsonb_populate_record(NULL::executions, op);
            UPDATE executions SET status = e.status, output = e.output,
                failure_reason = e.failure_reason, updated_at = e.updated_at,
                last_event_seq = e.last_event_seq
            WHERE id = e.id;
            -- Delivered on commit: a replica holding a long poll on this execution answers
            -- at once instead of at its next look.
            IF e.status IN ('completed', 'failed', 'cancelled') THEN
                PERFORM pg_notify('rebuno_execution', e.id);
            ELSIF op->>'announce' IS NOT NULL THEN
                -- §40.5: the writer saw the status change (a step does not): the activity
                -- feeds of the other replicas look at it. An end is announced above.
                PERFORM pg_notify('rebuno_activity', (op->>'announce') || ' ' || e.id);
            END IF;
        WHEN 'insert_execution' THEN
            INSERT INTO executions (id, agent_id, agent_version, input, status, output,
                failure_reason, created_at, updated_at, deadline_at, last_event_seq,
                idempotency_key, parent_execution_id, created_by, on_behalf_of, session,
                admitted_at, spawned_by_execution_id, spawned_by_step_id, forked_from,
                fork_seq, policy_bundle)
            SELECT id, agent_id, agent_version, input, status, output,
                failure_reason, created_at, updated_at, deadline_at, last_event_seq,
                idempotency_key, parent_execution_id, created_by, on_behalf_of, session,
                admitted_at, spawned_by_execution_id, spawned_by_step_id, forked_from, fork_seq,
                policy_bundle
            FROM jsonb_populate_record(NULL::executions, op);
            IF op->>'announce' IS NOT NULL THEN
                PERFORM pg_notify('rebuno_activity', (op->>'announce') || ' ' || (op->>'id'));
            END IF;
        WHEN 'admit_execution' THEN
            -- §24.3: a session's waiter is let run, with the parent chosen for it.
            UPDATE executions SET admitted_at = (op->>'admitted_at')::timestamptz,
                parent_execution_id = COALESCE(parent_execution_id, op->>'parent_execution_id')
            WHERE id = op->>'id';
        WHEN 'mark_parent' THEN
            UPDATE executions SET has_children = true WHERE id = op->>'id' AND NOT has_children;
        WHEN 'mark_resources' THEN
            UPDATE executions SET has_resources = true
            WHERE id = op->>'id' AND NOT has_resources;
        WHEN 'set_restoration' THEN
            UPDATE executions SET restoration = op->>'restoration' WHERE id = op->>'id';
        WHEN 'put_resource' THEN
            INSERT INTO resources AS r (execution_id, key, driver_id, configuration,
                coverage_reuse, every_steps, on_completion, registered_seq, generation, count,
                binding, checkpoint_ref)
            SELECT execution_id, key, driver_id, configuration, coverage_reuse, every_steps,
                on_completion, registered_seq, generation, count, binding, checkpoint_ref
            FROM jsonb_populate_record(NULL::resources, op)
            ON CONFLICT (execution_id, key) DO UPDATE SET every_steps = EXCLUDED.every_steps,
                on_completion = EXCLUDED.on_completion, generation = EXCLUDED.generation,
                count = EXCLUDED.count, binding = EXCLUDED.binding,
                checkpoint_ref = EXCLUDED.checkpoint_ref;
        WHEN 'insert_checkpoint' THEN
            INSERT INTO resource_checkpoints (execution_id, key, generation, checkpoint_ref,
                covered_seq, invalidated_seq)
            SELECT execution_id, key, generation, checkpoint_ref, covered_seq, invalidated_seq
            FROM jsonb_populate_record(NULL::resource_checkpoints, op);
        WHEN 'close_checkpoints' THEN
            UPDATE resource_checkpoints SET invalidated_seq = (op->>'seq')::bigint
            WHERE execution_id = op->>'execution_id' AND key = op->>'key'
                AND invalidated_seq IS NULL;
        WHEN 'set_affected_keys' THEN
            UPDATE steps SET affected_keys = NULLIF(op->'keys', 'null'::jsonb)
            WHERE step_id = op->>'step_id';
        WHEN 'set_state' THEN
            UPDATE executions SET state = op->>'state' WHERE id = op->>'id';
        WHEN 'set_occurrence' THEN
            INSERT INTO dispatch_step_counters AS c (dispatch_id, kind, target, args_hash,
                consumed)
            SELECT dispatch_id, kind, target, args_hash, consumed
            FROM jsonb_populate_record(NULL::dispatch_step_counters, op)
            ON CONFLICT (dispatch_id, kind, target, args_hash)
            DO UPDATE SET consumed = greatest(c.consumed, EXCLUDED.consumed);
        WHEN 'insert_dispatch' THEN
            INSERT INTO dispatches (id, execution_id, status, attempt, max_attempts,
                next_attempt_at, locked_by, locked_at, created_at, updated_at)
            SELECT id, execution_id, status, attempt, max_attempts,
                next_attempt_at, locked_by, locked_at, created_at, updated_at
            FROM jsonb_populate_record(NULL::dispatches, op);
            -- Delivered when (and only if) the transaction commits; the payload names the
            -- store that enqueued it, which has woken its own dispatch loop already.
            PERFORM pg_notify('rebuno_dispatch', COALESCE(op->>'tag', ''));
        WHEN 'update_dispatch' THEN
            d := jsonb_populate_record(NULL::dispatches, op);
            UPDATE dispatches SET status = d.status, attempt = d.attempt,
                next_attempt_at = d.next_attempt_at, locked_by = d.locked_by,
                locked_at = d.locked_at, updated_at = d.updated_at
            WHERE id = d.id;
        WHEN 'retire_dispatches' THEN
            UPDATE dispatches SET status = 'exhausted', locked_by = NULL, locked_at = NULL,
                updated_at = (op->>'updated_at')::timestamptz
            WHERE execution_id = op->>'execution_id' AND status <> 'exhausted';
        ELSE
            RAISE EXCEPTION 'rebuno_apply: unknown operation %', op->>'op';
        END CASE;
    END LOOP;
END
$$;

-- `rebuno_apply` for a transaction that inserts an execution: refuses (RB003, "agent <id> not
-- found") when its agent is not registered, so creating an execution is this one statement
-- instead of a read of the agent followed by the writes.
CREATE OR REPLACE FUNCTION rebuno_apply_for_agent(p_agent text, ops jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM agents WHERE id = p_agent FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found', p_agent USING ERRCODE = 'RB003';
    END IF;
    PERFORM rebuno_apply(ops);
END
$$;

-- == The optimistic condition ==============================================================

-- The condition of an optimistic transaction (`store/base.py`, `Unchanged`), written here once:
-- `p_unchanged` is that value as a JSON object under its field names. Evaluated under the
-- execution's lock (the caller holds it); true while every clause holds:
--   `last_event_seq`: the execution is still at the record its writes were built from;
--   `childless` (when true): no sub-agent was started from it, as a child's create marks its
--     parent without moving it (§25.6);
--   `policy_hash` (when given): its policy bundle (its own, else its agent's; the empty text
--     when it has none) still hashes to it, as a policy change moves no execution (§35.6);
--   `lease` and `now` (when given): the lease's dispatch has used no occurrence counter, and
--     the lease owns the live dispatch, which is then renewed at `now`.
-- `status` decides what the writes announce (`update_execution`), not whether they apply. A
-- clause added here is added to the embedded store's `still_unchanged` too, with its test in
-- `tests/store/test_optimistic_condition.py`.
CREATE OR REPLACE FUNCTION rebuno_unchanged(p_execution text, p_unchanged jsonb)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    lease jsonb := NULLIF(p_unchanged->'lease', 'null');
    hashed text := p_unchanged->>'policy_hash';
BEGIN
    PERFORM 1 FROM executions e
    WHERE e.id = p_execution AND e.last_event_seq = (p_unchanged->>'last_event_seq')::bigint
        AND NOT (COALESCE((p_unchanged->>'childless')::boolean, false) AND e.has_children)
        AND (hashed IS NULL OR encode(sha256(convert_to(COALESCE(e.policy_bundle,
            (SELECT a.policy_bundle FROM agents a WHERE a.id = e.agent_id), ''), 'UTF8')),
            'hex') = hashed);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF lease IS NULL OR p_unchanged->>'now' IS NULL THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM dispatch_step_counters WHERE dispatch_id = lease->>'dispatch_id' LIMIT 1;
    RETURN NOT FOUND AND rebuno_renew_lease(p_execution, lease->>'dispatch_id',
        (lease->>'attempt')::integer, (p_unchanged->>'now')::timestamptz);
END
$$;

-- An optimistic transaction in one statement: `item` is an object of its `lock` (the
-- execution's advisory-lock key), `execution_id`, `unchanged` (the condition above) and `ops`
-- (`rebuno_apply`'s argument). Under that lock, the writes apply only while the condition
-- holds. Returns whether they did; when they did not, nothing was written and the caller does
-- the use case the ordinary way.
CREATE OR REPLACE FUNCTION rebuno_apply_unchanged(item jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock((item->>'lock')::bigint);
    RETURN rebuno_apply_if_unchanged(item);
END
$$;

-- The condition and the writes of `rebuno_apply_unchanged`, under the lock the caller holds.
CREATE OR REPLACE FUNCTION rebuno_apply_if_unchanged(item jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT rebuno_unchanged(item->>'execution_id', item->'unchanged') THEN
        RETURN false;
    END IF;
    PERFORM rebuno_apply(item->'ops');
    RETURN true;
END
$$;

-- A group commit (`store/postgres/group.py`): several optimistic transactions in one, each an
-- item of `rebuno_apply_unchanged`. Each lock is only tried, so a group never waits for one: a
-- member whose execution is locked did not apply. Returns, in order, whether each applied.
CREATE OR REPLACE FUNCTION rebuno_apply_unchanged_all(items jsonb) RETURNS boolean[]
LANGUAGE plpgsql AS $$
DECLARE
    item jsonb;
    applied boolean[] := '{}';
BEGIN
    FOR item IN SELECT jsonb_array_elements(items) LOOP
        IF pg_try_advisory_xact_lock((item->>'lock')::bigint) THEN
            applied := applied || rebuno_apply_if_unchanged(item);
        ELSE
            applied := applied || false;
        END IF;
    END LOOP;
    RETURN applied;
END
$$;

-- == Reads under the lock ====================================================================

-- The results name their columns after the tables': `e_` an execution's (`executions.COLUMNS`
-- in the store's Python), `s_` a step's (`steps.COLUMNS`), in those lists' order, so the store
-- maps each record from its own part of the row (`submissions.py`).

-- Everything a step submission reads, in one call: the execution's lock (unless the caller
-- holds it: `p_lock` NULL), the lease's strong check and renewal, the next occurrence, the
-- execution, its agent's policy bundle, the step recorded under that occurrence, and the
-- steps whose completions the request carries.
-- A VOLATILE function takes a fresh snapshot for each statement, so what it reads after the
-- lock includes everything committed before the lock was granted.
-- The first row (`tag` 0) is the submission; each carried step follows as a row with `tag` 1
-- that fills only the step columns.
CREATE OR REPLACE FUNCTION rebuno_load_submission(
    p_lock bigint, p_execution text, p_dispatch text, p_attempt integer, p_now timestamptz,
    p_kind text, p_target text, p_args_hash text, p_carried text[]
) RETURNS TABLE (
    tag integer,
    e_id text, e_agent_id text, e_agent_version text, e_input text, e_status text,
    e_output text, e_failure_reason text, e_created_at timestamptz, e_updated_at timestamptz,
    e_deadline_at timestamptz, e_last_event_seq bigint, e_idempotency_key text,
    e_parent_execution_id text, e_created_by text, e_on_behalf_of text, e_session text,
    e_admitted_at timestamptz, e_spawned_by_execution_id text, e_spawned_by_step_id text,
    e_forked_from text, e_fork_seq bigint, e_has_children boolean, e_has_resources boolean,
    lease_live boolean, occurrence integer, policy_bundle text,
    s_step_id text, s_execution_id text, s_kind text, s_target text, s_args_hash text,
    s_occurrence integer, s_status text, s_idempotency text, s_args text, s_result text,
    s_error text, s_usage_input bigint, s_usage_output bigint, s_proposed_seq bigint,
    s_started_at timestamptz, s_completed_at timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    live boolean;
    next_occurrence integer;
BEGIN
    IF p_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(p_lock);
    END IF;
    live := rebuno_renew_lease(p_execution, p_dispatch, p_attempt, p_now);
    SELECT c.consumed + 1 INTO next_occurrence FROM dispatch_step_counters c
    WHERE c.dispatch_id = p_dispatch AND c.kind = p_kind AND c.target = p_target
        AND c.args_hash = p_args_hash;
    next_occurrence := COALESCE(next_occurrence, 0);
    RETURN QUERY
        SELECT 0, e.id, e.agent_id, e.agent_version, e.input, e.status, e.output,
            e.failure_reason, e.created_at, e.updated_at, e.deadline_at, e.last_event_seq,
            e.idempotency_key, e.parent_execution_id, e.created_by, e.on_behalf_of,
            e.session, e.admitted_at, e.spawned_by_execution_id, e.spawned_by_step_id,
            e.forked_from, e.fork_seq, e.has_children, e.has_resources,
            live, next_occurrence, COALESCE(e.policy_bundle, a.policy_bundle),
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
        -- By primary key alone; the caller keeps only the steps of this execution. The same
        -- columns, the execution's joined on nothing.
        RETURN QUERY
            SELECT 1, e.id, e.agent_id, e.agent_version, e.input, e.status, e.output,
                e.failure_reason, e.created_at, e.updated_at, e.deadline_at, e.last_event_seq,
                e.idempotency_key, e.parent_execution_id, e.created_by, e.on_behalf_of,
                e.session, e.admitted_at, e.spawned_by_execution_id, e.spawned_by_step_id,
                e.forked_from, e.fork_seq, e.has_children, e.has_resources,
                NULL::boolean, NULL::integer, NULL::text,
                s.step_id, s.execution_id, s.kind, s.target, s.args_hash, s.occurrence,
                s.status, s.idempotency, s.args, s.result, s.error, s.usage_input,
                s.usage_output, s.proposed_seq, s.started_at, s.completed_at
            FROM steps s LEFT JOIN executions e ON false
            WHERE s.step_id = ANY(p_carried);
    END IF;
END
$$;

-- What completing, failing or heart-beating an execution reads, and what recording a webhook's
-- acknowledgement reads, in one call: the execution's lock (unless `p_lock` is NULL), the
-- lease's strong check and renewal (when a dispatch is given), the execution and its agent's
-- policy bundle. Like `rebuno_load_submission`, it reads after the lock with fresh snapshots.
CREATE OR REPLACE FUNCTION rebuno_lock_execution(
    p_lock bigint, p_execution text, p_dispatch text, p_attempt integer, p_now timestamptz
) RETURNS TABLE (
    e_id text, e_agent_id text, e_agent_version text, e_input text, e_status text,
    e_output text, e_failure_reason text, e_created_at timestamptz, e_updated_at timestamptz,
    e_deadline_at timestamptz, e_last_event_seq bigint, e_idempotency_key text,
    e_parent_execution_id text, e_created_by text, e_on_behalf_of text, e_session text,
    e_admitted_at timestamptz, e_spawned_by_execution_id text, e_spawned_by_step_id text,
    e_forked_from text, e_fork_seq bigint, e_has_children boolean, e_has_resources boolean,
    lease_live boolean, policy_bundle text
) LANGUAGE plpgsql AS $$
DECLARE
    live boolean := false;
BEGIN
    IF p_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(p_lock);
    END IF;
    IF p_dispatch IS NOT NULL THEN
        live := rebuno_renew_lease(p_execution, p_dispatch, p_attempt, p_now);
    END IF;
    RETURN QUERY
        SELECT e.id, e.agent_id, e.agent_version, e.input, e.status, e.output,
            e.failure_reason, e.created_at, e.updated_at, e.deadline_at, e.last_event_seq,
            e.idempotency_key, e.parent_execution_id, e.created_by, e.on_behalf_of,
            e.session, e.admitted_at, e.spawned_by_execution_id, e.spawned_by_step_id,
            e.forked_from, e.fork_seq, e.has_children, e.has_resources,
            live, COALESCE(e.policy_bundle, a.policy_bundle)
        FROM executions e
        LEFT JOIN agents a ON a.id = e.agent_id
        WHERE e.id = p_execution;
END
$$;
