//! Several `mailcluster serve` processes over one store: a fresh PostgreSQL
//! database and a Redis key prefix of their own, as pods of one cluster share them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::command;

/// Runs a future to completion on a throwaway runtime (for synchronous tests).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(f)
}

/// Environment that puts every listener and the admin port on a free loopback port.
pub fn ephemeral_ports() -> Vec<(&'static str, &'static str)> {
    let mut env = vec![("MAILCLUSTER_LISTEN_ADDR", "127.0.0.1"), ("MAILCLUSTER_ADMIN_PORT", "0")];
    for var in [
        "MAILCLUSTER_SMTP_PORT",
        "MAILCLUSTER_SUBMISSION_PORT",
        "MAILCLUSTER_SUBMISSIONS_PORT",
        "MAILCLUSTER_IMAP_PORT",
        "MAILCLUSTER_IMAPS_PORT",
        "MAILCLUSTER_POP3_PORT",
        "MAILCLUSTER_POP3S_PORT",
        "MAILCLUSTER_MANAGESIEVE_PORT",
    ] {
        env.push((var, "0"));
    }
    env
}

/// The environment of the `serve` processes of one test cluster: listeners on
/// free loopback ports, its database, Redis under a key prefix of its own,
/// `protocols`, and logins without TLS (the tests' clients speak plain text).
pub fn cluster_env<'a>(
    database: &'a str,
    redis: &'a str,
    prefix: &'a str,
    protocols: &'a str,
) -> Vec<(&'a str, &'a str)> {
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_DATABASE_URL", database),
        ("MAILCLUSTER_REDIS_URL", redis),
        ("MAILCLUSTER_REDIS__KEY_PREFIX", prefix),
        ("MAILCLUSTER_PROTOCOLS", protocols),
        ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
    ]);
    env
}

/// Migrates the database, adds the domain example.org and `users`, each with
/// `password`.
pub fn add_users(dir: &Path, env: &[(&str, &str)], users: &[&str], password: &str) {
    super::run(dir, &["migrate"], env).ok();
    super::run(dir, &["domain", "add", "example.org"], env).ok();
    for user in users {
        let stdin = format!("{password}\n");
        super::run_with(dir, &["user", "add", user], env, &stdin, Duration::from_secs(120)).ok();
    }
}

/// A running `mailcluster serve` with JSON logs; killed when dropped (and checked
/// for panics in its log then).
pub struct ServeProcess {
    pub child: Child,
    pub admin: SocketAddr,
    /// Listener name → bound address, from the "listening" log events.
    pub listeners: BTreeMap<String, SocketAddr>,
    /// Every log line so far. The log is drained for the whole life of the
    /// process: a full pipe would block the server's logging and with it the server.
    log: Arc<Mutex<Vec<String>>>,
}

impl ServeProcess {
    /// Starts `serve` in `cwd` with `env` (plus JSON logs) and waits until the admin
    /// port and `expected` listeners are up.
    pub fn start(cwd: &Path, env: &[(&str, &str)], expected: usize) -> ServeProcess {
        let mut env = env.to_vec();
        env.push(("MAILCLUSTER_LOG_FORMAT", "json"));
        let mut child = command(cwd, &["serve"], &env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mailcluster serve");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, lines) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut admin = None;
        let mut listeners = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while admin.is_none() || listeners.len() < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = lines.recv_timeout(left) else {
                let _ = child.kill();
                panic!("server did not come up; log so far:\n{}", log.lock().unwrap().join("\n"));
            };
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
        ServeProcess { child, admin: admin.expect("admin address"), listeners, log }
    }

    pub fn addr(&self, listener: &str) -> SocketAddr {
        *self.listeners.get(listener).unwrap_or_else(|| panic!("no {listener} listener"))
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|l| l.contains(needle))
    }

    /// Waits until `/healthz` reports the shared cache up. A pod starts, and stays
    /// ready, while Redis is slow to answer; it connects (again) in the background
    /// every `retry_after`, so "up" is a state reached, not one held from the start.
    pub fn wait_for_cache_up(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let health = super::wire::http_get(self.admin, "/healthz").1;
            if health.contains("cache (redis): up") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cache is not up within {within:?}: {health}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
    }

    /// SIGKILL: the process gets no chance to clean up (a crashed pod).
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill9();
        if !std::thread::panicking() {
            assert!(!self.log_contains("panicked"), "server panicked:\n{}", self.log_text());
        }
    }
}

/// Delivers one message to `rcpt` over SMTP (port 25 semantics: no
/// authentication) and waits for its 250; returns when the end of DATA was sent,
/// the moment the delivery starts.
pub fn smtp_deliver(addr: SocketAddr, rcpt: &str, subject: &str) -> Instant {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect smtp");
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let expect = |r: &mut BufReader<TcpStream>, code: &str| loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("smtp reply");
        assert!(line.starts_with(code), "expected {code}, got {line:?}");
        if line.as_bytes().get(3) == Some(&b' ') {
            break;
        }
    };
    expect(&mut r, "220");
    for (cmd, code) in [
        ("EHLO client.test", "250"),
        ("MAIL FROM:<sender@remote.test>", "250"),
        (&format!("RCPT TO:<{rcpt}>"), "250"),
        ("DATA", "354"),
    ] {
        write!(w, "{cmd}\r\n").unwrap();
        expect(&mut r, code);
    }
    write!(w, "From: sender@remote.test\r\nTo: {rcpt}\r\nSubject: {subject}\r\n\r\nbody of {subject}\r\n")
        .unwrap();
    let sent = Instant::now();
    write!(w, ".\r\n").unwrap();
    expect(&mut r, "250");
    write!(w, "QUIT\r\n").unwrap();
    sent
}
