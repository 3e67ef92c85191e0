-- `agent-instances`: who acknowledged a dispatch's current attempt, as the agent named itself
-- (its instance name, stable across restarts of one process slot, and the incarnation, fresh
-- per start). Set when the acknowledgement is recorded, cleared by the next claim. When a new
-- incarnation of that name announces itself, the attempts the older ones held are reclaimed
-- at once. No index: the announcement reads the in-flight rows only, through
-- `dispatches_in_flight`, and these columns change on every delivery.
ALTER TABLE dispatches ADD COLUMN instance_name text, ADD COLUMN instance_incarnation text;
