-- The foreign keys of the rows every step writes (events, steps, dispatches and a dispatch's
-- occurrence counters) go: PostgreSQL checks each with a query that also locks the parent
-- row, once per inserted row, about a sixth of the database's work for a run of ten steps.
-- Only the kernel writes these rows, in the transaction that holds their execution's lock and
-- read or inserted the execution there; the embedded store keeps the same keys enforced, and
-- the behavioural tests run on both. Retention now deletes the children itself. Approvals
-- (one per human decision) and executions (one per run) keep theirs.
ALTER TABLE events DROP CONSTRAINT events_execution_id_fkey;
ALTER TABLE steps DROP CONSTRAINT steps_execution_id_fkey;
ALTER TABLE dispatches DROP CONSTRAINT dispatches_execution_id_fkey;
ALTER TABLE dispatch_step_counters DROP CONSTRAINT dispatch_step_counters_dispatch_id_fkey;
