//! The system of record: domains, accounts, mailboxes, messages, flags and the
//! outbound queue.
//!
//! Sessions talk to a `dyn Store`; two implementations pass the same conformance
//! suite (`tests/store_conformance.rs`): PostgreSQL for clusters and SQLite for the
//! embedded single-process default.
//!
//! Schema decisions that every implementation keeps:
//! - A message body is stored once (`messages`) however many mailboxes link it
//!   (`mailbox_messages`); bodies are zstd-compressed when that saves space.
//! - Parsed metadata ([`MessageMeta`]) is computed once at delivery and stored next to
//!   the body, so FETCH ENVELOPE/BODYSTRUCTURE and header SEARCH never re-parse.
//! - UIDs are allocated per mailbox by bumping that mailbox's `uid_next` row: the
//!   only lock a delivery takes is the row lock of the mailboxes it writes, never a
//!   global one. Batches lock mailboxes in ascending id order so concurrent batches
//!   cannot deadlock.
//! - Every change to a mailbox bumps its `highest_modseq`; flag changes stamp the row
//!   with the new modseq and expunges leave a tombstone, so a session on any pod can
//!   ask "what changed since modseq N" with an indexed query.

pub(crate) mod common;
pub mod postgres;
mod scripts;
mod sql;
pub mod sqlite;
pub(crate) mod steps;

// The vocabulary the trait speaks, for the backends under this module.
use mailcluster_model::*;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

/// Errors a store reports. `NotFound`/`AlreadyExists`/`Invalid` are the caller's
/// business (they become protocol replies); `Unavailable` and `Internal` mean the
/// backend failed and the session should answer with a temporary failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    #[error("invalid: {0}")]
    Invalid(String),
    /// A limit of the account's would be exceeded (its Sieve scripts' number
    /// or size).
    #[error("over quota: {0}")]
    OverQuota(String),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store error: {0}")]
    Internal(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Receives the time a store waited for a pooled connection.
pub type AcquireObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// The database as a running service: its schema, health, pool, identity
/// (epoch) and the leases that stand in for the cache's while Redis is away.
#[async_trait]
pub trait Operations: Send + Sync + 'static {
    /// "postgres" or "sqlite"; used in logs and metrics labels.
    fn backend(&self) -> &'static str;

    /// Apply pending schema migrations (idempotent).
    async fn migrate(&self) -> StoreResult<()>;
    /// A cheap round trip used by `/readyz`.
    async fn ping(&self) -> StoreResult<()>;
    /// Connection pool figures for the `mail_db_pool_*` metrics.
    fn pool_stats(&self) -> PoolStats;
    /// Registers a callback told how long each connection acquisition waited
    /// (for `mail_db_pool_acquire_seconds`). Set once; stores without a pool
    /// ignore it.
    fn set_acquire_observer(&self, observer: AcquireObserver) {
        let _ = observer;
    }

    /// Who the database server is and where its history stands: a value that
    /// changes when the database is restored, fails over to a replica or is
    /// replaced — after any of which ids it handed out may be handed out again and
    /// modseqs may go backwards. Per-process caches built on those are cleared when
    /// it changes. None: the backend cannot tell (the embedded SQLite file is this
    /// process's own).
    async fn epoch(&self) -> StoreResult<Option<String>> {
        Ok(None)
    }

    /// Takes a lease on `key` for `member` unless `limit` live leases of other
    /// members hold it; renews it when `member` already holds one. `true` when
    /// `member` holds a lease afterwards. A lease lapses `ttl` after it was taken or
    /// last renewed (by the database's clock, the same for every pod).
    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> StoreResult<bool>;
    /// Extends `member`'s lease on `key` by `ttl` only while it is still live;
    /// `false` when it had lapsed (and may be somebody else's now).
    async fn lease_extend(&self, key: &str, member: &str, ttl: Duration) -> StoreResult<bool>;
    async fn lease_release(&self, key: &str, member: &str) -> StoreResult<()>;
    /// Live leases on `key`.
    async fn lease_count(&self, key: &str) -> StoreResult<u64>;
}

