-- Expunge tombstones are kept for a while, then pruned (Store::prune_tombstones).
-- `expunged_at` dates them; a mailbox's `expunged_floor` is the highest modseq of
-- a pruned tombstone, below which "what was expunged since N" can no longer be
-- listed and callers get the full UID list instead.
ALTER TABLE expunged ADD COLUMN expunged_at TIMESTAMPTZ NOT NULL DEFAULT now();
ALTER TABLE mailboxes ADD COLUMN expunged_floor BIGINT NOT NULL DEFAULT 0;
CREATE INDEX expunged_at ON expunged (expunged_at);
