-- The addresses an account may send as besides its own, its aliases' and
-- their subaddresses: a full address, or `@domain` for any of that domain.
-- Submission refuses every other MAIL FROM, From:, Sender:, Resent-From: and
-- Resent-Sender:.
CREATE TABLE account_senders (
    account_id INTEGER NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    address    TEXT NOT NULL,
    PRIMARY KEY (account_id, address)
);
-- The aliases that deliver to an account, read at each submitted MAIL.
CREATE INDEX aliases_target ON aliases (target);