/// Accounts: who exists, their passwords, state, limits and last login.
#[async_trait]
pub trait Directory: Send + Sync + 'static {
    /// Creates the account (its domain must exist) and its default mailboxes:
    /// INBOX plus the SPECIAL-USE set (Drafts, Sent, Trash, Junk, Archive), all
    /// subscribed. `email` is stored lower-cased.
    async fn account_create(&self, email: &str, password_hash: &str) -> StoreResult<Account>;
    async fn account_delete(&self, email: &str) -> StoreResult<()>;
    async fn account_set_password(&self, email: &str, password_hash: &str) -> StoreResult<()>;
    /// Case-insensitive lookup by full address.
    async fn account_get(&self, email: &str) -> StoreResult<Option<Account>>;
    /// Switches the account on or off. Off, logins fail and its mail is refused as
    /// an unknown user's; its mailboxes stay.
    async fn account_set_enabled(&self, email: &str, enabled: bool) -> StoreResult<()>;
    /// Sets (or with `None` removes) the name shown for the account.
    async fn account_set_display_name(&self, email: &str, name: Option<&str>) -> StoreResult<()>;
    /// Sets (or with `None` removes) the account's own storage limit in octets.
    async fn account_set_quota(&self, email: &str, limit: Option<u64>) -> StoreResult<()>;
    /// The account's limits and usage, from its mailboxes' counters.
    async fn quota(&self, account_id: i64) -> StoreResult<Quota>;
    async fn account_list(&self, domain: Option<&str>) -> StoreResult<Vec<Account>>;
    /// Creates the accounts of `batch` as [`Directory::account_create`] does, with
    /// their quotas and aliases, all or none: the SQL stores use one transaction
    /// (a bulk import's batch). Accounts that exist are left alone and listed;
    /// an alias pair that exists is kept.
    async fn accounts_import(&self, batch: &[ImportedAccount]) -> StoreResult<ImportOutcome>;
    /// Notes that the account logged in at `at` (later than what is recorded;
    /// an earlier time is ignored). Servers write it at most every few minutes
    /// per account.
    async fn account_record_login(
        &self,
        account_id: i64,
        at: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<()>;
    /// When the account last logged in, as recorded; `None` if never. `NotFound`
    /// for an unknown account.
    async fn account_last_login(&self, email: &str) -> StoreResult<Option<chrono::DateTime<chrono::Utc>>>;
}

/// The domains served, with their defaults: quota, catch-all account and the
/// DKIM key their mail is signed with.
#[async_trait]
pub trait Domains: Send + Sync + 'static {
    async fn domain_add(&self, domain: &str) -> StoreResult<()>;
    /// Deleting a domain that still has accounts is refused with `Invalid`.
    async fn domain_del(&self, domain: &str) -> StoreResult<()>;
    async fn domain_list(&self) -> StoreResult<Vec<String>>;
    async fn domain_exists(&self, domain: &str) -> StoreResult<bool>;
    /// Sets (or removes) the default storage limit of the domain's accounts.
    async fn domain_set_quota(&self, domain: &str, limit: Option<u64>) -> StoreResult<()>;
    /// The domain's default storage limit; `NotFound` for an unknown domain.
    async fn domain_quota(&self, domain: &str) -> StoreResult<Option<u64>>;
    /// Sets (or with `None` removes) the account that receives the domain's mail
    /// for local parts that are neither an account nor an alias. `NotFound`
    /// for an unknown domain or a target that is not an account.
    async fn domain_set_catch_all(&self, domain: &str, target: Option<&str>) -> StoreResult<()>;
    /// The domain's catch-all account; `NotFound` for an unknown domain.
    async fn domain_catch_all(&self, domain: &str) -> StoreResult<Option<String>>;
    /// Sets (or with `None` removes) the key the domain's mail is signed with;
    /// `key.domain` is ignored. `NotFound` for an unknown domain.
    async fn domain_key_set(&self, domain: &str, key: Option<&DomainKey>) -> StoreResult<()>;
    /// Every domain's signing key, by domain.
    async fn domain_keys(&self) -> StoreResult<Vec<DomainKey>>;
}

