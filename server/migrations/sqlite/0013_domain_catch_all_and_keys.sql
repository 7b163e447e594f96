-- The address that receives mail for the domain's unknown local parts (a
-- MailDomain's catchAll); NULL: unknown local parts are refused.
ALTER TABLE domains ADD COLUMN catch_all TEXT;
-- The key each domain's mail is signed with, besides the key files of
-- `dkim.keys` (which win): written by the operator once the key's record is
-- seen in DNS, read by every pod every few seconds.
CREATE TABLE dkim_keys (
    domain_id   INTEGER PRIMARY KEY REFERENCES domains (id) ON DELETE CASCADE,
    selector    TEXT NOT NULL,
    algorithm   TEXT NOT NULL,
    private_key TEXT NOT NULL
);
