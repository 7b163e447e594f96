//! The [`Store`] of both SQL backends, written once over a [`Backend`]: each
//! backend supplies its connections, the SQL its dialect spells its own way, how
//! it stores a timestamp, and the operations it carries out differently (delivery,
//! the mailbox index, FETCH's batched reads, flag changes, CONDSTORE's changes,
//! the queue's claims, leases). The rules and the row mapping around them are
//! here.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::common::{
    AcquireTimer, compress_batch, db_err, decompress_body, from_json, group_by_mailbox, header_size_of,
    is_unique_violation, json_of, limit_column, meta_from_json, meta_to_json, normalize_domain,
    normalize_email, normalize_flagset, normalize_mailbox_name, u32_of, u64_of,
};
use super::steps::{
    self, Cols, FlagChange, MAILBOX_BY_ID, MAILBOX_BY_NAME, Param, SharedSql, StoreTx, flag_row,
    mailbox_from_row,
};
use super::*;

/// A SELECT of accounts with their domain's name, for [`account_of`].
macro_rules! account_select {
    ($tail:literal) => {
        concat!(
            "SELECT a.id, a.email, d.name AS domain, a.password_hash, a.created_at, a.disabled, a.display_name \
             FROM accounts a JOIN domains d ON d.id = a.domain_id ",
            $tail
        )
    };
}

