-- Leases with an expiry (see the PostgreSQL migration of the same name). Times are
-- Unix microseconds, as elsewhere in this schema.
CREATE TABLE leases (
    key        TEXT NOT NULL,
    member     TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (key, member)
);
