//! Group commit across pods: `mailcluster serve` processes over one PostgreSQL
//! database, every one configured alike (`smtp.group_commit_leader` naming the
//! leader, `smtp.group_commit_port` open), as the operator configures a
//! Deployment's pods. The follower hands its deliveries to the leader, which
//! finds itself under the leader's name and commits its own; a pod without the
//! key commits its own; when the leader is killed mid-load no message that got
//! a 250 is lost or stored twice, while the follower goes on delivering; and a
//! leader that drains (SIGTERM) declines what it is sent, so that its follower
//! commits it and no delivery fails; and a leader the network cuts off (packets
//! dropped, no reset) is given up within seconds, failing only what was in
//! flight.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestDatabase;
use common::cluster::{ServeProcess, ephemeral_ports};
use common::redis::free_port;
use common::wire::{http_get, imap_transcript, smtp_try};
use common::{redis_url, run, run_with, unique};

/// `mail_group_commit_forwarded_total{committed=…}` of a pod.
fn forwarded(pod: &ServeProcess, committed: &str) -> u64 {
    let (status, body) = http_get(pod.admin, "/metrics");
    assert_eq!(status, 200, "metrics of the pod");
    let needle = format!("mail_group_commit_forwarded_total{{committed=\"{committed}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {needle} in\n{body}"))
}

/// Waits until `pod` has logged `needle` (pods connect to their leader in the
/// background from the start: what comes before must not race that).
fn wait_log(pod: &ServeProcess, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pod.log_contains(needle) {
        assert!(Instant::now() < deadline, "no {needle:?} in\n{}", pod.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Subject → how many messages in alice's INBOX have it.
fn inbox_subjects(imap: SocketAddr) -> BTreeMap<String, usize> {
    let lines = imap_transcript(
        imap,
        "alice@example.org",
        "alicepw",
        &["SELECT INBOX", "FETCH 1:* (BODY.PEEK[HEADER.FIELDS (SUBJECT)])"],
    )
    .expect("imap session");
    let mut subjects = BTreeMap::new();
    for line in lines {
        if let Some(subject) = line.strip_prefix("Subject: ") {
            *subjects.entry(subject.to_string()).or_default() += 1;
        }
    }
    subjects
}

/// One database with alice, and the environment every pod shares: the leader
/// named at a loopback port of its own.
struct Cluster {
    _db: TestDatabase,
    _dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    /// The group-commit port: only the pod started with it leads.
    port: String,
}

impl Cluster {
    fn new() -> Cluster {
        let db = TestDatabase::create_blocking("mc_group_commit");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port().to_string();
        let mut env: Vec<(String, String)> =
            ephemeral_ports().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        env.extend(
            [
                ("MAILCLUSTER_DATABASE_URL", db.url.clone()),
                ("MAILCLUSTER_REDIS_URL", redis_url()),
                ("MAILCLUSTER_REDIS__KEY_PREFIX", format!("{}:", unique("mcgc"))),
                ("MAILCLUSTER_PROTOCOLS", "smtp,imap".into()),
                ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true".into()),
                ("MAILCLUSTER_SMTP__GROUP_COMMIT_LEADER", format!("127.0.0.1:{port}")),
                // What the operator puts in every pod of a cluster from its Secret.
                ("MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET", unique("group-commit-key")),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
        let cluster = Cluster { _db: db, _dir: dir, env, port };
        let env = cluster.with(&[]);
        let dir = cluster._dir.path();
        run(dir, &["migrate"], &env).ok();
        run(dir, &["domain", "add", "example.org"], &env).ok();
        run_with(dir, &["user", "add", "alice@example.org"], &env, "alicepw\n", Duration::from_secs(120))
            .ok();
        cluster
    }

    fn with<'a>(&'a self, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain(more.iter().copied()).collect()
    }

    /// A pod with every pod's configuration, and `port` as its group-commit port.
    fn pod(&self, dir: &tempfile::TempDir, port: &str, more: &[(&str, &str)]) -> ServeProcess {
        let mut env = self.with(&[("MAILCLUSTER_SMTP__GROUP_COMMIT_PORT", port)]);
        env.extend_from_slice(more);
        ServeProcess::start(dir.path(), &env, 2)
    }
}

/// Senders delivering to `smtp` until stopped: what got a 250, what a 451.
struct Load {
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<usize>>>,
    failed: Arc<Mutex<Vec<usize>>>,
    senders: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(smtp: SocketAddr, senders: usize) -> Load {
        let (stop, next) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(100)));
        let (accepted, failed) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let senders = (0..senders)
            .map(|_| {
                let (accepted, stop, next, failed) =
                    (accepted.clone(), stop.clone(), next.clone(), failed.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        match smtp_try(smtp, "alice@example.org", n) {
                            Ok((verdict, _)) if verdict.starts_with("250") => {
                                accepted.lock().unwrap().push(n)
                            }
                            // A delivery sent to the leader and never answered: the
                            // client must retry (it may then be stored twice).
                            Ok((verdict, _)) if verdict.starts_with("451") => failed.lock().unwrap().push(n),
                            other => panic!("delivery {n}: {other:?}"),
                        }
                    }
                })
            })
            .collect();
        Load { stop, accepted, failed, senders }
    }

    /// Stops the senders: (accepted, failed with 451).
    fn stop(self) -> (Vec<usize>, Vec<usize>) {
        self.stop.store(true, Ordering::Relaxed);
        for s in self.senders {
            s.join().expect("sender");
        }
        (self.accepted.lock().unwrap().clone(), self.failed.lock().unwrap().clone())
    }
}