/// One SQL backend: what differs between PostgreSQL and SQLite.
pub(crate) trait Backend: Send + Sync + 'static {
    /// "postgres" or "sqlite".
    const NAME: &'static str;
    /// `SELECT id FROM domains WHERE name = $1`, locked for a deletion.
    const DOMAIN_FOR_DELETE: &'static str;
    /// `SELECT id FROM accounts WHERE email = $1`, locked for a deletion.
    const ACCOUNT_FOR_DELETE: &'static str;
    /// `SELECT id FROM accounts WHERE id = $1`, locked against the other
    /// writers of the account's Sieve scripts.
    const ACCOUNT_SIEVE_LOCK: &'static str;
    /// Locks the mailboxes of account `$1` in ascending id order, where other
    /// writers could hold them.
    const LOCK_ACCOUNT_MAILBOXES: Option<&'static str>;
    /// [`MAILBOX_COLS`](steps::MAILBOX_COLS) of account `$1`'s mailboxes, by name
    /// in byte order.
    const MAILBOX_LIST: &'static str;
    /// Account `$1`'s subscribed names in byte order.
    const SUBSCRIPTIONS: &'static str;
    /// `n` and `bytes` of mailbox `$1`'s messages flagged `\Deleted`.
    const MAILBOX_DELETED: &'static str;
    /// Hands a claimed item `$1` of worker `$2` back untried.
    const QUEUE_RELEASE: &'static str;
    /// [`queue_entry_of`]'s columns of the oldest queue items, after the
    /// [`Backend::clock`] parameters: `limit`.
    const QUEUE_LIST: &'static str;
    /// The same and `raw` of one item: `id`.
    const QUEUE_GET: &'static str;
    /// Makes item `id` (NULL: all) due now.
    const QUEUE_RETRY: &'static str;
    /// `n`, the live leases on `key`.
    const LEASE_COUNT: &'static str;
    /// Queues a message: sender, recipients, raw, account_id, next_attempt and
    /// expires_at, then the [`Backend::clock`] parameters; returns `id`.
    const ENQUEUE: &'static str;
    /// Leases due items to worker `$1`, at most `$2`, for the [`Backend::lease_expiry`]
    /// parameters, the [`Backend::clock`] ones after; returns [`queue_item_of`]'s
    /// columns.
    const CLAIM: &'static str;
    /// Reschedules item `$1` of worker `$2` for recipients `$3`, appending the
    /// outcomes `$4`, with last error `$5`, next attempt `$6` and `delay_notified`
    /// `$7`, releasing its lease.
    const RESCHEDULE: &'static str;
    /// Serialises the lease writes on key `$1`, where the transaction alone does not.
    const LEASE_LOCK: Option<&'static str>;
    /// Deletes the lapsed leases of key `$1`; the [`Backend::clock`] parameters after.
    const LEASE_PRUNE: &'static str;
    /// Renews member `$2`'s lease on key `$1`, the [`Backend::lease_expiry`]
    /// parameters after.
    const LEASE_RENEW: &'static str;
    /// The same as a new lease.
    const LEASE_INSERT: &'static str;
    /// [`Backend::LEASE_RENEW`] while the lease is live: the [`Backend::clock`]
    /// parameters after the expiry ones.
    const LEASE_EXTEND: &'static str;

    type Row: Cols + Send + Sync + 'static;
    type Tx: StoreTx + 'static;

    fn acquire_timer(&self) -> &AcquireTimer;
    /// An open write transaction.
    fn begin(&self) -> impl Future<Output = StoreResult<Self::Tx>> + Send;
    /// The rows of a statement (text both dialects read alike, or the backend's
    /// own), on the connection for writes when `write`.
    fn fetch(
        &self,
        write: bool,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> impl Future<Output = StoreResult<Vec<Self::Row>>> + Send;
    /// Runs a write: the rows changed.
    fn execute(
        &self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// The parameters standing for the current time, bound before the others in
    /// the statements that name them (`QUEUE_*`, `LEASE_COUNT`): none where the
    /// database's own clock is used.
    fn clock() -> Vec<Param<'static>>;
    /// A timestamp parameter.
    fn time(t: DateTime<Utc>) -> Param<'static>;
    /// The parameters saying when a lease of `ttl` taken now lapses.
    fn lease_expiry(ttl: Duration) -> Vec<Param<'static>>;
    /// A timestamp column.
    fn date(row: &Self::Row, name: &str) -> StoreResult<DateTime<Utc>>;
    fn opt_date(row: &Self::Row, name: &str) -> StoreResult<Option<DateTime<Utc>>>;
    /// `columns` of `mailbox_messages mm JOIN messages m` for the given UIDs,
    /// ascending.
    fn linked_rows(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        columns: &'static str,
    ) -> impl Future<Output = StoreResult<Vec<Self::Row>>> + Send;

    fn run_migrations(&self) -> impl Future<Output = StoreResult<()>> + Send;
    fn pool_figures(&self) -> PoolStats;
    fn insert_domain(&self, name: &str) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// Raises the mailbox's `recent_floor` to at least `up_to`: the floor before,
    /// `None` without such a mailbox. Serialised against concurrent raises.
    fn raise_recent_floor(
        &self,
        mailbox_id: i64,
        up_to: i64,
    ) -> impl Future<Output = StoreResult<Option<i64>>> + Send;
    fn deliver(&self, batch: Batch<'_>) -> impl Future<Output = StoreResult<Vec<Vec<DeliveredTo>>>> + Send;
    fn index(&self, mailbox_id: i64) -> impl Future<Output = StoreResult<MailboxIndex>> + Send;
    /// The POP3 listing of a mailbox past `after_uid`, ascending by UID.
    fn maildrop_listing(
        &self,
        mailbox_id: i64,
        after_uid: u32,
    ) -> impl Future<Output = StoreResult<Vec<MaildropEntry>>> + Send;
    fn links(&self, keys: &[(i64, u32)]) -> impl Future<Output = StoreResult<MessageLinks>> + Send;
    fn bodies(&self, message_ids: &[i64]) -> impl Future<Output = StoreResult<Vec<StoredBody>>> + Send;
    fn flagged_uids(
        &self,
        mailbox_id: i64,
        with: Flags,
        without: Flags,
    ) -> impl Future<Output = StoreResult<Vec<u32>>> + Send;
    fn change_flags(
        &self,
        mailbox_id: i64,
        change: FlagChange<'_>,
    ) -> impl Future<Output = StoreResult<Vec<FlagRow>>> + Send;
    fn modseqs_of(&self, mailbox_ids: &[i64]) -> impl Future<Output = StoreResult<Vec<(i64, u64)>>> + Send;
    fn changes(
        &self,
        mailbox_id: i64,
        modseq: u64,
    ) -> impl Future<Output = StoreResult<MailboxChanges>> + Send;
    fn prune(&self, before: DateTime<Utc>) -> impl Future<Output = StoreResult<u64>> + Send;
    /// See [`Messages::expunge`].
    fn expunge_links(
        &self,
        mailbox_id: i64,
        uids: Option<&UidSet>,
    ) -> impl Future<Output = StoreResult<Expunged>> + Send;
    /// See [`Operations::epoch`].
    fn cluster_epoch(&self) -> impl Future<Output = StoreResult<Option<String>>> + Send {
        async { Ok(None) }
    }
}

const MAILBOX_STATUS: &str =
    "SELECT messages, unseen, uid_next, uid_validity, highest_modseq FROM mailboxes WHERE id = $1";
const RECENT_COUNT: &str = "SELECT (SELECT count(*) FROM mailbox_messages mm \
     WHERE mm.mailbox_id = m.id AND mm.uid > m.recent_floor) AS n FROM mailboxes m WHERE m.id = $1";
const QUOTA: &str = "SELECT a.quota_bytes, d.default_quota_bytes, \
     (SELECT CAST(coalesce(sum(bytes), 0) AS BIGINT) FROM mailboxes WHERE account_id = a.id) AS used \
     FROM accounts a JOIN domains d ON d.id = a.domain_id WHERE a.id = $1";
/// [`MAILBOX_BY_NAME`] with [`MAILBOX_STATUS`]' columns, in one round trip.
const MAILBOX_WITH_STATUS: &str = "SELECT id, account_id, name, uid_validity, uid_next, highest_modseq, \
     special_use, recent_floor, messages, unseen FROM mailboxes WHERE account_id = $1 AND name = $2";
/// [`MAILBOX_BY_NAME`] with [`QUOTA`]'s columns, in one round trip.
const MAILBOX_WITH_QUOTA: &str = "SELECT m.id, m.account_id, m.name, m.uid_validity, m.uid_next, \
     m.highest_modseq, m.special_use, m.recent_floor, a.quota_bytes, d.default_quota_bytes, \
     (SELECT CAST(coalesce(sum(bytes), 0) AS BIGINT) FROM mailboxes WHERE account_id = a.id) AS used \
     FROM mailboxes m JOIN accounts a ON a.id = m.account_id JOIN domains d ON d.id = a.domain_id \
     WHERE m.account_id = $1 AND m.name = $2";
/// What [`Addresses::recipient`] needs, in one round trip: kind 0 is the account
/// of address `$1` with its INBOX and limits, 1 that of its user `$2` (neither
/// when the account is disabled: its mail is refused as an unknown user's), 2 and 3
/// the alias targets of the address `$3` and of the user `$4`, 4 a row when
/// domain `$5` is ours.
const RECIPIENT: &str = "SELECT CAST(0 AS BIGINT) AS kind, a.id AS account_id, m.id AS mailbox_id, \
     a.quota_bytes, d.default_quota_bytes, CAST(NULL AS TEXT) AS target \
     FROM accounts a JOIN domains d ON d.id = a.domain_id \
     LEFT JOIN mailboxes m ON m.account_id = a.id AND m.name = 'INBOX' WHERE a.email = $1 AND a.disabled = 0 \
     UNION ALL SELECT 1, a.id, m.id, a.quota_bytes, d.default_quota_bytes, NULL \
     FROM accounts a JOIN domains d ON d.id = a.domain_id \
     LEFT JOIN mailboxes m ON m.account_id = a.id AND m.name = 'INBOX' WHERE a.email = $2 AND a.disabled = 0 \
     UNION ALL SELECT 2, NULL, NULL, NULL, NULL, target FROM aliases WHERE address = $3 \
     UNION ALL SELECT 3, NULL, NULL, NULL, NULL, target FROM aliases WHERE address = $4 \
     UNION ALL SELECT 4, NULL, NULL, NULL, NULL, catch_all FROM domains WHERE name = $5 \
     ORDER BY kind, target";
const MESSAGE_ROW_COLS: &str =
    "mm.uid, mm.message_id, mm.flags, mm.keywords, mm.modseq, mm.internal_date, m.meta";
const SORT_ROW_COLS: &str = "mm.uid, mm.message_id, mm.internal_date, m.size, m.sent_date, m.subject, \
     m.from_addr, m.to_addr, m.cc_addr, m.message_id AS message_id_header";

/// A delivery batch made ready before its transaction opens: flags normalised,
/// metadata encoded, bodies compressed, deliveries grouped by mailbox.
pub(crate) struct Batch<'a> {
    pub deliveries: &'a [NewDelivery],
    pub flags: Vec<FlagSet>,
    pub metas: Vec<String>,
    pub bodies: Vec<common::StoredBody>,
    pub groups: std::collections::BTreeMap<i64, common::MailboxShare>,
}

/// Counters, not COUNT(*): kept in the writers' transactions, so they are exactly
/// as current as the rows.
fn status_of(row: &impl Cols) -> StoreResult<MailboxStatus> {
    Ok(MailboxStatus {
        messages: u32_of(row.int("messages")?, "messages")?,
        unseen: u32_of(row.int("unseen")?, "unseen")?,
        uid_next: u32_of(row.int("uid_next")?, "uid_next")?,
        uid_validity: u32_of(row.int("uid_validity")?, "uid_validity")?,
        highest_modseq: u64_of(row.int("highest_modseq")?),
    })
}

fn quota_of(row: &impl Cols) -> StoreResult<Quota> {
    Ok(Quota {
        account_limit: row.opt_int("quota_bytes")?.map(u64_of),
        domain_limit: row.opt_int("default_quota_bytes")?.map(u64_of),
        used: u64_of(row.int("used")?),
    })
}

/// A stored body row (`body`, `compressed`, `size`, `header_size`), inflated.
pub(crate) fn stored_body_of(r: &impl Cols, message_id: i64) -> StoreResult<StoredBody> {
    let body = decompress_body(r.blob("body")?, r.boolean("compressed")?, r.int("size")?)?;
    Ok(StoredBody { message_id, header_size: header_size_of(r.opt_int("header_size")?, &body), body })
}

/// Every UID of a mailbox, for a [`MailboxChanges::present`] list.
pub(crate) const PRESENT_UIDS: &str = "SELECT uid FROM mailbox_messages WHERE mailbox_id = $1 ORDER BY uid";

/// What a backend read of a mailbox's changes in one snapshot: its highest
/// modseq, the changed rows (`uid`, `flags`, `keywords`, `modseq`), the UIDs
/// expunged and, after a prune passed the asked modseq, [`PRESENT_UIDS`]' rows.
pub(crate) fn changes_of<R: Cols>(
    highest: i64,
    changed: &[R],
    expunged: Vec<i64>,
    present: Option<Vec<R>>,
) -> StoreResult<MailboxChanges> {
    let present = present.map(|rows| rows.iter().map(|r| u32_of(r.int("uid")?, "uid")).collect());
    Ok(MailboxChanges {
        highest_modseq: u64_of(highest),
        changed: changed.iter().map(flag_row).collect::<StoreResult<_>>()?,
        expunged: expunged.into_iter().map(|u| u32_of(u, "uid")).collect::<StoreResult<_>>()?,
        present: present.transpose()?,
    })
}

fn account_of<B: Backend>(r: &B::Row) -> StoreResult<Account> {
    Ok(Account {
        id: r.int("id")?,
        email: r.text("email")?,
        domain: r.text("domain")?,
        password_hash: r.text("password_hash")?,
        created_at: B::date(r, "created_at")?,
        enabled: r.int("disabled")? == 0,
        display_name: r.opt_text("display_name")?,
    })
}

fn queue_item_of<B: Backend>(r: &B::Row) -> StoreResult<QueueItem> {
    Ok(QueueItem {
        id: r.int("id")?,
        sender: r.text("sender")?,
        recipients: from_json(&r.text("recipients")?, "recipients")?,
        raw: Bytes::from(r.blob("raw")?),
        account_id: r.opt_int("account_id")?,
        attempts: u32::try_from(r.int32("attempts")?).unwrap_or(0),
        last_error: r.opt_text("last_error")?,
        created_at: B::date(r, "created_at")?,
        expires_at: B::date(r, "expires_at")?,
        delay_notified: r.boolean("delay_notified")?,
        dsn: from_json(&r.text("dsn")?, "dsn")?,
    })
}

fn queue_entry_of<B: Backend>(r: &B::Row) -> StoreResult<QueueEntry> {
    Ok(QueueEntry {
        id: r.int("id")?,
        sender: r.text("sender")?,
        recipients: from_json(&r.text("recipients")?, "recipients")?,
        size: u64_of(r.int("size")?),
        attempts: u32::try_from(r.int32("attempts")?).unwrap_or(0),
        next_attempt: B::date(r, "next_attempt")?,
        created_at: B::date(r, "created_at")?,
        expires_at: B::date(r, "expires_at")?,
        last_error: r.opt_text("last_error")?,
        locked_by: r.opt_text("locked_by")?,
        outcomes: from_json(&r.text("outcomes")?, "outcomes")?,
    })
}

/// The first row, or `NotFound(what)`.
fn first<R>(rows: Vec<R>, what: impl FnOnce() -> String) -> StoreResult<R> {
    rows.into_iter().next().ok_or_else(|| StoreError::NotFound(what()))
}

/// An allowed sender as stored: a lower-cased address, or `@` and a domain.
fn allowed_sender(address: &str) -> StoreResult<String> {
    match address.trim().strip_prefix('@') {
        Some(domain) => Ok(format!("@{}", normalize_domain(domain)?)),
        None => Ok(normalize_email(address)?.0),
    }
}

/// The statement's parameters after the [`Backend::clock`] ones.
fn after_clock<'a, B: Backend>(params: &[Param<'a>]) -> Vec<Param<'a>> {
    let mut all = B::clock();
    all.extend_from_slice(params);
    all
}

