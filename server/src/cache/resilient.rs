//! Redis as a cache, not a single point of failure.
//!
//! Every pod of a cluster shares one Redis, so anything that makes a request wait
//! on Redis, or fail with it, turns a cache outage into a full mail outage. This
//! wrapper puts the pod's own stand-ins behind each operation and decides, per call,
//! in bounded time, which one serves:
//!
//! - **A budget per request** (`redis.request_budget_ms`): a call to Redis that has
//!   not answered by then counts as failed and the fallback answers instead.
//! - **A circuit breaker**: after a failure the pod stops calling Redis at all and
//!   serves from the fallbacks, so a dead Redis costs nothing per request; a
//!   background probe pings Redis every `redis.retry_after_secs` and closes the
//!   breaker when it answers. The state is the gauge `mail_cache_up`, a line in
//!   `/healthz` and one log line per change; never a reason to fail readiness.
//!
//! The stand-ins, and why each is the right one:
//! - credentials, counters (rate limits), small values and shared secrets → the
//!   in-process cache: a login is verified against the store (argon2) and cached in
//!   the pod; rate limits become per pod; TLS session-ticket keys become per pod
//!   (resumption then works on the pod that issued the ticket).
//! - mailbox-change notifications → sent from a bounded queue by a task of their
//!   own, so a delivery never waits on a publish (what queued up meanwhile goes in
//!   one pipelined round trip, one event per mailbox); while Redis is away (or the queue
//!   is full) events are dropped and counted (`mail_cache_events_dropped_total`):
//!   IDLE sessions whose subscription ended poll the store instead.
//! - locks (one POP3 session per maildrop) and lease sets (IMAP connections per
//!   account) → rows with an expiry in the store (`Store::lease_*`), which every pod
//!   shares: they stay correct across pods rather than per pod. Locks and leases
//!   taken in the store are remembered here, so their renewal and release go back
//!   to the store even after Redis returns. While the breaker switches, the leases
//!   still held in Redis are not counted by the store: the per-account limit may
//!   admit up to twice its value until those lapse (within their TTL).
//! - subscriptions → refused while Redis is away (the caller polls).
//!
//! A Redis that cannot be reached when the pod starts does not stop it: the pod
//! starts on the stand-ins and connects in the background. Behind Sentinels
//! (`redis+sentinel://…`, [`super::target`]) the probe asks them for the master
//! again after each failure, so a failover moves the pod to the new master.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::mpsc;

use super::local::LocalCache;
use super::target::RedisTarget;
use super::{Cache, CacheError, CacheResult, LockToken, MailboxEvent, RotatingSecret};
use crate::store::Store;
use mailcluster_model::PoolStats;

/// How the pod treats Redis.
#[derive(Debug, Clone, Copy)]
pub struct ResilienceOptions {
    /// Longest a request waits on Redis before its fallback answers.
    pub budget: Duration,
    /// How long the breaker stays open before the probe tries Redis again.
    pub retry_after: Duration,
    /// Mailbox-change events waiting to be published, at most.
    pub publish_queue: usize,
    /// `redis.client_cache_keys`: values kept in the pod under Redis' tracking.
    pub client_cache_keys: usize,
}

impl Default for ResilienceOptions {
    fn default() -> Self {
        ResilienceOptions {
            budget: Duration::from_millis(250),
            retry_after: Duration::from_secs(2),
            publish_queue: 4096,
            client_cache_keys: 0,
        }
    }
}

/// The metrics of the cache's health.
#[derive(Clone)]
struct CacheMetrics {
    up: IntGauge,
    fallbacks: IntCounterVec,
    events_dropped: IntCounter,
}

impl CacheMetrics {
    fn new() -> Self {
        CacheMetrics {
            up: IntGauge::new(
                "mail_cache_up",
                "1 while the shared cache (Redis) answers, 0 while its stand-ins serve",
            )
            .expect("valid metric"),
            fallbacks: IntCounterVec::new(
                Opts::new(
                    "mail_cache_fallbacks_total",
                    "Cache operations served by a stand-in because Redis did not",
                ),
                &["op"],
            )
            .expect("valid metric"),
            events_dropped: IntCounter::new(
                "mail_cache_events_dropped_total",
                "Mailbox-change notifications not published (Redis away or the queue full)",
            )
            .expect("valid metric"),
        }
    }
}

