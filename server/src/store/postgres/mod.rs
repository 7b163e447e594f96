//! The cluster store: PostgreSQL through a sqlx pool, shared by every pod.
//!
//! Locking: each write to a mailbox begins by updating (or `FOR UPDATE`-locking)
//! that mailbox's row, so writers of one mailbox are serialised by a row lock and
//! writers of different mailboxes never wait for each other. Operations touching
//! several mailboxes (a delivery batch, COPY/MOVE, RENAME, account deletion) lock
//! them with `ORDER BY id FOR UPDATE` (`FOR NO KEY UPDATE` in `DELIVER`) first:
//! everyone takes row locks in ascending id order, so concurrent batches cannot
//! deadlock.
//!
//! Round trips are what a delivery batch pays for while it holds those locks, so
//! the batch is written with array parameters (`UNNEST`) as one statement
//! (`DELIVER`), whatever the batch size.
//!
//! Durability: the store never changes `synchronous_commit`; with the server
//! default (`on`) COMMIT returns after the WAL is flushed, which is what lets SMTP
//! answer 250 after `deliver_batch` returns. [`PgStore::connect`] warns when a
//! database or role default has turned it off.

pub mod nodelay;

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, Postgres, Row, Transaction};

use super::common::{
    AcquireTimer, db_err, delivered, encode_keywords, flag_conditions, flagset_from_row, is_unique_violation,
    mailbox_index_from, u32_of, u64_of, uid_ranges, uids_fit,
};
use super::sql::{Backend, Batch, PRESENT_UIDS, stored_body_of};
use super::steps::{
    self, Cols, FlagChange, LinkRow, MAILBOX_COLS, NewAccount, NewMailbox, Param, RenameFrom, SharedSql,
    StoreTx, mailbox_from_row,
};
use super::*;

/// See [`super::common::rollback_tolerant`].
static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(|| super::common::rollback_tolerant(sqlx::migrate!("./migrations/postgres")));

/// Pooled connections idle longer than this are pinged before use.
const IDLE_PING_AFTER: Duration = Duration::from_secs(30);

pub struct PgStore {
    pool: PgPool,
    options: PgConnectOptions,
    acquire: AcquireTimer,
    /// Whether this role may read the cluster's control data (`epoch`); false after
    /// the first refusal, so that a role without pg_monitor does not leave an error
    /// in the server's log at every check.
    control_readable: std::sync::atomic::AtomicBool,
    /// Message ids drawn from the sequence ahead of need (see `message_ids`).
    spare_ids: std::sync::Mutex<Vec<i64>>,
}

/// Message ids drawn from the sequence at a time: one round trip per this many
/// stored messages instead of one per delivery transaction (an APPEND is a
/// transaction of one). Ids left unused when the process ends are gaps in the
/// sequence, which nothing reads.
const SPARE_IDS: usize = 256;

type Tx = Transaction<'static, Postgres>;

