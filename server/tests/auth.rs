//! `Authenticator`: passwords, the verified-credential cache, rate limits and
//! failure handling, over the in-process cache and (for the cross-pod cases) over
//! Redis (`REDIS_URL`, default redis://127.0.0.1:6379; fails when unreachable).
//!
//! The store is the real embedded one (`store::open(None, tempdir)`, SQLite);
//! `DownStore` and `down_cache` stand for an unreachable database and Redis.

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::cheap_hash;
use common::gated::{Gate, Gated};
use mailcluster_model::*;
use mailcluster_server::auth::{AuthConfig, AuthOutcome, Authenticator, hash_password};
use mailcluster_server::cache::{self, Cache, CacheError, CacheResult};
use mailcluster_server::store::*;

// ---------------------------------------------------------------- a failing store

/// A database that is not there: every call fails. Logins read the directory
/// only, so that is all it fakes.
struct DownStore;

fn down_store<T>() -> StoreResult<T> {
    Err(StoreError::Unavailable("database is down (test)".into()))
}

#[async_trait]
impl Directory for DownStore {
    async fn account_create(&self, _: &str, _: &str) -> StoreResult<Account> {
        down_store()
    }
    async fn accounts_import(&self, _: &[ImportedAccount]) -> StoreResult<ImportOutcome> {
        down_store()
    }
    async fn account_record_login(&self, _: i64, _: chrono::DateTime<chrono::Utc>) -> StoreResult<()> {
        down_store()
    }
    async fn account_last_login(&self, _: &str) -> StoreResult<Option<chrono::DateTime<chrono::Utc>>> {
        down_store()
    }
    async fn account_delete(&self, _: &str) -> StoreResult<()> {
        down_store()
    }
    async fn account_set_password(&self, _: &str, _: &str) -> StoreResult<()> {
        down_store()
    }
    async fn account_set_enabled(&self, _: &str, _: bool) -> StoreResult<()> {
        down_store()
    }
    async fn account_set_display_name(&self, _: &str, _: Option<&str>) -> StoreResult<()> {
        down_store()
    }
    async fn account_set_quota(&self, _: &str, _: Option<u64>) -> StoreResult<()> {
        down_store()
    }
    async fn quota(&self, _: i64) -> StoreResult<Quota> {
        down_store()
    }
    async fn account_get(&self, _: &str) -> StoreResult<Option<Account>> {
        down_store()
    }
    async fn account_list(&self, _: Option<&str>) -> StoreResult<Vec<Account>> {
        down_store()
    }
}

#[async_trait]
impl Domains for DownStore {
    async fn domain_add(&self, _: &str) -> StoreResult<()> {
        down_store()
    }
    async fn domain_del(&self, _: &str) -> StoreResult<()> {
        down_store()
    }
    async fn domain_list(&self) -> StoreResult<Vec<String>> {
        down_store()
    }
    async fn domain_exists(&self, _: &str) -> StoreResult<bool> {
        down_store()
    }
    async fn domain_set_catch_all(&self, _: &str, _: Option<&str>) -> StoreResult<()> {
        down_store()
    }
    async fn domain_catch_all(&self, _: &str) -> StoreResult<Option<String>> {
        down_store()
    }
    async fn domain_key_set(&self, _: &str, _: Option<&DomainKey>) -> StoreResult<()> {
        down_store()
    }
    async fn domain_keys(&self) -> StoreResult<Vec<DomainKey>> {
        down_store()
    }
    async fn domain_set_quota(&self, _: &str, _: Option<u64>) -> StoreResult<()> {
        down_store()
    }
    async fn domain_quota(&self, _: &str) -> StoreResult<Option<u64>> {
        down_store()
    }
}

// ---------------------------------------------------------------- a failing cache

/// A cache whose backend is gone: every call fails (the cache behind is never
/// reached).
struct Down;

#[async_trait]
impl Gate for Down {
    async fn pass(&self, _: &'static str) -> CacheResult<()> {
        Err(CacheError::Unavailable("cache is down (test)".into()))
    }
}

