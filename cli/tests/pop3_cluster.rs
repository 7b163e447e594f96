//! POP3 across two `mailcluster serve` processes over one PostgreSQL database and
//! one Redis: the maildrop lock holds across pods ([IN-USE]), QUIT on one pod
//! frees it for the other at once, and a pod killed with SIGKILL while holding it
//! blocks the maildrop only until the lock's lifetime runs out — without applying
//! the dead session's deletions.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::TestDatabase;
use common::cluster::{ServeProcess, ephemeral_ports, smtp_deliver};
use common::{redis_url, run, run_with, unique};

/// Lifetime of the maildrop lock in this test (renewed every third of it).
const LOCK_TTL_SECS: u64 = 2;

struct Pop3 {
    reader: BufReader<TcpStream>,
}

impl Pop3 {
    fn connect(addr: SocketAddr) -> Pop3 {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect pop3");
        stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut c = Pop3 { reader: BufReader::new(stream) };
        let greeting = c.line();
        assert!(greeting.starts_with("+OK"), "{greeting}");
        c
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read");
        line.trim_end().to_string()
    }

    fn cmd(&mut self, command: &str) -> String {
        write!(self.reader.get_mut(), "{command}\r\n").expect("write");
        self.line()
    }

    fn login(&mut self) -> String {
        assert!(self.cmd("USER bob@example.org").starts_with("+OK"));
        self.cmd("PASS pop secret")
    }
}

#[test]
fn maildrop_lock_holds_across_processes_and_expires_after_a_crash() {
    let db = TestDatabase::create_blocking("mc_pop3");
    let prefix = format!("{}:", unique("mcpop3"));
    let redis = redis_url();
    let dir = tempfile::tempdir().unwrap();
    let ttl = LOCK_TTL_SECS.to_string();
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_DATABASE_URL", db.url.as_str()),
        ("MAILCLUSTER_REDIS_URL", redis.as_str()),
        ("MAILCLUSTER_REDIS__KEY_PREFIX", prefix.as_str()),
        ("MAILCLUSTER_PROTOCOLS", "smtp,pop3"),
        ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
        ("MAILCLUSTER_POP3__LOCK_TTL_SECS", ttl.as_str()),
    ]);
    run(dir.path(), &["migrate"], &env).ok();
    run(dir.path(), &["domain", "add", "example.org"], &env).ok();
    run_with(dir.path(), &["user", "add", "bob@example.org"], &env, "pop secret\n", Duration::from_secs(120))
        .ok();

    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = ServeProcess::start(dir_a.path(), &env, 2);
    let b = ServeProcess::start(dir_b.path(), &env, 2);
    for subject in ["one", "two", "three"] {
        smtp_deliver(a.addr("smtp"), "bob@example.org", subject);
    }

    // A holds the maildrop: B refuses with [IN-USE].
    let mut on_a = Pop3::connect(a.addr("pop3"));
    let r = on_a.login();
    assert!(r.starts_with("+OK") && r.contains("3 messages"), "{r}");
    let mut on_b = Pop3::connect(b.addr("pop3"));
    let r = on_b.login();
    assert!(r.starts_with("-ERR [IN-USE]"), "{r}");
    // The lock outlives its TTL while A's session is alive (it is renewed).
    std::thread::sleep(Duration::from_secs(LOCK_TTL_SECS + 1));
    assert!(on_b.login().starts_with("-ERR [IN-USE]"), "renewed lock still held");
    // QUIT on A applies the deletion and frees the maildrop for B at once.
    assert!(on_a.cmd("DELE 1").starts_with("+OK"));
    assert!(on_a.cmd("QUIT").starts_with("+OK"));
    let r = on_b.login();
    assert!(r.starts_with("+OK") && r.contains("2 messages"), "B sees A's deletion: {r}");
    assert!(on_b.cmd("QUIT").starts_with("+OK"));

    // A pod dies while holding the maildrop, with a deletion pending.
    let mut on_a = Pop3::connect(a.addr("pop3"));
    assert!(on_a.login().starts_with("+OK"));
    assert!(on_a.cmd("DELE 1").starts_with("+OK"));
    a.kill9();
    let killed = Instant::now();
    let mut on_b = Pop3::connect(b.addr("pop3"));
    let mut last = on_b.login();
    while !last.starts_with("+OK") {
        assert!(last.starts_with("-ERR [IN-USE]"), "{last}");
        assert!(killed.elapsed() < Duration::from_secs(LOCK_TTL_SECS + 10), "lock never expired");
        std::thread::sleep(Duration::from_millis(100));
        last = on_b.login();
    }
    let waited = killed.elapsed();
    println!("maildrop free {waited:?} after SIGKILL of its holder (lock TTL {LOCK_TTL_SECS} s)");
    assert!(last.contains("2 messages"), "the dead session deleted nothing: {last}");
    assert!(on_b.cmd("QUIT").starts_with("+OK"));
    drop(b);
}
