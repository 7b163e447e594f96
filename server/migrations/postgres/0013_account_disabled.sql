-- 1 when the account is switched off (a MailAccount with enabled: false, or
-- deleted under deletionPolicy: Retain): logins fail and mail to it is refused
-- as to an unknown user, while its mailboxes stay. An integer rather than a
-- boolean so that both stores compare it with the same SQL.
ALTER TABLE accounts ADD COLUMN disabled BIGINT NOT NULL DEFAULT 0;