fn client_copies_vec() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "mail_cache_client_copies_total",
            "Hot values read from the pod's copy (hit) or from Redis (miss), and copies dropped \
             because Redis reported a change or they expired (invalidated)",
        ),
        &["result"],
    )
    .expect("valid metric")
}

/// `mail_cache_client_copies_total`, read at scrape time from the current
/// Redis connection. Its figures start again from 0 on a new connection (a
/// failover), which Prometheus reads as a counter reset.
struct ClientCopies {
    shared: std::sync::Weak<Shared>,
    template: IntCounterVec,
}

impl prometheus::core::Collector for ClientCopies {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.template.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let stats = self.shared.upgrade().and_then(|s| s.current()).and_then(|p| p.client_cache_stats());
        let Some(stats) = stats else { return Vec::new() };
        let counters = client_copies_vec();
        counters.with_label_values(&["hit"]).inc_by(stats.hits);
        counters.with_label_values(&["miss"]).inc_by(stats.misses);
        counters.with_label_values(&["invalidated"]).inc_by(stats.invalidations);
        counters.collect()
    }
}

struct Shared {
    /// The Redis connection; None until the first connection succeeded. Replaced
    /// when the Sentinels name another master.
    primary: RwLock<Option<Arc<dyn Cache>>>,
    /// The master's URL behind `primary`.
    master_url: Mutex<String>,
    up: AtomicBool,
    /// Why Redis is down, for `/healthz`.
    reason: Mutex<String>,
    metrics: CacheMetrics,
}

impl Shared {
    fn current(&self) -> Option<Arc<dyn Cache>> {
        self.primary.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, primary: Arc<dyn Cache>, url: String) {
        *self.primary.write().unwrap_or_else(|e| e.into_inner()) = Some(primary);
        *self.master_url.lock().unwrap_or_else(|e| e.into_inner()) = url;
    }

    fn set_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            self.metrics.up.set(1);
            tracing::info!("cache: Redis answers again; shared caches, limits and notifications restored");
        }
    }

    fn set_down(&self, op: &str, reason: &str) {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = format!("{op}: {reason}");
        if self.up.swap(false, Ordering::AcqRel) {
            self.metrics.up.set(0);
            tracing::warn!(op, reason, "cache: Redis unavailable; serving from per-pod caches and the store");
        }
    }
}

pub struct ResilientCache {
    shared: Arc<Shared>,
    local: LocalCache,
    store: Arc<dyn Store>,
    opts: ResilienceOptions,
    publish: mpsc::Sender<MailboxEvent>,
    /// (key, member) of the locks and leases held in the store, so that their
    /// renewal and release reach the store whatever Redis does meanwhile.
    in_store: Mutex<HashSet<(String, String)>>,
}

/// Locks taken in the store carry this in their token.
const STORE_TOKEN: &str = "store:";

/// Runs `$call` on Redis when it is up, within the budget. `Some(result)` when Redis
/// answered (an error Redis reported included); `None` when the caller must use its
/// fallback (Redis down, unreachable or too slow — the breaker is then open).
macro_rules! on_redis {
    ($self:ident, $op:literal, |$p:ident| $call:expr) => {{
        match $self.primary() {
            None => None,
            Some($p) => match tokio::time::timeout($self.opts.budget, $call).await {
                Ok(Err(CacheError::Unavailable(e))) => {
                    $self.shared.set_down($op, &e);
                    None
                }
                Ok(result) => Some(result),
                Err(_) => {
                    $self.shared.set_down($op, "no answer within the request budget");
                    None
                }
            },
        }
    }};
}

