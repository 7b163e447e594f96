//! One behaviour, two backends: every test below runs against the in-process
//! `LocalCache` and against Redis (`REDIS_URL`, default redis://127.0.0.1:6379).
//!
//! Each test gets two cache handles, `a` and `b`, standing for two pods. For Redis
//! they are two separate `RedisCache` instances (own connections) on one random key
//! prefix, deleted when the test ends; for the local cache they are the same
//! in-process instance, which is what "another pod" means for it. Redis tests fail,
//! not skip, when Redis is unreachable.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use mailcluster_server::cache::{self, Cache, CacheError, LockToken, MailboxEvent};

struct Pods {
    a: Arc<dyn Cache>,
    b: Arc<dyn Cache>,
    _cleanup: Option<RedisCleanup>,
}

use mailcluster_testkit::redis_url;

fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    rand::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Deletes the test's keys, also when the test panicked (hence `Drop` and the
/// synchronous client).
struct RedisCleanup {
    url: String,
    prefix: String,
}

impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let Ok(client) = ::redis::Client::open(self.url.as_str()) else { return };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else { return };
        let keys: Vec<String> =
            ::redis::cmd("KEYS").arg(format!("{}*", self.prefix)).query(&mut conn).unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = ::redis::cmd("DEL").arg(&keys).query(&mut conn);
        }
    }
}

impl Pods {
    async fn local() -> Pods {
        let a = cache::open(None, "ignored:", Duration::from_secs(1)).await.expect("local cache");
        assert_eq!(a.backend(), "local");
        Pods { b: a.clone(), a, _cleanup: None }
    }

    async fn redis() -> Pods {
        let url = redis_url();
        let prefix = format!("mctest:{}:", random_hex());
        // As a serving pod connects: RESP3, with client-side copies of hot values.
        let keys = mailcluster_server::config::RedisConfig::default().client_cache_keys;
        let open = || async {
            let cache = cache::redis::RedisCache::connect(&url, &prefix, Duration::from_secs(5), keys)
                .await
                .unwrap_or_else(|e| panic!("Redis must be reachable for this test (REDIS_URL): {e}"));
            Arc::new(cache) as Arc<dyn Cache>
        };
        let (a, b) = (open().await, open().await);
        assert_eq!(a.backend(), "redis");
        Pods { a, b, _cleanup: Some(RedisCleanup { url, prefix }) }
    }
}

/// Instantiates each test once per backend: `local::name` and `redis::name`.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        conformance!(@on local, $($name),*);
        conformance!(@on redis, $($name),*);
    };
    // One module of tests, named after the `Pods` constructor they run on.
    (@on $backend:ident, $($name:ident),*) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let pods = super::Pods::$backend().await;
                    tokio::time::timeout(std::time::Duration::from_secs(30), super::$name(&pods))
                        .await
                        .expect("test timed out");
                }
            )*
        }
    };
}

conformance!(
    ping_and_pool_stats,
    credentials_put_get_expire,
    credentials_purge_one_account_only,
    credentials_touch_extends_live_entries_only,
    counters_count_in_fixed_windows,
    values_put_get_del_expire,
    hot_values_follow_every_pods_changes,
    publish_reaches_subscribers_of_that_account_only,
    bursts_reach_subscribers_with_each_mailboxs_last_change,
    subscriptions_survive_other_subscribers_leaving,
    lock_is_exclusive_across_pods,
    lock_expires_and_stale_holder_cannot_refresh_or_release,
    lock_refresh_extends,
    secret_created_once_for_racing_pods,
    secret_rotation_yields_one_generation,
    leases_are_bounded_across_pods,
    leases_lapse_unless_renewed,
);

const WAIT: Duration = Duration::from_secs(5);

async fn next_event(stream: &mut BoxStream<'static, MailboxEvent>) -> MailboxEvent {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("no event within 5 s")
        .expect("event stream ended unexpectedly")
}

async fn ping_and_pool_stats(p: &Pods) {
    p.a.ping().await.expect("ping");
    let stats = p.a.pool_stats();
    assert!(stats.in_use <= stats.max, "{stats:?}");
    match p.a.backend() {
        "local" => assert_eq!((stats.max, stats.idle, stats.in_use), (0, 0, 0)),
        _ => {
            assert!(stats.max > 0, "{stats:?}");
            assert_eq!(stats.idle + stats.in_use, stats.max, "{stats:?}");
        }
    }
}

