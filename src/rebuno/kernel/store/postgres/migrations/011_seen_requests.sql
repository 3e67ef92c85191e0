-- Replay protection of `v1=` agent requests (docs/protocol.md §2.3): a digest of each accepted
-- request whose copy must not act again, when it was first accepted, and until when a copy's
-- timestamp could still verify. The sweep deletes the rows past `expires_at`; the index is
-- what that delete scans.
CREATE TABLE seen_requests (
    digest bytea PRIMARY KEY,
    seen_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX seen_requests_expiry ON seen_requests (expires_at);