impl ResilientCache {
    /// Wraps the Redis that `url` names (directly or through Sentinels). A Redis
    /// that does not answer now is connected in the background; only a URL that
    /// cannot be valid is an error.
    pub async fn start(
        url: &str,
        prefix: &str,
        connect_timeout: Duration,
        store: Arc<dyn Store>,
        opts: ResilienceOptions,
    ) -> CacheResult<Arc<ResilientCache>> {
        let target = RedisTarget::parse(url)?;
        let shared = Arc::new(Shared {
            primary: RwLock::new(None),
            master_url: Mutex::new(String::new()),
            up: AtomicBool::new(false),
            reason: Mutex::new("not connected yet".into()),
            metrics: CacheMetrics::new(),
        });
        match connect(&target, prefix, connect_timeout, opts.client_cache_keys).await {
            Ok((redis, master)) => {
                shared.replace(redis, master);
                shared.up.store(true, Ordering::Release);
                shared.metrics.up.set(1);
            }
            Err(CacheError::Unavailable(e)) => {
                tracing::warn!(error = %e, "cache: Redis unavailable at start; starting on per-pod caches and the store");
                *shared.reason.lock().unwrap_or_else(|e| e.into_inner()) = e;
            }
            Err(e) => return Err(e),
        }
        let (publish, queue) = mpsc::channel(opts.publish_queue.max(1));
        let cache = Arc::new(ResilientCache {
            shared: shared.clone(),
            local: LocalCache::new(),
            store,
            opts,
            publish,
            in_store: Mutex::new(HashSet::new()),
        });
        tokio::spawn(publisher(Arc::downgrade(&shared), queue, opts.budget));
        let reconnect = Reconnect { target, prefix: prefix.to_owned(), connect_timeout };
        tokio::spawn(probe(Arc::downgrade(&shared), Some(reconnect), opts));
        Ok(cache)
    }

    /// Wraps an already connected cache (tests: a cache that fails on demand).
    pub fn wrap(
        primary: Arc<dyn Cache>,
        store: Arc<dyn Store>,
        opts: ResilienceOptions,
    ) -> Arc<ResilientCache> {
        let shared = Arc::new(Shared {
            primary: RwLock::new(Some(primary)),
            master_url: Mutex::new(String::new()),
            up: AtomicBool::new(true),
            reason: Mutex::new(String::new()),
            metrics: CacheMetrics::new(),
        });
        shared.metrics.up.set(1);
        let (publish, queue) = mpsc::channel(opts.publish_queue.max(1));
        tokio::spawn(publisher(Arc::downgrade(&shared), queue, opts.budget));
        tokio::spawn(probe(Arc::downgrade(&shared), None, opts));
        Arc::new(ResilientCache {
            shared,
            local: LocalCache::new(),
            store,
            opts,
            publish,
            in_store: Mutex::new(HashSet::new()),
        })
    }

    /// Registers `mail_cache_up`, `mail_cache_fallbacks_total`,
    /// `mail_cache_events_dropped_total` and `mail_cache_client_copies_total`.
    pub fn register_metrics(&self, registry: &Registry) -> prometheus::Result<()> {
        let m = &self.shared.metrics;
        registry.register(Box::new(m.up.clone()))?;
        registry.register(Box::new(m.fallbacks.clone()))?;
        registry.register(Box::new(m.events_dropped.clone()))?;
        registry.register(Box::new(ClientCopies {
            shared: Arc::downgrade(&self.shared),
            template: client_copies_vec(),
        }))?;
        Ok(())
    }

    /// Whether Redis serves now, and why not when it does not.
    pub fn health(&self) -> Result<(), String> {
        if self.shared.up.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(self.shared.reason.lock().unwrap_or_else(|e| e.into_inner()).clone())
        }
    }

    fn primary(&self) -> Option<Arc<dyn Cache>> {
        if self.shared.up.load(Ordering::Acquire) { self.shared.current() } else { None }
    }

    fn fallback(&self, op: &str) {
        self.shared.metrics.fallbacks.with_label_values(&[op]).inc();
    }

    fn remember(&self, key: &str, member: &str) {
        self.in_store.lock().unwrap_or_else(|e| e.into_inner()).insert((key.to_owned(), member.to_owned()));
    }

    fn forget(&self, key: &str, member: &str) -> bool {
        self.in_store.lock().unwrap_or_else(|e| e.into_inner()).remove(&(key.to_owned(), member.to_owned()))
    }

    fn held_in_store(&self, key: &str, member: &str) -> bool {
        self.in_store.lock().unwrap_or_else(|e| e.into_inner()).contains(&(key.to_owned(), member.to_owned()))
    }
}

