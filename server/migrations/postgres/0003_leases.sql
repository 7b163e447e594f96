-- Leases with an expiry: what the cache's locks (one POP3 session per maildrop)
-- and bounded lease sets (IMAP connections per account) fall back to while Redis
-- is unavailable, so they stay correct across pods instead of per pod. Rows of a
-- crashed pod stop counting when they expire; expired rows of a key are removed by
-- the next acquire of that key.
CREATE TABLE leases (
    key        TEXT NOT NULL,
    member     TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (key, member)
);
