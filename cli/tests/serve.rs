//! `mailcluster serve` with the embedded default (SQLite in a temporary directory,
//! in-process cache, generated certificate) on free ports: it comes up, answers
//! health checks and a protocol greeting, and drains on SIGTERM with exit code 0.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::cluster::{ServeProcess, ephemeral_ports};

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect admin");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    let _ = s.read_to_string(&mut response);
    response
}

/// Every listener the default configuration starts, by name (sorted).
const EXPECTED: [&str; 8] =
    ["imap", "imaps", "managesieve", "pop3", "pop3s", "smtp", "submission", "submissions"];

#[test]
fn embedded_default_serves_health_and_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = ephemeral_ports();
    env.push(("MAILCLUSTER_SHUTDOWN_GRACE_SECS", "5"));
    let mut server = ServeProcess::start(dir.path(), &env, EXPECTED.len());
    let (admin, listeners) = (server.admin, server.listeners.clone());
    let names: Vec<&str> = listeners.keys().map(String::as_str).collect();
    assert_eq!(names, EXPECTED);

    assert!(http_get(admin, "/healthz").starts_with("HTTP/1.1 200"));
    let ready = http_get(admin, "/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = http_get(admin, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200") && metrics.contains("mail_db_pool_max"), "{metrics}");
    // /readyz above pinged the store, so at least one connection wait was observed.
    let acquired = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mail_db_pool_acquire_seconds_count "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(acquired > 0, "no database connection acquisitions observed:\n{metrics}");
    // The pod's metrics are registered at start, before any traffic: the HPA rules
    // and dashboards find them on a pod that has served nothing yet. (Labelled
    // families show once they have a series; SMTP's have one per listener.)
    for family in [
        "mail_db_pool_max",
        "mail_smtp_delivery_seconds",
        "mail_smtp_messages_total",
        "mail_group_commit_batch_size",
        "mail_imap_idle_sessions",
        "mail_imap_body_cache_bytes",
        "mail_imap_meta_cache_bytes",
        "mail_queue_depth",
        "mail_queue_oldest_age_seconds",
    ] {
        assert!(metrics.contains(&format!("# TYPE {family} ")), "{family} missing:\n{metrics}");
    }

    // The listeners really speak their protocols.
    for (name, expected) in [("smtp", "220 "), ("imap", "* OK "), ("pop3", "+OK ")] {
        let mut conn = TcpStream::connect(listeners[name]).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = String::new();
        BufReader::new(&mut conn).read_line(&mut greeting).unwrap();
        assert!(greeting.starts_with(expected), "{name}: {greeting}");
    }

    // The embedded store and generated certificate live in the data dir.
    assert!(dir.path().join("mailcluster-data").is_dir());

    let pid = server.child.id().to_string();
    let status = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() > deadline {
            server.kill9();
            panic!("server did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0), "log:\n{}", server.log_text());
    assert!(!server.log_contains("panicked"), "{}", server.log_text());
}

/// `worker_threads` (what the operator sets from a pod's CPU request) sizes the
/// runtime; unset, the runtime takes one thread per CPU this process may use,
/// which the test process shares (same affinity, same cgroup).
#[test]
fn the_runtime_has_the_threads_it_is_given() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (setting, expected) in [(None, cpus), (Some("3"), 3), (Some("1"), 1)] {
        let dir = tempfile::tempdir().unwrap();
        let mut env = ephemeral_ports();
        env.push(("MAILCLUSTER_PROTOCOLS", "smtp"));
        if let Some(n) = setting {
            env.push(("MAILCLUSTER_WORKER_THREADS", n));
        }
        let server = ServeProcess::start(dir.path(), &env, 1);
        let metrics = http_get(server.admin, "/metrics");
        let workers = metrics
            .lines()
            .find_map(|l| l.strip_prefix("mail_runtime_worker_threads "))
            .and_then(|v| v.trim().parse::<usize>().ok());
        assert_eq!(workers, Some(expected), "{setting:?}:\n{metrics}");
        // The pod still serves with a single thread.
        let mut conn = TcpStream::connect(server.addr("smtp")).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = String::new();
        BufReader::new(&mut conn).read_line(&mut greeting).unwrap();
        assert!(greeting.starts_with("220 "), "{setting:?}: {greeting}");
    }
}

/// The start says what the kernel gives the listeners: the backlog follows the
/// pod's `net.core.somaxconn` unless set, a larger setting is said to be capped,
/// and an open-files limit below what the connection limits need is a warning
/// with the figures, also on `/metrics`.
#[test]
fn the_start_states_the_backlog_and_open_files_the_kernel_gives() {
    let somaxconn: u64 =
        std::fs::read_to_string("/proc/sys/net/core/somaxconn").unwrap().trim().parse().unwrap();
    let gauge = |metrics: &str, name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    let too_long = (somaxconn * 2).to_string();
    for (backlog, max_connections) in [(None, None), (Some(too_long.as_str()), Some("100000000"))] {
        let dir = tempfile::tempdir().unwrap();
        let mut env = ephemeral_ports();
        env.push(("MAILCLUSTER_PROTOCOLS", "smtp"));
        if let Some(b) = backlog {
            env.push(("MAILCLUSTER_NET__BACKLOG", b));
        }
        if let Some(m) = max_connections {
            env.push(("MAILCLUSTER_NET__MAX_CONNECTIONS", m));
        }
        let server = ServeProcess::start(dir.path(), &env, 1);
        let metrics = http_get(server.admin, "/metrics");
        let (limit, needed) =
            (gauge(&metrics, "mail_open_files_limit"), gauge(&metrics, "mail_open_files_needed"));
        let log = server.log_text();
        match backlog {
            None => {
                assert!(log.contains(&format!("\"backlog\":{somaxconn}")), "{log}");
                assert!(!log.contains("net.backlog is above"), "{log}");
                // Whether this machine's limit covers the default caps is its own
                // business; the warning must say so exactly when it does not.
                assert_eq!(log.contains("RLIMIT_NOFILE is"), limit < needed, "{limit} {needed}:\n{log}");
            }
            Some(b) => {
                assert!(log.contains("net.backlog is above net.core.somaxconn"), "{log}");
                assert!(log.contains(&format!("\"somaxconn\":{somaxconn}")) && log.contains(b), "{log}");
                assert!(needed > 100_000_000.0 && limit < needed, "{limit} {needed}");
                assert!(log.contains("RLIMIT_NOFILE is"), "{log}");
            }
        }
    }
}
