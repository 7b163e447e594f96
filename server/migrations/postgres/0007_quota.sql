-- Storage quotas (IMAP QUOTA, RFC 9208, resource STORAGE). Each mailbox keeps the
-- octets of its messages beside its message count, in the same row every writer
-- already updates, so an account's usage is the sum over its few mailboxes and
-- never a scan of its messages. A message linked into two mailboxes counts twice,
-- as RFC 9208 counts it.
ALTER TABLE mailboxes ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
UPDATE mailboxes mb SET bytes = s.total
  FROM (SELECT mm.mailbox_id, sum(m.size) AS total
          FROM mailbox_messages mm JOIN messages m ON m.id = mm.message_id
         GROUP BY mm.mailbox_id) s
 WHERE s.mailbox_id = mb.id;
-- Limits in octets; NULL is no limit. An account's own limit wins over its
-- domain's default.
ALTER TABLE accounts ADD COLUMN quota_bytes BIGINT;
ALTER TABLE domains ADD COLUMN default_quota_bytes BIGINT;
