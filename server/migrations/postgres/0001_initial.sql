-- Mailcluster schema, PostgreSQL. Kept in the same shape as migrations/sqlite.
--
-- Every write to a mailbox (delivery, flag change, expunge, copy/move) first
-- updates that mailbox's row (uid_next / highest_modseq / counters): the row lock
-- is what serialises writers of one mailbox, and writers that touch several
-- mailboxes lock them in ascending id order, so there is neither a global lock nor
-- a deadlock between concurrent batches.

CREATE TABLE domains (
    id         BIGSERIAL PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE accounts (
    id            BIGSERIAL PRIMARY KEY,
    -- always stored lower-cased; the unique index is the account lookup index
    email         TEXT NOT NULL UNIQUE,
    domain_id     BIGINT NOT NULL REFERENCES domains (id),
    password_hash TEXT NOT NULL,
    -- last UIDVALIDITY handed out to one of this account's mailboxes: new ones are
    -- max(now in seconds, last + 1), so a re-created or renamed mailbox never reuses one
    last_uid_validity BIGINT NOT NULL DEFAULT 0,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX accounts_domain ON accounts (domain_id);

CREATE TABLE mailboxes (
    id             BIGSERIAL PRIMARY KEY,
    account_id     BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    uid_validity   BIGINT NOT NULL,
    uid_next       BIGINT NOT NULL DEFAULT 1,
    highest_modseq BIGINT NOT NULL DEFAULT 1,
    special_use    TEXT,
    -- Counters kept in the same transactions that change the links: STATUS and
    -- SELECT run in client loops and must not COUNT(*) a 100k-message mailbox.
    -- Updating them costs nothing extra because every writer updates this row anyway.
    messages       BIGINT NOT NULL DEFAULT 0,
    unseen         BIGINT NOT NULL DEFAULT 0,
    UNIQUE (account_id, name)
);

-- IMAP subscriptions are names, independent of whether the mailbox exists
-- (RFC 3501 §6.3.6), hence a table of their own rather than a mailbox column.
CREATE TABLE subscriptions (
    account_id BIGINT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    PRIMARY KEY (account_id, name)
);

-- A body is stored once however many mailboxes link it.
CREATE TABLE messages (
    id         BIGSERIAL PRIMARY KEY,
    body       BYTEA NOT NULL,
    -- body is zstd-compressed (only when that saved more than 10%)
    compressed BOOLEAN NOT NULL,
    size       BIGINT NOT NULL,
    -- serde_json of MessageMeta (envelope, bodystructure, part offsets)
    meta       TEXT NOT NULL,
    -- header summary for SEARCH/SORT without decoding meta
    subject    TEXT NOT NULL DEFAULT '',
    from_addr  TEXT NOT NULL DEFAULT '',
    to_addr    TEXT NOT NULL DEFAULT '',
    cc_addr    TEXT NOT NULL DEFAULT '',
    message_id TEXT NOT NULL DEFAULT '',
    sent_date  TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE mailbox_messages (
    mailbox_id    BIGINT NOT NULL REFERENCES mailboxes (id) ON DELETE CASCADE,
    uid           BIGINT NOT NULL,
    message_id    BIGINT NOT NULL REFERENCES messages (id),
    -- system flags bit set (store::Flags): 1 seen, 2 answered, 4 flagged, 8 deleted, 16 draft
    flags         INTEGER NOT NULL DEFAULT 0,
    -- keywords, sorted, space separated
    keywords      TEXT NOT NULL DEFAULT '',
    modseq        BIGINT NOT NULL,
    internal_date TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (mailbox_id, uid)
);
-- CONDSTORE / QRESYNC: "what changed since modseq N"
CREATE INDEX mailbox_messages_modseq ON mailbox_messages (mailbox_id, modseq);
-- UID SEARCH UNSEEN touches only unseen rows
CREATE INDEX mailbox_messages_unseen ON mailbox_messages (mailbox_id, uid) WHERE flags & 1 = 0;
-- EXPUNGE touches only \Deleted rows
CREATE INDEX mailbox_messages_deleted ON mailbox_messages (mailbox_id, uid) WHERE flags & 8 <> 0;
-- "is this body still linked anywhere" when links go away
CREATE INDEX mailbox_messages_message ON mailbox_messages (message_id);

CREATE TABLE expunged (
    mailbox_id BIGINT NOT NULL REFERENCES mailboxes (id) ON DELETE CASCADE,
    uid        BIGINT NOT NULL,
    modseq     BIGINT NOT NULL,
    PRIMARY KEY (mailbox_id, uid)
);
CREATE INDEX expunged_modseq ON expunged (mailbox_id, modseq);

CREATE TABLE outbound_queue (
    id           BIGSERIAL PRIMARY KEY,
    sender       TEXT NOT NULL,
    -- JSON array of addresses
    recipients   TEXT NOT NULL,
    raw          BYTEA NOT NULL,
    account_id   BIGINT REFERENCES accounts (id) ON DELETE SET NULL,
    -- 'queued' until delivered (row deleted) or given up ('failed')
    status       TEXT NOT NULL DEFAULT 'queued',
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_attempt TIMESTAMPTZ NOT NULL,
    locked_by    TEXT,
    locked_until TIMESTAMPTZ,
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL
);
-- due items, in order; claimed rows are filtered on locked_until
CREATE INDEX outbound_queue_due ON outbound_queue (next_attempt) WHERE status = 'queued';
