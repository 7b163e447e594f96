-- When the account last logged in (a MailAccount's status shows it); NULL: never
-- since it was recorded. Written by each server at most every few minutes per
-- account, never backwards.
ALTER TABLE accounts ADD COLUMN last_login_at INTEGER;