/// Runs an UPDATE meant for one row; `NotFound(what)` when it matched none.
async fn update_one<B: Backend>(
    store: &B,
    sql: &'static str,
    params: &[Param<'_>],
    what: String,
) -> StoreResult<()> {
    match store.execute(sql, params).await.map_err(db_err)? {
        0 => Err(StoreError::NotFound(what)),
        _ => Ok(()),
    }
}

fn is_foreign_key_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_foreign_key_violation())
}

#[async_trait]
impl<B: Backend> Operations for B {
    fn backend(&self) -> &'static str {
        B::NAME
    }

    async fn migrate(&self) -> StoreResult<()> {
        self.run_migrations().await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.fetch(false, "SELECT 1", &[]).await.map(drop)
    }

    fn pool_stats(&self) -> PoolStats {
        self.pool_figures()
    }

    fn set_acquire_observer(&self, observer: AcquireObserver) {
        self.acquire_timer().set(observer);
    }

    async fn epoch(&self) -> StoreResult<Option<String>> {
        self.cluster_epoch().await
    }

    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> StoreResult<bool> {
        // One writer per key at a time: count-then-insert must not interleave with
        // another process's.
        let mut tx = self.begin().await?;
        if let Some(sql) = B::LEASE_LOCK {
            tx.run(sql, &[Param::Text(key)]).await?;
        }
        tx.run(B::LEASE_PRUNE, &[&[Param::Text(key)], &B::clock()[..]].concat()).await?;
        let lease = [&[Param::Text(key), Param::Text(member)], &B::lease_expiry(ttl)[..]].concat();
        if tx.execute(B::LEASE_RENEW, &lease).await.map_err(db_err)? == 0 {
            let live =
                tx.fetch_int("SELECT count(*) FROM leases WHERE key = $1", &[Param::Text(key)]).await?;
            if u64_of(live.unwrap_or(0)) >= limit {
                tx.commit().await?;
                return Ok(false);
            }
            tx.run(B::LEASE_INSERT, &lease).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn lease_extend(&self, key: &str, member: &str, ttl: Duration) -> StoreResult<bool> {
        let params =
            [&[Param::Text(key), Param::Text(member)], &B::lease_expiry(ttl)[..], &B::clock()].concat();
        Ok(self.execute(B::LEASE_EXTEND, &params).await.map_err(db_err)? > 0)
    }

    async fn lease_release(&self, key: &str, member: &str) -> StoreResult<()> {
        let sql = "DELETE FROM leases WHERE key = $1 AND member = $2";
        self.execute(sql, &[Param::Text(key), Param::Text(member)]).await.map_err(db_err)?;
        Ok(())
    }

    async fn lease_count(&self, key: &str) -> StoreResult<u64> {
        let rows = self.fetch(false, B::LEASE_COUNT, &after_clock::<B>(&[Param::Text(key)])).await?;
        Ok(u64_of(first(rows, || format!("lease {key}"))?.int("n")?))
    }
}

#[async_trait]
impl<B: Backend> Directory for B {
    async fn account_create(&self, email: &str, password_hash: &str) -> StoreResult<Account> {
        steps::account_create(self.begin(), email, password_hash).await
    }

    async fn accounts_import(&self, batch: &[ImportedAccount]) -> StoreResult<ImportOutcome> {
        steps::accounts_import(self.begin(), batch).await
    }

    async fn account_delete(&self, email: &str) -> StoreResult<()> {
        let (email, _) = normalize_email(email)?;
        let mut tx = self.begin().await?;
        let id = tx
            .fetch_int(B::ACCOUNT_FOR_DELETE, &[Param::Text(&email)])
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("account {email}")))?;
        // the mailboxes in lock order before the cascade deletes them
        if let Some(sql) = B::LOCK_ACCOUNT_MAILBOXES {
            tx.fetch_ids(sql, &[Param::Int(id)]).await?;
        }
        let bodies = "SELECT DISTINCT mm.message_id FROM mailbox_messages mm \
             JOIN mailboxes m ON m.id = mm.mailbox_id WHERE m.account_id = $1";
        let message_ids = tx.fetch_ids(bodies, &[Param::Int(id)]).await?;
        tx.run("DELETE FROM accounts WHERE id = $1", &[Param::Int(id)]).await?;
        tx.delete_orphans(&message_ids).await?;
        tx.commit().await
    }

    async fn account_set_password(&self, email: &str, password_hash: &str) -> StoreResult<()> {
        let (email, _) = normalize_email(email)?;
        let sql = "UPDATE accounts SET password_hash = $1 WHERE email = $2";
        update_one(self, sql, &[Param::Text(password_hash), Param::Text(&email)], format!("account {email}"))
            .await
    }

    async fn account_get(&self, email: &str) -> StoreResult<Option<Account>> {
        let Ok((email, _)) = normalize_email(email) else { return Ok(None) };
        let rows = self.fetch(false, account_select!("WHERE a.email = $1"), &[Param::Text(&email)]).await?;
        rows.first().map(account_of::<B>).transpose()
    }

    async fn account_set_enabled(&self, email: &str, enabled: bool) -> StoreResult<()> {
        let (email, _) = normalize_email(email)?;
        let sql = "UPDATE accounts SET disabled = $1 WHERE email = $2";
        let params = [Param::Int(i64::from(!enabled)), Param::Text(&email)];
        update_one(self, sql, &params, format!("account {email}")).await
    }

    async fn account_set_display_name(&self, email: &str, name: Option<&str>) -> StoreResult<()> {
        let (email, _) = normalize_email(email)?;
        let sql = "UPDATE accounts SET display_name = $1 WHERE email = $2";
        update_one(self, sql, &[Param::OptText(name), Param::Text(&email)], format!("account {email}")).await
    }

    async fn account_set_quota(&self, email: &str, limit: Option<u64>) -> StoreResult<()> {
        let (email, _) = normalize_email(email)?;
        let sql = "UPDATE accounts SET quota_bytes = $1 WHERE email = $2";
        let params = [Param::OptInt(limit_column(limit)), Param::Text(&email)];
        update_one(self, sql, &params, format!("account {email}")).await
    }

    async fn quota(&self, account_id: i64) -> StoreResult<Quota> {
        let rows = self.fetch(false, QUOTA, &[Param::Int(account_id)]).await?;
        quota_of(&first(rows, || format!("account {account_id}"))?)
    }

    async fn account_record_login(&self, account_id: i64, at: DateTime<Utc>) -> StoreResult<()> {
        let sql = "UPDATE accounts SET last_login_at = $1 WHERE id = $2 \
             AND (last_login_at IS NULL OR last_login_at < $3)";
        self.execute(sql, &[B::time(at), Param::Int(account_id), B::time(at)]).await.map_err(db_err)?;
        Ok(())
    }

    async fn account_last_login(&self, email: &str) -> StoreResult<Option<DateTime<Utc>>> {
        let (email, _) = normalize_email(email)?;
        let rows = self
            .fetch(false, "SELECT last_login_at FROM accounts WHERE email = $1", &[Param::Text(&email)])
            .await?;
        B::opt_date(&first(rows, || format!("account {email}"))?, "last_login_at")
    }

    async fn account_list(&self, domain: Option<&str>) -> StoreResult<Vec<Account>> {
        let rows = match domain {
            Some(d) => {
                let d = normalize_domain(d)?;
                let sql = account_select!("WHERE d.name = $1 ORDER BY a.email");
                self.fetch(false, sql, &[Param::Text(&d)]).await?
            }
            None => self.fetch(false, account_select!("ORDER BY a.email"), &[]).await?,
        };
        rows.iter().map(account_of::<B>).collect()
    }
}

