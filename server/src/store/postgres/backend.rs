//! The PostgreSQL `Backend` of the shared SQL store (`sql.rs`): the statements
//! its dialect spells its own way, and the operations it runs as one statement
//! where SQLite runs steps (a delivery batch, STORE, EXPUNGE) or reads as arrays
//! (a mailbox's index, its changes since a modseq).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{Connection, PgConnection, Row};

use super::statements::{
    DELIVER, EXPUNGE_DELETED, EXPUNGE_ONE, EXPUNGE_RANGES, STORE_FLAGS_ONE, STORE_FLAGS_RANGES,
    links_in_ranges, range_arrays,
};
use super::{MIGRATOR, PgStore, Tx, describe};
use crate::store::common::{
    AcquireTimer, db_err, delivered, encode_keywords, flag_conditions, flagset_from_row, mailbox_index_from,
    u32_of, u64_of, uids_fit,
};
use crate::store::sql::{Backend, Batch, PRESENT_UIDS, stored_body_of};
use crate::store::steps::{self, Cols, FlagChange, Param};
use crate::store::*;

/// Message ids drawn from the sequence at a time: one round trip per this many
/// stored messages instead of one per delivery transaction (an APPEND is a
/// transaction of one). Ids left unused when the process ends are gaps in the
/// sequence, which nothing reads.
const SPARE_IDS: usize = 256;

/// STORE as one statement, on `conn` (a pooled connection or a transaction).
pub(super) async fn store_flags_on(
    conn: &mut PgConnection,
    mailbox_id: i64,
    FlagChange { uids, op, flags }: FlagChange<'_>,
) -> StoreResult<Vec<FlagRow>> {
    let (los, his) = range_arrays(uids);
    let op_code: i32 = match op {
        FlagOp::Add => 0,
        FlagOp::Remove => 1,
        FlagOp::Replace => 2,
    };
    // One statement, one round trip, its own transaction: STORE is the most
    // frequent write of a mail client, and as six statements in a transaction
    // (bump, read, update, unseen, BEGIN, COMMIT) its round trips were most of
    // PostgreSQL's CPU in the imap-mix benchmark. The rules are those of
    // `apply_flags`: keywords kept sorted bytewise (COLLATE "C", as Rust sorts)
    // and unique. Lock order as everywhere: the mailbox row first (the InitPlan
    // `(SELECT id FROM mb)` runs before any message row is read), then the
    // rows, each re-read at its newest version once locked (READ COMMITTED).
    // The modseq moves only when a row changes; no row from `mb` means no
    // mailbox.
    // One UID (what a client's flag change usually names) as a scalar: with
    // UID arrays PostgreSQL plans the statement anew on every execution (the
    // planning cost more than the execution), with a scalar it keeps one plan.
    let single = matches!(uids.0.as_slice(), [(lo, hi)] if lo == hi);
    let sql = if single { STORE_FLAGS_ONE } else { STORE_FLAGS_RANGES };
    let rows = sqlx::query(sql)
        .bind(mailbox_id)
        .bind(&los)
        .bind(&his)
        .bind(op_code)
        .bind(flags.system.0 as i32)
        .bind(&flags.keywords)
        .fetch_all(conn)
        .await
        .map_err(db_err)?;
    if rows.is_empty() {
        return Err(StoreError::NotFound(format!("mailbox {mailbox_id}")));
    }
    let mut changed = Vec::with_capacity(rows.len());
    for row in &rows {
        let Some(uid) = row.try_get::<Option<i64>, _>("uid").map_err(db_err)? else { continue };
        let system: i32 = row.try_get("flags").map_err(db_err)?;
        let keywords: String = row.try_get("keywords").map_err(db_err)?;
        let modseq: i64 = row.try_get("modseq").map_err(db_err)?;
        changed.push(FlagRow {
            uid: u32_of(uid, "uid")?,
            flags: flagset_from_row(i64::from(system), &keywords),
            modseq: u64_of(modseq),
        });
    }
    Ok(changed)
}

impl PgStore {
    /// Why `DELIVER` wrote nothing: a target mailbox is gone, or it has no UIDs
    /// left for its share. Read after the fact, off the delivery's path.
    async fn why_not_delivered(&self, conn: &mut PgConnection, mb_ids: &[i64], counts: &[i64]) -> StoreError {
        let found: Result<Vec<(i64, i64)>, _> =
            sqlx::query_as("SELECT id, uid_next FROM mailboxes WHERE id = ANY($1)")
                .bind(mb_ids)
                .fetch_all(conn)
                .await;
        let found = match found {
            Ok(found) => found,
            Err(e) => return db_err(e),
        };
        for (id, n) in mb_ids.iter().zip(counts) {
            match found.iter().find(|(f, _)| f == id) {
                None => return StoreError::NotFound(format!("mailbox {id}")),
                Some((_, uid_next)) if !uids_fit(*uid_next, *n) => {
                    return StoreError::Invalid(format!("mailbox {id} has run out of UIDs"));
                }
                Some(_) => {}
            }
        }
        // Every mailbox is there and has room after all: nothing was stored, and
        // nothing said why, so the caller may try again.
        StoreError::Unavailable("delivery wrote nothing; retry".into())
    }

