-- Relay workers: see the PostgreSQL migration of the same name.
ALTER TABLE outbound_queue ADD COLUMN outcomes TEXT NOT NULL DEFAULT '[]';
ALTER TABLE outbound_queue ADD COLUMN delay_notified INTEGER NOT NULL DEFAULT 0;
