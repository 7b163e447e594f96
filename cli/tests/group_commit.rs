//! Group commit across pods: `mailcluster serve` processes over one PostgreSQL
//! database, every one configured alike (`smtp.group_commit_leader` naming the
//! leader, `smtp.group_commit_port` open), as the operator configures a
//! Deployment's pods. The follower hands its deliveries to the leader, which
//! finds itself under the leader's name and commits its own; a pod without the
//! key commits its own; and when the leader is killed mid-load no message that
//! got a 250 is lost or stored twice, while the follower goes on delivering.

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

#[test]
fn followers_commit_through_the_leader_and_survive_its_death() {
    let db = TestDatabase::create_blocking("mc_group_commit");
    let prefix = format!("{}:", unique("mcgc"));
    let redis = redis_url();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let leader = format!("127.0.0.1:{port}");
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_DATABASE_URL", db.url.as_str()),
        ("MAILCLUSTER_REDIS_URL", redis.as_str()),
        ("MAILCLUSTER_REDIS__KEY_PREFIX", prefix.as_str()),
        ("MAILCLUSTER_PROTOCOLS", "smtp,imap"),
        ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
        ("MAILCLUSTER_SMTP__GROUP_COMMIT_LEADER", leader.as_str()),
    ]);
    run(dir.path(), &["migrate"], &env).ok();
    run(dir.path(), &["domain", "add", "example.org"], &env).ok();
    run_with(dir.path(), &["user", "add", "alice@example.org"], &env, "alicepw\n", Duration::from_secs(120))
        .ok();

    // The same configuration for every pod; only the leader's address can bind the port.
    let with_port = |port: &'static str| {
        let mut env = env.clone();
        env.push(("MAILCLUSTER_SMTP__GROUP_COMMIT_PORT", port));
        env
    };
    let port: &'static str = Box::leak(port.into_boxed_str());
    let (dir_a, dir_b, dir_c) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = ServeProcess::start(dir_a.path(), &with_port(port), 2);
    let b = ServeProcess::start(dir_b.path(), &with_port("0"), 2);

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
    assert!(a.log_contains("this pod is the group-commit leader"), "{}", a.log_text());
    let subjects = inbox_subjects(b.addr("imap"));
    assert_eq!(subjects.len(), 13, "{subjects:?}");
    assert!(subjects.values().all(|&n| n == 1), "{subjects:?}");

    // A pod with another key is refused and commits its own mail.
    let mut wrong = with_port("0");
    wrong.push(("MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET", "not the cluster's"));
    let c = ServeProcess::start(dir_c.path(), &wrong, 2);
    let (verdict, _) = smtp_try(c.addr("smtp"), "alice@example.org", 13).expect("delivery via c");
    assert!(verdict.starts_with("250"), "{verdict}");
    assert_eq!((forwarded(&c, "leader"), forwarded(&c, "here")), (0, 1));
    assert!(c.log_contains("refused this pod's key"), "{}", c.log_text());
    drop(c);

    // Four senders on the follower; the leader dies under them.
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let (stop, next, failures) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(100)), Arc::new(Mutex::new(Vec::new())));
    let b_smtp = b.addr("smtp");
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (accepted, stop, next, failures) =
                (accepted.clone(), stop.clone(), next.clone(), failures.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    match smtp_try(b_smtp, "alice@example.org", n) {
                        Ok((verdict, _)) if verdict.starts_with("250") => accepted.lock().unwrap().push(n),
                        // A delivery sent to the leader and never answered: the
                        // client must retry (it may then be stored twice).
                        Ok((verdict, _)) if verdict.starts_with("451") => failures.lock().unwrap().push(n),
                        other => panic!("delivery {n}: {other:?}"),
                    }
                }
            })
        })
        .collect();
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
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.join().expect("sender");
    }

    let subjects = inbox_subjects(b.addr("imap"));
    let accepted = accepted.lock().unwrap().clone();
    let failed = failures.lock().unwrap().clone();
    println!(
        "{} accepted, {} answered 451 when the leader died; {} forwarded before the kill",
        accepted.len(),
        failed.len(),
        before
    );
    for n in &accepted {
        assert_eq!(subjects.get(&format!("load {n}")), Some(&1), "message {n} got a 250: stored once");
    }
    // Nothing is stored that no sender tried, and nothing twice but what got a 451.
    for (subject, count) in &subjects {
        let n: usize = subject.strip_prefix("load ").and_then(|n| n.parse().ok()).expect("a load subject");
        if n >= 100 {
            assert!(accepted.contains(&n) || failed.contains(&n), "{subject} was never sent");
            assert!(*count == 1 || failed.contains(&n), "{subject} stored {count} times");
        }
    }
}
