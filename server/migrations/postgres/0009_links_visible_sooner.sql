-- An index-only scan (the POP3 listing from the primary key, 0008) still reads a
-- link's heap page unless VACUUM has marked that page all-visible. Links are
-- inserted all the time and rarely updated, so by default autovacuum comes back
-- only after 20 % of the table is new: at 2.5 million links, after 500,000
-- deliveries. In the 30-minute soak that left 38 % of a maildrop listing's rows to
-- be read from the heap (978 heap fetches for 2,557 rows, 8.3 ms), and the listing
-- was PostgreSQL's costliest statement (bench/RESULTS.md). After 1 % (and the
-- default 1,000 rows), autovacuum visits the table at every `autovacuum_naptime`
-- round under load, and each visit reads only the pages filled since the last.
ALTER TABLE mailbox_messages SET (autovacuum_vacuum_insert_scale_factor = 0.01);