    /// `n` fresh message ids: from the spares, drawn from the sequence (on the
    /// delivery's own connection) only when they run out. Sequence values are
    /// never given back, so an id is never handed out twice, whatever becomes of
    /// the statement that was to use it.
    async fn message_ids(&self, conn: &mut PgConnection, n: usize) -> StoreResult<Vec<i64>> {
        let take = |spare: &mut Vec<i64>| (spare.len() >= n).then(|| spare.split_off(spare.len() - n));
        if let Some(ids) = take(&mut self.spare_ids.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(ids);
        }
        let drawn: Vec<i64> = sqlx::query_scalar(
            "SELECT nextval(pg_get_serial_sequence('messages', 'id')) FROM generate_series(1, $1)",
        )
        .bind((n + SPARE_IDS) as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(db_err)?;
        if drawn.len() != n + SPARE_IDS {
            return Err(StoreError::Internal("message id allocation came back short".into()));
        }
        let mut spare = self.spare_ids.lock().unwrap_or_else(|p| p.into_inner());
        spare.extend_from_slice(&drawn[n..]);
        Ok(drawn[..n].to_vec())
    }

    /// `columns` of `mailbox_messages mm JOIN messages m` for the given UIDs,
    /// ascending.
    ///
    /// The usual `UID FETCH n` gets `uid = $2`, a primary-key lookup, and one
    /// range `BETWEEN`, a single range scan; several ranges are read range by
    /// range (`links_in_ranges!`).
    async fn rows_of_uids(&self, mailbox_id: i64, uids: &UidSet, columns: &str) -> StoreResult<Vec<PgRow>> {
        let (los, his) = range_arrays(uids);
        let from = "FROM mailbox_messages mm JOIN messages m ON m.id = mm.message_id";
        let query = match (los.as_slice(), his.as_slice()) {
            ([], _) => return Ok(Vec::new()),
            ([lo], [hi]) if lo == hi => {
                let sql = format!("SELECT {columns} {from} WHERE mm.mailbox_id = $1 AND mm.uid = $2");
                sqlx::query(sqlx::AssertSqlSafe(sql)).bind(mailbox_id).bind(*lo)
            }
            ([lo], [hi]) => {
                let sql = format!(
                    "SELECT {columns} {from} WHERE mm.mailbox_id = $1 AND mm.uid BETWEEN $2 AND $3 ORDER BY mm.uid"
                );
                sqlx::query(sqlx::AssertSqlSafe(sql)).bind(mailbox_id).bind(*lo).bind(*hi)
            }
            _ => {
                let sql = format!(
                    "SELECT {columns} FROM {} JOIN messages m ON m.id = mm.message_id ORDER BY mm.uid",
                    links_in_ranges!()
                );
                sqlx::query(sqlx::AssertSqlSafe(sql)).bind(mailbox_id).bind(&los).bind(&his)
            }
        };
        query.fetch_all(&mut *self.conn().await?).await.map_err(db_err)
    }
}

impl Backend for PgStore {
    const NAME: &'static str = "postgres";
    const DOMAIN_FOR_DELETE: &'static str = "SELECT id FROM domains WHERE name = $1 FOR UPDATE";
    const ACCOUNT_FOR_DELETE: &'static str = "SELECT id FROM accounts WHERE email = $1 FOR UPDATE";
    // NO KEY: inserts elsewhere that reference the account are not held up.
    const ACCOUNT_SIEVE_LOCK: &'static str = "SELECT id FROM accounts WHERE id = $1 FOR NO KEY UPDATE";
    const LOCK_ACCOUNT_MAILBOXES: Option<&'static str> =
        Some("SELECT id FROM mailboxes WHERE account_id = $1 ORDER BY id FOR UPDATE");
    // byte order, like SQLite's BINARY collation, whatever the database locale
    const MAILBOX_LIST: &'static str = "SELECT id, account_id, name, uid_validity, uid_next, highest_modseq, \
         special_use, recent_floor FROM mailboxes WHERE account_id = $1 ORDER BY name COLLATE \"C\"";
    const SUBSCRIPTIONS: &'static str =
        "SELECT name FROM subscriptions WHERE account_id = $1 ORDER BY name COLLATE \"C\"";
    // literal predicate: served by the partial index on \Deleted rows
    const MAILBOX_DELETED: &'static str = "SELECT count(*) AS n, coalesce(sum(size), 0)::bigint AS bytes \
         FROM mailbox_messages WHERE mailbox_id = $1 AND flags & 8 <> 0";
    const QUEUE_RELEASE: &'static str = "UPDATE outbound_queue SET locked_by = NULL, locked_until = NULL, \
         attempts = greatest(attempts - 1, 0) WHERE id = $1 AND locked_by = $2";
    const QUEUE_LIST: &'static str = "SELECT id, sender, recipients, octet_length(raw)::bigint AS size, attempts, \
         next_attempt, created_at, expires_at, last_error, \
         CASE WHEN locked_until > now() THEN locked_by END AS locked_by, outcomes \
         FROM outbound_queue ORDER BY created_at, id LIMIT $1";
    const QUEUE_GET: &'static str = "SELECT id, sender, recipients, octet_length(raw)::bigint AS size, attempts, \
         next_attempt, created_at, expires_at, last_error, \
         CASE WHEN locked_until > now() THEN locked_by END AS locked_by, outcomes, raw \
         FROM outbound_queue WHERE id = $1";
    const ENQUEUE: &'static str = "INSERT INTO outbound_queue (sender, recipients, raw, account_id, next_attempt, \
         expires_at, dsn) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id";
    // SKIP LOCKED: concurrent claimers on other pods pass over rows another
    // claimer is taking right now instead of waiting for (and then re-taking) them.
    const CLAIM: &'static str = "WITH due AS ( \
           SELECT id FROM outbound_queue \
           WHERE status = 'queued' AND next_attempt <= now() \
             AND (locked_until IS NULL OR locked_until <= now()) \
           ORDER BY next_attempt, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
         UPDATE outbound_queue q SET locked_by = $1, \
           locked_until = now() + make_interval(secs => $3::double precision / 1000000), \
           attempts = q.attempts + 1 \
         FROM due WHERE q.id = due.id \
         RETURNING q.id, q.sender, q.recipients, q.raw, q.account_id, q.attempts, q.last_error, \
           q.created_at, q.expires_at, q.delay_notified, q.dsn";
    // `outcomes || new`: jsonb concatenation of the two arrays, stored as text.
    const RESCHEDULE: &'static str = "UPDATE outbound_queue SET recipients = $3, \
         outcomes = (outcomes::jsonb || $4::jsonb)::text, last_error = $5, next_attempt = $6, \
         delay_notified = $7, locked_by = NULL, locked_until = NULL WHERE id = $1 AND locked_by = $2";
    const QUEUE_RETRY: &'static str = "UPDATE outbound_queue SET next_attempt = now() \
         WHERE ($1::bigint IS NULL OR id = $1) AND status = 'queued' AND next_attempt > now()";
    const LEASE_COUNT: &'static str =
        "SELECT count(*) AS n FROM leases WHERE key = $1 AND expires_at > now()";

