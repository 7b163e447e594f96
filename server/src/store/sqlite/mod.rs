//! The embedded store: SQLite through sqlx, for single-pod installs and development.
//!
//! Concurrency model: one *writer* connection and a pool of *reader* connections on
//! the same WAL-mode file. WAL lets readers run while the writer commits; funnelling
//! every write through a single connection means writers queue at the write gate
//! (fair, bounded by the acquire timeout) instead of colliding inside SQLite, so this
//! process never sees `SQLITE_BUSY` from itself. Write transactions start with
//! `BEGIN IMMEDIATE` so that a write lock held by *another* process (the CLI adding a
//! user while `serve` runs) is waited for by `busy_timeout` up front, rather than a
//! deferred transaction failing with an unretryable `SQLITE_BUSY_SNAPSHOT` halfway.
//!
//! Durability: `synchronous=FULL`. With WAL, NORMAL already survives `kill -9` (the
//! WAL write reaches the OS before COMMIT returns) but may drop the last commits on
//! power loss; a `250 OK` promises the message is stored, so every commit fsyncs the
//! WAL. Group commit amortises that fsync twice over: [`Messages::deliver_batch`] stores
//! many deliveries in one write, and the write gate ([`gate`]) commits the writes that
//! queue up together — deliveries, flag changes, expunges — in one transaction.
//!
//! Since a single connection writes, "locking mailboxes in ascending id order" is
//! implicit here; the statements still follow the PostgreSQL store's order so the
//! two read alike.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};

use super::common::{
    AcquireTimer, apply_flags, db_err, delivered, encode_keywords, flag_conditions, flagset_from_row,
    json_of, mailbox_index_from, u32_of, u64_of, uid_ranges,
};
use super::sql::{Backend, Batch, PRESENT_UIDS, changes_of, stored_body_of};
use super::steps::{
    self, Cols, FlagChange, LINK_COLS, LinkRow, MAILBOX_BY_NAME, MAILBOX_COLS, NewAccount, NewMailbox,
    OpenTx, Param, RenameFrom, SharedSql, StoreTx, mailbox_from_row,
};
use super::*;

mod gate;
use gate::{WriteGate, WriteTx};

/// See [`super::common::rollback_tolerant`].
static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(|| super::common::rollback_tolerant(sqlx::migrate!("./migrations/sqlite")));

/// How long a write waits for another process's write lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct SqliteStore {
    writer: SqlitePool,
    /// Every write goes through it: see [`gate`].
    gate: WriteGate,
    reader: SqlitePool,
    /// In-memory databases use one connection for both roles.
    shared: bool,
    acquire: AcquireTimer,
}

type Tx = WriteTx;

fn to_us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn from_us(us: i64) -> DateTime<Utc> {
    Utc.timestamp_micros(us).single().unwrap_or_default()
}

