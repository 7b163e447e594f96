//! Shared, lossy state that makes pods interchangeable: verified-credential cache,
//! rate-limit counters, mailbox-change notifications, short-lived locks (one POP3
//! session per maildrop), bounded lease sets (IMAP connections per account across
//! pods) and shared secrets (TLS session-ticket keys).
//!
//! Redis in a cluster; an in-process implementation for the embedded default. Both
//! pass `tests/cache_conformance.rs`. Nothing here is the system of record: losing
//! the cache costs performance, never mail.

pub mod local;
pub mod redis;
pub mod resilient;
pub mod sealed;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

/// Opens the cache named by `url`: `None` → the in-process [`local::LocalCache`]
/// (single pod), `redis://` or `rediss://` → [`redis::RedisCache`], and
/// `redis+sentinel://` / `rediss+sentinel://` → the master the Sentinels name
/// ([`target`]). Every Redis key
/// and channel starts with `prefix` so that several clusters (or test runs) can
/// share one Redis. An unreachable Redis is `CacheError::Unavailable` naming
/// `host:port` (never the password) after at most `connect_timeout`.
pub async fn open(url: Option<&str>, prefix: &str, connect_timeout: Duration) -> CacheResult<Arc<dyn Cache>> {
    match url {
        None => Ok(Arc::new(local::LocalCache::new())),
        Some(url) => {
            let master = target::RedisTarget::parse(url)?.resolve(connect_timeout).await?;
            // The admin commands read no value twice: no client-side copies.
            Ok(Arc::new(redis::RedisCache::connect(&master, prefix, connect_timeout, 0).await?))
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache unavailable: {0}")]
    Unavailable(String),
    #[error("cache error: {0}")]
    Internal(String),
}

pub type CacheResult<T> = Result<T, CacheError>;

/// "Something changed in this mailbox": published after every delivery, APPEND,
/// STORE, EXPUNGE, COPY/MOVE, so IDLE sessions on any pod re-check the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxEvent {
    pub account_id: i64,
    pub mailbox_id: i64,
    /// The mailbox's modseq after the change where the sender knows it without a
    /// read (STORE), else 0. Receivers re-check either way.
    pub modseq: u64,
}

/// See [`Cache::client_cache_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub invalidations: u64,
}

/// A held lock; pass it back to release. Locks expire by themselves after their TTL
/// so a crashed holder cannot block the resource for ever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockToken {
    pub key: String,
    pub token: String,
}

/// A secret shared by every pod, rotated on a schedule: `current` signs new things,
/// `previous` is still accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotatingSecret {
    pub current: Vec<u8>,
    pub previous: Option<Vec<u8>>,
    /// Monotonic generation number, bumped on each rotation.
    pub generation: u64,
}