    // One writer per key at a time: a transaction-scoped advisory lock (not a row
    // lock: there may be no row yet) is released by COMMIT/ROLLBACK whatever happens.
    const LEASE_LOCK: Option<&'static str> = Some("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))");
    const LEASE_PRUNE: &'static str = "DELETE FROM leases WHERE key = $1 AND expires_at <= now()";
    const LEASE_RENEW: &'static str = "UPDATE leases SET expires_at = now() + make_interval(secs => $3::double precision / 1000000) \
         WHERE key = $1 AND member = $2";
    const LEASE_INSERT: &'static str = "INSERT INTO leases (key, member, expires_at) \
         VALUES ($1, $2, now() + make_interval(secs => $3::double precision / 1000000))";
    const LEASE_EXTEND: &'static str = "UPDATE leases SET expires_at = now() + make_interval(secs => $3::double precision / 1000000) \
         WHERE key = $1 AND member = $2 AND expires_at > now()";

    type Row = PgRow;
    type Tx = Tx;

    fn acquire_timer(&self) -> &AcquireTimer {
        &self.acquire
    }

    async fn begin(&self) -> StoreResult<Tx> {
        self.tx().await
    }

    /// One pool serves reads and writes.
    async fn fetch(&self, _write: bool, sql: &'static str, params: &[Param<'_>]) -> StoreResult<Vec<PgRow>> {
        steps::fetch_all(&mut *self.conn().await?, sql, params).await
    }

    async fn execute(&self, sql: &'static str, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        let mut conn = self.acquire.time(self.pool.acquire()).await?;
        steps::execute_on(&mut *conn, sql, params).await
    }

