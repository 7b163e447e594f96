//! A pod killed (SIGKILL) while it holds a queue claim in the middle of a delivery:
//! another pod over the same PostgreSQL takes the message over when the lease runs
//! out and delivers it. Delivery is at least once: the remote saw the first copy's
//! content, but never acknowledged it, so the only complete transaction is the
//! second pod's.

mod common;

use std::time::{Duration, Instant};

use common::TestDatabase;
use common::cluster::{ServeProcess, ephemeral_ports};
use mailcluster_testkit::dns::TestDns;
use mailcluster_testkit::smtp::ScriptedRemote;

fn wait(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn claim_of_a_killed_pod_is_taken_over_after_its_lease() {
    const LEASE_SECS: u64 = 3;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let remote = rt.block_on(ScriptedRemote::start("250 2.1.5 ok"));
    remote.set_hold(true);
    let dns = rt.block_on(TestDns::start(&[(
        "remote.test.",
        "@ 60 IN MX 10 mx.remote.test.\nmx 60 IN A 127.0.0.1\n",
    )]));
    let db = TestDatabase::create_blocking("mc_relay");
    let dir = tempfile::tempdir().unwrap();
    let (port, dns_addr, lease) =
        (remote.addr.port().to_string(), format!("[\"{}\"]", dns.addr()), LEASE_SECS.to_string());
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_DATABASE_URL", db.url.as_str()),
        ("MAILCLUSTER_PROTOCOLS", "smtp"),
        ("MAILCLUSTER_RELAY__REMOTE_PORT", port.as_str()),
        ("MAILCLUSTER_RELAY__LEASE_SECS", lease.as_str()),
        ("MAILCLUSTER_RELAY__POLL_INTERVAL_MS", "200"),
        ("MAILCLUSTER_DNS__NAMESERVERS", dns_addr.as_str()),
        ("MAILCLUSTER_RELAY__ALLOWED_PRIVATE_NETWORKS", "[\"127.0.0.0/8\"]"),
    ]);
    common::run(dir.path(), &["migrate"], &env).ok();

    // One message in the queue, for a remote domain.
    let url = db.url.clone();
    rt.block_on(async move {
        let store =
            mailcluster_server::store::open(Some(&url), std::path::Path::new("."), 2, Duration::from_secs(5))
                .await
                .unwrap();
        let now = chrono::Utc::now();
        store
            .queue_enqueue(&mailcluster_model::NewQueueItem {
                sender: String::new(),
                recipients: vec!["x@remote.test".into()],
                raw: bytes::Bytes::from_static(b"Subject: takeover\r\n\r\nbody\r\n"),
                account_id: None,
                not_before: now,
                expires_at: now + chrono::Duration::days(1),
                dsn: Default::default(),
            })
            .await
            .unwrap();
    });

    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = ServeProcess::start(dir_a.path(), &env, 1);
    wait("pod A to send the content", Duration::from_secs(20), || remote.received().len() == 1);
    a.kill9();
    let killed = Instant::now();
    remote.set_hold(false);

    let _b = ServeProcess::start(dir_b.path(), &env, 1);
    wait("pod B to deliver", Duration::from_secs(30), || remote.received().iter().any(|r| r.acknowledged));
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_secs(LEASE_SECS - 1), "taken over only after the lease: {waited:?}");
    // Pod B's queue row is gone: nothing is sent a third time.
    let cfg = dir.path();
    wait("the queue to empty", Duration::from_secs(10), || {
        common::run(cfg, &["queue", "list"], &env).stdout.contains("queue is empty")
    });
    let got = remote.received();
    assert_eq!(got.len(), 2, "A's unacknowledged copy and B's: {got:?}");
    assert_eq!(got.iter().filter(|r| r.acknowledged).count(), 1, "one complete delivery");
}