impl SqliteStore {
    /// Opens (creating if missing) the database described by `options`.
    pub async fn connect(
        options: SqliteConnectOptions,
        pool_size: u32,
        acquire_timeout: Duration,
    ) -> StoreResult<Self> {
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let in_memory = options.get_filename().to_string_lossy().contains(":memory:")
            || options.get_filename().as_os_str().is_empty();
        let name = options.get_filename().display().to_string();
        let unavailable =
            |e: sqlx::Error| StoreError::Unavailable(format!("cannot open SQLite database {name}: {e}"));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(acquire_timeout)
            // taken once per write batch: a ping each time would be a round trip
            // to the connection's thread for nothing
            .test_before_acquire(false)
            // an in-memory database lives exactly as long as its connection
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options.clone())
            .await
            .map_err(unavailable)?;
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(pool_size.max(1))
                .acquire_timeout(acquire_timeout)
                .connect_with(options.create_if_missing(false))
                .await
                .map_err(unavailable)?
        };
        let gate = WriteGate::new(writer.clone(), in_memory, acquire_timeout);
        Ok(SqliteStore { writer, gate, reader, shared: in_memory, acquire: AcquireTimer::default() })
    }

    /// Opens the file at `path` (created with its directory if missing).
    pub async fn open_path(path: &Path, pool_size: u32, acquire_timeout: Duration) -> StoreResult<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create data directory {}: {e}", dir.display()))
            })?;
        }
        Self::connect(SqliteConnectOptions::new().filename(path), pool_size, acquire_timeout).await
    }

    /// Opens a `sqlite:` URL.
    pub async fn open_url(url: &str, pool_size: u32, acquire_timeout: Duration) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad SQLite URL: {e}")))?;
        if let Some(dir) = options.get_filename().parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        Self::connect(options, pool_size, acquire_timeout).await
    }

    async fn read_conn(&self) -> StoreResult<PoolConnection<Sqlite>> {
        self.acquire.time(self.reader.acquire()).await.map_err(db_err)
    }

    /// A write in the current group commit; waiting for it is how concurrent
    /// writers queue.
    async fn write_tx(&self) -> StoreResult<Tx> {
        self.acquire.time(self.gate.begin()).await.map_err(db_err)
    }

    /// Bumps the mailbox's modseq (and takes the write position for it); returns
    /// the new modseq, or NotFound.
    async fn bump_modseq(tx: &mut Tx, mailbox_id: i64) -> StoreResult<i64> {
        sqlx::query_scalar(
            "UPDATE mailboxes SET highest_modseq = highest_modseq + 1 WHERE id = ? RETURNING highest_modseq",
        )
        .bind(mailbox_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("mailbox {mailbox_id}")))
    }

    /// The flag change inside `tx`; the caller commits when rows changed (with
    /// none, dropping `tx` also takes back the modseq bump).
    async fn store_flags_in(
        tx: &mut Tx,
        mailbox_id: i64,
        FlagChange { uids, op, flags }: FlagChange<'_>,
    ) -> StoreResult<Vec<FlagRow>> {
        let modseq = Self::bump_modseq(tx, mailbox_id).await?;
        let links = tx.links_in(mailbox_id, uids).await?;
        let mut changed = Vec::new();
        let mut unseen_delta = 0i64;
        for l in &links {
            let old = flagset_from_row(i64::from(l.flags), &l.keywords);
            let new = apply_flags(&old, op, &flags);
            if new == old {
                continue;
            }
            let was_seen = old.system.contains(Flags::SEEN);
            let is_seen = new.system.contains(Flags::SEEN);
            unseen_delta += i64::from(was_seen) - i64::from(is_seen);
            sqlx::query(
                "UPDATE mailbox_messages SET flags = ?, keywords = ?, modseq = ? WHERE mailbox_id = ? AND uid = ?",
            )
            .bind(i64::from(new.system.0))
            .bind(encode_keywords(&new.keywords))
            .bind(modseq)
            .bind(mailbox_id)
            .bind(l.uid)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
            changed.push(FlagRow { uid: u32_of(l.uid, "uid")?, flags: new, modseq: u64_of(modseq) });
        }
        if changed.is_empty() {
            return Ok(changed);
        }
        if unseen_delta != 0 {
            sqlx::query("UPDATE mailboxes SET unseen = unseen + ? WHERE id = ?")
                .bind(unseen_delta)
                .bind(mailbox_id)
                .execute(&mut **tx)
                .await
                .map_err(db_err)?;
        }
        Ok(changed)
    }

    /// `columns` of `mailbox_messages mm JOIN messages m` for the given UIDs,
    /// ascending, one range at a time.
    async fn rows_of_uids(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        columns: &str,
    ) -> StoreResult<Vec<SqliteRow>> {
        let mut conn = self.read_conn().await?;
        let sql = format!(
            "SELECT {columns} FROM mailbox_messages mm JOIN messages m ON m.id = mm.message_id \
             WHERE mm.mailbox_id = ? AND mm.uid BETWEEN ? AND ? ORDER BY mm.uid"
        );
        let mut out = Vec::new();
        for (lo, hi) in uid_ranges(uids) {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(mailbox_id)
                .bind(lo)
                .bind(hi)
                .fetch_all(&mut *conn)
                .await
                .map_err(db_err)?;
            out.extend(rows);
        }
        Ok(out)
    }
}

type Link = LinkRow<i64>;

