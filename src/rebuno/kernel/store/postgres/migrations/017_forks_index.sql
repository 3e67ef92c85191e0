-- An execution's forks are listed by their source (`GET /v0/executions?forked_from=`, §5.1),
-- as its continuations and sub-agents are by the indexes of 012; only forks have an entry.
CREATE INDEX executions_forked_from ON executions (forked_from)
    WHERE forked_from IS NOT NULL;