/// Every message that got a 250 is stored once; nothing is stored that no
/// sender tried, and nothing twice but what got a 451.
fn assert_exactly_once(imap: SocketAddr, accepted: &[usize], failed: &[usize]) {
    let subjects = inbox_subjects(imap);
    for n in accepted {
        assert_eq!(subjects.get(&format!("load {n}")), Some(&1), "message {n} got a 250: stored once");
    }
    for (subject, count) in &subjects {
        let n: usize = subject.strip_prefix("load ").and_then(|n| n.parse().ok()).expect("a load subject");
        if n >= 100 {
            assert!(accepted.contains(&n) || failed.contains(&n), "{subject} was never sent");
            assert!(*count == 1 || failed.contains(&n), "{subject} stored {count} times");
        }
    }
}

#[test]
fn followers_commit_through_the_leader_and_survive_its_death() {
    let cluster = Cluster::new();
    let (dir_a, dir_b, dir_c) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The same configuration for every pod; only the leader's address can bind the port.
    let mut a = cluster.pod(&dir_a, &cluster.port, &[]);
    let b = cluster.pod(&dir_b, "0", &[]);
    wait_log(&a, "this pod is the group-commit leader");
    wait_log(&b, "connected to the group-commit leader");

    // The follower's mail goes to the leader; the leader commits its own.
    for n in 0..10 {
        let (verdict, _) = smtp_try(b.addr("smtp"), "alice@example.org", n).expect("delivery via b");
        assert!(verdict.starts_with("250"), "{verdict}");
    }
    for n in 10..13 {
        let (verdict, _) = smtp_try(a.addr("smtp"), "alice@example.org", n).expect("delivery via a");
        assert!(verdict.starts_with("250"), "{verdict}");
    }
    assert_eq!(forwarded(&b, "leader"), 10, "b forwarded everything");
    assert_eq!(forwarded(&b, "here"), 0);
    assert_eq!(forwarded(&a, "leader"), 0, "a does not forward to itself");
    assert_eq!(forwarded(&a, "here"), 3);
    // Nothing shed: the leader was never a round of commits behind.
    let (_, metrics) = http_get(a.admin, "/metrics");
    assert!(metrics.lines().any(|l| l == "mail_group_commit_shed_total 0"), "{metrics}");
    let subjects = inbox_subjects(b.addr("imap"));
    assert_eq!(subjects.len(), 13, "{subjects:?}");
    assert!(subjects.values().all(|&n| n == 1), "{subjects:?}");

    // A pod with another key is refused and commits its own mail.
    let c = cluster.pod(&dir_c, "0", &[("MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET", "not the cluster's")]);
    wait_log(&c, "refused this pod's key");
    let (verdict, _) = smtp_try(c.addr("smtp"), "alice@example.org", 13).expect("delivery via c");
    assert!(verdict.starts_with("250"), "{verdict}");
    assert_eq!((forwarded(&c, "leader"), forwarded(&c, "here")), (0, 1));
    drop(c);

    // Four senders on the follower; the leader dies under them.
    let load = Load::start(b.addr("smtp"), 4);
    std::thread::sleep(Duration::from_millis(1500));
    let before = forwarded(&b, "leader");
    assert!(before > 10, "the follower forwarded under load");
    a.kill9();
    let killed = Instant::now();
    // Within the retry interval the follower commits its own mail.
    while forwarded(&b, "here") < 20 {
        assert!(killed.elapsed() < Duration::from_secs(20), "follower never committed on its own");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (accepted, failed) = load.stop();
    println!(
        "{} accepted, {} answered 451 when the leader died; {before} forwarded before",
        accepted.len(),
        failed.len()
    );
    assert_exactly_once(b.addr("imap"), &accepted, &failed);
}

/// A leader (with `leader_env`) and a follower under four senders, once the
/// follower has forwarded: (leader, follower, load, the follower's own commits
/// so far).
fn forwarding_under_load(
    cluster: &Cluster,
    (dir_a, dir_b): &(tempfile::TempDir, tempfile::TempDir),
    leader_env: &[(&str, &str)],
) -> (ServeProcess, ServeProcess, Load, u64) {
    let a = cluster.pod(dir_a, &cluster.port, leader_env);
    let b = cluster.pod(dir_b, "0", &[]);
    wait_log(&b, "connected to the group-commit leader");
    let load = Load::start(b.addr("smtp"), 4);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(forwarded(&b, "leader") > 0, "the follower forwarded");
    let here_before = forwarded(&b, "here");
    (a, b, load, here_before)
}

#[test]
fn a_draining_leader_declines_and_no_delivery_fails() {
    let (cluster, dirs) = (Cluster::new(), (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()));
    let (mut a, b, load, here_before) =
        forwarding_under_load(&cluster, &dirs, &[("MAILCLUSTER_SHUTDOWN_GRACE_SECS", "20")]);
    let term = std::process::Command::new("kill").args(["-TERM", &a.child.id().to_string()]).status();
    assert!(term.expect("kill").success());
    let termed = Instant::now();
    let status = loop {
        if let Some(status) = a.child.try_wait().expect("wait") {
            break status;
        }
        assert!(termed.elapsed() < Duration::from_secs(30), "the leader never stopped");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stopped_after = termed.elapsed();
    // Deliveries go on after the leader is gone.
    std::thread::sleep(Duration::from_millis(1500));
    let (accepted, failed) = load.stop();
    println!(
        "leader stopped {stopped_after:?} after SIGTERM; {} accepted, {} failed",
        accepted.len(),
        failed.len()
    );
    assert!(status.success(), "a drained leader exits cleanly: {status:?}\n{}", a.log_text());
    assert!(a.log_contains("drained; stopping"), "{}", a.log_text());
    assert!(failed.is_empty(), "no delivery failed while the leader drained: {failed:?}");
    assert!(forwarded(&b, "here") > here_before, "the follower committed what the leader declined");
    assert!(b.log_contains("the group-commit leader is draining"), "{}", b.log_text());
    assert_exactly_once(b.addr("imap"), &accepted, &failed);
}

/// Drops every packet sent to a port (iptables, root), as a network does when
/// the leader's node is gone: nothing answers, nothing resets. Lifted on drop.
struct Blackhole(String);

impl Blackhole {
    fn port(port: &str) -> Blackhole {
        let rule = |op: &str| {
            std::process::Command::new("iptables")
                .args([op, "INPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", port, "-j", "DROP"])
                .status()
        };
        let status = rule("-I").expect("iptables (this test needs root and iptables)");
        assert!(status.success(), "iptables refused the rule");
        Blackhole(port.to_string())
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        let _ = std::process::Command::new("iptables")
            .args(["-D", "INPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", &self.0, "-j", "DROP"])
            .status();
    }
}

#[test]
fn a_leader_cut_off_by_the_network_is_left_within_seconds() {
    let (cluster, dirs) = (Cluster::new(), (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()));
    let (_a, b, load, here_before) = forwarding_under_load(&cluster, &dirs, &[]);
    let cut = Blackhole::port(&cluster.port);
    let cut_at = Instant::now();
    // What was in flight waits for the kernel to give the connection up (no
    // reset comes); after that the follower commits its own, and reconnecting
    // (SYNs dropped too) holds up nobody.
    while forwarded(&b, "here") < here_before + 50 {
        assert!(cut_at.elapsed() < Duration::from_secs(20), "the follower never left its silent leader");
        std::thread::sleep(Duration::from_millis(100));
    }
    let left_after = cut_at.elapsed();
    let (accepted, failed) = load.stop();
    drop(cut);
    println!(
        "left the leader after {left_after:?}: {} accepted, {} answered 451",
        accepted.len(),
        failed.len()
    );
    // At most what the four senders had in flight when the network went, and
    // what they sent before the connection was given up, fails; not the rest.
    assert!(failed.len() <= 8, "{} deliveries failed", failed.len());
    assert_exactly_once(b.addr("imap"), &accepted, &failed);
}
