//! The cache as a pod sees it when Redis fails: every operation answers within the
//! request budget from its stand-in, the breaker keeps a dead Redis off the request
//! path, the probe brings it back, publishing never waits, and locks and lease sets
//! stay correct across pods through the store.
//!
//! The Redis here is a cache that fails on demand (a hung or refusing Redis cannot
//! be made to answer "now hang, now refuse" on cue); the store is the real embedded
//! one. cli/tests/redis_outage.rs kills a real Redis under a real server.

mod common;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::gated::{Gate, Gated};
use mailcluster_server::cache::local::LocalCache;
use mailcluster_server::cache::resilient::{ResilienceOptions, ResilientCache};
use mailcluster_server::cache::{Cache, CacheError, CacheResult, MailboxEvent};
use mailcluster_server::store::Store;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Up,
    Hang,
    Refuse,
}

/// A Redis stand-in: a working in-process cache while `Up`; a Redis that never
/// answers (`Hang`) or refuses connections (`Refuse`) otherwise. Counts the calls
/// that reached it.
struct Flaky {
    mode: Mutex<Mode>,
    calls: AtomicU64,
}

impl Flaky {
    fn new() -> Arc<Gated<Flaky>> {
        let gate = Flaky { mode: Mutex::new(Mode::Up), calls: AtomicU64::new(0) };
        Arc::new(Gated { backend: "redis", inner: Arc::new(LocalCache::new()), gate })
    }
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Gate for Flaky {
    async fn pass(&self, _: &'static str) -> CacheResult<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mode = *self.mode.lock().unwrap();
        match mode {
            Mode::Up => Ok(()),
            Mode::Hang => std::future::pending().await,
            Mode::Refuse => Err(CacheError::Unavailable("connection refused (test)".into())),
        }
    }
}

const OPTS: ResilienceOptions = ResilienceOptions {
    budget: Duration::from_millis(50),
    retry_after: Duration::from_millis(200),
    publish_queue: 64,
    client_cache_keys: 0,
};

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let store =
        mailcluster_server::store::open(None, dir.path(), 4, Duration::from_secs(5)).await.expect("sqlite");
    store.migrate().await.expect("migrate");
    store
}

fn metric(registry: &prometheus::Registry, name: &str) -> f64 {
    let mut total = 0.0;
    for family in registry.gather() {
        if family.name() == name {
            for m in family.get_metric() {
                total += m.get_gauge().value() + m.get_counter().value();
            }
        }
    }
    total
}

/// Polls `f` for up to 5 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_hung_redis_costs_one_budget_then_nothing_until_it_answers_again() {
    let dir = tempfile::tempdir().unwrap();
    let redis = Flaky::new();
    let cache = ResilientCache::wrap(redis.clone(), store(&dir).await, OPTS);
    let registry = prometheus::Registry::new();
    cache.register_metrics(&registry).unwrap();
    let key = [7u8; 32];
    cache.credential_put(&key, 42, Duration::from_secs(60)).await.unwrap();
    assert_eq!(metric(&registry, "mail_cache_up"), 1.0);

    redis.gate.set(Mode::Hang);
    let t = Instant::now();
    // The credential lives in Redis, out of reach: a miss (the login then checks
    // the store), answered within the budget, not a hang and not an error.
    assert_eq!(cache.credential_get(&key).await.unwrap(), None);
    assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    assert_eq!(metric(&registry, "mail_cache_up"), 0.0);
    assert!(cache.health().is_err());

    // The breaker is open: nothing reaches Redis, every answer is immediate.
    let reached = redis.gate.calls();
    let t = Instant::now();
    for i in 0..1000u64 {
        cache.counter_incr(&format!("rate:{}", i % 10), Duration::from_secs(60)).await.unwrap();
        cache.credential_put(&key, 42, Duration::from_secs(60)).await.unwrap();
        assert_eq!(cache.credential_get(&key).await.unwrap(), Some(42), "the pod's own cache serves");
    }
    assert!(t.elapsed() < Duration::from_millis(500), "3,000 calls took {:?}", t.elapsed());
    // Only the background probe may have tried Redis meanwhile.
    assert!(
        redis.gate.calls() - reached <= 5,
        "requests reached a dead Redis: {}",
        redis.gate.calls() - reached
    );
    assert_eq!(cache.counter_get("rate:3").await.unwrap(), 100, "per-pod rate limits count");
    assert!(metric(&registry, "mail_cache_fallbacks_total") >= 3000.0);

    // Redis answers again: the probe closes the breaker; requests go to Redis.
    redis.gate.set(Mode::Up);
    eventually("the breaker closes", || cache.health().is_ok()).await;
    assert_eq!(metric(&registry, "mail_cache_up"), 1.0);
    let reached = redis.gate.calls();
    assert_eq!(cache.credential_get(&key).await.unwrap(), Some(42), "Redis kept the entry");
    assert_eq!(redis.gate.calls(), reached + 1);
}

