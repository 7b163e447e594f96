-- \Recent: see the PostgreSQL migration of the same name.
ALTER TABLE mailboxes ADD COLUMN recent_floor INTEGER NOT NULL DEFAULT 0;
UPDATE mailboxes SET recent_floor = uid_next - 1;