/// Where an address leads: aliases, the addresses an account may send as,
/// and the recipient lookup of every RCPT.
#[async_trait]
pub trait Addresses: Send + Sync + 'static {
    /// Allows the account to send as `address` (a full address, or `@domain`
    /// for every address of the domain); NotFound without such an account,
    /// AlreadyExists when it was allowed.
    async fn account_sender_add(&self, email: &str, address: &str) -> StoreResult<()>;
    /// Withdraws what [`Addresses::account_sender_add`] allowed; NotFound when it was not.
    async fn account_sender_del(&self, email: &str, address: &str) -> StoreResult<()>;
    /// The account's aliases and allowed senders (empty for an unknown account),
    /// in one round trip: submission reads them at every MAIL.
    async fn sender_rights(&self, email: &str) -> StoreResult<SenderRights>;

    /// Mail to `address` (at a local domain, no account's) also goes to the
    /// account `target`. NotFound when the domain or the account does not
    /// exist, Invalid when `address` is an account's, AlreadyExists when the
    /// pair does.
    async fn alias_add(&self, address: &str, target: &str) -> StoreResult<()>;
    /// Removes the alias's target `target`, or all of its targets: NotFound
    /// when there was none.
    async fn alias_del(&self, address: &str, target: Option<&str>) -> StoreResult<()>;
    /// `(address, target)` of every alias (of `domain`), in address order.
    async fn alias_list(&self, domain: Option<&str>) -> StoreResult<Vec<(String, String)>>;
    /// The targets of `address`; empty when it is no alias.
    async fn alias_targets(&self, address: &str) -> StoreResult<Vec<String>>;

    /// Where mail for `address` goes. `user` is the address without its
    /// subaddress detail (RFC 5233), if it has one. An account's own address
    /// wins over its subaddressed user, which wins over an alias (of the
    /// address, then of its user). Every RCPT that misses the cache asks this,
    /// so stores answer it in one round trip where they can
    /// ([`recipient_by_reads`] is the same answer from the single reads).
    async fn recipient(&self, address: &str, user: Option<&str>) -> StoreResult<Recipient>;
}