/// A delivery batch as one statement, which PostgreSQL runs as its own
/// transaction: one round trip where BEGIN, the lock, the counters, the bodies,
/// the links and COMMIT took six. Besides the round trips themselves, the
/// mailbox rows stay locked for one statement and its WAL flush only, which is
/// what concurrent batches (of this pod or another) wait on.
///
/// Order of effects: the count in the UPDATE's WHERE names no column of the
/// rows, so PostgreSQL makes it a one-time filter, evaluated before the UPDATE
/// reads a row. It runs `locked`, which locks the target mailboxes in ascending
/// id order (the order every multi-mailbox writer uses, so batches cannot
/// deadlock), and checks that every one exists and has UIDs left for its share.
/// Only then are the counters raised, and the bodies and links are written only
/// when every mailbox's were (`whole`): a batch is stored entirely or not at
/// all, as a transaction would have it. Nothing stored returns no rows;
/// `why_not_delivered` says why.
///
/// Parameters: $1–$4 per mailbox (id ascending, messages, unseen, octets);
/// $5–$16 per body; $17–$23 per link (mailbox, position in the mailbox's share,
/// body id, flags, keywords, internal date, size).
const DELIVER: &str = "WITH locked AS ( \
        SELECT id, uid_next FROM mailboxes WHERE id = ANY($1::bigint[]) ORDER BY id FOR NO KEY UPDATE \
    ), mb AS ( \
        UPDATE mailboxes m SET uid_next = m.uid_next + t.n, highest_modseq = m.highest_modseq + 1, \
            messages = m.messages + t.n, unseen = m.unseen + t.u, bytes = m.bytes + t.b \
        FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[]) AS t(id, n, u, b) \
        WHERE m.id = t.id AND (SELECT count(*) FROM locked l JOIN UNNEST($1::bigint[], $2::bigint[]) \
            AS g(id, n) ON g.id = l.id WHERE l.uid_next + g.n <= 4294967295) = cardinality($1::bigint[]) \
        RETURNING m.id, m.uid_next - t.n AS first_uid, m.highest_modseq \
    ), whole AS ( \
        SELECT count(*) = cardinality($1::bigint[]) AS ok FROM mb \
    ), msg AS ( \
        INSERT INTO messages (id, body, compressed, size, meta, subject, from_addr, to_addr, cc_addr, \
            message_id, sent_date, header_size) \
        SELECT b.* FROM UNNEST($5::bigint[], $6::bytea[], $7::bool[], $8::bigint[], $9::text[], $10::text[], \
            $11::text[], $12::text[], $13::text[], $14::text[], $15::timestamptz[], $16::bigint[]) \
            AS b(id, body, compressed, size, meta, subject, from_addr, to_addr, cc_addr, message_id, \
                 sent_date, header_size), whole \
        WHERE whole.ok \
    ), link AS ( \
        INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, size) \
        SELECT l.mb, mb.first_uid + l.k, l.msg, l.flags, l.kw, mb.highest_modseq, l.date, l.size \
        FROM UNNEST($17::bigint[], $18::bigint[], $19::bigint[], $20::int[], $21::text[], \
            $22::timestamptz[], $23::bigint[]) AS l(mb, k, msg, flags, kw, date, size) \
        JOIN mb ON mb.id = l.mb, whole \
        WHERE whole.ok \
    ) \
    SELECT mb.id, mb.first_uid, mb.highest_modseq FROM mb, whole WHERE whole.ok";

/// The STORE statement around the part that names the message rows (`mm`).
macro_rules! store_flags_sql {
    ($rows:expr) => {
        concat!(
            r#"WITH mb AS (
                SELECT id, highest_modseq + 1 AS modseq FROM mailboxes WHERE id = $1 FOR NO KEY UPDATE
            ), cur AS (
                SELECT mm.uid, mm.flags AS old_flags, mm.keywords AS old_keywords,
                    CASE $4 WHEN 0 THEN mm.flags | $5 WHEN 1 THEN mm.flags & ~$5 ELSE $5 END AS new_flags,
                    CASE $4
                        WHEN 0 THEN array_to_string(ARRAY(
                            SELECT DISTINCT k COLLATE "C" FROM unnest(string_to_array(mm.keywords, ' ') || $6::text[]) AS k
                            WHERE k <> '' ORDER BY 1), ' ')
                        WHEN 1 THEN array_to_string(ARRAY(
                            SELECT k COLLATE "C" FROM unnest(string_to_array(mm.keywords, ' ')) AS k
                            WHERE k <> '' AND k <> ALL($6::text[]) ORDER BY 1), ' ')
                        ELSE array_to_string($6::text[], ' ')
                    END AS new_keywords
                "#,
            $rows,
            r#"
                FOR UPDATE OF mm
            ), upd AS (
                UPDATE mailbox_messages mm
                SET flags = c.new_flags, keywords = c.new_keywords, modseq = (SELECT modseq FROM mb)
                FROM cur c
                WHERE mm.mailbox_id = $1 AND mm.uid = c.uid
                    AND (c.new_flags <> c.old_flags OR c.new_keywords <> c.old_keywords)
                RETURNING mm.uid, mm.flags, mm.keywords, c.old_flags
            ), bump AS (
                UPDATE mailboxes m SET highest_modseq = mb.modseq,
                    unseen = m.unseen + (SELECT coalesce(sum((u.old_flags & 1) - (u.flags & 1)), 0) FROM upd u)
                FROM mb WHERE m.id = mb.id AND EXISTS (SELECT 1 FROM upd)
            )
            SELECT mb.modseq, u.uid, u.flags, u.keywords FROM mb LEFT JOIN upd u ON true ORDER BY u.uid"#
        )
    };
}