fn down_cache() -> Arc<dyn Cache> {
    Arc::new(Gated { backend: "down", inner: local_cache(), gate: Down })
}

// ---------------------------------------------------------------- fixtures

const ALICE_PW: &str = "correct horse battery staple";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The embedded store in a temporary directory (removed when dropped), holding
/// example.com and alice@example.com.
struct Fixture {
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

async fn store_with_alice() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = mailcluster_server::store::open(None, dir.path(), 4, Duration::from_secs(5))
        .await
        .expect("embedded store");
    store.migrate().await.expect("migrations");
    store.domain_add("example.com").await.unwrap();
    store.account_create("alice@example.com", &cheap_hash(ALICE_PW)).await.unwrap();
    Fixture { store, _dir: dir }
}

fn local_cache() -> Arc<dyn Cache> {
    Arc::new(cache::local::LocalCache::new())
}

/// Failures answered at once: the delay has tests of its own.
fn config() -> AuthConfig {
    AuthConfig { max_concurrent_hashes: 2, failure_delay_ms: 0, ..AuthConfig::default() }
}

fn random_prefix() -> String {
    let mut bytes = [0u8; 8];
    rand::fill(&mut bytes);
    format!("mcauth:{}:", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Deletes the Redis keys of a test, also when it panicked.
struct RedisCleanup {
    url: String,
    prefix: String,
}

impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else { return };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else { return };
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{}*", self.prefix)).query(&mut conn).unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query(&mut conn);
        }
    }
}

/// Two Redis-backed caches on one prefix: two pods.
async fn redis_pods() -> (Arc<dyn Cache>, Arc<dyn Cache>, RedisCleanup) {
    let url = mailcluster_testkit::redis_url();
    let prefix = random_prefix();
    let open = || async {
        cache::open(Some(&url), &prefix, Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("Redis must be reachable for this test (REDIS_URL): {e}"))
    };
    let (a, b) = (open().await, open().await);
    (a, b, RedisCleanup { url, prefix })
}

fn is_ok_for(outcome: &AuthOutcome, email: &str) -> bool {
    matches!(outcome, AuthOutcome::Ok(a) if a.email == email)
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn right_password_logs_in_with_full_address_any_case_or_bare_local_part() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let from = ip("192.0.2.1");
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    assert!(is_ok_for(&auth.verify("Alice@EXAMPLE.com", ALICE_PW, from).await, "alice@example.com"));
    assert!(is_ok_for(&auth.verify("alice", ALICE_PW, from).await, "alice@example.com"), "one domain");
}