/// An account's mailboxes: the hierarchy, subscriptions, status counters,
/// UIDVALIDITY and `\Recent`.
#[async_trait]
pub trait Mailboxes: Send + Sync + 'static {
    async fn mailbox_list(&self, account_id: i64) -> StoreResult<Vec<Mailbox>>;
    /// Exact name match; "INBOX" is matched case-insensitively.
    async fn mailbox_get(&self, account_id: i64, name: &str) -> StoreResult<Option<Mailbox>>;
    async fn mailbox_get_by_id(&self, mailbox_id: i64) -> StoreResult<Option<Mailbox>>;
    /// [`Mailboxes::mailbox_get`] and its [`Mailboxes::mailbox_status`], read together:
    /// what STATUS needs.
    async fn mailbox_get_with_status(
        &self,
        account_id: i64,
        name: &str,
    ) -> StoreResult<Option<(Mailbox, MailboxStatus)>> {
        match self.mailbox_get(account_id, name).await? {
            Some(mb) => {
                let status = self.mailbox_status(mb.id).await?;
                Ok(Some((mb, status)))
            }
            None => Ok(None),
        }
    }
    /// [`Mailboxes::mailbox_get`] and its account's [`Directory::quota`], read together:
    /// what APPEND needs before it stores anything.
    async fn mailbox_with_quota(&self, account_id: i64, name: &str) -> StoreResult<Option<(Mailbox, Quota)>>;
    async fn mailbox_create(
        &self,
        account_id: i64,
        name: &str,
        special_use: Option<SpecialUse>,
    ) -> StoreResult<Mailbox>;
    /// Deletes the mailbox and its message links (bodies no longer linked anywhere
    /// are removed too). INBOX cannot be deleted.
    async fn mailbox_delete(&self, account_id: i64, name: &str) -> StoreResult<()>;
    /// Renames a mailbox and its children (`from/…` → `to/…`). Each renamed mailbox
    /// gets a new UIDVALIDITY. Renaming INBOX moves its messages into a new mailbox
    /// `to` and leaves INBOX empty (RFC 3501 §6.3.5).
    async fn mailbox_rename(&self, account_id: i64, from: &str, to: &str) -> StoreResult<()>;
    async fn mailbox_subscribe(&self, account_id: i64, name: &str, subscribed: bool) -> StoreResult<()>;
    /// Subscribed names (they may name mailboxes that no longer exist).
    async fn subscriptions(&self, account_id: i64) -> StoreResult<Vec<String>>;
    /// Counts for STATUS / SELECT, served from indexes (no scan of the mailbox).
    async fn mailbox_status(&self, mailbox_id: i64) -> StoreResult<MailboxStatus>;
    /// Takes the messages with UIDs in (floor, `up_to`] as `\Recent` for the calling
    /// session (RFC 3501 §2.3.2): raises the mailbox's `recent_floor` to `up_to` and
    /// returns the floor before. Concurrent claims, from any process, are
    /// serialised: every UID is given as recent to exactly one caller.
    async fn recent_claim(&self, mailbox_id: i64, up_to: u32) -> StoreResult<u32>;
    /// Gives the mailbox a new UIDVALIDITY, greater than `old`, if it still has
    /// `old`: its UIDs are to be handed out again (the database went back in
    /// time and lost some), so clients must forget the ones they know. `None`
    /// when the mailbox is gone or no longer has `old` (another process renewed
    /// it first).
    async fn mailbox_renew_uid_validity(&self, mailbox_id: i64, old: u32) -> StoreResult<Option<u32>>;
    /// [`Mailboxes::recent_claim`] of messages the caller itself has just added, which
    /// no other session can have taken yet in the common case: stores may skip
    /// the read that answers a claim already taken.
    async fn recent_claim_own(&self, mailbox_id: i64, up_to: u32) -> StoreResult<u32> {
        self.recent_claim(mailbox_id, up_to).await
    }
    /// Octets of all messages of the mailbox (STATUS SIZE, RFC 8438), from its
    /// counter.
    async fn mailbox_size(&self, mailbox_id: i64) -> StoreResult<u64>;
    /// Messages flagged `\Deleted` and their octets (STATUS DELETED and
    /// DELETED-STORAGE, RFC 9208 §4.2).
    async fn mailbox_deleted(&self, mailbox_id: i64) -> StoreResult<(u32, u64)>;
    /// Messages no session has been given as `\Recent` yet (STATUS RECENT). Not
    /// part of [`Mailboxes::mailbox_status`]: it counts rows, and clients poll STATUS
    /// without asking for it. The backends count in SQL.
    async fn recent_count(&self, mailbox_id: i64) -> StoreResult<u32>;
}