/// The links of mailbox `$mailbox` (`$1` unless given: an SQL expression) in the
/// UID ranges whose bounds are `$2`/`$3`, as `mm`: one primary-key range scan per
/// range. The plain join of UNNEST and
/// `mailbox_messages` has a generic plan that reads every link of the mailbox
/// (and, joined with `messages`, hashes the whole table) and then filters: 38 ms
/// a multi-range FETCH in the IMAP session mix, 6.6 against 0.65 ms for four
/// ranges of a 1,000-message mailbox. A LATERAL subquery with `OFFSET 0`, which
/// the planner does not flatten into that join, keeps the range scans.
macro_rules! links_in_ranges {
    () => {
        links_in_ranges!("$1")
    };
    ($mailbox:literal) => {
        concat!(
            "UNNEST($2::bigint[], $3::bigint[]) AS r(lo, hi) CROSS JOIN LATERAL \
             (SELECT * FROM mailbox_messages x WHERE x.mailbox_id = ",
            $mailbox,
            " AND x.uid BETWEEN r.lo AND r.hi OFFSET 0) mm"
        )
    };
}

/// `(los, his)` arrays of a UID set, for `UNNEST($2, $3) r(lo, hi)`.
fn range_arrays(uids: &UidSet) -> (Vec<i64>, Vec<i64>) {
    uid_ranges(uids).into_iter().unzip()
}

/// STORE as one statement (see `store_flags`); `$2`/`$3` the UID ranges' bounds.
/// The rows are read range by range (`links_in_ranges!`: 3.1 against 0.35 ms for
/// four ranges of a 1,000-message mailbox), after the mailbox lock.
const STORE_FLAGS_RANGES: &str = store_flags_sql!(concat!("FROM ", links_in_ranges!("(SELECT id FROM mb)")));
/// The same for one UID, `$2[1]` (`$3` unused).
const STORE_FLAGS_ONE: &str = store_flags_sql!(
    "FROM mailbox_messages mm WHERE mm.mailbox_id = (SELECT id FROM mb) AND mm.uid = ($2::bigint[])[1] \
     AND $3::bigint[] IS NOT NULL"
);

/// EXPUNGE as one statement around the part that picks the rows (`mm`): the
/// mailbox's write lock, the links deleted, the counters and modseq, the
/// tombstones, and the bodies no other link holds.
///
/// Every part reads the statement's snapshot, where the links this statement
/// deletes are still there: a body goes when its links there are all among them.
/// They are counted per body, which keeps the body index in use, and only up to
/// one more than this statement's links to it, so a body shared by thousands of
/// mailboxes is not read through (an anti-join against the links left was planned
/// as a scan of every link).
///
/// A link to one of these bodies that a transaction committed while this
/// statement waited for the lock is not in the snapshot: the body's deletion then
/// fails on the foreign key (see `expunge_links`), never leaving a link without
/// its body.
macro_rules! expunge_sql {
    ($using:expr, $rows:expr) => {
        concat!(
            "WITH mb AS (SELECT id FROM mailboxes WHERE id = $1::bigint FOR UPDATE), \
             gone AS (DELETE FROM mailbox_messages mm ",
            $using,
            " WHERE mm.mailbox_id = (SELECT id FROM mb) AND ",
            $rows,
            " RETURNING mm.uid, mm.message_id, mm.flags, mm.size), \
             counts AS (UPDATE mailboxes m SET highest_modseq = m.highest_modseq + 1, \
                 messages = m.messages - (SELECT count(*) FROM gone), \
                 unseen = m.unseen - (SELECT count(*) FROM gone WHERE flags & 1 = 0), \
                 bytes = m.bytes - (SELECT CAST(coalesce(sum(size), 0) AS BIGINT) FROM gone) \
                 WHERE m.id = $1 AND EXISTS (SELECT 1 FROM gone) RETURNING m.highest_modseq), \
             tombstones AS (INSERT INTO expunged (mailbox_id, uid, modseq) \
                 SELECT $1, g.uid, c.highest_modseq FROM gone g CROSS JOIN counts c \
                 ON CONFLICT (mailbox_id, uid) DO UPDATE SET modseq = EXCLUDED.modseq), \
             orphans AS (DELETE FROM messages m \
                 USING (SELECT message_id, count(*) AS n FROM gone GROUP BY message_id) g \
                 WHERE m.id = g.message_id \
                 AND (SELECT count(*) FROM (SELECT 1 FROM mailbox_messages o \
                     WHERE o.message_id = g.message_id LIMIT g.n + 1) o) = g.n) \
             SELECT EXISTS (SELECT 1 FROM mb) AS found, ARRAY(SELECT uid FROM gone ORDER BY uid) AS uids, \
                 coalesce((SELECT highest_modseq FROM counts), 0) AS modseq"
        )
    };
}

