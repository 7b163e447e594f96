-- Storage quotas (IMAP QUOTA, RFC 9208, resource STORAGE).
--
-- Each link carries its message's size, so what needs sizes per mailbox (the
-- counters below, the POP3 listing, expunge and copy) reads the link table alone
-- and never the message table with its bodies.
ALTER TABLE mailbox_messages ADD COLUMN size INTEGER NOT NULL DEFAULT 0;
UPDATE mailbox_messages SET size = (SELECT size FROM messages WHERE id = mailbox_messages.message_id);
-- Each mailbox keeps the octets of its messages beside its message count, in the
-- same row every writer already updates, so an account's usage is the sum over its
-- few mailboxes and never a scan of its messages. A message linked into two
-- mailboxes counts twice, as RFC 9208 counts it.
ALTER TABLE mailboxes ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
UPDATE mailboxes SET bytes = (
    SELECT coalesce(sum(size), 0) FROM mailbox_messages WHERE mailbox_id = mailboxes.id);
-- Limits in octets; NULL is no limit. An account's own limit wins over its
-- domain's default.
ALTER TABLE accounts ADD COLUMN quota_bytes INTEGER;
ALTER TABLE domains ADD COLUMN default_quota_bytes INTEGER;