/// Store errors as the cache's: the callers treat both as "temporarily unavailable".
fn store_err(e: crate::store::StoreError) -> CacheError {
    CacheError::Unavailable(format!("lease in the store: {e}"))
}

fn lease_store_key(key: &str) -> String {
    format!("lease:{key}")
}

fn lock_store_key(key: &str) -> String {
    format!("lock:{key}")
}

/// Most events a publish round trip carries.
const PUBLISH_BATCH: usize = 256;

/// Sends queued mailbox events to Redis: whatever has queued up meanwhile goes in
/// one pipelined round trip within the budget, so a pod delivering thousands of
/// messages a second does not pay a Redis round trip per message. While Redis is
/// down they are dropped (and counted), never held.
async fn publisher(
    shared: std::sync::Weak<Shared>,
    mut queue: mpsc::Receiver<MailboxEvent>,
    budget: Duration,
) {
    let mut events = Vec::with_capacity(PUBLISH_BATCH);
    while queue.recv_many(&mut events, PUBLISH_BATCH).await > 0 {
        let Some(shared) = shared.upgrade() else { return };
        coalesce(&mut events);
        let count = events.len() as u64;
        let primary = shared.up.load(Ordering::Acquire).then(|| shared.current()).flatten();
        let Some(primary) = primary else {
            shared.metrics.events_dropped.inc_by(count);
            events.clear();
            continue;
        };
        match tokio::time::timeout(budget, primary.publish_all(&events)).await {
            Ok(Ok(())) => {}
            Ok(Err(CacheError::Unavailable(e))) => {
                shared.metrics.events_dropped.inc_by(count);
                shared.set_down("publish", &e);
            }
            Ok(Err(e)) => {
                shared.metrics.events_dropped.inc_by(count);
                tracing::debug!(error = %e, "cache: publish failed");
            }
            Err(_) => {
                shared.metrics.events_dropped.inc_by(count);
                shared.set_down("publish", "no answer within the request budget");
            }
        }
        events.clear();
    }
}

/// One event per mailbox, in the order of each mailbox's first event, with the
/// highest modseq among its events (0, "unknown", when any of them is). Every
/// change they stand for is committed before its event is queued, and receivers
/// re-check the store on any event, so one notification per mailbox tells
/// subscribers everything the queued ones did.
fn coalesce(events: &mut Vec<MailboxEvent>) {
    let mut first: HashMap<(i64, i64), usize> = HashMap::with_capacity(events.len());
    let mut kept = 0;
    for i in 0..events.len() {
        let event = events[i];
        match first.entry((event.account_id, event.mailbox_id)) {
            std::collections::hash_map::Entry::Occupied(at) => {
                let kept_event = &mut events[*at.get()];
                kept_event.modseq = if kept_event.modseq == 0 || event.modseq == 0 {
                    0
                } else {
                    kept_event.modseq.max(event.modseq)
                };
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(kept);
                events[kept] = event;
                kept += 1;
            }
        }
    }
    events.truncate(kept);
}

/// How the probe reaches Redis again: the target and the connection settings.
struct Reconnect {
    target: RedisTarget,
    prefix: String,
    connect_timeout: Duration,
}

/// Resolves the master (asking the Sentinels when there are some) and connects.
async fn connect(
    target: &RedisTarget,
    prefix: &str,
    timeout: Duration,
    client_cache_keys: usize,
) -> CacheResult<(Arc<dyn Cache>, String)> {
    let master = target.resolve(timeout).await?;
    let redis = super::redis::RedisCache::connect(&master, prefix, timeout, client_cache_keys).await?;
    Ok((Arc::new(redis), master))
}