#[async_trait]
impl<B: Backend> Domains for B {
    async fn domain_add(&self, domain: &str) -> StoreResult<()> {
        let d = normalize_domain(domain)?;
        match self.insert_domain(&d).await {
            Ok(_) => Ok(()),
            Err(e) if is_unique_violation(&e) => Err(StoreError::AlreadyExists(format!("domain {d}"))),
            Err(e) => Err(db_err(e)),
        }
    }

    async fn domain_del(&self, domain: &str) -> StoreResult<()> {
        let d = normalize_domain(domain)?;
        let mut tx = self.begin().await?;
        let id = tx
            .fetch_int(B::DOMAIN_FOR_DELETE, &[Param::Text(&d)])
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("domain {d}")))?;
        let used = "SELECT id FROM accounts WHERE domain_id = $1 LIMIT 1";
        if tx.fetch_int(used, &[Param::Int(id)]).await?.is_some() {
            return Err(StoreError::Invalid(format!("domain {d} still has accounts")));
        }
        // an account created concurrently makes this fail on the foreign key
        tx.execute("DELETE FROM domains WHERE id = $1", &[Param::Int(id)]).await.map_err(|e| {
            if is_foreign_key_violation(&e) {
                StoreError::Invalid("domain still has accounts".into())
            } else {
                db_err(e)
            }
        })?;
        tx.commit().await
    }

    async fn domain_list(&self) -> StoreResult<Vec<String>> {
        let rows = self.fetch(false, "SELECT name FROM domains ORDER BY name", &[]).await?;
        rows.iter().map(|r| r.text("name")).collect()
    }

    async fn domain_exists(&self, domain: &str) -> StoreResult<bool> {
        let Ok(d) = normalize_domain(domain) else { return Ok(false) };
        let rows = self.fetch(false, "SELECT id FROM domains WHERE name = $1", &[Param::Text(&d)]).await?;
        Ok(!rows.is_empty())
    }

    async fn domain_set_quota(&self, domain: &str, limit: Option<u64>) -> StoreResult<()> {
        let d = normalize_domain(domain)?;
        let sql = "UPDATE domains SET default_quota_bytes = $1 WHERE name = $2";
        update_one(self, sql, &[Param::OptInt(limit_column(limit)), Param::Text(&d)], format!("domain {d}"))
            .await
    }

    async fn domain_quota(&self, domain: &str) -> StoreResult<Option<u64>> {
        let d = normalize_domain(domain)?;
        let sql = "SELECT default_quota_bytes FROM domains WHERE name = $1";
        let rows = self.fetch(false, sql, &[Param::Text(&d)]).await?;
        Ok(first(rows, || format!("domain {d}"))?.opt_int("default_quota_bytes")?.map(u64_of))
    }

    async fn domain_set_catch_all(&self, domain: &str, target: Option<&str>) -> StoreResult<()> {
        let d = normalize_domain(domain)?;
        let target = target.map(normalize_email).transpose()?.map(|(t, _)| t);
        let mut tx = self.begin().await?;
        if let Some(t) = &target {
            let account = "SELECT id FROM accounts WHERE email = $1";
            if tx.fetch_int(account, &[Param::Text(t)]).await?.is_none() {
                return Err(StoreError::NotFound(format!("account {t}")));
            }
        }
        let sql = "UPDATE domains SET catch_all = $1 WHERE name = $2";
        match tx.execute(sql, &[Param::OptText(target.as_deref()), Param::Text(&d)]).await.map_err(db_err)? {
            0 => Err(StoreError::NotFound(format!("domain {d}"))),
            _ => tx.commit().await,
        }
    }

    async fn domain_catch_all(&self, domain: &str) -> StoreResult<Option<String>> {
        let d = normalize_domain(domain)?;
        let rows =
            self.fetch(false, "SELECT catch_all FROM domains WHERE name = $1", &[Param::Text(&d)]).await?;
        first(rows, || format!("domain {d}"))?.opt_text("catch_all")
    }

    async fn domain_key_set(&self, domain: &str, key: Option<&DomainKey>) -> StoreResult<()> {
        let d = normalize_domain(domain)?;
        if !self.domain_exists(&d).await? {
            return Err(StoreError::NotFound(format!("domain {d}")));
        }
        let Some(key) = key else {
            let sql = "DELETE FROM dkim_keys WHERE domain_id = (SELECT id FROM domains WHERE name = $1)";
            self.execute(sql, &[Param::Text(&d)]).await.map_err(db_err)?;
            return Ok(());
        };
        // The SELECT's WHERE also keeps SQLite from reading ON CONFLICT as a join.
        let sql = "INSERT INTO dkim_keys (domain_id, selector, algorithm, private_key) \
             SELECT id, $2, $3, $4 FROM domains WHERE name = $1 \
             ON CONFLICT (domain_id) DO UPDATE SET selector = excluded.selector, \
             algorithm = excluded.algorithm, private_key = excluded.private_key";
        let params = [
            Param::Text(&d),
            Param::Text(&key.selector),
            Param::Text(&key.algorithm),
            Param::Text(&key.private_pem),
        ];
        update_one(self, sql, &params, format!("domain {d}")).await
    }

    async fn domain_keys(&self) -> StoreResult<Vec<DomainKey>> {
        let sql = "SELECT d.name, k.selector, k.algorithm, k.private_key \
             FROM dkim_keys k JOIN domains d ON d.id = k.domain_id ORDER BY d.name";
        self.fetch(false, sql, &[])
            .await?
            .iter()
            .map(|row| {
                Ok(DomainKey {
                    domain: row.text("name")?,
                    selector: row.text("selector")?,
                    algorithm: row.text("algorithm")?,
                    private_pem: row.text("private_key")?,
                })
            })
            .collect()
    }
}