/// EXPUNGE of the `\Deleted` links; a literal predicate, served by the partial index.
const EXPUNGE_DELETED: &str = expunge_sql!("", "mm.flags & 8 <> 0");
/// EXPUNGE of the links of one UID, `$2`.
const EXPUNGE_ONE: &str = expunge_sql!("", "mm.uid = $2");
/// EXPUNGE of the links in UID ranges (`$2`/`$3` their bounds), found range by
/// range as in `links_in_ranges!` (2.2 against 0.49 ms for four ranges of a
/// 1,000-message mailbox).
const EXPUNGE_RANGES: &str = expunge_sql!(
    concat!("USING (SELECT mm.uid FROM ", links_in_ranges!("(SELECT id FROM mb)"), ") AS sel"),
    "mm.uid = sel.uid"
);

/// TLS off for a server on this host unless the URL (or `PGSSLMODE`) asks for it.
/// The driver's default, `prefer`, takes TLS whenever the server offers it, as
/// Debian's does with its snakeoil certificate; over loopback that protects
/// nothing and cost 4 % of the machine in the IMAP session mix (bench/RESULTS.md).
fn plain_on_loopback(url: &str, options: PgConnectOptions) -> PgConnectOptions {
    let asked = std::env::var_os("PGSSLMODE").is_some()
        || url.split_once('?').is_some_and(|(_, query)| {
            query.split('&').any(|pair| {
                let key = pair.split_once('=').map_or(pair, |(k, _)| k);
                key.eq_ignore_ascii_case("sslmode") || key.eq_ignore_ascii_case("ssl-mode")
            })
        });
    let host = options.get_host();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if asked || !loopback || !matches!(options.get_ssl_mode(), sqlx::postgres::PgSslMode::Prefer) {
        return options;
    }
    options.ssl_mode(sqlx::postgres::PgSslMode::Disable)
}

/// Every statement is prepared once per connection and its generic plan reused,
/// unless the URL sets `plan_cache_mode` itself. Under PostgreSQL's default,
/// statements with a range parameter (changes since a modseq, a maildrop after a
/// UID, the delivery's UNNEST) were planned again at every execution, because the
/// generic plan's estimate (a third of the mailbox) looked worse than a custom
/// one: planning took 20 s of the 120 s PostgreSQL spent executing statements in
/// a soak window (bench/RESULTS.md). Every statement here starts from a mailbox
/// or message id on an index that has it first, so the generic plan is the plan
/// a custom one would pick.
fn generic_plans(options: PgConnectOptions) -> PgConnectOptions {
    if options.get_options().is_some_and(|o| o.contains("plan_cache_mode")) {
        return options;
    }
    options.options([("plan_cache_mode", "force_generic_plan")])
}

/// `host:port/database`, the part of a connection target that is safe to show.
fn describe(options: &PgConnectOptions) -> String {
    format!("{}:{}/{}", options.get_host(), options.get_port(), options.get_database().unwrap_or(""))
}