/// While the breaker is open, looks for Redis every `retry_after` and closes the
/// breaker when it answers. Requests never probe: they only use a Redis known up.
/// With Sentinels, the master is asked of them again each round: after a failover
/// the connection is replaced by one to the new master. A connected direct Redis
/// only needs a ping (its connection reconnects by itself).
async fn probe(shared: std::sync::Weak<Shared>, reconnect: Option<Reconnect>, opts: ResilienceOptions) {
    // The probe may wait longer than a request: nobody waits on it.
    let wait = opts.budget.max(Duration::from_secs(1));
    loop {
        tokio::time::sleep(opts.retry_after).await;
        let Some(s) = shared.upgrade() else { return };
        if s.up.load(Ordering::Acquire) {
            continue;
        }
        let current = s.current();
        let fresh_target = match &reconnect {
            Some(r) if current.is_none() || matches!(r.target, RedisTarget::Sentinel { .. }) => Some(r),
            _ => None,
        };
        if let Some(r) = fresh_target {
            let master = match r.target.resolve(r.connect_timeout).await {
                Ok(m) => m,
                Err(e) => {
                    *s.reason.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string();
                    continue;
                }
            };
            let same = *s.master_url.lock().unwrap_or_else(|e| e.into_inner()) == master;
            if current.is_none() || !same {
                match super::redis::RedisCache::connect(
                    &master,
                    &r.prefix,
                    r.connect_timeout,
                    opts.client_cache_keys,
                )
                .await
                {
                    Ok(redis) => {
                        tracing::info!(master = %redact(&master), "cache: connected to the Redis master");
                        s.replace(Arc::new(redis), master);
                        s.set_up();
                    }
                    Err(e) => *s.reason.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string(),
                }
                continue;
            }
        }
        let Some(primary) = current else { continue };
        match tokio::time::timeout(wait, primary.ping()).await {
            Ok(Ok(())) => s.set_up(),
            Ok(Err(e)) => *s.reason.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string(),
            Err(_) => *s.reason.lock().unwrap_or_else(|e| e.into_inner()) = "ping timed out".into(),
        }
    }
}

/// A master URL for a log line: without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(i), Some(j)) if j > i => format!("{}{}", &url[..i + 3], &url[j + 1..]),
        _ => url.to_owned(),
    }
}

#[async_trait]
impl Cache for ResilientCache {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn shared_across_processes(&self) -> bool {
        true
    }

    async fn ping(&self) -> CacheResult<()> {
        match (self.shared.current(), self.health()) {
            (Some(p), Ok(())) => p.ping().await,
            (_, Err(reason)) => Err(CacheError::Unavailable(reason)),
            (None, Ok(())) => Err(CacheError::Unavailable("not connected".into())),
        }
    }

    fn pool_stats(&self) -> PoolStats {
        self.shared.current().map(|p| p.pool_stats()).unwrap_or_default()
    }

    fn client_cache_stats(&self) -> Option<super::ClientCacheStats> {
        self.shared.current().and_then(|p| p.client_cache_stats())
    }

    async fn credential_put(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        if let Some(r) = on_redis!(self, "credential_put", |p| p.credential_put(key, account_id, ttl)) {
            return r;
        }
        self.fallback("credential_put");
        self.local.credential_put(key, account_id, ttl).await
    }

    async fn credential_get(&self, key: &[u8; 32]) -> CacheResult<Option<i64>> {
        if let Some(r) = on_redis!(self, "credential_get", |p| p.credential_get(key)) {
            return r;
        }
        self.fallback("credential_get");
        self.local.credential_get(key).await
    }

    async fn credential_touch(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        if let Some(r) = on_redis!(self, "credential_touch", |p| p.credential_touch(key, account_id, ttl)) {
            return r;
        }
        self.fallback("credential_touch");
        self.local.credential_touch(key, account_id, ttl).await
    }