#[async_trait]
impl<B: Backend> Addresses for B {
    async fn account_sender_add(&self, email: &str, address: &str) -> StoreResult<()> {
        let (email, _) = normalize_email(email)?;
        let address = allowed_sender(address)?;
        let rows =
            self.fetch(true, "SELECT id FROM accounts WHERE email = $1", &[Param::Text(&email)]).await?;
        let id = first(rows, || format!("account {email}"))?.int("id")?;
        let sql = "INSERT INTO account_senders (account_id, address) VALUES ($1, $2)";
        self.execute(sql, &[Param::Int(id), Param::Text(&address)]).await.map_err(|e| {
            if is_unique_violation(&e) {
                StoreError::AlreadyExists(format!("sender {address} of {email}"))
            } else if is_foreign_key_violation(&e) {
                StoreError::NotFound(format!("account {email}"))
            } else {
                db_err(e)
            }
        })?;
        Ok(())
    }

    async fn account_sender_del(&self, email: &str, address: &str) -> StoreResult<()> {
        let (email, _) = normalize_email(email)?;
        let address = allowed_sender(address)?;
        let sql = "DELETE FROM account_senders WHERE address = $1 \
                   AND account_id = (SELECT id FROM accounts WHERE email = $2)";
        let removed =
            self.execute(sql, &[Param::Text(&address), Param::Text(&email)]).await.map_err(db_err)?;
        if removed == 0 {
            return Err(StoreError::NotFound(format!("sender {address} of {email}")));
        }
        Ok(())
    }

    async fn sender_rights(&self, email: &str) -> StoreResult<SenderRights> {
        let Ok((email, _)) = normalize_email(email) else { return Ok(SenderRights::default()) };
        let sql = "SELECT CAST(0 AS BIGINT) AS kind, address FROM aliases WHERE target = $1 \
                   UNION ALL SELECT 1, s.address FROM account_senders s \
                   JOIN accounts a ON a.id = s.account_id WHERE a.email = $2 ORDER BY 1, 2";
        let rows = self.fetch(false, sql, &[Param::Text(&email), Param::Text(&email)]).await?;
        let mut rights = SenderRights::default();
        for row in &rows {
            let address = row.text("address")?;
            if row.int("kind")? == 0 { rights.aliases.push(address) } else { rights.allowed.push(address) }
        }
        Ok(rights)
    }