async fn credentials_put_get_expire(p: &Pods) {
    let k1 = [1u8; 32];
    let k2 = [2u8; 32];
    let short = [3u8; 32];
    assert_eq!(p.a.credential_get(&k1).await.unwrap(), None);
    p.a.credential_put(&k1, 42, Duration::from_secs(60)).await.unwrap();
    p.a.credential_put(&short, 42, Duration::from_secs(1)).await.unwrap();
    assert_eq!(p.a.credential_get(&k1).await.unwrap(), Some(42));
    assert_eq!(p.b.credential_get(&k1).await.unwrap(), Some(42), "other pod sees it");
    assert_eq!(p.b.credential_get(&k2).await.unwrap(), None);
    assert_eq!(p.a.credential_get(&short).await.unwrap(), Some(42));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(p.a.credential_get(&short).await.unwrap(), None, "expired after its TTL");
    assert_eq!(p.a.credential_get(&k1).await.unwrap(), Some(42), "longer TTL still live");
}

async fn credentials_purge_one_account_only(p: &Pods) {
    let ttl = Duration::from_secs(60);
    p.a.credential_put(&[10u8; 32], 7, ttl).await.unwrap();
    p.b.credential_put(&[11u8; 32], 7, ttl).await.unwrap();
    p.a.credential_put(&[12u8; 32], 8, ttl).await.unwrap();
    p.b.credential_purge_account(7).await.unwrap();
    assert_eq!(p.a.credential_get(&[10u8; 32]).await.unwrap(), None);
    assert_eq!(p.a.credential_get(&[11u8; 32]).await.unwrap(), None);
    assert_eq!(p.a.credential_get(&[12u8; 32]).await.unwrap(), Some(8), "other account untouched");
    // Purging an account with nothing cached is fine, and new entries work after.
    p.a.credential_purge_account(7).await.unwrap();
    p.a.credential_put(&[10u8; 32], 7, ttl).await.unwrap();
    assert_eq!(p.b.credential_get(&[10u8; 32]).await.unwrap(), Some(7));
}