#[tokio::test]
async fn publishing_never_waits_on_redis() {
    let dir = tempfile::tempdir().unwrap();
    let redis = Flaky::new();
    let cache = ResilientCache::wrap(redis.clone(), store(&dir).await, OPTS);
    let registry = prometheus::Registry::new();
    cache.register_metrics(&registry).unwrap();
    let mut events = cache.subscribe(1).await.unwrap();
    let event = MailboxEvent { account_id: 1, mailbox_id: 2, modseq: 3 };
    cache.publish(event).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(2), futures::StreamExt::next(&mut events)).await;
    assert_eq!(got.unwrap(), Some(event), "delivered through Redis while it is up");

    redis.gate.set(Mode::Hang);
    let t = Instant::now();
    for _ in 0..10_000 {
        cache.publish(event).await.unwrap();
    }
    assert!(t.elapsed() < Duration::from_millis(500), "10,000 publishes took {:?}", t.elapsed());
    eventually("drops counted", || metric(&registry, "mail_cache_events_dropped_total") >= 9_000.0).await;
    // With the breaker open a subscriber is told to poll, at once.
    let t = Instant::now();
    assert!(cache.subscribe(1).await.is_err());
    assert!(t.elapsed() < Duration::from_millis(200));
}

#[tokio::test]
async fn maildrop_locks_stay_exclusive_across_pods_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let shared_store = store(&dir).await;
    // Two pods over one Redis and one store.
    let redis = Flaky::new();
    let a = ResilientCache::wrap(redis.clone(), shared_store.clone(), OPTS);
    let b = ResilientCache::wrap(redis.clone(), shared_store.clone(), OPTS);
    let ttl = Duration::from_secs(30);

    // A lock in Redis whose Redis goes away is lost, not kept beside a new one.
    let in_redis = a.lock_try("pop3:1", ttl).await.unwrap().expect("free");
    redis.gate.set(Mode::Refuse);
    assert!(!a.lock_refresh(&in_redis, ttl).await.unwrap(), "cannot be kept while Redis is away");

    // While Redis is away the store holds the locks, for every pod alike.
    let held = a.lock_try("pop3:2", ttl).await.unwrap().expect("taken in the store");
    assert!(b.lock_try("pop3:2", ttl).await.unwrap().is_none(), "the other pod sees it held");
    assert!(a.lock_refresh(&held, ttl).await.unwrap());
    // Redis comes back: the store-held lock is still renewed and released there.
    redis.gate.set(Mode::Up);
    eventually("a's breaker closes", || a.health().is_ok()).await;
    assert!(a.lock_refresh(&held, ttl).await.unwrap());
    a.lock_release(&held).await.unwrap();
    assert_eq!(shared_store.lease_count("lock:pop3:2").await.unwrap(), 0);

    // A store lock of a crashed holder lapses with its TTL.
    redis.gate.set(Mode::Refuse);
    let short = Duration::from_millis(300);
    assert!(a.lock_try("pop3:3", short).await.unwrap().is_some());
    assert!(b.lock_try("pop3:3", short).await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(b.lock_try("pop3:3", short).await.unwrap().is_some(), "lapsed");
}

#[tokio::test]
async fn connection_leases_keep_their_limit_across_pods_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let shared_store = store(&dir).await;
    let redis = Flaky::new();
    redis.gate.set(Mode::Refuse);
    let a = ResilientCache::wrap(redis.clone(), shared_store.clone(), OPTS);
    let b = ResilientCache::wrap(redis.clone(), shared_store.clone(), OPTS);
    let ttl = Duration::from_secs(30);
    assert!(a.lease_acquire("imap:7", "a:1", 2, ttl).await.unwrap());
    assert!(b.lease_acquire("imap:7", "b:1", 2, ttl).await.unwrap());
    assert!(!a.lease_acquire("imap:7", "a:2", 2, ttl).await.unwrap(), "the limit counts both pods");
    assert_eq!(b.lease_count("imap:7").await.unwrap(), 2);
    // Renewal of a held lease, and release, reach the store.
    a.lease_renew(&[("imap:7".into(), "a:1".into())], ttl).await.unwrap();
    b.lease_release("imap:7", "b:1").await.unwrap();
    assert!(a.lease_acquire("imap:7", "a:2", 2, ttl).await.unwrap());
}