    async fn alias_add(&self, address: &str, target: &str) -> StoreResult<()> {
        let (address, domain) = normalize_email(address)?;
        let (target, _) = normalize_email(target)?;
        let mut tx = self.begin().await?;
        let domain_id = tx
            .fetch_int("SELECT id FROM domains WHERE name = $1", &[Param::Text(&domain)])
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("domain {domain}")))?;
        let account = "SELECT id FROM accounts WHERE email = $1";
        if tx.fetch_int(account, &[Param::Text(&address)]).await?.is_some() {
            return Err(StoreError::Invalid(format!("{address} is an account")));
        }
        if tx.fetch_int(account, &[Param::Text(&target)]).await?.is_none() {
            return Err(StoreError::NotFound(format!("account {target}")));
        }
        let sql = "INSERT INTO aliases (domain_id, address, target) VALUES ($1, $2, $3)";
        let params = [Param::Int(domain_id), Param::Text(&address), Param::Text(&target)];
        tx.execute(sql, &params).await.map_err(|e| {
            if is_unique_violation(&e) {
                StoreError::AlreadyExists(format!("alias {address} → {target}"))
            } else if is_foreign_key_violation(&e) {
                StoreError::NotFound(format!("domain {domain}"))
            } else {
                db_err(e)
            }
        })?;
        tx.commit().await
    }

    async fn alias_del(&self, address: &str, target: Option<&str>) -> StoreResult<()> {
        let (address, _) = normalize_email(address)?;
        let removed = match target {
            Some(t) => {
                let (t, _) = normalize_email(t)?;
                let sql = "DELETE FROM aliases WHERE address = $1 AND target = $2";
                self.execute(sql, &[Param::Text(&address), Param::Text(&t)]).await
            }
            None => self.execute("DELETE FROM aliases WHERE address = $1", &[Param::Text(&address)]).await,
        }
        .map_err(db_err)?;
        if removed == 0 {
            return Err(StoreError::NotFound(format!("alias {address}")));
        }
        Ok(())
    }

    async fn alias_list(&self, domain: Option<&str>) -> StoreResult<Vec<(String, String)>> {
        let rows = match domain {
            Some(d) => {
                let d = normalize_domain(d)?;
                let sql = "SELECT a.address, a.target FROM aliases a JOIN domains d ON d.id = a.domain_id \
                           WHERE d.name = $1 ORDER BY a.address, a.target";
                self.fetch(false, sql, &[Param::Text(&d)]).await?
            }
            None => {
                let sql = "SELECT address, target FROM aliases ORDER BY address, target";
                self.fetch(false, sql, &[]).await?
            }
        };
        rows.iter().map(|r| Ok((r.text("address")?, r.text("target")?))).collect()
    }

    async fn alias_targets(&self, address: &str) -> StoreResult<Vec<String>> {
        let Ok((address, _)) = normalize_email(address) else { return Ok(Vec::new()) };
        let sql = "SELECT target FROM aliases WHERE address = $1 ORDER BY target";
        let rows = self.fetch(false, sql, &[Param::Text(&address)]).await?;
        rows.iter().map(|r| r.text("target")).collect()
    }

    async fn recipient(&self, address: &str, user: Option<&str>) -> StoreResult<Recipient> {
        let Some((_, domain)) = address.rsplit_once('@') else { return Ok(Recipient::NotLocal) };
        let Ok(domain) = normalize_domain(domain) else { return Ok(Recipient::NotLocal) };
        let address = normalize_email(address).ok().map(|(a, _)| a);
        let user = user.and_then(|u| normalize_email(u).ok()).map(|(u, _)| u);
        let (address, user) = (address.as_deref(), user.as_deref());
        let params = [
            Param::OptText(address),
            Param::OptText(user),
            Param::OptText(address),
            Param::OptText(user),
            Param::Text(&domain),
        ];
        let rows = self.fetch(false, RECIPIENT, &params).await?;
        // Rows come in kind order: the domain's row (4) last, and the first
        // row is the answer that wins.
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else { return Ok(Recipient::NotLocal) };
        if last.int("kind")? != 4 {
            return Ok(Recipient::NotLocal);
        }
        match first.int("kind")? {
            0 | 1 => {
                let Some(mailbox_id) = first.opt_int("mailbox_id")? else { return Ok(Recipient::NoSuchUser) };
                let limits = Quota {
                    account_limit: first.opt_int("quota_bytes")?.map(u64_of),
                    domain_limit: first.opt_int("default_quota_bytes")?.map(u64_of),
                    used: 0,
                };
                Ok(Recipient::Mailbox {
                    account_id: first.int("account_id")?,
                    mailbox_id,
                    limited: limits.limit().is_some(),
                })
            }
            // No account or alias: the domain's catch-all account, if it has one.
            4 => Ok(match first.opt_text("target")? {
                Some(catch_all) => Recipient::Alias(vec![catch_all]),
                None => Recipient::NoSuchUser,
            }),
            aliases => {
                let mut targets = Vec::new();
                for row in &rows {
                    if row.int("kind")? != aliases {
                        break;
                    }
                    targets.push(row.text("target")?);
                }
                Ok(Recipient::Alias(targets))
            }
        }
    }
}

#[async_trait]
impl<B: Backend> Mailboxes for B {
    async fn mailbox_list(&self, account_id: i64) -> StoreResult<Vec<Mailbox>> {
        self.fetch(false, B::MAILBOX_LIST, &[Param::Int(account_id)])
            .await?
            .iter()
            .map(mailbox_from_row)
            .collect()
    }

    async fn mailbox_get(&self, account_id: i64, name: &str) -> StoreResult<Option<Mailbox>> {
        let Ok(name) = normalize_mailbox_name(name) else { return Ok(None) };
        let rows = self.fetch(false, MAILBOX_BY_NAME, &[Param::Int(account_id), Param::Text(&name)]).await?;
        rows.first().map(mailbox_from_row).transpose()
    }

    async fn mailbox_get_by_id(&self, mailbox_id: i64) -> StoreResult<Option<Mailbox>> {
        let rows = self.fetch(false, MAILBOX_BY_ID, &[Param::Int(mailbox_id)]).await?;
        rows.first().map(mailbox_from_row).transpose()
    }

    async fn mailbox_get_with_status(
        &self,
        account_id: i64,
        name: &str,
    ) -> StoreResult<Option<(Mailbox, MailboxStatus)>> {
        let Ok(name) = normalize_mailbox_name(name) else { return Ok(None) };
        let rows =
            self.fetch(false, MAILBOX_WITH_STATUS, &[Param::Int(account_id), Param::Text(&name)]).await?;
        rows.first().map(|r| Ok((mailbox_from_row(r)?, status_of(r)?))).transpose()
    }

    async fn mailbox_with_quota(&self, account_id: i64, name: &str) -> StoreResult<Option<(Mailbox, Quota)>> {
        let Ok(name) = normalize_mailbox_name(name) else { return Ok(None) };
        let rows =
            self.fetch(false, MAILBOX_WITH_QUOTA, &[Param::Int(account_id), Param::Text(&name)]).await?;
        rows.first().map(|r| Ok((mailbox_from_row(r)?, quota_of(r)?))).transpose()
    }

