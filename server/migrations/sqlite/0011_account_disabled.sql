-- 1 when the account is switched off (a MailAccount with enabled: false, or
-- deleted under deletionPolicy: Retain): logins fail and mail to it is refused
-- as to an unknown user, while its mailboxes stay.
ALTER TABLE accounts ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0;
