-- Each account's Sieve scripts (RFC 5804, managed over ManageSieve or with
-- `mailcluster sieve`): at most one of them active, the one delivery runs.
CREATE TABLE sieve_scripts (
    account_id INTEGER NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    source     BLOB NOT NULL,
    size       INTEGER NOT NULL,
    active     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, name)
);
CREATE UNIQUE INDEX sieve_scripts_one_active ON sieve_scripts (account_id) WHERE active;
-- What the scripts' vacation (RFC 5230) and duplicate (RFC 7352) tests
-- remember: `key` is a SHA-256 of what was seen (a sender and a vacation
-- handle, or a duplicate's unique id). Times in microseconds since the epoch.
-- Rows past `expires_at` are pruned.
CREATE TABLE sieve_seen (
    account_id INTEGER NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    kind       INTEGER NOT NULL,
    key        BLOB NOT NULL,
    seen_at    INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (account_id, kind, key)
);
CREATE INDEX sieve_seen_expiry ON sieve_seen (expires_at);