/// STORE as one statement, on `conn` (a pooled connection or a transaction).
async fn store_flags_on(
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

    /// Connects a pool of `pool_size` connections; an unreachable server is
    /// `Unavailable` with host and port named (never the password).
    pub async fn connect(url: &str, pool_size: u32, connect_timeout: Duration) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url).map_err(|e| {
            StoreError::Invalid(format!("bad PostgreSQL URL {}: {}", redact_url(url), redact_error(&e, url)))
        })?;
        let options = generic_plans(plain_on_loopback(url, options));
        let target = describe(&options);
        let port = options.get_port();
        let pool = PgPoolOptions::new()
            .max_connections(pool_size.max(1))
            .acquire_timeout(connect_timeout)
            // sqlx's default pings on every acquire: a round trip per query, which
            // IMAP sessions issuing STATUS/FETCH in loops would pay. Ping only
            // connections that sat idle long enough to have been cut (failover,
            // NAT/LB idle timeouts); a connection broken in use fails that query
            // with `Unavailable` and is discarded.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    // Opened before a server said it only reads (a failover):
                    // discard, so the pool opens a connection to the new primary.
                    if common::read_only_seen_ago().is_some_and(|ago| meta.age > ago) {
                        return Ok(false);
                    }
                    if meta.idle_for > IDLE_PING_AFTER {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |_conn, _meta| {
                Box::pin(async move {
                    nodelay::set_on_connections_to(port);
                    Ok(())
                })
            })
            .idle_timeout(Duration::from_secs(300))
            .connect_with(options.clone())
            .await
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot connect to PostgreSQL at {target}: {}",
                    redact_error(&e, url)
                ))
            })?;
        let store = PgStore {
            pool,
            options,
            acquire: AcquireTimer::default(),
            control_readable: std::sync::atomic::AtomicBool::new(true),
            spare_ids: std::sync::Mutex::new(Vec::new()),
        };
        match store.synchronous_commit().await {
            Ok(v) if v == "off" => tracing::warn!(
                target = %target,
                "synchronous_commit is off for this database/role: acknowledged mail can be lost on a crash"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not read synchronous_commit"),
        }
        Ok(store)
    }

    /// The session's `synchronous_commit` setting as the store's connections see it.
    pub async fn synchronous_commit(&self) -> StoreResult<String> {
        sqlx::query_scalar("SHOW synchronous_commit").fetch_one(&self.pool).await.map_err(db_err)
    }

    /// The underlying pool, for callers that observe acquire times.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn conn(&self) -> StoreResult<PoolConnection<Postgres>> {
        self.acquire.time(self.pool.acquire()).await.map_err(db_err)
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

    async fn tx(&self) -> StoreResult<Tx> {
        let conn = self.conn().await?;
        Transaction::begin(conn, None).await.map_err(db_err)
    }
}

/// The error text with the URL's password masked, should the error quote it.
fn redact_error(e: &dyn std::fmt::Display, url: &str) -> String {
    let mut text = e.to_string().replace(url, &redact_url(url));
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, pw)| pw);
    if let Some(pw) = password.filter(|pw| !pw.is_empty()) {
        text = text.replace(pw, "***");
    }
    text
}

type Link = LinkRow<DateTime<Utc>>;