    async fn mailbox_create(
        &self,
        account_id: i64,
        name: &str,
        special_use: Option<SpecialUse>,
    ) -> StoreResult<Mailbox> {
        steps::mailbox_create(self.begin(), account_id, name, special_use).await
    }

    async fn mailbox_delete(&self, account_id: i64, name: &str) -> StoreResult<()> {
        steps::mailbox_delete(self.begin(), account_id, name).await
    }

    async fn mailbox_rename(&self, account_id: i64, from: &str, to: &str) -> StoreResult<()> {
        steps::mailbox_rename(self.begin(), account_id, from, to).await
    }

    async fn mailbox_subscribe(&self, account_id: i64, name: &str, subscribed: bool) -> StoreResult<()> {
        let name = normalize_mailbox_name(name)?;
        let mut tx = self.begin().await?;
        let no_account = || StoreError::NotFound(format!("account {account_id}"));
        if tx.fetch_int("SELECT id FROM accounts WHERE id = $1", &[Param::Int(account_id)]).await?.is_none() {
            return Err(no_account());
        }
        let sql = if subscribed {
            "INSERT INTO subscriptions (account_id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM subscriptions WHERE account_id = $1 AND name = $2"
        };
        let params = [Param::Int(account_id), Param::Text(&name)];
        tx.execute(sql, &params)
            .await
            .map_err(|e| if is_foreign_key_violation(&e) { no_account() } else { db_err(e) })?;
        tx.commit().await
    }

    async fn subscriptions(&self, account_id: i64) -> StoreResult<Vec<String>> {
        let rows = self.fetch(false, B::SUBSCRIPTIONS, &[Param::Int(account_id)]).await?;
        rows.iter().map(|r| r.text("name")).collect()
    }

    async fn mailbox_status(&self, mailbox_id: i64) -> StoreResult<MailboxStatus> {
        let rows = self.fetch(false, MAILBOX_STATUS, &[Param::Int(mailbox_id)]).await?;
        status_of(&first(rows, || format!("mailbox {mailbox_id}"))?)
    }

    async fn recent_claim(&self, mailbox_id: i64, up_to: u32) -> StoreResult<u32> {
        // Most calls find the messages already taken (another session learnt of
        // them first): a plain read answers those, with no lock and no write on the
        // mailbox row deliveries also update. The floor only ever rises, so a
        // floor at or above `up_to` stays so.
        let sql = "SELECT recent_floor FROM mailboxes WHERE id = $1";
        let rows = self.fetch(false, sql, &[Param::Int(mailbox_id)]).await?;
        let floor = first(rows, || format!("mailbox {mailbox_id}"))?.int("recent_floor")?;
        if floor >= i64::from(up_to) {
            return u32_of(floor, "recent_floor");
        }
        self.recent_claim_own(mailbox_id, up_to).await
    }

    async fn mailbox_renew_uid_validity(&self, mailbox_id: i64, old: u32) -> StoreResult<Option<u32>> {
        // The time in seconds, as for a new mailbox, unless that is not above the
        // old value (a clock behind, or renewals within one second).
        let new = u32::try_from(super::common::now_secs()).unwrap_or(u32::MAX).max(old.saturating_add(1));
        if new == old {
            return Ok(None);
        }
        let sql = "UPDATE mailboxes SET uid_validity = $1 WHERE id = $2 AND uid_validity = $3";
        let params = [Param::Int(i64::from(new)), Param::Int(mailbox_id), Param::Int(i64::from(old))];
        let changed = self.execute(sql, &params).await.map_err(db_err)?;
        Ok((changed > 0).then_some(new))
    }

    async fn recent_claim_own(&self, mailbox_id: i64, up_to: u32) -> StoreResult<u32> {
        let before = self.raise_recent_floor(mailbox_id, i64::from(up_to)).await?;
        u32_of(before.ok_or_else(|| StoreError::NotFound(format!("mailbox {mailbox_id}")))?, "recent_floor")
    }

    async fn mailbox_size(&self, mailbox_id: i64) -> StoreResult<u64> {
        let rows =
            self.fetch(false, "SELECT bytes FROM mailboxes WHERE id = $1", &[Param::Int(mailbox_id)]).await?;
        Ok(u64_of(first(rows, || format!("mailbox {mailbox_id}"))?.int("bytes")?))
    }

    async fn mailbox_deleted(&self, mailbox_id: i64) -> StoreResult<(u32, u64)> {
        let rows = self.fetch(false, B::MAILBOX_DELETED, &[Param::Int(mailbox_id)]).await?;
        let row = first(rows, || format!("mailbox {mailbox_id}"))?;
        Ok((u32_of(row.int("n")?, "messages")?, u64_of(row.int("bytes")?)))
    }

    async fn recent_count(&self, mailbox_id: i64) -> StoreResult<u32> {
        let rows = self.fetch(false, RECENT_COUNT, &[Param::Int(mailbox_id)]).await?;
        u32_of(first(rows, || format!("mailbox {mailbox_id}"))?.int("n")?, "recent")
    }
}