#[async_trait]
pub trait Cache: Send + Sync + 'static {
    /// "redis" or "local".
    fn backend(&self) -> &'static str;
    /// Whether other processes (pods) read what this one stores, so that a value
    /// written here can spare them work; the embedded cache lives in this process.
    fn shared_across_processes(&self) -> bool;
    async fn ping(&self) -> CacheResult<()>;
    /// Connection figures for `mail_cache_pool_connections`.
    fn pool_stats(&self) -> mailcluster_model::PoolStats;
    /// Reads of [`Cache::value_get_hot`] answered by the pod's copy and by
    /// Redis, and copies dropped (changed, expired, evicted), since the
    /// connection was made; None without client-side copies.
    fn client_cache_stats(&self) -> Option<ClientCacheStats> {
        None
    }

    // ---- verified credentials ----
    /// Remembers that `key` (a keyed hash of user + password, never the password)
    /// verified as `account_id`, for `ttl`.
    async fn credential_put(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()>;
    async fn credential_get(&self, key: &[u8; 32]) -> CacheResult<Option<i64>>;
    /// Restarts the `ttl` of a credential still cached as `account_id`; a no-op
    /// when it has expired or was purged meanwhile (a touch never re-creates an
    /// entry, so it cannot bring back a password a change has just purged).
    async fn credential_touch(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()>;
    /// Forget every cached credential of an account (password change, deletion).
    async fn credential_purge_account(&self, account_id: i64) -> CacheResult<()>;

    // ---- counters ----
    /// Increments a fixed-window counter and returns the new value; the window
    /// (and the key) expires `window` after the first increment.
    async fn counter_incr(&self, key: &str, window: Duration) -> CacheResult<u64>;
    async fn counter_get(&self, key: &str) -> CacheResult<u64>;
    /// Takes back one increment of a live counter (never below 0, never
    /// creating it): an attempt counted up front that turned out not to count.
    async fn counter_decr(&self, key: &str) -> CacheResult<()>;
    /// Whether the counters answered now are the cluster's (every pod counts in
    /// them) rather than this pod's alone, as while Redis is away.
    fn counters_shared(&self) -> bool {
        true
    }

    // ---- generic small values (e.g. recipient-exists cache) ----
    async fn value_put(&self, key: &str, value: &[u8], ttl: Duration) -> CacheResult<()>;
    async fn value_get(&self, key: &str) -> CacheResult<Option<Vec<u8>>>;
    /// [`Cache::value_get`] for a small value read far more often than it
    /// changes (a recipient lookup): Redis lets the pod keep a
    /// copy and read it without a round trip until Redis reports the key
    /// changed or expired (`redis.client_cache_keys`). Not for large values:
    /// the copies are bounded in number, not in bytes.
    async fn value_get_hot(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        self.value_get(key).await
    }
    async fn value_del(&self, key: &str) -> CacheResult<()>;

    // ---- mailbox-change notifications ----
    /// The caches a serving pod uses (in-process, and Redis behind
    /// `resilient::ResilientCache`) queue the event and return at once, so callers
    /// on the delivery path await it directly.
    async fn publish(&self, event: MailboxEvent) -> CacheResult<()>;
    /// Several events at once: a backend that can send them in one round trip
    /// (Redis, as a pipeline) overrides this; the others publish them in turn.
    async fn publish_all(&self, events: &[MailboxEvent]) -> CacheResult<()> {
        for event in events {
            self.publish(*event).await?;
        }
        Ok(())
    }
    /// Events for one account (all its mailboxes), from now on. The stream ends when
    /// the backend connection is lost; callers then fall back to polling the store.
    async fn subscribe(&self, account_id: i64) -> CacheResult<BoxStream<'static, MailboxEvent>>;

    // ---- locks ----
    /// Takes `key` for `ttl` if free; `None` when somebody else holds it.
    async fn lock_try(&self, key: &str, ttl: Duration) -> CacheResult<Option<LockToken>>;
    /// Extends a held lock; `false` when it was lost (expired and taken).
    async fn lock_refresh(&self, lock: &LockToken, ttl: Duration) -> CacheResult<bool>;
    async fn lock_release(&self, lock: &LockToken) -> CacheResult<()>;

    // ---- bounded lease sets ----
    /// Adds `member` to the set `key` unless the set already holds `limit` live
    /// members; `true` when the lease was taken (or `member` already held one, which
    /// is then renewed). A lease lapses `ttl` after it was taken or last renewed, so
    /// the leases of a crashed pod stop counting by themselves.
    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> CacheResult<bool>;
    /// Renews many leases at once, `(key, member)` pairs, each for `ttl`: one call
    /// per renewal round for all of a pod's leases. A lease that had already lapsed
    /// is taken again even over the limit — its holder is alive after all.
    async fn lease_renew(&self, leases: &[(String, String)], ttl: Duration) -> CacheResult<()>;
    async fn lease_release(&self, key: &str, member: &str) -> CacheResult<()>;
    /// Live leases in the set `key`.
    async fn lease_count(&self, key: &str) -> CacheResult<u64>;

    // ---- shared secrets ----
    /// Returns the secret `name`, creating it (random, `len` bytes) if absent and
    /// rotating it when older than `rotate_every`. All pods calling this see the same
    /// value for a given generation.
    async fn secret_get(&self, name: &str, len: usize, rotate_every: Duration)
    -> CacheResult<RotatingSecret>;
}

/// Lower-case hex of `bytes`: how binary keys and tokens appear in key names.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}
