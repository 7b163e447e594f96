-- The name shown for the account (a MailAccount's displayName); NULL: none.
ALTER TABLE accounts ADD COLUMN display_name TEXT;