async fn credentials_touch_extends_live_entries_only(p: &Pods) {
    let (used, idle, purged, other) = ([20u8; 32], [21u8; 32], [22u8; 32], [23u8; 32]);
    let short = Duration::from_secs(1);
    for key in [&used, &idle, &purged, &other] {
        p.a.credential_put(key, 9, short).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Touched from the other pod, before the second ends: a minute from now.
    p.b.credential_touch(&used, 9, Duration::from_secs(60)).await.unwrap();
    // A touch naming another account extends nothing.
    p.b.credential_touch(&other, 10, Duration::from_secs(60)).await.unwrap();
    p.a.credential_purge_account(9).await.unwrap();
    p.b.credential_touch(&purged, 9, Duration::from_secs(60)).await.unwrap();
    assert_eq!(p.a.credential_get(&purged).await.unwrap(), None, "a touch never re-creates a purged entry");
    p.a.credential_put(&used, 9, short).await.unwrap();
    p.a.credential_put(&idle, 9, short).await.unwrap();
    p.a.credential_put(&other, 9, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    p.b.credential_touch(&used, 9, Duration::from_secs(60)).await.unwrap();
    p.b.credential_touch(&other, 10, Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(p.a.credential_get(&used).await.unwrap(), Some(9), "the touch restarted its time");
    assert_eq!(p.a.credential_get(&idle).await.unwrap(), None, "untouched: expired");
    assert_eq!(p.a.credential_get(&other).await.unwrap(), None, "touched as another account: expired");
    // The touched entry is still in the account's index: a purge removes it.
    p.b.credential_purge_account(9).await.unwrap();
    assert_eq!(p.a.credential_get(&used).await.unwrap(), None, "purged after the touch");
    // Touching an entry that expired does not bring it back.
    p.b.credential_touch(&idle, 9, Duration::from_secs(60)).await.unwrap();
    assert_eq!(p.a.credential_get(&idle).await.unwrap(), None);
}

async fn counters_count_in_fixed_windows(p: &Pods) {
    let window = Duration::from_secs(2);
    assert_eq!(p.a.counter_get("fail:u").await.unwrap(), 0);
    assert_eq!(p.a.counter_incr("fail:u", window).await.unwrap(), 1);
    assert_eq!(p.b.counter_incr("fail:u", window).await.unwrap(), 2, "shared between pods");
    assert_eq!(p.a.counter_incr("fail:other", window).await.unwrap(), 1, "keys are independent");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Still inside the window: a later increment does not extend it.
    assert_eq!(p.a.counter_incr("fail:u", window).await.unwrap(), 3);
    assert_eq!(p.b.counter_get("fail:u").await.unwrap(), 3);
    tokio::time::sleep(Duration::from_millis(1700)).await;
    // 2.1 s after the first increment: the window (fixed from the first increment)
    // is over although the last increment was only 1.7 s ago.
    assert_eq!(p.a.counter_get("fail:u").await.unwrap(), 0);
    assert_eq!(p.a.counter_incr("fail:u", window).await.unwrap(), 1, "a new window starts");
}

async fn values_put_get_del_expire(p: &Pods) {
    let ttl = Duration::from_secs(60);
    assert_eq!(p.a.value_get("rcpt:x").await.unwrap(), None);
    let binary = [0u8, 255, 10, 13, 0];
    p.a.value_put("rcpt:x", &binary, ttl).await.unwrap();
    assert_eq!(p.b.value_get("rcpt:x").await.unwrap().as_deref(), Some(&binary[..]));
    p.b.value_put("rcpt:x", b"new", ttl).await.unwrap();
    assert_eq!(p.a.value_get("rcpt:x").await.unwrap().as_deref(), Some(&b"new"[..]), "overwritten");
    p.a.value_put("rcpt:empty", b"", ttl).await.unwrap();
    assert_eq!(p.a.value_get("rcpt:empty").await.unwrap().as_deref(), Some(&b""[..]), "empty is a value");
    p.a.value_del("rcpt:x").await.unwrap();
    assert_eq!(p.b.value_get("rcpt:x").await.unwrap(), None);
    p.a.value_del("rcpt:never").await.unwrap();
    p.a.value_put("rcpt:short", b"1", Duration::from_secs(1)).await.unwrap();
    assert!(p.a.value_get("rcpt:short").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(p.a.value_get("rcpt:short").await.unwrap(), None, "expired");
    // Values, counters and locks live in separate namespaces.
    assert_eq!(p.a.counter_get("rcpt:empty").await.unwrap(), 0);
}

async fn hot_values_follow_every_pods_changes(p: &Pods) {
    let ttl = Duration::from_secs(60);
    let read = async || p.a.value_get_hot("rcpt:hot").await.unwrap();
    assert_eq!(read().await, None);
    p.b.value_put("rcpt:hot", b"1", ttl).await.unwrap();
    eventually(read, Some(b"1"), "after a put").await;
    assert_eq!(read().await.as_deref(), Some(&b"1"[..]), "read again");
    p.b.value_put("rcpt:hot", b"2", ttl).await.unwrap();
    eventually(read, Some(b"2"), "after an overwrite").await;
    p.b.value_del("rcpt:hot").await.unwrap();
    eventually(read, None, "after a delete").await;
    p.a.value_put("rcpt:hot", b"3", Duration::from_millis(600)).await.unwrap();
    assert_eq!(read().await.as_deref(), Some(&b"3"[..]));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(read().await, None, "expired");
}

async fn publish_reaches_subscribers_of_that_account_only(p: &Pods) {
    let ev = |account_id, mailbox_id, modseq| MailboxEvent { account_id, mailbox_id, modseq };
    // Pod b listens for account 1, pod a for account 2.
    let mut b1 = p.b.subscribe(1).await.unwrap();
    let mut a2 = p.a.subscribe(2).await.unwrap();
    p.a.publish(ev(2, 20, 5)).await.unwrap();
    p.a.publish(ev(1, 10, 6)).await.unwrap();
    p.a.publish(ev(1, 11, u64::MAX)).await.unwrap();
    assert_eq!(next_event(&mut b1).await, ev(1, 10, 6), "other pod receives, account 2 skipped");
    assert_eq!(next_event(&mut b1).await, ev(1, 11, u64::MAX));
    assert_eq!(next_event(&mut a2).await, ev(2, 20, 5));
    // Nothing else is pending for account 2: the next event it sees is the next one
    // published for it, not one of account 1's.
    p.b.publish(ev(2, 21, 7)).await.unwrap();
    assert_eq!(next_event(&mut a2).await, ev(2, 21, 7));
    // Events of an account nobody listens to go nowhere, without error.
    p.a.publish(ev(3, 30, 1)).await.unwrap();
}

async fn bursts_reach_subscribers_with_each_mailboxs_last_change(p: &Pods) {
    let ev = |mailbox_id, modseq| MailboxEvent { account_id: 7, mailbox_id, modseq };
    let mut events = p.b.subscribe(7).await.unwrap();
    // 20 rounds over 10 mailboxes as fast as they can be queued: a pod may send
    // them in fewer messages, but each mailbox's last change must arrive. The last
    // round goes in one call.
    for round in 0..19u64 {
        for m in 0..10 {
            p.a.publish(ev(70 + m, round * 10 + m as u64 + 1)).await.unwrap();
        }
    }
    let last: Vec<MailboxEvent> = (0..10).map(|m| ev(70 + m, 191 + m as u64)).collect();
    p.a.publish_all(&last).await.unwrap();
    let mut latest = std::collections::HashMap::new();
    let mut received = 0;
    while last.iter().any(|e| latest.get(&e.mailbox_id) != Some(&e.modseq)) {
        let event = next_event(&mut events).await;
        assert_eq!(event.account_id, 7);
        assert!((70..80).contains(&event.mailbox_id), "{event:?}");
        let seen = latest.entry(event.mailbox_id).or_insert(0);
        assert!(event.modseq > *seen, "a mailbox's events arrive in order: {event:?} after {seen}");
        *seen = event.modseq;
        received += 1;
    }
    assert!(received <= 200, "{received} events for 200 changes");
}

async fn subscriptions_survive_other_subscribers_leaving(p: &Pods) {
    let ev = |modseq| MailboxEvent { account_id: 5, mailbox_id: 50, modseq };
    let mut first = p.b.subscribe(5).await.unwrap();
    let second = p.b.subscribe(5).await.unwrap();
    drop(second);
    // Give the departed subscriber's clean-up time to run; it must not cut off the
    // remaining one.
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.a.publish(ev(1)).await.unwrap();
    assert_eq!(next_event(&mut first).await, ev(1));
    // Last one leaves and a new one arrives right away: the new one is served.
    drop(first);
    let mut again = p.b.subscribe(5).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.a.publish(ev(2)).await.unwrap();
    assert_eq!(next_event(&mut again).await, ev(2));
}

async fn lock_is_exclusive_across_pods(p: &Pods) {
    let ttl = Duration::from_secs(30);
    let held = p.a.lock_try("pop3:1", ttl).await.unwrap().expect("free lock is taken");
    assert_eq!(held.key, "pop3:1");
    assert!(p.b.lock_try("pop3:1", ttl).await.unwrap().is_none(), "other pod is refused");
    assert!(p.a.lock_try("pop3:1", ttl).await.unwrap().is_none(), "not re-entrant");
    assert!(p.b.lock_try("pop3:2", ttl).await.unwrap().is_some(), "other keys are free");
    // Releasing with a wrong token does nothing.
    let forged = LockToken { key: held.key.clone(), token: "not-the-token".into() };
    p.b.lock_release(&forged).await.unwrap();
    assert!(!p.b.lock_refresh(&forged, ttl).await.unwrap(), "wrong token cannot refresh");
    assert!(p.b.lock_try("pop3:1", ttl).await.unwrap().is_none(), "still held");
    // The right token releases it.
    p.a.lock_release(&held).await.unwrap();
    let taken = p.b.lock_try("pop3:1", ttl).await.unwrap().expect("free after release");
    assert_ne!(taken.token, held.token, "tokens are unique");
    // Concurrent takers: exactly one wins.
    let tries = futures::future::join_all(
        (0..10).map(|i| if i % 2 == 0 { p.a.lock_try("race", ttl) } else { p.b.lock_try("race", ttl) }),
    )
    .await;
    assert_eq!(tries.into_iter().filter(|t| matches!(t, Ok(Some(_)))).count(), 1);
}

async fn lock_expires_and_stale_holder_cannot_refresh_or_release(p: &Pods) {
    let stale = p.a.lock_try("dele", Duration::from_millis(300)).await.unwrap().expect("taken");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let fresh = p.b.lock_try("dele", Duration::from_secs(30)).await.unwrap().expect("expired lock is free");
    assert!(!p.a.lock_refresh(&stale, Duration::from_secs(30)).await.unwrap(), "lost lock cannot refresh");
    p.a.lock_release(&stale).await.unwrap();
    assert!(p.a.lock_try("dele", Duration::from_secs(30)).await.unwrap().is_none(), "new holder kept it");
    assert!(p.b.lock_refresh(&fresh, Duration::from_secs(30)).await.unwrap());
    // Expired and not retaken: refresh still reports the loss.
    let lapsed = p.a.lock_try("lapse", Duration::from_millis(200)).await.unwrap().expect("taken");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!p.a.lock_refresh(&lapsed, Duration::from_secs(30)).await.unwrap());
}

async fn lock_refresh_extends(p: &Pods) {
    let lock = p.a.lock_try("long", Duration::from_secs(2)).await.unwrap().expect("taken");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(p.a.lock_refresh(&lock, Duration::from_secs(30)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(p.b.lock_try("long", Duration::from_secs(1)).await.unwrap().is_none(), "refreshed lock held");
    p.a.lock_release(&lock).await.unwrap();
    assert!(p.b.lock_try("long", Duration::from_secs(1)).await.unwrap().is_some());
}

async fn leases_are_bounded_across_pods(p: &Pods) {
    let ttl = Duration::from_secs(30);
    assert!(p.a.lease_acquire("conn:1", "a1", 2, ttl).await.unwrap());
    assert!(p.b.lease_acquire("conn:1", "b1", 2, ttl).await.unwrap());
    assert!(!p.b.lease_acquire("conn:1", "b2", 2, ttl).await.unwrap(), "full for the other pod");
    assert!(!p.a.lease_acquire("conn:1", "a2", 2, ttl).await.unwrap(), "full for this pod");
    assert!(p.a.lease_acquire("conn:1", "a1", 2, ttl).await.unwrap(), "a held lease is renewed");
    assert!(p.a.lease_acquire("conn:2", "a2", 2, ttl).await.unwrap(), "other sets are separate");
    assert_eq!(p.b.lease_count("conn:1").await.unwrap(), 2);
    p.a.lease_release("conn:1", "a1").await.unwrap();
    p.a.lease_release("conn:1", "never-held").await.unwrap();
    assert_eq!(p.b.lease_count("conn:1").await.unwrap(), 1);
    assert!(p.b.lease_acquire("conn:1", "b2", 2, ttl).await.unwrap(), "free after release");
    // Racing takers on an empty set: exactly `limit` win.
    let tries = futures::future::join_all((0..10).map(|i| {
        let member = format!("m{i}");
        async move {
            let pod = if i % 2 == 0 { &p.a } else { &p.b };
            pod.lease_acquire("race", &member, 3, ttl).await
        }
    }))
    .await;
    assert_eq!(tries.into_iter().filter(|t| matches!(t, Ok(true))).count(), 3);
    assert_eq!(p.a.lease_count("nothing").await.unwrap(), 0);
}

async fn leases_lapse_unless_renewed(p: &Pods) {
    let short = Duration::from_millis(400);
    assert!(p.a.lease_acquire("lapse", "crashed", 1, short).await.unwrap());
    assert!(p.a.lease_acquire("kept", "alive", 1, short).await.unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    p.a.lease_renew(&[("kept".to_string(), "alive".to_string())], Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(p.b.lease_count("lapse").await.unwrap(), 0, "an unrenewed lease lapses");
    assert!(p.b.lease_acquire("lapse", "b", 1, short).await.unwrap(), "its place is free");
    assert_eq!(p.b.lease_count("kept").await.unwrap(), 1, "a renewed lease holds");
    assert!(!p.b.lease_acquire("kept", "b", 1, short).await.unwrap());
    // Renewing a lapsed lease takes it again, even over the limit: its holder lives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(p.a.lease_acquire("lapse", "other", 1, Duration::from_secs(30)).await.unwrap());
    p.a.lease_renew(&[("lapse".to_string(), "back".to_string())], Duration::from_secs(30)).await.unwrap();
    assert_eq!(p.a.lease_count("lapse").await.unwrap(), 2);
}

async fn secret_created_once_for_racing_pods(p: &Pods) {
    let every = Duration::from_secs(3600);
    let got = futures::future::join_all((0..16).map(|i| {
        let pod = if i % 2 == 0 { &p.a } else { &p.b };
        pod.secret_get("ticket-key", 48, every)
    }))
    .await;
    let first = got[0].as_ref().expect("secret").clone();
    assert_eq!(first.current.len(), 48);
    assert_eq!(first.generation, 1);
    assert_eq!(first.previous, None);
    for s in got {
        assert_eq!(s.expect("secret"), first, "every pod sees the same secret");
    }
    let other = p.a.secret_get("other-key", 32, every).await.unwrap();
    assert_ne!(other.current, first.current, "names are independent");
}

async fn secret_rotation_yields_one_generation(p: &Pods) {
    let every = Duration::from_millis(1500);
    let g1 = p.a.secret_get("rot", 32, every).await.unwrap();
    assert_eq!(p.b.secret_get("rot", 32, every).await.unwrap(), g1, "not due yet");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    // Due: pods racing to rotate produce exactly one new generation.
    let got = futures::future::join_all((0..16).map(|i| {
        let pod = if i % 2 == 0 { &p.a } else { &p.b };
        pod.secret_get("rot", 32, every)
    }))
    .await;
    let g2 = got[0].as_ref().expect("secret").clone();
    assert_eq!(g2.generation, g1.generation + 1);
    assert_eq!(g2.previous.as_deref(), Some(&g1.current[..]), "previous is the old current");
    assert_ne!(g2.current, g1.current);
    for s in got {
        assert_eq!(s.expect("secret"), g2);
    }
}

// ---- backend selection (not per-backend behaviour) ----

#[tokio::test]
async fn open_without_url_is_local() {
    let c = cache::open(None, "x:", Duration::from_secs(1)).await.expect("local");
    assert_eq!(c.backend(), "local");
}

#[tokio::test]
async fn open_rejects_unknown_scheme_without_echoing_the_url() {
    let err = match cache::open(Some("memcached://u:hunter2@h:1"), "x:", Duration::from_secs(1)).await {
        Ok(_) => panic!("memcached:// accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("memcached"), "{err}");
    assert!(!err.contains("hunter2"), "password leaked: {err}");
}

#[tokio::test]
async fn open_unreachable_redis_names_host_port_not_password() {
    // Port 1 on loopback: nothing listens there, the connect is refused at once.
    let url = "redis://user:hunter2@127.0.0.1:1/0";
    let started = std::time::Instant::now();
    let err = match cache::open(Some(url), "x:", Duration::from_secs(2)).await {
        Ok(_) => panic!("connected to 127.0.0.1:1"),
        Err(e) => e,
    };
    assert!(started.elapsed() < Duration::from_secs(1), "a refused connection is reported at once");
    assert!(matches!(err, CacheError::Unavailable(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("127.0.0.1:1"), "{msg}");
    assert!(msg.to_lowercase().contains("refused"), "the cause is named: {msg}");
    assert!(!msg.contains("hunter2"), "password leaked: {msg}");
}

#[tokio::test]
async fn open_silent_server_times_out_after_connect_timeout() {
    // Accepts connections and never answers, like a hung Redis or a black hole.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = std::time::Instant::now();
    let result = cache::open(Some(&format!("redis://{addr}")), "x:", Duration::from_millis(500)).await;
    let elapsed = started.elapsed();
    holder.abort();
    let err = result.err().expect("a silent server is not a cache");
    assert!(matches!(err, CacheError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    assert!(elapsed >= Duration::from_millis(450) && elapsed < Duration::from_secs(3), "took {elapsed:?}");
}

#[tokio::test]
async fn open_rediss_is_supported_and_unreachable_is_unavailable() {
    // TLS support is compiled in: the failure is the refused connection, not the
    // scheme.
    let err = match cache::open(Some("rediss://:hunter2@127.0.0.1:1"), "x:", Duration::from_secs(2)).await {
        Ok(_) => panic!("connected to 127.0.0.1:1"),
        Err(e) => e,
    };
    assert!(matches!(err, CacheError::Unavailable(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("127.0.0.1:1") && !msg.contains("hunter2"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pool_stats_count_requests_in_flight() {
    let pods = Pods::redis().await;
    let idle = pods.a.pool_stats();
    assert_eq!(idle.in_use, 0, "{idle:?}");
    // Many concurrent requests: all succeed and every slot is returned afterwards.
    let results =
        futures::future::join_all((0..200).map(|_| pods.a.counter_incr("load", Duration::from_secs(5))))
            .await;
    assert!(results.iter().all(|r| r.is_ok()));
    assert_eq!(pods.a.counter_get("load").await.unwrap(), 200);
    assert_eq!(pods.a.pool_stats().in_use, 0);
}

// ---- Redis outages, through a TCP proxy the test can cut ----

/// A TCP proxy in front of Redis: `cut` drops every open connection, `freeze`
/// stops forwarding while keeping the sockets open (a peer that vanished without
/// closing), `refuse` makes it accept and immediately close new ones (Redis
/// "down").
struct Proxy {
    addr: std::net::SocketAddr,
    cut: tokio::sync::broadcast::Sender<Signal>,
    refuse: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Copy, PartialEq)]
enum Signal {
    Cut,
    Freeze,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.cut.send(Signal::Cut);
        self.task.abort();
    }
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (cut, _) = tokio::sync::broadcast::channel(4);
        let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (cut_tx, refusing) = (cut.clone(), refuse.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if refusing.load(std::sync::atomic::Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let mut cut = cut_tx.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else { return };
                    let signal = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => return,
                        signal = cut.recv() => signal,
                    };
                    if signal == Ok(Signal::Freeze) {
                        // Hold both sockets open, forwarding nothing, until cut.
                        while !matches!(cut.recv().await, Ok(Signal::Cut) | Err(_)) {}
                    }
                });
            }
        });
        Proxy { addr, cut, refuse, task }
    }

    fn cut(&self) {
        let _ = self.cut.send(Signal::Cut);
    }

    fn freeze(&self) {
        let _ = self.cut.send(Signal::Freeze);
    }

    fn set_refusing(&self, refusing: bool) {
        self.refuse.store(refusing, std::sync::atomic::Ordering::SeqCst);
    }

    /// `url` with its host:port replaced by the proxy's.
    fn url_for(&self, url: &str) -> String {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let (auth, host_path) = rest.rsplit_once('@').map_or(("", rest), |(a, h)| (a, h));
        let path = host_path.find('/').map_or("", |i| &host_path[i..]);
        let auth = if auth.is_empty() { String::new() } else { format!("{auth}@") };
        format!("redis://{auth}{}{path}", self.addr)
    }
}

/// A proxy in front of `REDIS_URL`, that URL, and a fresh key prefix with its
/// cleanup.
async fn proxied_redis() -> (Proxy, String, String, RedisCleanup) {
    let url = redis_url();
    let target =
        ::redis::Client::open(url.as_str()).expect("REDIS_URL").get_connection_info().addr().to_string();
    let proxy = Proxy::start(target).await;
    let prefix = format!("mctest:{}:", random_hex());
    let cleanup = RedisCleanup { url: url.clone(), prefix: prefix.clone() };
    (proxy, url, prefix, cleanup)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_ends_streams_fails_fast_and_recovers() {
    let (proxy, url, prefix, _cleanup) = proxied_redis().await;
    let connect_timeout = Duration::from_secs(1);
    let flaky = cache::open(Some(&proxy.url_for(&url)), &prefix, connect_timeout)
        .await
        .unwrap_or_else(|e| panic!("Redis must be reachable for this test (REDIS_URL): {e}"));
    let direct = cache::open(Some(&url), &prefix, Duration::from_secs(5)).await.expect("direct Redis");
    let ev = |modseq| MailboxEvent { account_id: 9, mailbox_id: 90, modseq };

    let mut events = flaky.subscribe(9).await.unwrap();
    direct.publish(ev(1)).await.unwrap();
    assert_eq!(next_event(&mut events).await, ev(1));

    // Connection lost: the stream ends (its owner falls back to polling).
    proxy.set_refusing(true);
    proxy.cut();
    let end = tokio::time::timeout(WAIT, events.next()).await.expect("stream did not end after the cut");
    assert_eq!(end, None);

    // Redis away: requests fail promptly as Unavailable, they do not hang.
    let started = std::time::Instant::now();
    let err = flaky.counter_incr("c", Duration::from_secs(5)).await.expect_err("Redis is away");
    assert!(matches!(err, CacheError::Unavailable(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(6), "took {:?}", started.elapsed());
    assert!(matches!(flaky.subscribe(9).await, Err(CacheError::Unavailable(_))));
    assert_eq!(flaky.pool_stats().in_use, 0, "failed requests give their slot back");

    // Redis back: the same cache instance recovers for commands and pub/sub.
    proxy.set_refusing(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while flaky.ping().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "command connection did not recover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(flaky.counter_incr("c", Duration::from_secs(5)).await.unwrap(), 1);
    let mut events = flaky.subscribe(9).await.expect("subscribe after recovery");
    direct.publish(ev(2)).await.unwrap();
    assert_eq!(next_event(&mut events).await, ev(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_silent_pubsub_connection_is_detected_and_streams_end() {
    let (proxy, url, prefix, _cleanup) = proxied_redis().await;
    let flaky = cache::open(Some(&proxy.url_for(&url)), &prefix, Duration::from_secs(1))
        .await
        .unwrap_or_else(|e| panic!("Redis must be reachable for this test (REDIS_URL): {e}"));
    let mut events = flaky.subscribe(4).await.unwrap();
    // The peer goes silent without closing anything: only the keepalive ping
    // (every 15 s, 2 s to answer) can notice.
    proxy.freeze();
    let end = tokio::time::timeout(Duration::from_secs(25), events.next())
        .await
        .expect("silent pub/sub connection not detected within 25 s");
    assert_eq!(end, None);
}

/// Polls `read` until it gives `want`, for at most 2 s: how long a pod may go on
/// reading its copy after another pod changed the value (Redis' invalidation
/// travels as fast as any reply).
async fn eventually(read: impl AsyncFn() -> Option<Vec<u8>>, want: Option<&[u8]>, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let got = read().await;
        if got.as_deref() == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: still {got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hot_values_are_read_in_the_pod_until_redis_reports_a_change() {
    let (proxy, url, prefix, _cleanup) = proxied_redis().await;
    // Pod A keeps copies and reaches Redis through the proxy; pod B changes values.
    let a = cache::redis::RedisCache::connect(&proxy.url_for(&url), &prefix, Duration::from_secs(1), 100)
        .await
        .unwrap_or_else(|e| panic!("Redis must be reachable for this test (REDIS_URL): {e}"));
    let b = cache::open(Some(&url), &prefix, Duration::from_secs(5)).await.expect("direct Redis");
    let ttl = Duration::from_secs(60);
    let stats = || a.client_cache_stats().expect("copies are on");

    b.value_put("rcpt:k", b"v1", ttl).await.unwrap();
    assert_eq!(a.value_get_hot("rcpt:k").await.unwrap().as_deref(), Some(&b"v1"[..]));
    assert_eq!(stats().misses, 1, "the first read asks Redis");
    // While nothing reaches Redis any more, the copy still answers at once; a
    // plain read cannot.
    proxy.freeze();
    let started = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(a.value_get_hot("rcpt:k").await.unwrap().as_deref(), Some(&b"v1"[..]));
    }
    assert!(started.elapsed() < Duration::from_millis(500), "copies took {:?}", started.elapsed());
    assert_eq!(stats().hits, 3);
    assert!(a.value_get("rcpt:k").await.is_err(), "a plain read needs Redis");
    // Redis is reachable again through a fresh connection: the frozen one is
    // replaced, and with it every copy (invalidations may have been lost).
    proxy.cut();
    eventually(async || a.value_get_hot("rcpt:k").await.ok().flatten(), Some(b"v1"), "after the cut").await;

    // Another pod's change, deletion and a value's own expiry all reach the copy.
    assert_eq!(a.value_get_hot("rcpt:k").await.unwrap().as_deref(), Some(&b"v1"[..]));
    b.value_put("rcpt:k", b"v2", ttl).await.unwrap();
    eventually(async || a.value_get_hot("rcpt:k").await.unwrap(), Some(b"v2"), "after another pod's put")
        .await;
    assert!(stats().invalidations >= 1, "{:?}", stats());
    b.value_del("rcpt:k").await.unwrap();
    eventually(async || a.value_get_hot("rcpt:k").await.unwrap(), None, "after another pod's delete").await;
    b.value_put("rcpt:short", b"1", Duration::from_millis(600)).await.unwrap();
    assert!(a.value_get_hot("rcpt:short").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(a.value_get_hot("rcpt:short").await.unwrap(), None, "a copy outlives no expiry");

    // A copy, then the connection cut while another pod changes the value: the
    // change is never announced to A, so once A has seen its connection go it
    // must not answer from its copy (before, it may: as before an invalidation
    // arrives). While Redis is unreachable, A's reads fail.
    b.value_put("rcpt:cut", b"old", ttl).await.unwrap();
    assert_eq!(a.value_get_hot("rcpt:cut").await.unwrap().as_deref(), Some(&b"old"[..]));
    proxy.set_refusing(true);
    proxy.cut();
    b.value_put("rcpt:cut", b"new", ttl).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match a.value_get_hot("rcpt:cut").await {
            Ok(Some(v)) if v == b"old" => {
                assert!(std::time::Instant::now() < deadline, "a copy survived the lost connection");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(v) => panic!("Redis is unreachable, yet A read {v:?}"),
            Err(e) => {
                assert!(matches!(e, CacheError::Unavailable(_)), "{e:?}");
                break;
            }
        }
    }
    proxy.set_refusing(false);
    eventually(async || a.value_get_hot("rcpt:cut").await.ok().flatten(), Some(b"new"), "after reconnecting")
        .await;
}
