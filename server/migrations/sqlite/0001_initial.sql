-- Mailcluster schema, SQLite. Same shape as migrations/postgres; differences:
-- timestamps are INTEGER microseconds since the Unix epoch (sortable, exact, the
-- precision PostgreSQL keeps), booleans are INTEGER, and ids use AUTOINCREMENT so a
-- deleted message's or mailbox's id is never handed out again (caches and change
-- notifications key on them).

CREATE TABLE domains (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL
);

CREATE TABLE accounts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    email         TEXT NOT NULL UNIQUE,
    domain_id     INTEGER NOT NULL REFERENCES domains (id),
    password_hash TEXT NOT NULL,
    -- last UIDVALIDITY handed out to one of this account's mailboxes: new ones are
    -- max(now in seconds, last + 1), so a re-created or renamed mailbox never reuses one
    last_uid_validity INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL
);
CREATE INDEX accounts_domain ON accounts (domain_id);

CREATE TABLE mailboxes (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id     INTEGER NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    uid_validity   INTEGER NOT NULL,
    uid_next       INTEGER NOT NULL DEFAULT 1,
    highest_modseq INTEGER NOT NULL DEFAULT 1,
    special_use    TEXT,
    -- counters maintained by every writer (see migrations/postgres)
    messages       INTEGER NOT NULL DEFAULT 0,
    unseen         INTEGER NOT NULL DEFAULT 0,
    UNIQUE (account_id, name)
);

CREATE TABLE subscriptions (
    account_id INTEGER NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    PRIMARY KEY (account_id, name)
);

CREATE TABLE messages (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    body       BLOB NOT NULL,
    compressed INTEGER NOT NULL,
    size       INTEGER NOT NULL,
    meta       TEXT NOT NULL,
    subject    TEXT NOT NULL DEFAULT '',
    from_addr  TEXT NOT NULL DEFAULT '',
    to_addr    TEXT NOT NULL DEFAULT '',
    cc_addr    TEXT NOT NULL DEFAULT '',
    message_id TEXT NOT NULL DEFAULT '',
    sent_date  INTEGER,
    created_at INTEGER NOT NULL
);

CREATE TABLE mailbox_messages (
    mailbox_id    INTEGER NOT NULL REFERENCES mailboxes (id) ON DELETE CASCADE,
    uid           INTEGER NOT NULL,
    message_id    INTEGER NOT NULL REFERENCES messages (id),
    flags         INTEGER NOT NULL DEFAULT 0,
    keywords      TEXT NOT NULL DEFAULT '',
    modseq        INTEGER NOT NULL,
    internal_date INTEGER NOT NULL,
    PRIMARY KEY (mailbox_id, uid)
) WITHOUT ROWID;
CREATE INDEX mailbox_messages_modseq ON mailbox_messages (mailbox_id, modseq);
CREATE INDEX mailbox_messages_unseen ON mailbox_messages (mailbox_id, uid) WHERE flags & 1 = 0;
CREATE INDEX mailbox_messages_deleted ON mailbox_messages (mailbox_id, uid) WHERE flags & 8 <> 0;
CREATE INDEX mailbox_messages_message ON mailbox_messages (message_id);

CREATE TABLE expunged (
    mailbox_id INTEGER NOT NULL REFERENCES mailboxes (id) ON DELETE CASCADE,
    uid        INTEGER NOT NULL,
    modseq     INTEGER NOT NULL,
    PRIMARY KEY (mailbox_id, uid)
) WITHOUT ROWID;
CREATE INDEX expunged_modseq ON expunged (mailbox_id, modseq);

CREATE TABLE outbound_queue (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    sender       TEXT NOT NULL,
    recipients   TEXT NOT NULL,
    raw          BLOB NOT NULL,
    account_id   INTEGER REFERENCES accounts (id) ON DELETE SET NULL,
    status       TEXT NOT NULL DEFAULT 'queued',
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_attempt INTEGER NOT NULL,
    locked_by    TEXT,
    locked_until INTEGER,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
);
CREATE INDEX outbound_queue_due ON outbound_queue (next_attempt) WHERE status = 'queued';