impl StoreTx for Transaction<'_, Postgres> {
    const BUMP_UID_VALIDITY: &'static str = "UPDATE accounts \
         SET last_uid_validity = GREATEST(last_uid_validity + $2, $3 + $2 - 1) WHERE id = $1 RETURNING last_uid_validity";
    const INSERT_PARENT: &'static str = "INSERT INTO mailboxes (account_id, name, uid_validity) VALUES ($1, $2, $3) \
         ON CONFLICT (account_id, name) DO NOTHING";
    const LOCK_ACCOUNT: Option<&'static str> = Some("SELECT id FROM accounts WHERE id = $1 FOR UPDATE");
    // KEY SHARE: a concurrent domain_del waits for us (and then sees the account)
    const ACCOUNT_DOMAIN: &'static str = "SELECT id FROM domains WHERE name = $1 FOR KEY SHARE";

    type Date = DateTime<Utc>;

    async fn lock_mailboxes(&mut self, ids: &[i64]) -> StoreResult<Vec<i64>> {
        // One form for any number of ids: with generic plans (see `generic_plans`)
        // the array statement keeps its plan like a scalar one would.
        sqlx::query_scalar("SELECT id FROM mailboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind(ids)
            .fetch_all(&mut **self)
            .await
            .map_err(db_err)
    }

    async fn links_in(&mut self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<Link>> {
        let (los, his) = range_arrays(uids);
        if los.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_as(concat!(
            "SELECT mm.uid, mm.message_id, mm.flags, mm.keywords, mm.internal_date, mm.size FROM ",
            links_in_ranges!(),
            " ORDER BY mm.uid"
        ))
        .bind(mailbox_id)
        .bind(&los)
        .bind(&his)
        .fetch_all(&mut **self)
        .await
        .map_err(db_err)
    }

    async fn insert_links(&mut self, dest: i64, first: i64, modseq: i64, links: &[Link]) -> StoreResult<()> {
        let new_uids: Vec<i64> = (first..first + links.len() as i64).collect();
        let message_ids: Vec<i64> = links.iter().map(|l| l.message_id).collect();
        let flags: Vec<i32> = links.iter().map(|l| l.flags).collect();
        let keywords: Vec<&str> = links.iter().map(|l| l.keywords.as_str()).collect();
        let dates: Vec<DateTime<Utc>> = links.iter().map(|l| l.internal_date).collect();
        let sizes: Vec<i64> = links.iter().map(|l| l.size).collect();
        sqlx::query(
            "INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, \
             size) \
             SELECT $1, u, m, f, k, $2, d, s \
             FROM UNNEST($3::bigint[], $4::bigint[], $5::int[], $6::text[], $7::timestamptz[], $8::bigint[]) \
             AS t(u, m, f, k, d, s)",
        )
        .bind(dest)
        .bind(modseq)
        .bind(&new_uids)
        .bind(&message_ids)
        .bind(&flags)
        .bind(&keywords)
        .bind(&dates)
        .bind(&sizes)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn delete_links(&mut self, mailbox_id: i64, uids: &[i64], modseq: i64) -> StoreResult<()> {
        sqlx::query("DELETE FROM mailbox_messages WHERE mailbox_id = $1 AND uid = ANY($2)")
            .bind(mailbox_id)
            .bind(uids)
            .execute(&mut **self)
            .await
            .map_err(db_err)?;
        sqlx::query(
            "INSERT INTO expunged (mailbox_id, uid, modseq) SELECT $1, u, $3 FROM UNNEST($2::bigint[]) AS u \
             ON CONFLICT (mailbox_id, uid) DO UPDATE SET modseq = EXCLUDED.modseq",
        )
        .bind(mailbox_id)
        .bind(uids)
        .bind(modseq)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn tombstone_all(&mut self, mailbox_id: i64, modseq: i64) -> StoreResult<()> {
        let sql = "INSERT INTO expunged (mailbox_id, uid, modseq) \
             SELECT mailbox_id, uid, $2 FROM mailbox_messages WHERE mailbox_id = $1 \
             ON CONFLICT (mailbox_id, uid) DO UPDATE SET modseq = EXCLUDED.modseq";
        self.run(sql, &[Param::Int(mailbox_id), Param::Int(modseq)]).await
    }

    async fn delete_orphans(&mut self, message_ids: &[i64]) -> StoreResult<()> {
        if message_ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "DELETE FROM messages m WHERE m.id = ANY($1) \
             AND NOT EXISTS (SELECT 1 FROM mailbox_messages mm WHERE mm.message_id = m.id)",
        )
        .bind(message_ids)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn mailbox_in(&mut self, account_id: i64, name: &str, lock: bool) -> StoreResult<Option<Mailbox>> {
        let sql = format!(
            "SELECT {MAILBOX_COLS} FROM mailboxes WHERE account_id = $1 AND name = $2{}",
            if lock { " FOR UPDATE" } else { "" }
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(account_id)
            .bind(name)
            .fetch_optional(&mut **self)
            .await
            .map_err(db_err)?;
        row.as_ref().map(mailbox_from_row).transpose()
    }

    async fn insert_mailbox(&mut self, new: NewMailbox<'_>) -> StoreResult<Mailbox> {
        let sql = format!(
            "INSERT INTO mailboxes (account_id, name, uid_validity, special_use) VALUES ($1, $2, $3, $4) \
             RETURNING {MAILBOX_COLS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(new.account_id)
            .bind(new.name)
            .bind(new.uid_validity)
            .bind(new.special_use.map(SpecialUse::as_str))
            .fetch_one(&mut **self)
            .await
            .map_err(|e| match e {
                e if is_unique_violation(&e) => StoreError::AlreadyExists(format!("mailbox {}", new.name)),
                e => db_err(e),
            })?;
        mailbox_from_row(&row)
    }

    async fn rename_sources(&mut self, from: RenameFrom<'_>) -> StoreResult<Vec<(i64, String)>> {
        sqlx::query_as(
            "SELECT id, name FROM mailboxes WHERE account_id = $1 \
             AND (name = $2 OR ($3 AND left(name, length($2) + 1) = $2 || '/')) ORDER BY id FOR UPDATE",
        )
        .bind(from.account_id)
        .bind(from.name)
        .bind(from.children)
        .fetch_all(&mut **self)
        .await
        .map_err(db_err)
    }

    async fn rename_mailboxes(
        &mut self,
        ids: &[i64],
        names: &[String],
        first: i64,
        to: &str,
    ) -> StoreResult<()> {
        let validities: Vec<i64> = (first..first + ids.len() as i64).collect();
        // The unique (account_id, name) constraint is checked per row, so a
        // single UPDATE renaming A/x → B/x fails only if B/x already exists.
        sqlx::query(
            "UPDATE mailboxes m SET name = t.n, uid_validity = t.v \
             FROM UNNEST($1::bigint[], $2::text[], $3::bigint[]) AS t(id, n, v) WHERE m.id = t.id",
        )
        .bind(ids)
        .bind(names)
        .bind(&validities)
        .execute(&mut **self)
        .await
        .map_err(|e| match e {
            e if is_unique_violation(&e) => StoreError::AlreadyExists(format!("a mailbox under {to}")),
            e => db_err(e),
        })?;
        Ok(())
    }

    async fn insert_account(&mut self, new: NewAccount<'_>) -> StoreResult<(i64, DateTime<Utc>)> {
        let res = sqlx::query_as(
            "INSERT INTO accounts (email, domain_id, password_hash) VALUES ($1, $2, $3) RETURNING id, created_at",
        )
        .bind(new.email)
        .bind(new.domain_id)
        .bind(new.password_hash)
        .fetch_one(&mut **self)
        .await;
        match res {
            Ok(row) => Ok(row),
            Err(e) if is_unique_violation(&e) => {
                Err(StoreError::AlreadyExists(format!("account {}", new.email)))
            }
            Err(e) => Err(db_err(e)),
        }
    }

    async fn insert_default_mailboxes(&mut self, mailboxes: &[NewMailbox<'_>]) -> StoreResult<()> {
        let accounts: Vec<i64> = mailboxes.iter().map(|m| m.account_id).collect();
        let names: Vec<&str> = mailboxes.iter().map(|m| m.name).collect();
        let validities: Vec<i64> = mailboxes.iter().map(|m| m.uid_validity).collect();
        let specials: Vec<Option<&str>> =
            mailboxes.iter().map(|m| m.special_use.map(SpecialUse::as_str)).collect();
        sqlx::query(
            "INSERT INTO mailboxes (account_id, name, uid_validity, special_use) \
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::text[])",
        )
        .bind(&accounts)
        .bind(&names)
        .bind(&validities)
        .bind(&specials)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        sqlx::query(
            "INSERT INTO subscriptions (account_id, name) SELECT * FROM UNNEST($1::bigint[], $2::text[])",
        )
        .bind(&accounts)
        .bind(&names)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn modseqs_in(&mut self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<(i64, i64)>> {
        let (los, his) = range_arrays(uids);
        sqlx::query_as(concat!(
            "SELECT DISTINCT mm.uid, mm.modseq FROM ",
            links_in_ranges!(),
            " ORDER BY mm.uid"
        ))
        .bind(mailbox_id)
        .bind(&los)
        .bind(&his)
        .fetch_all(&mut **self)
        .await
        .map_err(db_err)
    }

    async fn store_flags(&mut self, mailbox_id: i64, change: FlagChange<'_>) -> StoreResult<Vec<FlagRow>> {
        store_flags_on(self, mailbox_id, change).await
    }
}

impl Backend for PgStore {
    const NAME: &'static str = "postgres";
    const DOMAIN_FOR_DELETE: &'static str = "SELECT id FROM domains WHERE name = $1 FOR UPDATE";
    const ACCOUNT_FOR_DELETE: &'static str = "SELECT id FROM accounts WHERE email = $1 FOR UPDATE";
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