    async fn credential_purge_account(&self, account_id: i64) -> CacheResult<()> {
        // The pod's own entries go whatever Redis does: they may date from an outage.
        self.local.credential_purge_account(account_id).await?;
        match on_redis!(self, "credential_purge", |p| p.credential_purge_account(account_id)) {
            Some(r) => r,
            // Entries other pods cached in Redis expire with their TTL; a purge
            // that cannot reach them must say so (a password change reports it).
            None => {
                Err(CacheError::Unavailable("Redis unavailable: cached logins expire with their TTL".into()))
            }
        }
    }

    async fn counter_incr(&self, key: &str, window: Duration) -> CacheResult<u64> {
        if let Some(r) = on_redis!(self, "counter_incr", |p| p.counter_incr(key, window)) {
            return r;
        }
        self.fallback("counter_incr");
        self.local.counter_incr(key, window).await
    }

    async fn counter_get(&self, key: &str) -> CacheResult<u64> {
        if let Some(r) = on_redis!(self, "counter_get", |p| p.counter_get(key)) {
            return r;
        }
        self.fallback("counter_get");
        self.local.counter_get(key).await
    }

    async fn counter_decr(&self, key: &str) -> CacheResult<()> {
        if let Some(r) = on_redis!(self, "counter_decr", |p| p.counter_decr(key)) {
            return r;
        }
        self.fallback("counter_decr");
        self.local.counter_decr(key).await
    }

    fn counters_shared(&self) -> bool {
        self.shared.up.load(Ordering::Acquire)
    }

    async fn value_put(&self, key: &str, value: &[u8], ttl: Duration) -> CacheResult<()> {
        if let Some(r) = on_redis!(self, "value_put", |p| p.value_put(key, value, ttl)) {
            return r;
        }
        self.fallback("value_put");
        self.local.value_put(key, value, ttl).await
    }

    async fn value_get(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        if let Some(r) = on_redis!(self, "value_get", |p| p.value_get(key)) {
            return r;
        }
        self.fallback("value_get");
        self.local.value_get(key).await
    }

    async fn value_get_hot(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        if let Some(r) = on_redis!(self, "value_get", |p| p.value_get_hot(key)) {
            return r;
        }
        self.fallback("value_get");
        self.local.value_get(key).await
    }

    async fn value_del(&self, key: &str) -> CacheResult<()> {
        self.local.value_del(key).await?;
        on_redis!(self, "value_del", |p| p.value_del(key)).unwrap_or(Ok(()))
    }

    async fn publish(&self, event: MailboxEvent) -> CacheResult<()> {
        if self.publish.try_send(event).is_err() {
            self.shared.metrics.events_dropped.inc();
        }
        Ok(())
    }