    fn clock() -> Vec<Param<'static>> {
        Vec::new()
    }

    fn time(t: DateTime<Utc>) -> Param<'static> {
        Param::Time(t)
    }

    /// The lease's length in microseconds, added to the database's clock.
    fn lease_expiry(ttl: Duration) -> Vec<Param<'static>> {
        vec![Param::Int(i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX / 2))]
    }

    fn date(row: &PgRow, name: &str) -> StoreResult<DateTime<Utc>> {
        row.try_get(name).map_err(db_err)
    }

    fn opt_date(row: &PgRow, name: &str) -> StoreResult<Option<DateTime<Utc>>> {
        row.try_get(name).map_err(db_err)
    }

    async fn linked_rows(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        columns: &'static str,
    ) -> StoreResult<Vec<PgRow>> {
        self.rows_of_uids(mailbox_id, uids, columns).await
    }
    async fn run_migrations(&self) -> StoreResult<()> {
        // A dedicated connection, closed afterwards: sqlx holds a session-level
        // advisory lock while migrating (so pods starting together take turns), and
        // if a migration fails the lock must die with the connection instead of
        // staying on a pooled one and blocking every other pod.
        let mut conn = sqlx::PgConnection::connect_with(&self.options).await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot connect to PostgreSQL at {}: {e}",
                describe(&self.options)
            ))
        })?;
        // `run_direct` is `run` on a plain connection (sqlx's own workaround for the
        // higher-ranked `Acquire` bound that `async_trait`'s Send future cannot meet).
        let result = MIGRATOR.run_direct(None, &mut conn, false).await;
        let _ = conn.close().await;
        result.map_err(|e| StoreError::Internal(format!("migration failed: {e}")))
    }

    fn pool_figures(&self) -> PoolStats {
        let idle = self.pool.num_idle() as u32;
        PoolStats {
            max: self.pool.options().get_max_connections(),
            idle,
            in_use: self.pool.size().saturating_sub(idle),
        }
    }

    async fn insert_domain(&self, name: &str) -> Result<u64, sqlx::Error> {
        self.execute("INSERT INTO domains (name) VALUES ($1)", &[Param::Text(name)]).await
    }

    async fn raise_recent_floor(&self, mailbox_id: i64, up_to: i64) -> StoreResult<Option<i64>> {
        // The row lock of the CTE serialises claims: a second claim waits, then reads
        // the floor the first one left. The claim commits without waiting for its WAL
        // flush (`synchronous_commit` off for this transaction alone): a floor lost to
        // a database crash only shows a message as \Recent to one more session, and the
        // wait was a second fsync per APPEND to a selected mailbox, after the
        // delivery's own.
        let sql = "WITH old AS (SELECT recent_floor FROM mailboxes WHERE id = $1 FOR UPDATE), \
             lazy AS (SELECT set_config('synchronous_commit', 'off', true)) \
             UPDATE mailboxes m SET recent_floor = GREATEST(m.recent_floor, $2) FROM old, lazy \
             WHERE m.id = $1 RETURNING old.recent_floor";
        let rows = self.fetch(true, sql, &[Param::Int(mailbox_id), Param::Int(up_to)]).await?;
        rows.first().map(|r| r.int("recent_floor")).transpose()
    }

    async fn deliver(&self, batch: Batch<'_>) -> StoreResult<Vec<Vec<DeliveredTo>>> {
        let Batch { deliveries: batch, flags, metas, bodies, groups } = batch;
        let stored: Vec<usize> = (0..batch.len()).filter(|&i| !batch[i].targets.is_empty()).collect();
        if stored.is_empty() {
            return Ok(vec![Vec::new(); batch.len()]);
        }
        let mut conn = self.conn().await?;
        // One body per message, with ids taken up front so that the link rows can
        // reference them without relying on RETURNING order.
        let ids = self.message_ids(&mut conn, stored.len()).await?;
        let mut message_ids: Vec<Option<i64>> = vec![None; batch.len()];
        for (&i, &id) in stored.iter().zip(&ids) {
            message_ids[i] = Some(id);
        }
        let mb_ids: Vec<i64> = groups.keys().copied().collect();
        let counts: Vec<i64> = groups.values().map(|s| s.deliveries.len() as i64).collect();
        let unseen: Vec<i64> = groups.values().map(|s| s.unseen).collect();
        let bytes: Vec<i64> = groups.values().map(|s| s.bytes).collect();
        let col = |f: fn(&NewDelivery) -> &str| stored.iter().map(|&i| f(&batch[i])).collect::<Vec<&str>>();
        let meta_col: Vec<&str> = stored.iter().map(|&i| metas[i].as_str()).collect();
        let body_refs: Vec<&[u8]> = stored.iter().map(|&i| bodies[i].as_slice(&batch[i].raw)).collect();
        let compressed: Vec<bool> = stored.iter().map(|&i| bodies[i].compressed).collect();
        let sizes: Vec<i64> = stored.iter().map(|&i| batch[i].raw.len() as i64).collect();
        let sent: Vec<Option<DateTime<Utc>>> = stored.iter().map(|&i| batch[i].meta.sent_date).collect();
        let header_sizes: Vec<i64> = stored.iter().map(|&i| i64::from(batch[i].meta.header_size)).collect();
        // The links: the k-th delivery of a mailbox's share gets that mailbox's
        // first new UID + k, in batch order.
        let keywords: Vec<String> = flags.iter().map(|f| encode_keywords(&f.keywords)).collect();
        let mut l_mb = Vec::new();
        let mut l_k = Vec::new();
        let mut l_msg = Vec::new();
        let mut l_flags = Vec::new();
        let mut l_kw: Vec<&str> = Vec::new();
        let mut l_date = Vec::new();
        let mut l_size = Vec::new();
        for (&mb, share) in &groups {
            for (k, &i) in share.deliveries.iter().enumerate() {
                l_mb.push(mb);
                l_k.push(k as i64);
                l_msg.push(message_ids[i].ok_or_else(|| StoreError::Internal("unstored body".into()))?);
                l_flags.push(flags[i].system.0 as i32);
                l_kw.push(keywords[i].as_str());
                l_date.push(batch[i].internal_date);
                l_size.push(batch[i].raw.len() as i64);
            }
        }
        let rows = sqlx::query(DELIVER)
            .bind(&mb_ids)
            .bind(&counts)
            .bind(&unseen)
            .bind(&bytes)
            .bind(&ids)
            .bind(&body_refs)
            .bind(&compressed)
            .bind(&sizes)
            .bind(&meta_col)
            .bind(col(|d| d.meta.subject.as_str()))
            .bind(col(|d| d.meta.from.as_str()))
            .bind(col(|d| d.meta.to.as_str()))
            .bind(col(|d| d.meta.cc.as_str()))
            .bind(col(|d| d.meta.message_id.as_str()))
            .bind(&sent)
            .bind(&header_sizes)
            .bind(&l_mb)
            .bind(&l_k)
            .bind(&l_msg)
            .bind(&l_flags)
            .bind(&l_kw)
            .bind(&l_date)
            .bind(&l_size)
            .fetch_all(&mut *conn)
            .await
            .map_err(db_err)?;
        if rows.is_empty() {
            return Err(self.why_not_delivered(&mut conn, &mb_ids, &counts).await);
        }
        let mut assigned: HashMap<(usize, i64), u32> = HashMap::new();
        let mut changes: BTreeMap<i64, (u64, u32)> = BTreeMap::new();
        for r in &rows {
            let mb: i64 = r.try_get("id").map_err(db_err)?;
            let first: i64 = r.try_get("first_uid").map_err(db_err)?;
            let modseq: i64 = r.try_get("highest_modseq").map_err(db_err)?;
            let share =
                groups.get(&mb).ok_or_else(|| StoreError::Internal(format!("mailbox {mb} not asked for")))?;
            changes.insert(mb, (u64_of(modseq), u32_of(share.deliveries.len() as i64, "messages")?));
            for (k, &i) in share.deliveries.iter().enumerate() {
                assigned.insert((i, mb), u32_of(first + k as i64, "uid")?);
            }
        }
        Ok(delivered(batch, &assigned, &changes))
    }

    async fn maildrop_listing(&self, mailbox_id: i64, after_uid: u32) -> StoreResult<Vec<MaildropEntry>> {
        // Decoded by position into a tuple, straight from the wire: a maildrop that
        // keeps its mail lists thousands of messages at every login, and a generic
        // row looked up by column name cost the pod more CPU than PostgreSQL spent
        // on the read (bench/pop3.sh CLONE=1: 5.4 ms of server CPU per session).
        // One row per message stays: aggregating the rows into arrays halved the
        // pod's CPU but added 30 % to PostgreSQL's, the one part pods do not scale.
        let mut conn = self.conn().await?;
        let mut rows = sqlx::query_as::<_, (i64, i64, i64, DateTime<Utc>)>(
            "SELECT uid, message_id, size, internal_date FROM mailbox_messages \
             WHERE mailbox_id = $1 AND uid > $2 ORDER BY uid",
        )
        .bind(mailbox_id)
        .bind(i64::from(after_uid))
        .fetch(&mut *conn);
        let mut entries = Vec::new();
        while let Some((uid, message_id, size, internal_date)) =
            futures::TryStreamExt::try_next(&mut rows).await.map_err(db_err)?
        {
            entries.push(MaildropEntry {
                uid: u32_of(uid, "uid")?,
                message_id,
                size: u32_of(size, "size")?,
                internal_date,
            });
        }
        Ok(entries)
    }

    async fn index(&self, mailbox_id: i64) -> StoreResult<MailboxIndex> {
        // One statement, so one snapshot: the modseq matches the rows. Columns as
        // arrays, not a row per message: sqlx decodes rows one by one through an
        // async stream, which cost more CPU than the query itself for a
        // 10,000-message mailbox (perf profile of IMAP SELECT). The aggregates read one
        // row stream (from the primary key, in UID order), so the arrays line up;
        // an ORDER BY per aggregate would sort each one again (+40 % per SELECT).
        // `mailbox_index_from` sorts should the order ever differ.
        let row = sqlx::query(
            "SELECT mb.highest_modseq, mb.uid_next, l.uids, l.flags, l.modseqs, l.kw_uids, l.kws \
             FROM mailboxes mb \
             CROSS JOIN LATERAL (SELECT COALESCE(array_agg(uid), '{}') AS uids, \
               COALESCE(array_agg(flags), '{}') AS flags, \
               COALESCE(array_agg(modseq), '{}') AS modseqs, \
               COALESCE(array_agg(uid) FILTER (WHERE keywords <> ''), '{}') AS kw_uids, \
               COALESCE(array_agg(keywords) FILTER (WHERE keywords <> ''), '{}') AS kws \
               FROM (SELECT uid, flags, modseq, keywords FROM mailbox_messages WHERE mailbox_id = mb.id \
                     ORDER BY uid) o) l \
             WHERE mb.id = $1",
        )
        .bind(mailbox_id)
        .fetch_optional(&mut *self.conn().await?)
        .await
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("mailbox {mailbox_id}")))?;
        let kw_uids: Vec<i64> = row.try_get("kw_uids").map_err(db_err)?;
        let kws: Vec<String> = row.try_get("kws").map_err(db_err)?;
        mailbox_index_from(
            row.try_get("highest_modseq").map_err(db_err)?,
            row.try_get("uid_next").map_err(db_err)?,
            row.try_get("uids").map_err(db_err)?,
            row.try_get("flags").map_err(db_err)?,
            row.try_get("modseqs").map_err(db_err)?,
            kw_uids.into_iter().zip(kws).collect(),
        )
    }

    async fn links(&self, keys: &[(i64, u32)]) -> StoreResult<MessageLinks> {
        // One statement, so one snapshot for the links and the modseqs. The LEFT
        // JOIN keeps a row for every asked mailbox that exists, also when none of
        // its asked UIDs does (expunged elsewhere): its modseq tells the session so.
        // The mailboxes are looked up by key in a LATERAL subquery: as a plain join
        // its generic plan hashes a scan of the whole mailboxes table whenever that
        // table is small enough (0.75 against 0.19 ms at 1,120 mailboxes).
        if keys.is_empty() {
            return Ok(MessageLinks::default());
        }
        let (mailbox_ids, uids): (Vec<i64>, Vec<i64>) = keys.iter().map(|&(m, u)| (m, i64::from(u))).unzip();
        let rows = sqlx::query(
            "SELECT mb.id AS mailbox_id, mb.highest_modseq, mm.uid, mm.message_id, mm.flags, mm.keywords, \
             mm.internal_date FROM UNNEST($1::bigint[], $2::bigint[]) AS q(mailbox_id, uid) \
             CROSS JOIN LATERAL (SELECT id, highest_modseq FROM mailboxes WHERE id = q.mailbox_id OFFSET 0) mb \
             LEFT JOIN mailbox_messages mm ON mm.mailbox_id = q.mailbox_id AND mm.uid = q.uid",
        )
        .bind(mailbox_ids)
        .bind(uids)
        .fetch_all(&mut *self.conn().await?)
        .await
        .map_err(db_err)?;
        let mut out = MessageLinks::default();
        for r in rows {
            let mailbox_id: i64 = r.try_get("mailbox_id").map_err(db_err)?;
            if !out.mailboxes.iter().any(|&(m, _)| m == mailbox_id) {
                out.mailboxes.push((mailbox_id, u64_of(r.try_get("highest_modseq").map_err(db_err)?)));
            }
            let Some(uid) = r.try_get::<Option<i64>, _>("uid").map_err(db_err)? else { continue };
            let flags: i32 = r.try_get("flags").map_err(db_err)?;
            let keywords: String = r.try_get("keywords").map_err(db_err)?;
            out.links.push(MessageLink {
                mailbox_id,
                uid: u32_of(uid, "uid")?,
                message_id: r.try_get("message_id").map_err(db_err)?,
                flags: flagset_from_row(i64::from(flags), &keywords),
                internal_date: r.try_get("internal_date").map_err(db_err)?,
            });
        }
        Ok(out)
    }

    async fn bodies(&self, message_ids: &[i64]) -> StoreResult<Vec<StoredBody>> {
        if message_ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows =
            sqlx::query("SELECT id, body, compressed, size, header_size FROM messages WHERE id = ANY($1)")
                .bind(message_ids)
                .fetch_all(&mut *self.conn().await?)
                .await
                .map_err(db_err)?;
        rows.iter().map(|r| stored_body_of(r, r.int("id")?)).collect()
    }

    async fn flagged_uids(&self, mailbox_id: i64, with: Flags, without: Flags) -> StoreResult<Vec<u32>> {
        // One array, not a row per UID (see `mailbox_index`).
        let sql = format!(
            "SELECT COALESCE(array_agg(uid ORDER BY uid), '{{}}') FROM mailbox_messages WHERE mailbox_id = $1{}",
            flag_conditions(with, without)
        );
        let uids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(mailbox_id)
            .fetch_one(&mut *self.conn().await?)
            .await
            .map_err(db_err)?;
        uids.into_iter().map(|u| u32_of(u, "uid")).collect()
    }

    async fn change_flags(&self, mailbox_id: i64, change: FlagChange<'_>) -> StoreResult<Vec<FlagRow>> {
        store_flags_on(&mut *self.conn().await?, mailbox_id, change).await
    }

    async fn modseqs_of(&self, mailbox_ids: &[i64]) -> StoreResult<Vec<(i64, u64)>> {
        let rows: Vec<(i64, i64)> =
            sqlx::query_as("SELECT id, highest_modseq FROM mailboxes WHERE id = ANY($1)")
                .bind(mailbox_ids)
                .fetch_all(&mut *self.conn().await?)
                .await
                .map_err(db_err)?;
        Ok(rows.into_iter().map(|(id, m)| (id, u64_of(m))).collect())
    }

    async fn changes(&self, mailbox_id: i64, modseq: u64) -> StoreResult<MailboxChanges> {
        let mut conn = self.conn().await?;
        let since = i64::try_from(modseq).unwrap_or(i64::MAX);
        // One statement, so one snapshot: the modseq, the changed rows, the
        // tombstones and the prune floor agree (a prune deletes tombstones and
        // raises the floor in one transaction). It was three round trips; a
        // session asks only once its probe saw the mailbox change. Columns as
        // arrays (see `index`). Its generic plan (see `generic_plans`) reads the
        // (mailbox_id, modseq) index with both conditions.
        let row = sqlx::query(
            "SELECT mb.highest_modseq, mb.expunged_floor, c.uids, c.flags, c.keywords, c.modseqs, \
             ARRAY(SELECT uid FROM expunged WHERE mailbox_id = $1 AND modseq > $2 ORDER BY uid) AS expunged \
             FROM mailboxes mb CROSS JOIN LATERAL (SELECT COALESCE(array_agg(uid), '{}') AS uids, \
               COALESCE(array_agg(flags), '{}') AS flags, COALESCE(array_agg(keywords), '{}') AS keywords, \
               COALESCE(array_agg(modseq), '{}') AS modseqs \
               FROM mailbox_messages WHERE mailbox_id = $1 AND modseq > $2) c \
             WHERE mb.id = $1",
        )
        .bind(mailbox_id)
        .bind(since)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("mailbox {mailbox_id}")))?;
        let get = |name: &str| row.try_get::<Vec<i64>, _>(name).map_err(db_err);
        let (uids, modseqs) = (get("uids")?, get("modseqs")?);
        let flags: Vec<i32> = row.try_get("flags").map_err(db_err)?;
        let keywords: Vec<String> = row.try_get("keywords").map_err(db_err)?;
        if [flags.len(), keywords.len(), modseqs.len()] != [uids.len(); 3] {
            return Err(StoreError::Internal("change columns of unequal length".into()));
        }
        let mut changed = Vec::with_capacity(uids.len());
        for (((uid, flags), keywords), modseq) in uids.into_iter().zip(flags).zip(&keywords).zip(modseqs) {
            let flags = flagset_from_row(i64::from(flags), keywords);
            changed.push(FlagRow { uid: u32_of(uid, "uid")?, flags, modseq: u64_of(modseq) });
        }
        // Sessions add new messages in UID order.
        changed.sort_unstable_by_key(|r| r.uid);
        let floor: i64 = row.try_get("expunged_floor").map_err(db_err)?;
        let present = match since < floor {
            true => {
                let rows = steps::fetch_all(&mut *conn, PRESENT_UIDS, &[Param::Int(mailbox_id)]).await?;
                Some(rows.iter().map(|r| u32_of(r.int("uid")?, "uid")).collect::<StoreResult<_>>()?)
            }
            false => None,
        };
        let expunged: Vec<i64> = row.try_get("expunged").map_err(db_err)?;
        Ok(MailboxChanges {
            highest_modseq: u64_of(row.try_get("highest_modseq").map_err(db_err)?),
            changed,
            expunged: expunged.into_iter().map(|u| u32_of(u, "uid")).collect::<StoreResult<_>>()?,
            present,
        })
    }

    async fn expunge_links(&self, mailbox_id: i64, uids: Option<&UidSet>) -> StoreResult<Expunged> {
        let ranges = uids.map(range_arrays);
        // Up to two retries: a body linked again while the statement waited for the
        // mailbox lock fails its deletion on the foreign key, and the statement,
        // all of it undone, runs again on a snapshot that sees the new link.
        let mut attempt = 0;
        let (found, uids, modseq): (bool, Vec<i64>, i64) = loop {
            let query = match &ranges {
                None => sqlx::query_as(EXPUNGE_DELETED).bind(mailbox_id),
                Some((los, his)) if los.len() == 1 && los[0] == his[0] => {
                    sqlx::query_as(EXPUNGE_ONE).bind(mailbox_id).bind(los[0])
                }
                Some((los, his)) => sqlx::query_as(EXPUNGE_RANGES).bind(mailbox_id).bind(los).bind(his),
            };
            match query.fetch_one(&mut *self.conn().await?).await {
                Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() && attempt < 2 => attempt += 1,
                other => break other.map_err(db_err)?,
            }
        };
        if !found {
            return Err(StoreError::NotFound(format!("mailbox {mailbox_id}")));
        }
        let uids = uids.into_iter().map(|u| u32_of(u, "uid")).collect::<StoreResult<_>>()?;
        Ok(Expunged { uids, modseq: u64_of(modseq) })
    }

    async fn prune(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        // In batches, each its own short transaction: the first prune after an
        // upgrade (every older tombstone dated at the migration) must not hold
        // locks on millions of rows at once.
        const BATCH: i64 = 10_000;
        let mut total = 0u64;
        loop {
            let mut tx = self.tx().await?;
            let gone: Vec<(i64, i64)> = sqlx::query_as(
                "DELETE FROM expunged WHERE ctid IN \
                 (SELECT ctid FROM expunged WHERE expunged_at < $1 LIMIT $2) RETURNING mailbox_id, modseq",
            )
            .bind(before)
            .bind(BATCH)
            .fetch_all(&mut *tx)
            .await
            .map_err(db_err)?;
            let mut floors: BTreeMap<i64, i64> = BTreeMap::new();
            for (mailbox, modseq) in &gone {
                let f = floors.entry(*mailbox).or_default();
                *f = (*f).max(*modseq);
            }
            // Mailbox rows in ascending id order, as every writer locks them.
            let ids: Vec<i64> = floors.keys().copied().collect();
            let floor_values: Vec<i64> = floors.values().copied().collect();
            sqlx::query("SELECT id FROM mailboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE")
                .bind(&ids)
                .fetch_all(&mut *tx)
                .await
                .map_err(db_err)?;
            sqlx::query(
                "UPDATE mailboxes m SET expunged_floor = GREATEST(m.expunged_floor, t.f) \
                 FROM UNNEST($1::bigint[], $2::bigint[]) AS t(id, f) WHERE m.id = t.id",
            )
            .bind(&ids)
            .bind(&floor_values)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
            tx.commit().await.map_err(db_err)?;
            total += gone.len() as u64;
            if (gone.len() as i64) < BATCH {
                return Ok(total);
            }
        }
    }

    async fn cluster_epoch(&self) -> StoreResult<Option<String>> {
        use std::sync::atomic::Ordering;
        let mut conn = self.conn().await?;
        // The cluster's identifier and timeline say it best (a promoted replica
        // shares the identifier but moves to a new timeline; a restore into a new
        // cluster changes the identifier), but reading them needs pg_monitor or a
        // superuser. Without, the server's start time: it changes on every restart
        // and failover too (clearing caches once more than needed, never less).
        // The database's own identity (its oid) joins either: a database dropped
        // and restored from a dump under the same name on the same server is a
        // new one.
        if self.control_readable.load(Ordering::Relaxed) {
            let control: Result<String, _> = sqlx::query_scalar(
                "SELECT s.system_identifier::text || '/' || c.timeline_id::text || '/' || \
                 pg_postmaster_start_time()::text || '/' || d.oid::text \
                 FROM pg_control_system() s, pg_control_checkpoint() c, pg_database d \
                 WHERE d.datname = current_database()",
            )
            .fetch_one(&mut *conn)
            .await;
            match control {
                Ok(epoch) => return Ok(Some(epoch)),
                Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("42501") => {
                    self.control_readable.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(db_err(e)),
            }
        }
        let started: String = sqlx::query_scalar(
            "SELECT pg_postmaster_start_time()::text || '/' || oid::text FROM pg_database \
             WHERE datname = current_database()",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err)?;
        Ok(Some(started))
    }
}
