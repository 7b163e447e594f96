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

mod backend;
pub mod nodelay;
mod statements;
mod tx;

use std::str::FromStr;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, Postgres, Transaction};

use super::common::{AcquireTimer, db_err};
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

type Tx = Transaction<'static, Postgres>;

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

impl PgStore {
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
