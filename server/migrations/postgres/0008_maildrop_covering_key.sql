-- The POP3 listing of a maildrop (UID, message id, size, arrival time) from the
-- primary key alone. Deliveries interleave mailboxes, so a mailbox's links lie
-- on as many heap pages as it has messages; listing a maildrop of 2,700 messages
-- read 2,700 pages (61 ms a listing, two thirds of PostgreSQL's time in minutes
-- 20-30 of the soak, bench/RESULTS.md), where the key holds them on a few dozen.
-- The included columns never change after the insert, so flag updates cost the
-- same as before. Rebuilding the key locks the table for the time of the build.
ALTER TABLE mailbox_messages
    DROP CONSTRAINT mailbox_messages_pkey,
    ADD CONSTRAINT mailbox_messages_pkey PRIMARY KEY (mailbox_id, uid) INCLUDE (message_id, size, internal_date);
