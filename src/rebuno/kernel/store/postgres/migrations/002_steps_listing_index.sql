-- Step lookups find a step by its identity (the unique key, or the step id). The index on
-- (execution_id, proposed_seq) let a plan cached while the table was small take it for those
-- lookups too, and then scan every step of the execution on each submission: a cost that grew
-- with the execution's history. Listing an execution's steps in proposal order now reads them
-- through the unique key's leading column and sorts; listings are rare, submissions are not.
DROP INDEX IF EXISTS steps_execution;
