-- What the sender asked of delivery status notifications (RFC 3461: RET, ENVID,
-- and each recipient's NOTIFY and ORCPT), as JSON; '{}' is the defaults.
ALTER TABLE outbound_queue ADD COLUMN dsn TEXT NOT NULL DEFAULT '{}';