/// The links flagged `\Deleted`, ascending.
async fn deleted_links(tx: &mut Tx, mailbox_id: i64) -> StoreResult<Vec<Link>> {
    let sql = format!(
        "SELECT {LINK_COLS} FROM mailbox_messages INDEXED BY mailbox_messages_deleted \
         WHERE mailbox_id = ? AND flags & 8 <> 0 ORDER BY uid"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(mailbox_id).fetch_all(&mut **tx).await.map_err(db_err)
}

impl OpenTx for Tx {
    type Db = Sqlite;

    fn conn(&mut self) -> &mut SqliteConnection {
        self
    }

    async fn commit_tx(self) -> StoreResult<()> {
        WriteTx::commit(self).await
    }
}

impl StoreTx for Tx {
    const BUMP_UID_VALIDITY: &'static str = "UPDATE accounts \
         SET last_uid_validity = MAX(last_uid_validity + $2, $3 + $2 - 1) WHERE id = $1 RETURNING last_uid_validity";
    const INSERT_PARENT: &'static str =
        "INSERT INTO mailboxes (account_id, name, uid_validity) VALUES ($1, $2, $3)";
    // the single writer connection serialises renames already
    const LOCK_ACCOUNT: Option<&'static str> = None;
    const ACCOUNT_DOMAIN: &'static str = "SELECT id FROM domains WHERE name = $1";

    type Date = i64;

    /// The single writer connection holds the write lock already: this only
    /// looks the mailboxes up.
    async fn lock_mailboxes(&mut self, ids: &[i64]) -> StoreResult<Vec<i64>> {
        let mut found = Vec::with_capacity(ids.len());
        for &id in ids {
            found.extend(
                self.fetch_ints("SELECT id FROM mailboxes WHERE id = $1", &[Param::Int(id)])
                    .await?
                    .map(|_| id),
            );
        }
        Ok(found)
    }

    async fn links_in(&mut self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<Link>> {
        let sql = format!(
            "SELECT {LINK_COLS} FROM mailbox_messages WHERE mailbox_id = ? AND uid BETWEEN ? AND ? ORDER BY uid"
        );
        let mut out = Vec::new();
        for (lo, hi) in uid_ranges(uids) {
            let query = sqlx::query_as::<_, Link>(sqlx::AssertSqlSafe(sql.clone()))
                .bind(mailbox_id)
                .bind(lo)
                .bind(hi);
            out.extend(query.fetch_all(&mut **self).await.map_err(db_err)?);
        }
        Ok(out)
    }

    async fn insert_links(&mut self, dest: i64, first: i64, modseq: i64, links: &[Link]) -> StoreResult<()> {
        for (uid, l) in (first..).zip(links) {
            sqlx::query(
                "INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, \
                 internal_date, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(dest)
            .bind(uid)
            .bind(l.message_id)
            .bind(l.flags)
            .bind(&l.keywords)
            .bind(modseq)
            .bind(l.internal_date)
            .bind(l.size)
            .execute(&mut **self)
            .await
            .map_err(db_err)?;
        }
        Ok(())
    }

    async fn delete_links(&mut self, mailbox_id: i64, uids: &[i64], modseq: i64) -> StoreResult<()> {
        let now = to_us(Utc::now());
        for &uid in uids {
            let link = [Param::Int(mailbox_id), Param::Int(uid)];
            self.run("DELETE FROM mailbox_messages WHERE mailbox_id = $1 AND uid = $2", &link).await?;
            let sql = "INSERT OR REPLACE INTO expunged (mailbox_id, uid, modseq, expunged_at) VALUES ($1, $2, $3, $4)";
            let tombstone = [Param::Int(mailbox_id), Param::Int(uid), Param::Int(modseq), Param::Int(now)];
            self.run(sql, &tombstone).await?;
        }
        Ok(())
    }

    async fn tombstone_all(&mut self, mailbox_id: i64, modseq: i64) -> StoreResult<()> {
        let sql = "INSERT OR REPLACE INTO expunged (mailbox_id, uid, modseq, expunged_at) \
             SELECT mailbox_id, uid, $2, $3 FROM mailbox_messages WHERE mailbox_id = $1";
        let params = [Param::Int(mailbox_id), Param::Int(modseq), Param::Int(to_us(Utc::now()))];
        self.run(sql, &params).await
    }

    /// Removes bodies that no mailbox links any more.
    async fn delete_orphans(&mut self, message_ids: &[i64]) -> StoreResult<()> {
        if message_ids.is_empty() {
            return Ok(());
        }
        let sql = "DELETE FROM messages WHERE id IN (SELECT value FROM json_each($1)) \
             AND NOT EXISTS (SELECT 1 FROM mailbox_messages mm WHERE mm.message_id = messages.id)";
        self.run(sql, &[Param::Text(&json_of(message_ids)?)]).await
    }

    /// `lock` is moot: the single writer connection holds the write lock.
    async fn mailbox_in(&mut self, account_id: i64, name: &str, _lock: bool) -> StoreResult<Option<Mailbox>> {
        let rows =
            steps::fetch_all(&mut **self, MAILBOX_BY_NAME, &[Param::Int(account_id), Param::Text(name)])
                .await?;
        rows.first().map(mailbox_from_row).transpose()
    }

    async fn insert_mailbox(&mut self, new: NewMailbox<'_>) -> StoreResult<Mailbox> {
        let sql = format!(
            "INSERT INTO mailboxes (account_id, name, uid_validity, special_use) VALUES (?, ?, ?, ?) \
             RETURNING {MAILBOX_COLS}"
        );
        let query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(new.account_id).bind(new.name);
        let query = query.bind(new.uid_validity).bind(new.special_use.map(SpecialUse::as_str));
        mailbox_from_row(&query.fetch_one(&mut **self).await.map_err(db_err)?)
    }

    async fn rename_sources(&mut self, from: RenameFrom<'_>) -> StoreResult<Vec<(i64, String)>> {
        let sql = "SELECT id, name FROM mailboxes WHERE account_id = ?1 \
             AND (name = ?2 OR (?3 AND substr(name, 1, length(?2) + 1) = ?2 || '/')) ORDER BY id";
        let query = sqlx::query_as(sql).bind(from.account_id).bind(from.name).bind(from.children);
        query.fetch_all(&mut **self).await.map_err(db_err)
    }

    async fn rename_mailboxes(
        &mut self,
        ids: &[i64],
        names: &[String],
        first: i64,
        _to: &str,
    ) -> StoreResult<()> {
        for ((&id, name), uv) in ids.iter().zip(names).zip(first..) {
            let params = [Param::Text(name), Param::Int(uv), Param::Int(id)];
            let sql = "UPDATE mailboxes SET name = $1, uid_validity = $2 WHERE id = $3";
            match self.run(sql, &params).await {
                Err(StoreError::AlreadyExists(_)) => {
                    return Err(StoreError::AlreadyExists(format!("mailbox {name}")));
                }
                other => other?,
            }
        }
        Ok(())
    }

    async fn insert_account(&mut self, new: NewAccount<'_>) -> StoreResult<(i64, DateTime<Utc>)> {
        // microsecond precision, as stored
        let created_at = to_us(Utc::now());
        let sql = "INSERT INTO accounts (email, domain_id, password_hash, created_at) VALUES ($1, $2, $3, $4) RETURNING id";
        let params = [
            Param::Text(new.email),
            Param::Int(new.domain_id),
            Param::Text(new.password_hash),
            Param::Int(created_at),
        ];
        match self.fetch_ints(sql, &params).await {
            Ok(Some(row)) => Ok((row[0], from_us(created_at))),
            Ok(None) => Err(StoreError::Internal("account insert returned no id".into())),
            Err(StoreError::AlreadyExists(_)) => {
                Err(StoreError::AlreadyExists(format!("account {}", new.email)))
            }
            Err(e) => Err(e),
        }
    }

    async fn insert_default_mailboxes(&mut self, mailboxes: &[NewMailbox<'_>]) -> StoreResult<()> {
        for m in mailboxes {
            let sql =
                "INSERT INTO mailboxes (account_id, name, uid_validity, special_use) VALUES ($1, $2, $3, $4)";
            let special = m.special_use.map(SpecialUse::as_str);
            let params = [
                Param::Int(m.account_id),
                Param::Text(m.name),
                Param::Int(m.uid_validity),
                Param::OptText(special),
            ];
            self.run(sql, &params).await?;
            let sql = "INSERT INTO subscriptions (account_id, name) VALUES ($1, $2)";
            self.run(sql, &[Param::Int(m.account_id), Param::Text(m.name)]).await?;
        }
        Ok(())
    }

    async fn modseqs_in(&mut self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<(i64, i64)>> {
        let sql = "SELECT uid, modseq FROM mailbox_messages WHERE mailbox_id = ? AND uid BETWEEN ? AND ? ORDER BY uid";
        let mut rows = Vec::new();
        for (lo, hi) in uid_ranges(uids) {
            let query = sqlx::query_as::<_, (i64, i64)>(sql).bind(mailbox_id).bind(lo).bind(hi);
            rows.extend(query.fetch_all(&mut **self).await.map_err(db_err)?);
        }
        Ok(rows)
    }

    async fn store_flags(&mut self, mailbox_id: i64, change: FlagChange<'_>) -> StoreResult<Vec<FlagRow>> {
        SqliteStore::store_flags_in(self, mailbox_id, change).await
    }
}

impl Backend for SqliteStore {
    const NAME: &'static str = "sqlite";
    // the single writer connection holds the write lock already
    const DOMAIN_FOR_DELETE: &'static str = "SELECT id FROM domains WHERE name = $1";
    const ACCOUNT_FOR_DELETE: &'static str = "SELECT id FROM accounts WHERE email = $1";
    const ACCOUNT_SIEVE_LOCK: &'static str = "SELECT id FROM accounts WHERE id = $1";
    const LOCK_ACCOUNT_MAILBOXES: Option<&'static str> = None;
    const MAILBOX_LIST: &'static str = "SELECT id, account_id, name, uid_validity, uid_next, highest_modseq, \
         special_use, recent_floor FROM mailboxes WHERE account_id = $1 ORDER BY name";
    const SUBSCRIPTIONS: &'static str = "SELECT name FROM subscriptions WHERE account_id = $1 ORDER BY name";
    const MAILBOX_DELETED: &'static str = "SELECT count(*) AS n, coalesce(sum(size), 0) AS bytes \
         FROM mailbox_messages INDEXED BY mailbox_messages_deleted WHERE mailbox_id = $1 AND flags & 8 <> 0";
    const QUEUE_RELEASE: &'static str = "UPDATE outbound_queue SET locked_by = NULL, locked_until = NULL, \
         attempts = max(attempts - 1, 0) WHERE id = $1 AND locked_by = $2";
    // `$1` is the current time (a lease is live until `locked_until`).
    const QUEUE_LIST: &'static str = "SELECT id, sender, recipients, length(raw) AS size, attempts, next_attempt, \
         created_at, expires_at, last_error, CASE WHEN locked_until > $1 THEN locked_by END AS locked_by, outcomes \
         FROM outbound_queue ORDER BY created_at, id LIMIT $2";
    const QUEUE_GET: &'static str = "SELECT id, sender, recipients, length(raw) AS size, attempts, next_attempt, \
         created_at, expires_at, last_error, CASE WHEN locked_until > $1 THEN locked_by END AS locked_by, outcomes, \
         raw FROM outbound_queue WHERE id = $2";
    const ENQUEUE: &'static str = "INSERT INTO outbound_queue (sender, recipients, raw, account_id, next_attempt, \
         expires_at, dsn, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id";
    // The single writer connection makes this UPDATE the only claimer at a time.
    const CLAIM: &'static str = "UPDATE outbound_queue SET locked_by = $1, locked_until = $3, attempts = attempts + 1 \
         WHERE id IN (SELECT id FROM outbound_queue WHERE status = 'queued' AND next_attempt <= $4 \
           AND (locked_until IS NULL OR locked_until <= $4) ORDER BY next_attempt, id LIMIT $2) \
         RETURNING id, sender, recipients, raw, account_id, attempts, last_error, created_at, expires_at, \
           delay_notified, dsn";
    // json_group_array over both arrays' elements: their concatenation.
    const RESCHEDULE: &'static str = "UPDATE outbound_queue SET recipients = $3, \
         outcomes = (SELECT json_group_array(json(value)) FROM \
           (SELECT value FROM json_each(outcomes) UNION ALL SELECT value FROM json_each($4))), \
         last_error = $5, next_attempt = $6, delay_notified = $7, locked_by = NULL, locked_until = NULL \
         WHERE id = $1 AND locked_by = $2";
    const QUEUE_RETRY: &'static str = "UPDATE outbound_queue SET next_attempt = $1 WHERE ($2 IS NULL OR id = $2) \
         AND status = 'queued' AND next_attempt > $1";
    const LEASE_COUNT: &'static str = "SELECT count(*) AS n FROM leases WHERE key = $2 AND expires_at > $1";

    // the single writer connection's BEGIN IMMEDIATE serialises count-then-insert
    const LEASE_LOCK: Option<&'static str> = None;
    const LEASE_PRUNE: &'static str = "DELETE FROM leases WHERE key = $1 AND expires_at <= $2";
    const LEASE_RENEW: &'static str = "UPDATE leases SET expires_at = $3 WHERE key = $1 AND member = $2";
    const LEASE_INSERT: &'static str = "INSERT INTO leases (key, member, expires_at) VALUES ($1, $2, $3)";
    const LEASE_EXTEND: &'static str =
        "UPDATE leases SET expires_at = $3 WHERE key = $1 AND member = $2 AND expires_at > $4";

    type Row = SqliteRow;
    type Tx = Tx;

    fn acquire_timer(&self) -> &AcquireTimer {
        &self.acquire
    }

    async fn begin(&self) -> StoreResult<Tx> {
        self.write_tx().await
    }

    async fn fetch(
        &self,
        write: bool,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> StoreResult<Vec<SqliteRow>> {
        if !write {
            return steps::fetch_all(&mut *self.read_conn().await?, sql, params).await;
        }
        let mut tx = self.write_tx().await?;
        let rows = steps::fetch_all(&mut *tx, sql, params).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn execute(&self, sql: &'static str, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        let mut tx = self.acquire.time(self.gate.begin()).await?;
        let changed = steps::execute_on(&mut *tx, sql, params).await?;
        // The statement's own errors stay typed (unique violations); a failed
        // COMMIT is the connection's.
        tx.commit().await.map_err(|e| sqlx::Error::Io(std::io::Error::other(e.to_string())))?;
        Ok(changed)
    }

    /// SQLite has no clock in microseconds: the time is this process's.
    fn clock() -> Vec<Param<'static>> {
        vec![Param::Int(to_us(Utc::now()))]
    }

    fn time(t: DateTime<Utc>) -> Param<'static> {
        Param::Int(to_us(t))
    }

    fn lease_expiry(ttl: Duration) -> Vec<Param<'static>> {
        let until = to_us(Utc::now()).saturating_add(i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX));
        vec![Param::Int(until)]
    }

    fn date(row: &SqliteRow, name: &str) -> StoreResult<DateTime<Utc>> {
        Ok(from_us(row.int(name)?))
    }

    fn opt_date(row: &SqliteRow, name: &str) -> StoreResult<Option<DateTime<Utc>>> {
        Ok(row.opt_int(name)?.map(from_us))
    }

    async fn linked_rows(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        columns: &'static str,
    ) -> StoreResult<Vec<SqliteRow>> {
        self.rows_of_uids(mailbox_id, uids, columns).await
    }

    /// One statement for all: the ids as a JSON array.
    async fn modseqs_of(&self, mailbox_ids: &[i64]) -> StoreResult<Vec<(i64, u64)>> {
        let sql = "SELECT id, highest_modseq FROM mailboxes WHERE id IN (SELECT value FROM json_each($1))";
        let rows = self.fetch(false, sql, &[Param::Text(&json_of(mailbox_ids)?)]).await?;
        rows.iter().map(|r| Ok((r.int("id")?, u64_of(r.int("highest_modseq")?)))).collect()
    }
    async fn run_migrations(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.writer).await.map_err(|e| StoreError::Internal(format!("migration failed: {e}")))
    }

    fn pool_figures(&self) -> PoolStats {
        let mut stats = PoolStats::default();
        let pools: &[&SqlitePool] = if self.shared {
            &[&self.writer]
        } else {
            // The gate keeps the writer connection: in use while a write holds it.
            let busy = u32::from(self.gate.busy());
            stats.max += 1;
            stats.in_use += busy;
            stats.idle += 1 - busy;
            &[&self.reader]
        };
        for p in pools {
            let idle = p.num_idle() as u32;
            stats.max += p.options().get_max_connections();
            stats.idle += idle;
            stats.in_use += p.size().saturating_sub(idle);
        }
        stats
    }

    async fn insert_domain(&self, name: &str) -> Result<u64, sqlx::Error> {
        let sql = "INSERT INTO domains (name, created_at) VALUES ($1, $2)";
        self.execute(sql, &[Param::Text(name), Param::Int(to_us(Utc::now()))]).await
    }

    async fn raise_recent_floor(&self, mailbox_id: i64, up_to: i64) -> StoreResult<Option<i64>> {
        // BEGIN IMMEDIATE: the write lock serialises read-then-raise.
        let mut tx = self.write_tx().await?;
        let sql = "SELECT recent_floor FROM mailboxes WHERE id = $1";
        let Some(before) = tx.fetch_int(sql, &[Param::Int(mailbox_id)]).await? else { return Ok(None) };
        if before < up_to {
            let sql = "UPDATE mailboxes SET recent_floor = $1 WHERE id = $2";
            tx.run(sql, &[Param::Int(up_to), Param::Int(mailbox_id)]).await?;
        }
        tx.commit().await?;
        Ok(Some(before))
    }

    async fn deliver(&self, batch: Batch<'_>) -> StoreResult<Vec<Vec<DeliveredTo>>> {
        let Batch { deliveries: batch, flags, metas, bodies, groups } = batch;

        let mut tx = self.write_tx().await?;
        // UIDs first, in ascending mailbox order (the lock order of the PG store).
        let mut firsts: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        for (&mb, share) in &groups {
            let n = share.deliveries.len() as i64;
            let params = [Param::Int(n), Param::Int(share.unseen), Param::Int(mb), Param::Int(share.bytes)];
            let Some(&[first, modseq]) = tx.fetch_ints(steps::ADD_COUNTS, &params).await?.as_deref() else {
                return Err(StoreError::NotFound(format!("mailbox {mb}")));
            };
            if !super::common::uids_fit(first, n) {
                return Err(StoreError::Invalid(format!("mailbox {mb} has run out of UIDs")));
            }
            firsts.insert(mb, (first, modseq));
        }
        let now = to_us(Utc::now());
        let mut message_ids: Vec<Option<i64>> = vec![None; batch.len()];
        for (i, d) in batch.iter().enumerate() {
            if d.targets.is_empty() {
                continue;
            }
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO messages (body, compressed, size, meta, subject, from_addr, to_addr, cc_addr, \
                 message_id, sent_date, created_at, header_size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 RETURNING id",
            )
            .bind(bodies[i].as_slice(&d.raw))
            .bind(bodies[i].compressed)
            .bind(d.raw.len() as i64)
            .bind(&metas[i])
            .bind(&d.meta.subject)
            .bind(&d.meta.from)
            .bind(&d.meta.to)
            .bind(&d.meta.cc)
            .bind(&d.meta.message_id)
            .bind(d.meta.sent_date.map(to_us))
            .bind(now)
            .bind(i64::from(d.meta.header_size))
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err)?;
            message_ids[i] = Some(id);
        }
        let mut assigned: HashMap<(usize, i64), u32> = HashMap::new();
        let mut changes: BTreeMap<i64, (u64, u32)> = BTreeMap::new();
        for (&mb, share) in &groups {
            let (first, modseq) = firsts[&mb];
            changes.insert(mb, (u64_of(modseq), u32_of(share.deliveries.len() as i64, "messages")?));
            for (k, &i) in share.deliveries.iter().enumerate() {
                let uid = first + k as i64;
                let message_id =
                    message_ids[i].ok_or_else(|| StoreError::Internal("unstored body".into()))?;
                sqlx::query(
                    "INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, \
                     internal_date, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(mb)
                .bind(uid)
                .bind(message_id)
                .bind(i64::from(flags[i].system.0))
                .bind(encode_keywords(&flags[i].keywords))
                .bind(modseq)
                .bind(to_us(batch[i].internal_date))
                .bind(batch[i].raw.len() as i64)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
                assigned.insert((i, mb), u32_of(uid, "uid")?);
            }
        }
        tx.commit().await?;
        Ok(delivered(batch, &assigned, &changes))
    }

    async fn maildrop_listing(&self, mailbox_id: i64, after_uid: u32) -> StoreResult<Vec<MaildropEntry>> {
        // internal_date is microseconds since the epoch here (see `date`).
        let rows: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT uid, message_id, size, internal_date FROM mailbox_messages \
             WHERE mailbox_id = ? AND uid > ? ORDER BY uid",
        )
        .bind(mailbox_id)
        .bind(i64::from(after_uid))
        .fetch_all(&mut *self.read_conn().await?)
        .await
        .map_err(db_err)?;
        rows.into_iter()
            .map(|(uid, message_id, size, internal_date)| {
                Ok(MaildropEntry {
                    uid: u32_of(uid, "uid")?,
                    message_id,
                    size: u32_of(size, "size")?,
                    internal_date: from_us(internal_date),
                })
            })
            .collect()
    }

    async fn index(&self, mailbox_id: i64) -> StoreResult<MailboxIndex> {
        // One read transaction: the modseq matches the rows.
        let mut tx = Transaction::begin(self.read_conn().await?, None).await.map_err(db_err)?;
        let (highest, uid_next): (i64, i64) =
            sqlx::query_as("SELECT highest_modseq, uid_next FROM mailboxes WHERE id = ?")
                .bind(mailbox_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_err)?
                .ok_or_else(|| StoreError::NotFound(format!("mailbox {mailbox_id}")))?;
        let rows: Vec<(i64, i32, i64, String)> = sqlx::query_as(
            "SELECT uid, flags, modseq, keywords FROM mailbox_messages WHERE mailbox_id = ? ORDER BY uid",
        )
        .bind(mailbox_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(db_err)?;
        let mut uids = Vec::with_capacity(rows.len());
        let mut flags = Vec::with_capacity(rows.len());
        let mut modseqs = Vec::with_capacity(rows.len());
        let mut keywords = Vec::new();
        for (uid, f, m, k) in rows {
            uids.push(uid);
            flags.push(f);
            modseqs.push(m);
            if !k.is_empty() {
                keywords.push((uid, k));
            }
        }
        mailbox_index_from(highest, uid_next, uids, flags, modseqs, keywords)
    }

    async fn links(&self, keys: &[(i64, u32)]) -> StoreResult<MessageLinks> {
        // One read transaction: the modseqs match the links.
        let mut tx = Transaction::begin(self.read_conn().await?, None).await.map_err(db_err)?;
        let mut out = MessageLinks::default();
        for &(mailbox_id, uid) in keys {
            if !out.mailboxes.iter().any(|&(m, _)| m == mailbox_id) {
                let highest: Option<i64> =
                    sqlx::query_scalar("SELECT highest_modseq FROM mailboxes WHERE id = ?")
                        .bind(mailbox_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db_err)?;
                match highest {
                    Some(h) => out.mailboxes.push((mailbox_id, u64_of(h))),
                    None => continue,
                }
            }
            let row = sqlx::query(
                "SELECT message_id, flags, keywords, internal_date FROM mailbox_messages \
                 WHERE mailbox_id = ? AND uid = ?",
            )
            .bind(mailbox_id)
            .bind(i64::from(uid))
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_err)?;
            if let Some(r) = row {
                let keywords: String = r.try_get("keywords").map_err(db_err)?;
                let flags: i64 = r.try_get("flags").map_err(db_err)?;
                out.links.push(MessageLink {
                    mailbox_id,
                    uid,
                    message_id: r.try_get("message_id").map_err(db_err)?,
                    flags: flagset_from_row(flags, &keywords),
                    internal_date: from_us(r.try_get("internal_date").map_err(db_err)?),
                });
            }
        }
        Ok(out)
    }

    async fn bodies(&self, message_ids: &[i64]) -> StoreResult<Vec<StoredBody>> {
        let mut conn = self.read_conn().await?;
        let mut out = Vec::with_capacity(message_ids.len());
        for &id in message_ids {
            let row = sqlx::query("SELECT body, compressed, size, header_size FROM messages WHERE id = ?")
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db_err)?;
            let Some(r) = row else { continue };
            out.push(stored_body_of(&r, id)?);
        }
        Ok(out)
    }

    async fn flagged_uids(&self, mailbox_id: i64, with: Flags, without: Flags) -> StoreResult<Vec<u32>> {
        // Without statistics SQLite prefers the primary key (it serves ORDER BY uid)
        // and filters the whole mailbox; name the partial index so that UNSEEN and
        // DELETED searches cost what they return, not the mailbox size.
        let index = if without.contains(Flags::SEEN) {
            " INDEXED BY mailbox_messages_unseen"
        } else if with.contains(Flags::DELETED) && !without.contains(Flags::DELETED) {
            " INDEXED BY mailbox_messages_deleted"
        } else {
            ""
        };
        let sql = format!(
            "SELECT uid FROM mailbox_messages{index} WHERE mailbox_id = ?{} ORDER BY uid",
            flag_conditions(with, without)
        );
        let uids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(mailbox_id)
            .fetch_all(&mut *self.read_conn().await?)
            .await
            .map_err(db_err)?;
        uids.into_iter().map(|u| u32_of(u, "uid")).collect()
    }

    async fn change_flags(&self, mailbox_id: i64, change: FlagChange<'_>) -> StoreResult<Vec<FlagRow>> {
        let mut tx = self.write_tx().await?;
        let changed = Self::store_flags_in(&mut tx, mailbox_id, change).await?;
        if !changed.is_empty() {
            tx.commit().await?;
        }
        Ok(changed)
    }

    async fn changes(&self, mailbox_id: i64, modseq: u64) -> StoreResult<MailboxChanges> {
        // One read transaction: a consistent snapshot of mailbox, rows and tombstones.
        // The modseq indexes are named because SQLite, lacking statistics, would
        // rather walk the primary key for the ORDER BY and filter the whole mailbox.
        let mut tx = Transaction::begin(self.read_conn().await?, None).await.map_err(db_err)?;
        // The floor with the modseq: one snapshot with the tombstones read below.
        let (highest, floor): (i64, i64) =
            sqlx::query_as("SELECT highest_modseq, expunged_floor FROM mailboxes WHERE id = ?")
                .bind(mailbox_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_err)?
                .ok_or_else(|| StoreError::NotFound(format!("mailbox {mailbox_id}")))?;
        let since = i64::try_from(modseq).unwrap_or(i64::MAX);
        if since >= highest {
            return changes_of::<SqliteRow>(highest, &[], Vec::new(), None);
        }
        let after = [Param::Int(mailbox_id), Param::Int(since)];
        let sql = "SELECT uid, flags, keywords, modseq FROM mailbox_messages INDEXED BY mailbox_messages_modseq \
             WHERE mailbox_id = $1 AND modseq > $2 ORDER BY uid";
        let rows = steps::fetch_all(&mut *tx, sql, &after).await?;
        let sql = "SELECT uid FROM expunged INDEXED BY expunged_modseq WHERE mailbox_id = $1 AND modseq > $2 ORDER BY uid";
        let expunged = steps::fetch_all(&mut *tx, sql, &after)
            .await?
            .iter()
            .map(|r| r.int("uid"))
            .collect::<StoreResult<_>>()?;
        let present = match since < floor {
            true => Some(steps::fetch_all(&mut *tx, PRESENT_UIDS, &[Param::Int(mailbox_id)]).await?),
            false => None,
        };
        changes_of(highest, &rows, expunged, present)
    }

    /// The steps one at a time: the single writer connection makes them atomic
    /// without the one-statement form PostgreSQL needs.
    async fn expunge_links(&self, mailbox_id: i64, uids: Option<&UidSet>) -> StoreResult<Expunged> {
        let mut tx = self.write_tx().await?;
        steps::lock_mailboxes(&mut tx, &[mailbox_id]).await?;
        let links = match uids {
            Some(uids) => tx.links_in(mailbox_id, uids).await?,
            None => deleted_links(&mut tx, mailbox_id).await?,
        };
        if links.is_empty() {
            return Ok(Expunged::default());
        }
        let modseq = steps::remove_links(&mut tx, mailbox_id, &links).await?;
        tx.commit().await?;
        let uids = links.iter().map(|l| u32_of(l.uid, "uid")).collect::<StoreResult<_>>()?;
        Ok(Expunged { uids, modseq: u64_of(modseq) })
    }

    async fn prune(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        let mut tx = self.write_tx().await?;
        let cutoff = to_us(before);
        sqlx::query(
            "UPDATE mailboxes SET expunged_floor = max(expunged_floor, \
             (SELECT max(modseq) FROM expunged e WHERE e.mailbox_id = mailboxes.id AND e.expunged_at < ?1)) \
             WHERE id IN (SELECT mailbox_id FROM expunged WHERE expunged_at < ?1)",
        )
        .bind(cutoff)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        let gone = sqlx::query("DELETE FROM expunged WHERE expunged_at < ?")
            .bind(cutoff)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
        tx.commit().await?;
        Ok(gone)
    }
}