/// A login is recorded in the store (what a MailAccount's status shows), once
/// per interval however often the client logs in; a failed one is not.
#[tokio::test]
async fn logins_are_recorded_once_per_interval_and_failures_not_at_all() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let from = ip("192.0.2.1");
    assert_eq!(auth.verify("alice@example.com", "wrong", from).await, AuthOutcome::Failed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(f.store.account_last_login("alice@example.com").await.unwrap(), None, "a failure is no login");
    let before = chrono::Utc::now();
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    let first = async {
        loop {
            if let Some(at) = f.store.account_last_login("alice@example.com").await.unwrap() {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let first = tokio::time::timeout(Duration::from_secs(5), first).await.expect("the login is recorded");
    assert!(first >= before - chrono::Duration::milliseconds(1), "{first} {before}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        f.store.account_last_login("alice@example.com").await.unwrap(),
        Some(first),
        "within {:?} of the last write the process writes nothing",
        mailcluster_server::auth::LOGIN_RECORD_INTERVAL
    );
}

#[tokio::test]
async fn bare_local_part_is_refused_when_several_domains_exist() {
    let f = store_with_alice().await;
    f.store.domain_add("example.org").await.unwrap();
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    assert_eq!(auth.verify("alice", ALICE_PW, ip("192.0.2.1")).await, AuthOutcome::Failed);
    assert!(is_ok_for(
        &auth.verify("alice@example.com", ALICE_PW, ip("192.0.2.1")).await,
        "alice@example.com"
    ));
}

#[tokio::test]
async fn wrong_password_and_unknown_user_both_fail_alike() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let from = ip("192.0.2.1");
    assert_eq!(auth.verify("alice@example.com", "wrong", from).await, AuthOutcome::Failed);
    assert_eq!(auth.verify("alice@example.com", "", from).await, AuthOutcome::Failed);
    assert_eq!(auth.verify("alice@example.com", &"x".repeat(5000), from).await, AuthOutcome::Failed);
    let runs = auth.argon2_runs();
    assert_eq!(auth.verify("nobody@example.com", ALICE_PW, from).await, AuthOutcome::Failed);
    // An unknown user costs an argon2 run too: no user enumeration by timing.
    assert_eq!(auth.argon2_runs(), runs + 1);
    assert_eq!(auth.verify("", ALICE_PW, from).await, AuthOutcome::Failed);
}

#[tokio::test]
async fn verified_credentials_are_served_from_the_cache_without_argon2() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let from = ip("192.0.2.1");
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    assert_eq!(auth.argon2_runs(), 1);
    for _ in 0..5 {
        assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    }
    // The bare local part normalises to the same credential.
    assert!(is_ok_for(&auth.verify("ALICE", ALICE_PW, from).await, "alice@example.com"));
    assert_eq!(auth.argon2_runs(), 1, "cache hits run no argon2");
    // A wrong password is never a hit.
    assert_eq!(auth.verify("alice@example.com", "nope", from).await, AuthOutcome::Failed);
    assert_eq!(auth.argon2_runs(), 2);
}

#[tokio::test]
async fn cached_credentials_expire() {
    let cfg = AuthConfig { credential_cache_secs: 1, ..config() };
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    let from = ip("192.0.2.1");
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    assert_eq!(auth.argon2_runs(), 1);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    assert_eq!(auth.argon2_runs(), 2, "expired entry means a fresh argon2 run");
}

#[tokio::test]
async fn a_credential_in_use_stays_cached() {
    let cfg = AuthConfig { credential_cache_secs: 1, ..config() };
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    let from = ip("192.0.2.1");
    // Logins every 0.6 s for 2.4 s: each restarts the entry's second.
    for _ in 0..5 {
        assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(auth.argon2_runs(), 1, "every login after the first was a hit");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    assert_eq!(auth.argon2_runs(), 2, "unused for longer than its lifetime: verified again");
}

#[tokio::test]
async fn a_password_changed_without_a_purge_ends_cached_logins() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let from = ip("192.0.2.1");
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    assert_eq!(auth.argon2_runs(), 1);
    // Changed in the store only, as when the purge could not reach the cache.
    f.store.account_set_password("alice@example.com", &hash_password("new secret").unwrap()).await.unwrap();
    assert_eq!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Failed, "old password");
    assert_eq!(auth.argon2_runs(), 2, "the old entry did not match: argon2 said no");
    assert!(is_ok_for(&auth.verify("alice@example.com", "new secret", from).await, "alice@example.com"));
}

