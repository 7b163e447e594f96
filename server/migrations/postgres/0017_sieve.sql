-- Each account's Sieve scripts (RFC 5804, managed over ManageSieve or with
-- `mailcluster sieve`): at most one of them active, the one delivery runs.
CREATE TABLE sieve_scripts (
    account_id BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    source     BYTEA NOT NULL,
    size       BIGINT NOT NULL,
    active     BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (account_id, name)
);
CREATE UNIQUE INDEX sieve_scripts_one_active ON sieve_scripts (account_id) WHERE active;
-- What the scripts' vacation (RFC 5230) and duplicate (RFC 7352) tests
-- remember, shared by every pod: `key` is a SHA-256 of what was seen (a
-- sender and a vacation handle, or a duplicate's unique id), so its length
-- does not depend on the script or the message. Rows past `expires_at` are
-- pruned.
CREATE TABLE sieve_seen (
    account_id BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind       SMALLINT NOT NULL,
    key        BYTEA NOT NULL,
    seen_at    TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (account_id, kind, key)
);
CREATE INDEX sieve_seen_expiry ON sieve_seen (expires_at);
