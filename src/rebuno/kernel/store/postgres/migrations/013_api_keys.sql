-- Scoped API keys (docs/protocol.md §34): a key's name and scopes, and the SHA-256 of its
-- whole token; the token itself is never stored. A key is never deleted (revoked ones stay,
-- so every `key:<id>` the log records keeps its name), and its scopes never change.
CREATE TABLE api_keys (
    id text PRIMARY KEY,
    name text NOT NULL,
    scopes jsonb NOT NULL,
    secret_hash bytea NOT NULL,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz,
    created_by text
);