#[tokio::test]
async fn failures_of_a_user_from_one_network_are_limited_there_and_not_elsewhere() {
    let cfg = AuthConfig { max_failures_per_user: 3, user_window_secs: 3, ..config() };
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    let guesser = ip("192.0.2.1");
    for _ in 1..=3 {
        assert_eq!(auth.verify("alice@example.com", "guess", guesser).await, AuthOutcome::Failed);
    }
    let runs = auth.argon2_runs();
    // Limited from there, even with the right password and under the bare local part.
    assert_eq!(auth.verify("alice@example.com", ALICE_PW, guesser).await, AuthOutcome::RateLimited);
    assert_eq!(auth.verify("alice", ALICE_PW, guesser).await, AuthOutcome::RateLimited);
    assert_eq!(auth.argon2_runs(), runs, "refused before any argon2 work");
    // The owner, from an address that has not failed, logs in: failing on
    // purpose locks nobody out.
    assert!(is_ok_for(
        &auth.verify("alice@example.com", ALICE_PW, ip("192.0.2.9")).await,
        "alice@example.com"
    ));
    // Failures spread over addresses are each address's own.
    for i in 10..=13 {
        assert_eq!(
            auth.verify("alice@example.com", "x", ip(&format!("192.0.2.{i}"))).await,
            AuthOutcome::Failed
        );
    }
    // Other users are not affected from the guessing address either.
    assert_eq!(auth.verify("bob@example.com", "x", guesser).await, AuthOutcome::Failed);
    // The window is fixed from the first failure, at most 3 s ago.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, guesser).await, AuthOutcome::Ok(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_guesses_are_counted_before_they_are_checked() {
    let cfg = AuthConfig { max_failures_per_user: 10, max_concurrent_hashes: 1, ..config() };
    let f = store_with_alice().await;
    let auth = Arc::new(Authenticator::new(f.store.clone(), local_cache(), cfg));
    let guesses = (0..60).map(|i| {
        let auth = auth.clone();
        tokio::spawn(
            async move { auth.verify("alice@example.com", &format!("guess {i}"), ip("192.0.2.1")).await },
        )
    });
    let outcomes: Vec<AuthOutcome> =
        futures::future::join_all(guesses).await.into_iter().map(Result::unwrap).collect();
    let failed = outcomes.iter().filter(|o| **o == AuthOutcome::Failed).count();
    let limited = outcomes.iter().filter(|o| **o == AuthOutcome::RateLimited).count();
    assert_eq!((failed, limited), (10, 50), "{outcomes:?}");
    assert_eq!(auth.argon2_runs(), 10, "only the attempts within the limit were checked");
}

/// A mail client (or an office behind one address) opens many connections at
/// once, each logging in with the right password: more at once than the limits,
/// cold (every one runs argon2). None is refused: attempts over a limit wait for
/// the client's attempts in flight, which give their reservations back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_right_passwords_at_once_from_one_address_all_log_in() {
    let cfg =
        AuthConfig { max_failures_per_user: 3, max_failures_per_ip: 5, max_concurrent_hashes: 1, ..config() };
    let f = store_with_alice().await;
    let auth = Arc::new(Authenticator::new(f.store.clone(), local_cache(), cfg));
    let logins = (0..40).map(|_| {
        let auth = auth.clone();
        tokio::spawn(async move { auth.verify("alice@example.com", ALICE_PW, ip("192.0.2.1")).await })
    });
    let outcomes: Vec<AuthOutcome> =
        futures::future::join_all(logins).await.into_iter().map(Result::unwrap).collect();
    assert!(outcomes.iter().all(|o| is_ok_for(o, "alice@example.com")), "{outcomes:?}");
    // And the limit still holds for guesses afterwards.
    for i in 0..3 {
        assert_eq!(
            auth.verify("alice@example.com", &format!("guess {i}"), ip("192.0.2.1")).await,
            AuthOutcome::Failed
        );
    }
    assert_eq!(auth.verify("alice@example.com", "guess 3", ip("192.0.2.1")).await, AuthOutcome::RateLimited);
}

