-- \Recent (RFC 3501 §2.3.2): the highest UID a session has already been given as
-- recent. A session that selects the mailbox takes the UIDs above it and raises it
-- in one statement, so each new message is recent for exactly one session in the
-- cluster. Existing messages start as seen by an earlier session.
ALTER TABLE mailboxes ADD COLUMN recent_floor BIGINT NOT NULL DEFAULT 0;
UPDATE mailboxes SET recent_floor = uid_next - 1;
