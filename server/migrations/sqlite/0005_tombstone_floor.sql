-- Tombstone pruning: see the PostgreSQL migration of the same name. Times are Unix
-- microseconds; tombstones from before this migration count as old.
ALTER TABLE expunged ADD COLUMN expunged_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE mailboxes ADD COLUMN expunged_floor INTEGER NOT NULL DEFAULT 0;
CREATE INDEX expunged_at ON expunged (expunged_at);