#[async_trait]
impl<B: Backend> Messages for B {
    async fn deliver_batch(&self, batch: &[NewDelivery]) -> StoreResult<Vec<Vec<DeliveredTo>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // Everything that can fail or take CPU happens before the transaction
        // opens, so row locks are held only for the statements themselves.
        let flags = batch.iter().map(|d| normalize_flagset(&d.flags)).collect::<StoreResult<_>>()?;
        let metas = batch.iter().map(|d| meta_to_json(&d.meta)).collect::<StoreResult<_>>()?;
        let bodies = compress_batch(batch).await?;
        self.deliver(Batch { deliveries: batch, flags, metas, bodies, groups: group_by_mailbox(batch) }).await
    }

    async fn mailbox_index(&self, mailbox_id: i64) -> StoreResult<MailboxIndex> {
        self.index(mailbox_id).await
    }

    async fn maildrop(&self, mailbox_id: i64, after_uid: u32) -> StoreResult<Vec<MaildropEntry>> {
        self.maildrop_listing(mailbox_id, after_uid).await
    }

    async fn messages_by_uid(&self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<MessageRow>> {
        let rows = self.linked_rows(mailbox_id, uids, MESSAGE_ROW_COLS).await?;
        rows.iter()
            .map(|r| {
                let f = flag_row(r)?;
                Ok(MessageRow {
                    uid: f.uid,
                    message_id: r.int("message_id")?,
                    flags: f.flags,
                    modseq: f.modseq,
                    internal_date: B::date(r, "internal_date")?,
                    meta: meta_from_json(&r.text("meta")?)?,
                })
            })
            .collect()
    }

    async fn sort_rows(&self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<SortRow>> {
        let rows = self.linked_rows(mailbox_id, uids, SORT_ROW_COLS).await?;
        rows.iter()
            .map(|r| {
                Ok(SortRow {
                    uid: u32_of(r.int("uid")?, "uid")?,
                    message_id: r.int("message_id")?,
                    internal_date: B::date(r, "internal_date")?,
                    size: u32_of(r.int("size")?, "size")?,
                    sent_date: B::opt_date(r, "sent_date")?,
                    subject: r.text("subject")?,
                    from: r.text("from_addr")?,
                    to: r.text("to_addr")?,
                    cc: r.text("cc_addr")?,
                    message_id_header: r.text("message_id_header")?,
                })
            })
            .collect()
    }

    async fn message_links(&self, keys: &[(i64, u32)]) -> StoreResult<MessageLinks> {
        self.links(keys).await
    }

    async fn message_bodies(&self, message_ids: &[i64]) -> StoreResult<Vec<StoredBody>> {
        self.bodies(message_ids).await
    }

    async fn message_body(&self, message_id: i64) -> StoreResult<Bytes> {
        let sql = "SELECT body, compressed, size FROM messages WHERE id = $1";
        let rows = self.fetch(false, sql, &[Param::Int(message_id)]).await?;
        let row = first(rows, || format!("message {message_id}"))?;
        decompress_body(row.blob("body")?, row.boolean("compressed")?, row.int("size")?)
    }

    async fn uids_by_flags(&self, mailbox_id: i64, with: Flags, without: Flags) -> StoreResult<Vec<u32>> {
        self.flagged_uids(mailbox_id, with, without).await
    }

    async fn store_flags(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
    ) -> StoreResult<Vec<FlagRow>> {
        self.change_flags(mailbox_id, FlagChange::new(uids, op, flags)?).await
    }

    async fn store_flags_unchanged_since(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
        unchanged_since: u64,
    ) -> StoreResult<ConditionalStore> {
        steps::store_flags_unchanged_since(self.begin(), mailbox_id, uids, (op, flags), unchanged_since).await
    }

    async fn expunge(&self, mailbox_id: i64, uids: Option<&UidSet>) -> StoreResult<Expunged> {
        self.expunge_links(mailbox_id, uids).await
    }

    async fn copy(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>> {
        steps::copy_or_move(self.begin(), src, uids, dest, false).await
    }

    async fn move_messages(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>> {
        steps::copy_or_move(self.begin(), src, uids, dest, true).await
    }

    async fn highest_modseqs(&self, mailbox_ids: &[i64]) -> StoreResult<Vec<(i64, u64)>> {
        self.modseqs_of(mailbox_ids).await
    }

    async fn changes_since(&self, mailbox_id: i64, modseq: u64) -> StoreResult<MailboxChanges> {
        self.changes(mailbox_id, modseq).await
    }

    async fn prune_tombstones(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        self.prune(before).await
    }
}

#[async_trait]
impl<B: Backend> Queue for B {
    async fn queue_enqueue(&self, item: &NewQueueItem) -> StoreResult<i64> {
        let recipients = json_of(&item.recipients)?;
        let dsn = json_of(&item.dsn)?;
        let params = [
            Param::Text(&item.sender),
            Param::Text(&recipients),
            Param::Bytes(&item.raw),
            Param::OptInt(item.account_id),
            B::time(item.not_before),
            B::time(item.expires_at),
            Param::Text(&dsn),
        ];
        let rows = self.fetch(true, B::ENQUEUE, &[&params[..], &B::clock()].concat()).await?;
        first(rows, || "queued item".into())?.int("id")
    }

    async fn queue_claim(&self, worker: &str, limit: u32, lease: Duration) -> StoreResult<Vec<QueueItem>> {
        let params =
            [&[Param::Text(worker), Param::Int(i64::from(limit))], &B::lease_expiry(lease)[..], &B::clock()];
        let rows = self.fetch(true, B::CLAIM, &params.concat()).await?;
        let mut items = rows.iter().map(queue_item_of::<B>).collect::<StoreResult<Vec<_>>>()?;
        items.sort_by_key(|i| i.id);
        Ok(items)
    }

    async fn queue_complete(&self, id: i64) -> StoreResult<()> {
        update_one(
            self,
            "DELETE FROM outbound_queue WHERE id = $1",
            &[Param::Int(id)],
            format!("queue item {id}"),
        )
        .await
    }

    async fn queue_finish(&self, id: i64, worker: &str, attempt: &QueueAttempt) -> StoreResult<bool> {
        let changed = if attempt.remaining.is_empty() {
            let sql = "DELETE FROM outbound_queue WHERE id = $1 AND locked_by = $2";
            self.execute(sql, &[Param::Int(id), Param::Text(worker)]).await.map_err(db_err)?
        } else {
            let remaining = json_of(&attempt.remaining)?;
            let outcomes = json_of(&attempt.outcomes)?;
            let params = [
                Param::Int(id),
                Param::Text(worker),
                Param::Text(&remaining),
                Param::Text(&outcomes),
                Param::OptText(attempt.last_error.as_deref()),
                B::time(attempt.retry_at),
                Param::Bool(attempt.delay_notified),
            ];
            self.execute(B::RESCHEDULE, &params).await.map_err(db_err)?
        };
        Ok(changed > 0)
    }

    async fn queue_release(&self, id: i64, worker: &str) -> StoreResult<()> {
        self.execute(B::QUEUE_RELEASE, &[Param::Int(id), Param::Text(worker)]).await.map_err(db_err)?;
        Ok(())
    }

    async fn queue_list(&self, limit: u32) -> StoreResult<Vec<QueueEntry>> {
        let params = after_clock::<B>(&[Param::Int(i64::from(limit))]);
        self.fetch(false, B::QUEUE_LIST, &params).await?.iter().map(queue_entry_of::<B>).collect()
    }

    async fn queue_get(&self, id: i64) -> StoreResult<Option<(QueueEntry, Bytes)>> {
        let rows = self.fetch(false, B::QUEUE_GET, &after_clock::<B>(&[Param::Int(id)])).await?;
        let Some(row) = rows.first() else { return Ok(None) };
        Ok(Some((queue_entry_of::<B>(row)?, Bytes::from(row.blob("raw")?))))
    }

    async fn queue_retry(&self, id: Option<i64>) -> StoreResult<u64> {
        self.execute(B::QUEUE_RETRY, &after_clock::<B>(&[Param::OptInt(id)])).await.map_err(db_err)
    }

    async fn queue_delete(&self, id: i64) -> StoreResult<bool> {
        let gone = self.execute("DELETE FROM outbound_queue WHERE id = $1", &[Param::Int(id)]).await;
        Ok(gone.map_err(db_err)? > 0)
    }

    async fn queue_stats(&self) -> StoreResult<QueueStats> {
        let sql = "SELECT count(*) AS depth, min(created_at) AS oldest FROM outbound_queue";
        let row = first(self.fetch(false, sql, &[]).await?, || "queue".into())?;
        Ok(QueueStats { depth: u64_of(row.int("depth")?), oldest: B::opt_date(&row, "oldest")? })
    }
}
