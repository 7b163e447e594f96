-- Relay workers: what happened to each recipient so far (JSON array of
-- {recipient, status, reply, at}; `recipients` keeps only the ones still to
-- deliver) and whether the sender was told the message is late.
ALTER TABLE outbound_queue ADD COLUMN outcomes TEXT NOT NULL DEFAULT '[]';
ALTER TABLE outbound_queue ADD COLUMN delay_notified BOOLEAN NOT NULL DEFAULT false;
