//! `imap.max_connections_per_user` holds across pods: two `App`s (two pods) with
//! their own Redis connections under one key prefix enforce one limit together,
//! as do two `App`s sharing the in-process cache; a crashed pod's sessions stop
//! counting once their leases lapse, and a live pod's leases are renewed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gated::{Gate, Gated};
use common::{Client, account, app_configured, connect, login, sqlite_store};
use mailcluster_server::app::App;
use mailcluster_server::cache::{self, Cache};
use mailcluster_server::imap::limit::lease_key;
use mailcluster_server::store::Store;

const USER: &str = "bob@example.org";

fn pod(store: &Arc<dyn Store>, cache: Arc<dyn Cache>, limit: usize, lease_secs: u64) -> App {
    app_configured(store.clone(), cache, |c| {
        c.tls.allow_plaintext_auth = true;
        c.imap.max_connections_per_user = limit;
        c.imap.connection_lease_secs = lease_secs;
    })
}

/// A client, its session's shutdown trigger (the session ends when it is dropped)
/// and the tagged answer to LOGIN.
type Attempt = (Client<tokio::io::DuplexStream>, tokio::sync::watch::Sender<bool>, String);

async fn try_login(app: &App) -> Attempt {
    let (mut c, tx) = connect(app);
    c.line().await;
    let r = c.cmd("L", &format!("LOGIN {USER} pw")).await;
    let tagged = r.last().expect("tagged").clone();
    (c, tx, tagged)
}

async fn refused(app: &App) {
    let (_c, _tx, tagged) = try_login(app).await;
    assert_eq!(tagged, "L NO [LIMIT] Too many connections for this account");
}

/// Waits until the account's lease count is `n` (releases after a dropped
/// connection run when the session notices the EOF).
async fn wait_count(cache: &Arc<dyn Cache>, account_id: i64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = cache.lease_count(&lease_key(account_id)).await.expect("lease count");
        if got == n {
            return;
        }
        assert!(Instant::now() < deadline, "lease count stayed {got}, expected {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes the test's keys from the shared Redis.
struct RedisCleanup {
    url: String,
    prefix: String,
}

impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let Ok(client) = ::redis::Client::open(self.url.as_str()) else { return };
        let Ok(mut conn) = client.get_connection() else { return };
        let keys: Vec<String> =
            ::redis::cmd("KEYS").arg(format!("{}*", self.prefix)).query(&mut conn).unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = ::redis::cmd("DEL").arg(&keys).query(&mut conn);
        }
    }
}

/// Two pods, each with its own Redis connections under one prefix.
async fn redis_pods() -> (Arc<dyn Cache>, Arc<dyn Cache>, RedisCleanup) {
    let url = mailcluster_testkit::redis_url();
    let mut id = [0u8; 8];
    rand::fill(&mut id);
    let prefix = format!("mctest:imaplimit:{}:", id.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let open = || async {
        cache::open(Some(&url), &prefix, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("Redis must be reachable for this test (REDIS_URL): {e}"))
    };
    let (a, b) = (open().await, open().await);
    (a, b, RedisCleanup { url, prefix })
}

/// The same scenario on any pair of pods sharing a cache.
async fn limit_holds_across(a: App, b: App) {
    let bob = account(&a, USER, "pw").await;
    let (_a1, _ta1) = login(&a, USER, "pw").await;
    let (mut b1, _tb1) = login(&b, USER, "pw").await;
    refused(&a).await;
    refused(&b).await;
    wait_count(&a.cache, bob.id, 2).await;

    // LOGOUT frees the slot before it completes: the next login anywhere succeeds.
    b1.cmd("o", "LOGOUT").await;
    let (a2, _ta2, tagged) = try_login(&a).await;
    assert!(tagged.starts_with("L OK"), "{tagged}");
    refused(&b).await;

    // A connection dropped without LOGOUT frees its slot too.
    drop(a2);
    wait_count(&b.cache, bob.id, 1).await;
    let (_b2, _tb2, tagged) = try_login(&b).await;
    assert!(tagged.starts_with("L OK"), "{tagged}");
    refused(&a).await;
}

#[tokio::test]
async fn two_pods_sharing_redis_enforce_one_limit() {
    let (ca, cb, _cleanup) = redis_pods().await;
    let (store, _dir) = sqlite_store().await;
    limit_holds_across(pod(&store, ca, 2, 300), pod(&store, cb, 2, 300)).await;
}

#[tokio::test]
async fn two_apps_sharing_the_in_process_cache_enforce_one_limit() {
    let local = cache::open(None, "x:", Duration::from_secs(1)).await.expect("local cache");
    let (store, _dir) = sqlite_store().await;
    limit_holds_across(pod(&store, local.clone(), 2, 300), pod(&store, local, 2, 300)).await;
}

#[tokio::test]
async fn a_crashed_pods_sessions_lapse_and_a_live_pods_are_renewed() {
    let (ca, cb, _cleanup) = redis_pods().await;
    let (store, _dir) = sqlite_store().await;
    // Leases of one second, renewed every third of it.
    let live = pod(&store, ca.clone(), 2, 1);
    let bob = account(&live, USER, "pw").await;
    let (_held, _th) = login(&live, USER, "pw").await;
    // A pod that died holding a session: its lease is never renewed nor released.
    assert!(cb.lease_acquire(&lease_key(bob.id), "dead-pod:0", 2, Duration::from_millis(800)).await.unwrap());
    refused(&live).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The dead pod's lease lapsed; the live session's was renewed and still counts.
    wait_count(&cb, bob.id, 1).await;
    let (_second, _ts, tagged) = try_login(&live).await;
    assert!(tagged.starts_with("L OK"), "{tagged}");
    refused(&live).await;
}

/// The lease operations failing, as when Redis is away, in front of the
/// in-process cache: everything else works, so logins themselves succeed.
struct LeasesDown;

#[async_trait::async_trait]
impl Gate for LeasesDown {
    async fn pass(&self, op: &'static str) -> cache::CacheResult<()> {
        if op.starts_with("lease_") {
            return Err(cache::CacheError::Unavailable("lease set unreachable (test)".into()));
        }
        Ok(())
    }
}

/// Without the shared lease set the limit is still held per pod: logins are let
/// through (a cache outage must not become a mail outage) up to the limit on
/// this pod, and slots are freed as sessions end.
#[tokio::test]
async fn without_the_lease_set_each_pod_still_holds_the_limit() {
    let local = cache::open(None, "x:", Duration::from_secs(1)).await.expect("local cache");
    let (store, _dir) = sqlite_store().await;
    let app = pod(&store, Arc::new(Gated { backend: "local", inner: local, gate: LeasesDown }), 2, 300);
    account(&app, USER, "pw").await;
    let (mut first, _t1) = login(&app, USER, "pw").await;
    let (_second, _t2) = login(&app, USER, "pw").await;
    refused(&app).await;
    first.cmd("o", "LOGOUT").await;
    let (_third, _t3, tagged) = try_login(&app).await;
    assert!(tagged.starts_with("L OK"), "{tagged}");
}