    async fn subscribe(&self, account_id: i64) -> CacheResult<BoxStream<'static, MailboxEvent>> {
        match on_redis!(self, "subscribe", |p| p.subscribe(account_id)) {
            Some(r) => r,
            None => Err(CacheError::Unavailable("Redis unavailable: poll the store".into())),
        }
    }

    async fn lock_try(&self, key: &str, ttl: Duration) -> CacheResult<Option<LockToken>> {
        if let Some(r) = on_redis!(self, "lock_try", |p| p.lock_try(key, ttl)) {
            return r;
        }
        self.fallback("lock_try");
        let mut nonce = [0u8; 16];
        rand::fill(&mut nonce);
        let token = format!("{STORE_TOKEN}{}", super::hex(&nonce));
        let store_key = lock_store_key(key);
        if self.store.lease_acquire(&store_key, &token, 1, ttl).await.map_err(store_err)? {
            self.remember(&store_key, &token);
            Ok(Some(LockToken { key: key.to_owned(), token }))
        } else {
            Ok(None)
        }
    }

    async fn lock_refresh(&self, lock: &LockToken, ttl: Duration) -> CacheResult<bool> {
        if lock.token.starts_with(STORE_TOKEN) {
            return self
                .store
                .lease_extend(&lock_store_key(&lock.key), &lock.token, ttl)
                .await
                .map_err(store_err);
        }
        match on_redis!(self, "lock_refresh", |p| p.lock_refresh(lock, ttl)) {
            Some(r) => r,
            // A lock in an unreachable Redis cannot be kept: say it is lost rather
            // than let the holder go on beside a holder of a lock in the store.
            None => Ok(false),
        }
    }

    async fn lock_release(&self, lock: &LockToken) -> CacheResult<()> {
        if lock.token.starts_with(STORE_TOKEN) {
            let store_key = lock_store_key(&lock.key);
            self.forget(&store_key, &lock.token);
            return self.store.lease_release(&store_key, &lock.token).await.map_err(store_err);
        }
        // A lock in a Redis that is away expires there by itself.
        on_redis!(self, "lock_release", |p| p.lock_release(lock)).unwrap_or(Ok(()))
    }

    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> CacheResult<bool> {
        if let Some(r) = on_redis!(self, "lease_acquire", |p| p.lease_acquire(key, member, limit, ttl)) {
            return r;
        }
        self.fallback("lease_acquire");
        let store_key = lease_store_key(key);
        let held = self.store.lease_acquire(&store_key, member, limit, ttl).await.map_err(store_err)?;
        if held {
            self.remember(&store_key, member);
        }
        Ok(held)
    }

    async fn lease_renew(&self, leases: &[(String, String)], ttl: Duration) -> CacheResult<()> {
        let (in_store, in_redis): (Vec<_>, Vec<_>) =
            leases.iter().cloned().partition(|(k, m)| self.held_in_store(&lease_store_key(k), m));
        for (key, member) in &in_store {
            // Renewal takes a lapsed lease again even over the limit: its holder lives.
            self.store
                .lease_acquire(&lease_store_key(key), member, u64::MAX, ttl)
                .await
                .map_err(store_err)?;
        }
        if in_redis.is_empty() {
            return Ok(());
        }
        match on_redis!(self, "lease_renew", |p| p.lease_renew(&in_redis, ttl)) {
            Some(r) => r,
            // They lapse in Redis; the next acquires count in the store.
            None => Ok(()),
        }
    }

    async fn lease_release(&self, key: &str, member: &str) -> CacheResult<()> {
        let store_key = lease_store_key(key);
        if self.forget(&store_key, member) {
            return self.store.lease_release(&store_key, member).await.map_err(store_err);
        }
        on_redis!(self, "lease_release", |p| p.lease_release(key, member)).unwrap_or(Ok(()))
    }

    async fn lease_count(&self, key: &str) -> CacheResult<u64> {
        if let Some(r) = on_redis!(self, "lease_count", |p| p.lease_count(key)) {
            return r;
        }
        self.fallback("lease_count");
        self.store.lease_count(&lease_store_key(key)).await.map_err(store_err)
    }

    async fn secret_get(
        &self,
        name: &str,
        len: usize,
        rotate_every: Duration,
    ) -> CacheResult<RotatingSecret> {
        if let Some(r) = on_redis!(self, "secret_get", |p| p.secret_get(name, len, rotate_every)) {
            return r;
        }
        self.fallback("secret_get");
        self.local.secret_get(name, len, rotate_every).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(account_id: i64, mailbox_id: i64, modseq: u64) -> MailboxEvent {
        MailboxEvent { account_id, mailbox_id, modseq }
    }

    #[test]
    fn coalesce_keeps_one_event_per_mailbox_in_first_seen_order() {
        let mut events =
            vec![ev(1, 10, 3), ev(2, 10, 4), ev(1, 11, 5), ev(1, 10, 9), ev(1, 10, 7), ev(2, 10, 0)];
        coalesce(&mut events);
        // Mailbox 10 of account 2 is a different mailbox from account 1's 10; an
        // unknown modseq (0) wins over known ones, else the highest is kept.
        assert_eq!(events, vec![ev(1, 10, 9), ev(2, 10, 0), ev(1, 11, 5)]);
        let mut none = Vec::new();
        coalesce(&mut none);
        assert!(none.is_empty());
    }
}
