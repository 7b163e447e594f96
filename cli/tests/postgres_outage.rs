//! PostgreSQL stopped and started again under a running `mailcluster serve`: while
//! it is down, clients get temporary failures only (SMTP 4xx, IMAP `NO
//! [UNAVAILABLE]`), each within a bounded time, and readiness turns false; once it
//! is back the pod serves again within 5 s without a restart, readiness returns,
//! and everything acknowledged is stored.
//!
//! The PostgreSQL is one of this test's own (initdb in a temporary directory, a free
//! port), so the shared one the other tests use stays up.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{ServeProcess, block_on, ephemeral_ports};
use common::wire::{http_get, imap_exchange, smtp_try};
use common::{run, run_with};
use sqlx::Connection;

/// A PostgreSQL cluster of this test's own; stopped and removed on drop.
struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

impl Postgres {
    /// The server binaries of the newest PostgreSQL installed the Debian way.
    fn bin() -> Option<PathBuf> {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .collect();
        versions.sort();
        versions.pop()
    }

    /// Runs a PostgreSQL server tool as the `postgres` user when we are root (the
    /// server refuses to run as root), else as ourselves.
    fn tool(&self, name: &str) -> Command {
        let path = self.bin.join(name);
        if nix_is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn init() -> Postgres {
        let bin = Postgres::bin().expect("PostgreSQL server binaries (scripts/test.sh installs postgresql)");
        let dir = tempfile::tempdir().unwrap();
        if nix_is_root() {
            let ok =
                Command::new("chown").args(["-R", "postgres"]).arg(dir.path()).status().unwrap().success();
            assert!(ok, "chown the data directory to postgres");
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pg = Postgres { bin, dir, port };
        let out = pg
            .tool("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(pg.data())
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-o", &opts, "-l"])
            .arg(self.dir.path().join("log"))
            .args(["-w", "-t", "30", "start"])
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Stops at once, as a crash or a failover would: clients see their
    /// connections cut.
    fn stop(&self) {
        let _ =
            self.tool("pg_ctl").arg("-D").arg(self.data()).args(["-m", "immediate", "-w", "stop"]).output();
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

fn nix_is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false)
}

fn http_status(addr: SocketAddr, path: &str) -> u16 {
    http_get(addr, path).0
}

fn deliver(addr: SocketAddr, n: usize) -> Result<String, String> {
    smtp_try(addr, "user@example.test", n).map(|(verdict, _)| verdict)
}

/// LOGIN then SELECT INBOX: the tagged replies ("" for a command not reached).
fn imap_select(addr: SocketAddr) -> Result<(String, String), String> {
    imap_commands(addr, false).map(|(login, select, _)| (login, select))
}

/// LOGIN, SELECT INBOX and, with `store`, a flag change on message 1.
fn imap_commands(addr: SocketAddr, store: bool) -> Result<(String, String, String), String> {
    let commands: &[&str] =
        if store { &["SELECT INBOX", "STORE 1 +FLAGS (\\Flagged)"] } else { &["SELECT INBOX"] };
    let mut r = imap_exchange(addr, "user@example.test", "secret", commands)?.into_iter();
    Ok((r.next().unwrap_or_default(), r.next().unwrap_or_default(), r.next().unwrap_or_default()))
}

/// Runs one statement as the cluster's superuser.
fn psql(url: &str, sql: &str) {
    block_on(async {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.unwrap();
    });
}

#[test]
fn a_postgres_outage_gives_temporary_failures_and_the_pod_recovers_by_itself() {
    let pg = Postgres::init();
    pg.start();
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_DATABASE_URL", url.as_str()),
        ("MAILCLUSTER_PROTOCOLS", "smtp,imap"),
        ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
        ("MAILCLUSTER_DATABASE__CONNECT_TIMEOUT_SECS", "2"),
    ]);
    run(dir.path(), &["migrate"], &env).ok();
    run(dir.path(), &["domain", "add", "example.test"], &env).ok();
    run_with(dir.path(), &["user", "add", "user@example.test"], &env, "secret\n", Duration::from_secs(120))
        .ok();
    let serve_dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(serve_dir.path(), &env, 2);
    let (smtp, imap, admin) = (server.addr("smtp"), server.addr("imap"), server.admin);

    let mut acknowledged = 0;
    for n in 0..10 {
        let r = deliver(smtp, n).unwrap();
        assert!(r.starts_with("250"), "{r}");
        acknowledged += 1;
    }
    let (login, select) = imap_select(imap).unwrap();
    assert!(login.starts_with("a OK") && select.starts_with("b OK"), "{login} / {select}");
    assert_eq!(http_status(admin, "/readyz"), 200);

    // The primary turns read-only (as a demoted primary does in a failover): writes
    // are temporary failures; once it takes writes again, the pod does too.
    psql(&url, "ALTER SYSTEM SET default_transaction_read_only = on");
    psql(&url, "SELECT pg_reload_conf()");
    std::thread::sleep(Duration::from_millis(300));
    let r = deliver(smtp, 50).unwrap();
    assert!(r.starts_with("451"), "a delivery to a read-only primary: {r}");
    let (_, _, stored) = imap_commands(imap, true).unwrap();
    assert!(stored.contains("NO [UNAVAILABLE]"), "STORE on a read-only primary: {stored}");
    psql(&url, "ALTER SYSTEM SET default_transaction_read_only = off");
    psql(&url, "SELECT pg_reload_conf()");
    let writable = Instant::now();
    loop {
        let r = deliver(smtp, 60).unwrap();
        if r.starts_with("250") {
            acknowledged += 1;
            break;
        }
        assert!(writable.elapsed() < Duration::from_secs(5), "still failing 5 s after writes returned: {r}");
        std::thread::sleep(Duration::from_millis(100));
    }

    pg.stop();
    // Down: every attempt ends in a temporary failure, each within a bound.
    let down_since = Instant::now();
    let mut verdicts = Vec::new();
    for n in 100..106 {
        let t = Instant::now();
        let r = deliver(smtp, n).unwrap_or_else(|e| panic!("delivery {n} during the outage: {e}"));
        assert!(t.elapsed() < Duration::from_secs(15), "delivery {n} took {:?}", t.elapsed());
        assert!(r.starts_with('4'), "a temporary failure while the database is down, got {r:?}");
        verdicts.push(r);
    }
    let (login, select) = imap_select(imap).unwrap_or_else(|e| panic!("IMAP during the outage: {e}"));
    // A login answered from the pod's credential cache may pass; the mailbox cannot.
    let unavailable = |l: &str| l.contains("NO [UNAVAILABLE]");
    assert!(
        unavailable(&login) || (login.starts_with("a OK") && unavailable(&select)),
        "IMAP while the database is down: {login} / {select}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_status(admin, "/readyz") != 503 {
        assert!(Instant::now() < deadline, "readiness stayed 200 with the database down");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("down {:?}: {verdicts:?}", down_since.elapsed());

    // Back: the pod serves again by itself, within 5 s.
    pg.start();
    let back = Instant::now();
    let mut n = 200;
    loop {
        let r = deliver(smtp, n).unwrap_or_else(|e| e);
        n += 1;
        if r.starts_with("250") {
            acknowledged += 1;
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(5), "not serving 5 s after the database returned: {r}");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("serving again {:?} after the database returned", back.elapsed());
    while http_status(admin, "/readyz") != 200 {
        assert!(back.elapsed() < Duration::from_secs(10), "readiness did not return");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (login, select) = imap_select(imap).unwrap();
    assert!(login.starts_with("a OK") && select.starts_with("b OK"), "{login} / {select}");
    // A restarted server is another epoch: the pod's IMAP read caches, which
    // assume the database never goes back in time, are cleared.
    while !server.log_contains("read caches cleared") {
        assert!(back.elapsed() < Duration::from_secs(20), "the database's new epoch went unnoticed");
        std::thread::sleep(Duration::from_millis(200));
    }

    let stored: i64 = block_on(async {
        let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM mailbox_messages").fetch_one(&mut c).await.unwrap()
    });
    assert_eq!(stored, acknowledged, "stored exactly what was acknowledged");
    drop(server);
}
