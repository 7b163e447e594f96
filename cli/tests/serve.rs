//! `mailcluster serve` with the embedded default (SQLite in a temporary directory,
//! in-process cache, generated certificate) on free ports: it comes up, answers
//! health checks and a protocol greeting, and drains on SIGTERM with exit code 0.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Sends each stderr line (JSON logs) of the server to the test.
fn log_lines(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect admin");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    let _ = s.read_to_string(&mut response);
    response
}

/// Every listener the default configuration starts, by name (sorted).
const EXPECTED: [&str; 7] = ["imap", "imaps", "pop3", "pop3s", "smtp", "submission", "submissions"];

#[test]
fn embedded_default_serves_health_and_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = vec![
        ("MAILCLUSTER_LISTEN_ADDR", "127.0.0.1"),
        ("MAILCLUSTER_LOG_FORMAT", "json"),
        ("MAILCLUSTER_SHUTDOWN_GRACE_SECS", "5"),
        ("MAILCLUSTER_ADMIN_PORT", "0"),
    ];
    for var in [
        "MAILCLUSTER_SMTP_PORT",
        "MAILCLUSTER_SUBMISSION_PORT",
        "MAILCLUSTER_SUBMISSIONS_PORT",
        "MAILCLUSTER_IMAP_PORT",
        "MAILCLUSTER_IMAPS_PORT",
        "MAILCLUSTER_POP3_PORT",
        "MAILCLUSTER_POP3S_PORT",
    ] {
        env.push((var, "0"));
    }
    let mut child = common::command(dir.path(), &["serve"], &env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let lines = log_lines(&mut child);

    // Collect "listening" events until the admin port and every protocol are up.
    let mut admin: Option<SocketAddr> = None;
    let mut listeners = std::collections::BTreeMap::new();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin.is_none() || listeners.len() < EXPECTED.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("server did not come up; log so far:\n{}", seen.join("\n"));
            }
        };
        seen.push(line.clone());
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        let addr = event.get("addr").and_then(|a| a.as_str()).and_then(|a| a.parse::<SocketAddr>().ok());
        match (event.get("message").and_then(|m| m.as_str()), addr) {
            (Some("admin listening"), Some(addr)) => admin = Some(addr),
            (Some("listening"), Some(addr)) => {
                let name = event.get("listener").and_then(|l| l.as_str()).unwrap_or("?").to_string();
                listeners.insert(name, addr);
            }
            _ => {}
        }
    }
    let admin = admin.expect("admin address");
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

    // The listeners really speak their protocols.
    let mut smtp = TcpStream::connect(listeners["smtp"]).expect("connect smtp");
    smtp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = String::new();
    BufReader::new(&mut smtp).read_line(&mut greeting).unwrap();
    assert!(greeting.starts_with("220 "), "{greeting}");
    drop(smtp);

    // The embedded store and generated certificate live in the data dir.
    assert!(dir.path().join("mailcluster-data").is_dir());

    let pid = child.id().to_string();
    let status = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("server did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest: Vec<String> = lines.try_iter().collect();
    seen.extend(rest);
    assert_eq!(code, Some(0), "log:\n{}", seen.join("\n"));
    assert!(!seen.iter().any(|l| l.contains("panicked")), "{}", seen.join("\n"));
}
