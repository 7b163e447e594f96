-- Storage quotas (IMAP QUOTA, RFC 9208, resource STORAGE).
--
-- Each link carries its message's size, so what needs sizes per mailbox (the
-- counters below, the POP3 listing, expunge and copy) reads the link table alone
-- and never the message table with its bodies. Backfilling it rewrites
-- mailbox_messages once.
ALTER TABLE mailbox_messages ADD COLUMN size BIGINT NOT NULL DEFAULT 0;
UPDATE mailbox_messages mm SET size = m.size FROM messages m WHERE m.id = mm.message_id;
-- every writer sets it from here on
ALTER TABLE mailbox_messages ALTER COLUMN size DROP DEFAULT;
-- Each mailbox keeps the octets of its messages beside its message count, in the
-- same row every writer already updates, so an account's usage is the sum over its
-- few mailboxes and never a scan of its messages. A message linked into two
-- mailboxes counts twice, as RFC 9208 counts it.
ALTER TABLE mailboxes ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
UPDATE mailboxes mb SET bytes = s.total
  FROM (SELECT mailbox_id, sum(size) AS total FROM mailbox_messages GROUP BY mailbox_id) s
 WHERE s.mailbox_id = mb.id;
-- Limits in octets; NULL is no limit. An account's own limit wins over its
-- domain's default.
ALTER TABLE accounts ADD COLUMN quota_bytes BIGINT;
ALTER TABLE domains ADD COLUMN default_quota_bytes BIGINT;