/// The messages in mailboxes: delivery, listings, bodies, flags, copies,
/// expunges and the changes since a modseq.
#[async_trait]
pub trait Messages: Send + Sync + 'static {
    /// The group-commit entry point: stores every message of the batch once and links
    /// it into each of its target mailboxes, all in ONE transaction (one fsync).
    /// Returns, per delivery and in order, the (mailbox_id, uid) pairs assigned.
    /// On error nothing of the batch is stored.
    async fn deliver_batch(&self, batch: &[NewDelivery]) -> StoreResult<Vec<Vec<DeliveredTo>>>;
    /// All UIDs of the mailbox in ascending order; `NotFound` when the mailbox
    /// does not exist. (Sessions take them from [`Messages::mailbox_index`].)
    async fn mailbox_uids(&self, mailbox_id: i64) -> StoreResult<Vec<u32>> {
        Ok(self.mailbox_index(mailbox_id).await?.uids)
    }
    /// UIDs, flags, UIDNEXT and HIGHESTMODSEQ of the mailbox from one consistent
    /// snapshot (what SELECT loads). `NotFound` when the mailbox does not exist.
    async fn mailbox_index(&self, mailbox_id: i64) -> StoreResult<MailboxIndex>;
    /// UID, body id, size and INTERNALDATE of every message with a UID above
    /// `after_uid`, ascending: a POP3 maildrop listing (`after_uid` 0), or what
    /// arrived since a cached one.
    /// Backends answer it from the link and body tables without decoding metadata;
    /// this default (for test doubles) goes through [`Messages::messages_by_uid`].
    async fn maildrop(&self, mailbox_id: i64, after_uid: u32) -> StoreResult<Vec<MaildropEntry>> {
        let Some(first) = after_uid.checked_add(1) else { return Ok(Vec::new()) };
        let rows = self.messages_by_uid(mailbox_id, &UidSet(vec![(first, u32::MAX)])).await?;
        Ok(rows
            .into_iter()
            .map(|r| MaildropEntry {
                uid: r.uid,
                message_id: r.message_id,
                size: r.meta.size,
                internal_date: r.internal_date,
            })
            .collect())
    }
    /// Per-message rows (flags, size, dates, metadata) for the given UIDs, ascending.
    /// Unknown UIDs are skipped.
    async fn messages_by_uid(&self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<MessageRow>>;
    /// The sort and thread keys of those messages, by UID: the summary columns
    /// only. This default (for test doubles) reads the whole rows.
    async fn sort_rows(&self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<SortRow>> {
        Ok(self.messages_by_uid(mailbox_id, uids).await?.iter().map(SortRow::of).collect())
    }
    /// The links (message id, flags, INTERNALDATE) of the asked `(mailbox, uid)`
    /// pairs that exist, and the highest modseq of each asked mailbox that exists,
    /// read in one snapshot: the first half of IMAP FETCH of bodies, asked for the
    /// commands of many sessions at once. This default (for test doubles) goes
    /// through [`Messages::highest_modseqs`] and [`Messages::messages_by_uid`], which is
    /// not one snapshot.
    async fn message_links(&self, keys: &[(i64, u32)]) -> StoreResult<MessageLinks> {
        let mut ids: Vec<i64> = keys.iter().map(|&(m, _)| m).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut out = MessageLinks { mailboxes: self.highest_modseqs(&ids).await?, links: Vec::new() };
        for &(mailbox_id, _) in &out.mailboxes {
            let uids: Vec<u32> = keys.iter().filter(|&&(m, _)| m == mailbox_id).map(|&(_, u)| u).collect();
            for r in self.messages_by_uid(mailbox_id, &UidSet::from_uids(&uids)).await? {
                out.links.push(MessageLink {
                    mailbox_id,
                    uid: r.uid,
                    message_id: r.message_id,
                    flags: r.flags,
                    internal_date: r.internal_date,
                });
            }
        }
        Ok(out)
    }
    /// The bodies of those of the given messages that exist, in no particular
    /// order. Callers bound how many they ask for at once (each is held in memory).
    /// This default (for test doubles) asks [`Messages::message_body`] per message.
    async fn message_bodies(&self, message_ids: &[i64]) -> StoreResult<Vec<StoredBody>> {
        let mut out = Vec::with_capacity(message_ids.len());
        for &id in message_ids {
            match self.message_body(id).await {
                Ok(body) => out.push(StoredBody {
                    message_id: id,
                    header_size: common::header_size_of(None, &body),
                    body,
                }),
                Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
    /// The raw RFC 5322 bytes of a message as delivered (decompressed).
    async fn message_body(&self, message_id: i64) -> StoreResult<bytes::Bytes>;
    /// UIDs whose system flags contain all of `with` and none of `without`
    /// (e.g. `UID SEARCH UNSEEN` = without SEEN), from an index.
    async fn uids_by_flags(&self, mailbox_id: i64, with: Flags, without: Flags) -> StoreResult<Vec<u32>>;
    /// Changes a flag set; returns the rows that actually changed, with their new
    /// modseq. One modseq is used for the whole call.
    async fn store_flags(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
    ) -> StoreResult<Vec<FlagRow>>;
    /// A conditional STORE (`UNCHANGEDSINCE`, RFC 7162 §3.1.3): like
    /// [`Messages::store_flags`] for the messages whose modseq is at most
    /// `unchanged_since`; the others are left alone and reported as `modified`.
    /// The test and the change are one atomic step, so two clients changing the
    /// same message never both succeed against the same modseq.
    async fn store_flags_unchanged_since(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
        unchanged_since: u64,
    ) -> StoreResult<ConditionalStore>;
    /// Removes the given messages (or, with `None`, every message flagged \Deleted)
    /// and leaves tombstones.
    async fn expunge(&self, mailbox_id: i64, uids: Option<&UidSet>) -> StoreResult<Expunged>;
    /// Links the messages into `dest` with fresh UIDs (bodies are not copied).
    /// Returns (source uid, destination uid) pairs in source order.
    async fn copy(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>>;
    /// COPY then expunge from the source, atomically.
    async fn move_messages(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>>;
    /// `(mailbox id, highest modseq)` of those of the given mailboxes that exist,
    /// in one round trip: the batched "anything changed?" check of IMAP sessions.
    async fn highest_modseqs(&self, mailbox_ids: &[i64]) -> StoreResult<Vec<(i64, u64)>>;
    /// Everything that changed after `modseq`: flag rows stamped later (including
    /// new messages) and UIDs expunged later. Served from the modseq indexes.
    async fn changes_since(&self, mailbox_id: i64, modseq: u64) -> StoreResult<MailboxChanges>;
    /// Deletes the expunge tombstones older than `before`, raising each affected
    /// mailbox's floor to the newest modseq pruned; returns how many went. Later
    /// [`Messages::changes_since`] calls from before a floor answer with the full
    /// UID list. This default, for stores that keep tombstones forever, prunes
    /// nothing.
    async fn prune_tombstones(&self, before: chrono::DateTime<chrono::Utc>) -> StoreResult<u64> {
        let _ = before;
        Ok(0)
    }
}

/// The outbound queue the relay workers claim, complete and retry.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    async fn queue_enqueue(&self, item: &NewQueueItem) -> StoreResult<i64>;
    /// Claims up to `limit` due items for `lease` (FOR UPDATE SKIP LOCKED on
    /// PostgreSQL) so that workers on different pods never take the same row.
    /// Each claim counts as an attempt (`attempts` includes this one); an item
    /// whose lease ran out (its worker died) is claimable again.
    async fn queue_claim(
        &self,
        worker: &str,
        limit: u32,
        lease: std::time::Duration,
    ) -> StoreResult<Vec<QueueItem>>;
    /// Delivered: the item is removed.
    async fn queue_complete(&self, id: i64) -> StoreResult<()>;
    /// Records the end of an attempt by `worker`: the item is rescheduled for its
    /// remaining recipients, or removed when none remain. `false` when `worker` no
    /// longer holds the item (its lease ran out and another worker took it): then
    /// nothing is written.
    async fn queue_finish(&self, id: i64, worker: &str, attempt: &QueueAttempt) -> StoreResult<bool>;
    /// Gives a claimed item back untried (a draining pod): due again at once, and
    /// the claim does not count as an attempt.
    async fn queue_release(&self, id: i64, worker: &str) -> StoreResult<()>;
    /// The queue, oldest first, at most `limit` items.
    async fn queue_list(&self, limit: u32) -> StoreResult<Vec<QueueEntry>>;
    /// One item with its message.
    async fn queue_get(&self, id: i64) -> StoreResult<Option<(QueueEntry, bytes::Bytes)>>;
    /// Makes one item (or all) due now; the number of items changed.
    async fn queue_retry(&self, id: Option<i64>) -> StoreResult<u64>;
    /// Removes an item without delivering it or telling anyone.
    async fn queue_delete(&self, id: i64) -> StoreResult<bool>;
    async fn queue_stats(&self) -> StoreResult<QueueStats>;
}

/// One of an account's Sieve scripts, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SieveEntry {
    pub name: String,
    pub active: bool,
    /// Octets of its source.
    pub size: u64,
}

/// An account whose mail a Sieve script filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveScript {
    pub account_id: i64,
    /// The account's address.
    pub email: String,
    /// A SHA-256 of the script's source.
    pub digest: [u8; 32],
}

/// What an account's Sieve scripts may take (`sieve.max_scripts`,
/// `sieve.max_script_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SieveQuota {
    pub max_scripts: usize,
    pub max_bytes: usize,
}

pub use scripts::sieve_name_problem;

/// An account's Sieve scripts (RFC 5804: at most one active) and what their
/// vacation (RFC 5230) and duplicate (RFC 7352) tests remember across pods.
/// Script names are checked by [`sieve_name_problem`]: `Invalid` otherwise.
#[async_trait]
pub trait Scripts: Send + Sync + 'static {
    /// Creates the script `name` or replaces its source (an active script stays
    /// active). `OverQuota` when `source` is over `quota.max_bytes`, or the
    /// script is new and the account has `quota.max_scripts` already;
    /// `NotFound` for an unknown account.
    async fn sieve_put(
        &self,
        account_id: i64,
        name: &str,
        source: &[u8],
        quota: SieveQuota,
    ) -> StoreResult<()>;
    /// The account's scripts by name.
    async fn sieve_list(&self, account_id: i64) -> StoreResult<Vec<SieveEntry>>;
    /// A script's source; `None` when there is no such script.
    async fn sieve_get(&self, account_id: i64, name: &str) -> StoreResult<Option<Vec<u8>>>;
    /// Deletes a script: `NotFound` without one, `Invalid` when it is the
    /// active script (RFC 5804 §2.10).
    async fn sieve_delete(&self, account_id: i64, name: &str) -> StoreResult<()>;
    /// Renames a script, which stays active if it was (RFC 5804 §2.11.1):
    /// `NotFound` without `from`, `AlreadyExists` when `to` exists.
    async fn sieve_rename(&self, account_id: i64, from: &str, to: &str) -> StoreResult<()>;
    /// Makes `name` the active script (`NotFound` without it), or with `None`
    /// leaves none active.
    async fn sieve_activate(&self, account_id: i64, name: Option<&str>) -> StoreResult<()>;
    /// The active script's name and source: what delivery runs.
    async fn sieve_active(&self, account_id: i64) -> StoreResult<Option<(String, Vec<u8>)>>;
    /// Every account with an active script, with a SHA-256 of its source:
    /// what each pod reads every few seconds to know whose mail it filters.
    async fn sieve_active_digests(&self) -> StoreResult<Vec<ActiveScript>>;
    /// Whether a vacation reply to `sender` under `handle` (RFC 5230 §4.2) was
    /// recorded less than `period_secs` ago; when it was not, records one now.
    /// One atomic step: of concurrent callers, on any pod, one gets `false`.
    async fn sieve_vacation_seen(
        &self,
        account_id: i64,
        handle: &str,
        sender: &str,
        period_secs: u64,
    ) -> StoreResult<bool>;
    /// The same for the duplicate test's unique id `key` (RFC 7352 §3).
    async fn sieve_duplicate_seen(&self, account_id: i64, key: &str, period_secs: u64) -> StoreResult<bool>;
    /// Forgets what the two above recorded once its period is over; how many
    /// records went.
    async fn sieve_seen_prune(&self) -> StoreResult<u64>;
}

/// The whole store, as the server's parts that use several roles hold it
/// (`Arc<dyn Store>`); a part that needs one role takes that role, so that a test
/// double implements only what it fakes. Every type with all the roles is one.
pub trait Store: Operations + Accounts + Addresses + Mailboxes + Messages + Queue + Scripts {}

impl<T: Operations + Accounts + Addresses + Mailboxes + Messages + Queue + Scripts + ?Sized> Store for T {}

/// Accounts and the domains they are in: what a login reads (an address
/// without a domain is tried at each domain).
pub trait Accounts: Directory + Domains {}

impl<T: Directory + Domains + ?Sized> Accounts for T {}

/// [`Addresses::recipient`] made of the single reads: the domain, the account (by
/// address, then by user), its INBOX and its limits, else the aliases. Four
/// round trips or more; the SQL stores answer in one, and their conformance
/// test holds them to this.
pub async fn recipient_by_reads<S: Domains + Directory + Addresses + Mailboxes + ?Sized>(
    store: &S,
    address: &str,
    user: Option<&str>,
) -> StoreResult<Recipient> {
    let Some((_, domain)) = address.rsplit_once('@') else { return Ok(Recipient::NotLocal) };
    if !store.domain_exists(domain).await? {
        return Ok(Recipient::NotLocal);
    }
    let account = match (store.account_get(address).await?, user) {
        (None, Some(user)) => store.account_get(user).await?,
        (found, _) => found,
    };
    let Some(account) = account else {
        let mut targets = store.alias_targets(address).await?;
        if targets.is_empty()
            && let Some(user) = user
        {
            targets = store.alias_targets(user).await?;
        }
        if targets.is_empty()
            && let Some(catch_all) = store.domain_catch_all(domain).await?
        {
            targets.push(catch_all);
        }
        return Ok(if targets.is_empty() { Recipient::NoSuchUser } else { Recipient::Alias(targets) });
    };
    Ok(match store.mailbox_get(account.id, "INBOX").await? {
        Some(inbox) => Recipient::Mailbox {
            account_id: account.id,
            mailbox_id: inbox.id,
            limited: store.quota(account.id).await?.limit().is_some(),
        },
        None => Recipient::NoSuchUser,
    })
}

/// File name of the embedded database inside the data directory.
pub const SQLITE_FILE: &str = "mailcluster.db";

/// Opens the store named by `url`: `postgres://…` → [`postgres::PgStore`],
/// `sqlite:…` → [`sqlite::SqliteStore`], `None` → the embedded SQLite file
/// `<data_dir>/mailcluster.db` (directory created when missing).
///
/// Connects eagerly so that a wrong or unreachable database is reported at start
/// (as `Unavailable`, naming host and port but never the password) rather than at
/// the first client command. Does not migrate: callers run [`Operations::migrate`].
pub async fn open(
    url: Option<&str>,
    data_dir: &Path,
    pool_size: u32,
    connect_timeout: Duration,
) -> StoreResult<Arc<dyn Store>> {
    match url.map(str::trim) {
        None | Some("") => {
            let store =
                sqlite::SqliteStore::open_path(&data_dir.join(SQLITE_FILE), pool_size, connect_timeout)
                    .await?;
            Ok(Arc::new(store))
        }
        Some(u) if u.starts_with("sqlite:") => {
            Ok(Arc::new(sqlite::SqliteStore::open_url(u, pool_size, connect_timeout).await?))
        }
        Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
            Ok(Arc::new(postgres::PgStore::connect(u, pool_size, connect_timeout).await?))
        }
        Some(u) => Err(StoreError::Invalid(format!(
            "unsupported database URL scheme in {:?} (expected postgres:// or sqlite:)",
            redact_url(u)
        ))),
    }
}

pub use mailcluster_api::config::redact_url;

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact_url("postgres://u:secret@db:5432/mail"), "postgres://u:***@db:5432/mail");
        assert_eq!(redact_url("postgres://u@db/mail"), "postgres://u@db/mail");
        assert_eq!(
            redact_url("postgres://db/mail?user=u&password=secret&sslmode=require"),
            "postgres://db/mail?user=u&password=***&sslmode=require"
        );
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
    }
}