#[tokio::test]
async fn a_client_that_logs_in_often_with_the_right_password_is_never_limited() {
    let cfg = AuthConfig { max_failures_per_user: 3, max_failures_per_ip: 3, ..config() };
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    let from = ip("192.0.2.1");
    assert_eq!(auth.verify("alice@example.com", "typo", from).await, AuthOutcome::Failed);
    for _ in 0..20 {
        assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_answered_after_a_delay_that_grows() {
    let cfg = AuthConfig { failure_delay_ms: 300, max_failure_delay_ms: 1_000, ..config() };
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    let registry = prometheus::Registry::new();
    auth.register_metrics(&registry).unwrap();
    let from = ip("192.0.2.1");
    let timed = |password: &'static str| {
        let auth = &auth;
        async move {
            let started = std::time::Instant::now();
            let outcome = auth.verify("alice@example.com", password, from).await;
            (outcome, started.elapsed())
        }
    };
    let (first, first_took) = timed("x").await;
    let (second, second_took) = timed("y").await;
    let (third, third_took) = timed("z").await;
    assert_eq!([first, second, third], [AuthOutcome::Failed, AuthOutcome::Failed, AuthOutcome::Failed]);
    assert!(first_took >= Duration::from_millis(300), "{first_took:?}");
    assert!(second_took >= Duration::from_millis(600), "doubled: {second_took:?}");
    assert!(third_took >= Duration::from_millis(1_000), "up to the ceiling: {third_took:?}");
    // A right password from an address that has not failed waits for nothing
    // (a generous bound: the point is it is not the penalty's second).
    let (ok, took) = {
        let started = std::time::Instant::now();
        (auth.verify("alice@example.com", ALICE_PW, ip("192.0.2.2")).await, started.elapsed())
    };
    assert!(matches!(ok, AuthOutcome::Ok(_)));
    assert!(took < Duration::from_millis(900), "{took:?}");
    // While a failure waits it holds no argon2 permit (there is one): a login
    // from elsewhere is checked meanwhile, and the wait shows in the gauge.
    let solo = Arc::new(Authenticator::new(
        f.store.clone(),
        local_cache(),
        AuthConfig {
            failure_delay_ms: 2_000,
            max_failure_delay_ms: 2_000,
            max_concurrent_hashes: 1,
            ..config()
        },
    ));
    let solo_metrics = prometheus::Registry::new();
    solo.register_metrics(&solo_metrics).unwrap();
    let wrong = tokio::spawn({
        let solo = solo.clone();
        async move { solo.verify("alice@example.com", "wrong", ip("192.0.2.3")).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let text = prometheus::TextEncoder::new().encode_to_string(&solo_metrics.gather()).unwrap();
    assert!(text.contains("mail_auth_delayed 1\n"), "{text}");
    let right = solo.verify("alice@example.com", ALICE_PW, ip("192.0.2.4")).await;
    assert!(matches!(right, AuthOutcome::Ok(_)));
    assert!(!wrong.is_finished(), "the right password was checked while the failure waited");
    assert_eq!(wrong.await.unwrap(), AuthOutcome::Failed);
    let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
    assert!(text.contains("mail_auth_delayed 0\n"), "{text}");
}

#[tokio::test]
async fn failures_per_client_network_are_limited_until_the_window_ends() {
    let cfg = AuthConfig { max_failures_per_ip: 3, ip_window_secs: 3, ..config() };
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    // One host spraying different user names over its IPv6 /64.
    for (i, user) in ["u1@example.com", "u2@example.com", "u3@example.com"].iter().enumerate() {
        let from = ip(&format!("2001:db8:0:1::{}", i + 1));
        assert_eq!(auth.verify(user, "x", from).await, AuthOutcome::Failed);
    }
    assert_eq!(
        auth.verify("alice@example.com", ALICE_PW, ip("2001:db8:0:1::99")).await,
        AuthOutcome::RateLimited
    );
    // Another network is fine.
    assert!(matches!(
        auth.verify("alice@example.com", ALICE_PW, ip("2001:db8:0:2::1")).await,
        AuthOutcome::Ok(_)
    ));
    tokio::time::sleep(Duration::from_millis(3100)).await;
    assert!(matches!(
        auth.verify("alice@example.com", ALICE_PW, ip("2001:db8:0:1::99")).await,
        AuthOutcome::Ok(_)
    ));
}

#[tokio::test]
async fn a_zero_limit_disables_that_limit() {
    let cfg = AuthConfig { max_failures_per_user: 0, max_failures_per_ip: 2, ip_window_secs: 60, ..config() };
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    // Many failures for one user from many networks: never limited per user.
    for i in 1..=4 {
        let from = ip(&format!("198.51.100.{i}"));
        assert_eq!(auth.verify("alice@example.com", "x", from).await, AuthOutcome::Failed);
    }
    assert!(matches!(
        auth.verify("alice@example.com", ALICE_PW, ip("198.51.100.9")).await,
        AuthOutcome::Ok(_)
    ));
    // The per-network limit still applies to guesses (a credential verified
    // before is no guess: it passes, see below).
    assert_eq!(auth.verify("alice@example.com", "x", ip("198.51.100.1")).await, AuthOutcome::Failed);
    assert_eq!(auth.verify("alice@example.com", "y", ip("198.51.100.1")).await, AuthOutcome::RateLimited);
}

#[tokio::test]
async fn password_change_purges_cached_credentials() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let from = ip("192.0.2.1");
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    auth.set_password("Alice@example.com", "new secret").await.unwrap();
    assert_eq!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Failed, "old password");
    assert!(matches!(auth.verify("alice@example.com", "new secret", from).await, AuthOutcome::Ok(_)));
    assert!(auth.set_password("nobody@example.com", "x").await.is_err());
}

#[tokio::test]
async fn deleted_account_is_not_served_from_the_cache() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let from = ip("192.0.2.1");
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    // Deleted without purging the cache (say, by a tool that knows nothing of it).
    f.store.account_delete("alice@example.com").await.unwrap();
    assert_eq!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Failed);
    // Recreated with the same password: a new account id, so the old entry for
    // the old id does not match either; a fresh verification logs in.
    let again = f.store.account_create("alice@example.com", &hash_password(ALICE_PW).unwrap()).await.unwrap();
    let runs = auth.argon2_runs();
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    assert_eq!(auth.argon2_runs(), runs + 1);
    assert!(
        matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(a) if a.id == again.id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_change_on_one_pod_purges_the_cache_of_all_pods() {
    let (cache_a, cache_b, _cleanup) = redis_pods().await;
    let f = store_with_alice().await;
    let pod_a = Authenticator::new(f.store.clone(), cache_a, config());
    let pod_b = Authenticator::new(f.store.clone(), cache_b, config());
    let from = ip("192.0.2.1");
    assert!(matches!(pod_a.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    // Pod b finds the credential pod a cached: one secret shared by both pods.
    assert!(matches!(pod_b.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    assert_eq!(pod_b.argon2_runs(), 0, "pod b hit pod a's cache entry");
    pod_b.set_password("alice@example.com", "rotated").await.unwrap();
    assert_eq!(pod_a.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Failed);
    assert!(matches!(pod_a.verify("alice@example.com", "rotated", from).await, AuthOutcome::Ok(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_entry_written_into_redis_logs_nobody_in() {
    use hmac::{KeyInit, Mac};
    let (cache, _, _cleanup) = redis_pods().await;
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), cache.clone(), config());
    let from = ip("192.0.2.1");
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, from).await, "alice@example.com"));
    // Someone who can write Redis, and knows the stored hash (a leaked backup),
    // reads the shared secret there and writes the entry a login with a
    // password of their choosing would look up: keyed by that secret alone,
    // it would log them in.
    let alice = f.store.account_get("alice@example.com").await.unwrap().unwrap();
    let secret = cache.secret_get("credential-key", 32, Duration::from_secs(30 * 24 * 3600)).await.unwrap();
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&secret.current).unwrap();
    for part in
        [b"alice@example.com".as_slice(), b"\0", b"attacker's choice", b"\0", alice.password_hash.as_bytes()]
    {
        mac.update(part);
    }
    let forged: [u8; 32] = mac.finalize().into_bytes().into();
    cache.credential_put(&forged, alice.id, Duration::from_secs(300)).await.unwrap();
    assert_eq!(auth.verify("alice@example.com", "attacker's choice", from).await, AuthOutcome::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_are_shared_between_pods() {
    let (cache_a, cache_b, _cleanup) = redis_pods().await;
    let f = store_with_alice().await;
    let cfg = AuthConfig { max_failures_per_user: 2, ..config() };
    let pod_a = Authenticator::new(f.store.clone(), cache_a, cfg.clone());
    let pod_b = Authenticator::new(f.store.clone(), cache_b, cfg);
    let from = ip("192.0.2.1");
    assert_eq!(pod_a.verify("alice@example.com", "x", from).await, AuthOutcome::Failed);
    assert_eq!(pod_b.verify("alice@example.com", "y", from).await, AuthOutcome::Failed);
    assert_eq!(pod_a.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::RateLimited);
    assert!(matches!(pod_b.verify("alice@example.com", ALICE_PW, ip("192.0.2.2")).await, AuthOutcome::Ok(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_away_each_pod_allows_its_share_of_a_limit() {
    let f = store_with_alice().await;
    // Nothing listens there: the pod serves from its stand-ins, and the pod set
    // lives in the store, where two other pods have announced themselves.
    let opts =
        cache::resilient::ResilienceOptions { retry_after: Duration::from_secs(60), ..Default::default() };
    let away = cache::resilient::ResilientCache::start(
        "redis://127.0.0.1:1",
        "mcauth:",
        Duration::from_millis(200),
        f.store.clone(),
        opts,
    )
    .await
    .unwrap();
    let cache: Arc<dyn Cache> = away;
    assert!(!cache.counters_shared());
    for other in ["pod-b", "pod-c"] {
        assert!(cache.lease_acquire("auth:pods", other, u64::MAX, Duration::from_secs(60)).await.unwrap());
    }
    let cfg = AuthConfig { max_failures_per_user: 9, ..config() };
    let auth = Arc::new(Authenticator::new(f.store.clone(), cache, cfg));
    let counting = tokio::spawn(auth.count_pods("pod-a".into()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let from = ip("192.0.2.1");
    for _ in 0..3 {
        assert_eq!(auth.verify("alice@example.com", "x", from).await, AuthOutcome::Failed);
    }
    assert_eq!(
        auth.verify("alice@example.com", ALICE_PW, from).await,
        AuthOutcome::RateLimited,
        "9 among 3 pods: 3 on this one"
    );
    counting.abort();
}

#[tokio::test]
async fn store_or_cache_trouble_is_unavailable_never_success_or_failure() {
    let f = store_with_alice().await;
    let cache = local_cache();
    let cfg = AuthConfig { max_failures_per_user: 1, ..config() };
    let auth = Authenticator::new(f.store.clone(), cache.clone(), cfg.clone());
    let from = ip("192.0.2.1");
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));
    // The database goes away (same cache, so the credential is cached): the
    // account row cannot be read, so not even a cache hit logs in.
    let no_db = Authenticator::new(Arc::new(DownStore), cache.clone(), cfg.clone());
    assert_eq!(no_db.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Unavailable);
    assert_eq!(no_db.verify("alice@example.com", "wrong", from).await, AuthOutcome::Unavailable);
    assert_eq!(no_db.verify("alice", ALICE_PW, from).await, AuthOutcome::Unavailable, "domain list");
    // Those were not counted as failures (the limit is 1).
    assert!(matches!(auth.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Ok(_)));

    let no_cache = Authenticator::new(f.store.clone(), down_cache(), cfg);
    assert_eq!(no_cache.verify("alice@example.com", ALICE_PW, from).await, AuthOutcome::Unavailable);
    assert_eq!(no_cache.verify("alice@example.com", "wrong", from).await, AuthOutcome::Unavailable);
    assert_eq!(no_cache.argon2_runs(), 0, "no verification without rate limits");
}

#[tokio::test]
async fn outcomes_are_counted_in_the_metric() {
    let f = store_with_alice().await;
    let auth = Authenticator::new(f.store.clone(), local_cache(), config());
    let registry = prometheus::Registry::new();
    auth.register_metrics(&registry).unwrap();
    let from = ip("192.0.2.1");
    let _ = auth.verify("alice@example.com", ALICE_PW, from).await;
    let _ = auth.verify("alice@example.com", "bad", from).await;
    let _ = auth.verify("alice@example.com", "bad", from).await;
    let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
    assert!(text.contains("mail_auth_total{result=\"ok\"} 1\n"), "{text}");
    assert!(text.contains("mail_auth_total{result=\"failed\"} 2\n"), "{text}");
}

/// A burst of cold credentials (every user's first login after a rollout)
/// queues for the argon2 permits: every login succeeds, the queue is visible
/// while it lasts (`mail_auth_hash_waiting`), and each wait is recorded
/// (`mail_auth_hash_wait_seconds`) beside the argon2 runs it preceded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_cold_logins_queues_for_argon2_and_the_queue_shows() {
    let f = store_with_alice().await;
    const USERS: usize = 12;
    for i in 0..USERS {
        f.store
            .account_create(&format!("user{i}@example.com"), &cheap_hash(&format!("pw{i}")))
            .await
            .unwrap();
    }
    let auth = Arc::new(Authenticator::new(
        f.store.clone(),
        local_cache(),
        AuthConfig { max_concurrent_hashes: 1, ..config() },
    ));
    let registry = prometheus::Registry::new();
    auth.register_metrics(&registry).unwrap();
    let gauge = |registry: &prometheus::Registry, name: &str| -> f64 {
        let families = registry.gather();
        let family =
            families.iter().find(|m| m.name() == name).unwrap_or_else(|| panic!("{name} registered"));
        let metric = &family.get_metric()[0];
        match family.get_field_type() {
            prometheus::proto::MetricType::HISTOGRAM => metric.get_histogram().get_sample_count() as f64,
            _ => metric.get_gauge().value(),
        }
    };
    let logins = (0..USERS).map(|i| {
        let auth = auth.clone();
        tokio::spawn(async move {
            let email = format!("user{i}@example.com");
            let outcome = auth.verify(&email, &format!("pw{i}"), ip("192.0.2.7")).await;
            (email, outcome)
        })
    });
    let burst = tokio::spawn(futures::future::join_all(logins));
    let mut most_waiting = 0.0f64;
    while !burst.is_finished() {
        most_waiting = most_waiting.max(gauge(&registry, "mail_auth_hash_waiting"));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for joined in burst.await.unwrap() {
        let (email, outcome) = joined.unwrap();
        assert!(is_ok_for(&outcome, &email), "{email}: {outcome:?}");
    }
    assert_eq!(auth.argon2_runs(), USERS as u64, "each cold credential hashed once");
    assert_eq!(gauge(&registry, "mail_auth_hash_wait_seconds"), USERS as f64, "every wait recorded");
    assert_eq!(gauge(&registry, "mail_auth_hash_waiting"), 0.0, "the queue is empty after the burst");
    assert!(most_waiting >= 1.0, "the queue was seen while {USERS} logins shared one permit");
}

/// The failure limits slow guessers, not owners: from an address whose
/// failures hold its limit, a password verified before (the credential cache,
/// which no guess can hit) still logs in, at once; a guess, and a first login
/// not verified yet, are refused there until the window passes.
#[tokio::test]
async fn a_verified_credential_logs_in_from_an_address_at_its_failure_limit() {
    let cfg = AuthConfig { max_failures_per_user: 10, max_failures_per_ip: 3, ..config() };
    let f = store_with_alice().await;
    f.store.account_create("carol@example.com", &cheap_hash("carol pw")).await.unwrap();
    let auth = Authenticator::new(f.store.clone(), local_cache(), cfg);
    let nat = ip("192.0.2.1");
    assert!(is_ok_for(
        &auth.verify("alice@example.com", ALICE_PW, ip("198.51.100.7")).await,
        "alice@example.com"
    ));
    for i in 0..3 {
        assert_eq!(auth.verify("bob@example.com", &format!("guess {i}"), nat).await, AuthOutcome::Failed);
    }
    assert_eq!(auth.verify("bob@example.com", "guess 3", nat).await, AuthOutcome::RateLimited);
    let runs = auth.argon2_runs();
    let started = std::time::Instant::now();
    assert!(is_ok_for(&auth.verify("alice@example.com", ALICE_PW, nat).await, "alice@example.com"));
    assert!(started.elapsed() < Duration::from_secs(2), "no admission wait: {:?}", started.elapsed());
    assert_eq!(auth.argon2_runs(), runs, "answered from the credential cache");
    assert_eq!(auth.verify("alice@example.com", "a guess", nat).await, AuthOutcome::RateLimited);
    assert_eq!(auth.verify("carol@example.com", "carol pw", nat).await, AuthOutcome::RateLimited);
    assert_eq!(auth.argon2_runs(), runs, "nothing over the limit reached argon2");
}
