//! A database that goes back in time under a running `mailcluster serve` (here:
//! restored from an earlier dump; a promoted replica that lost commits is the
//! same to the server) must not hand out UIDs a client already knows for other
//! messages. The mailbox gets a new UIDVALIDITY, the session that watched it is
//! ended, and a client that comes back resynchronises.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::TestDatabase;
use common::cluster::{ServeProcess, add_users, cluster_env, smtp_deliver};
use common::{database_url, redis_url, unique};

struct Imap {
    r: BufReader<TcpStream>,
    n: u32,
}

impl Imap {
    fn login(addr: SocketAddr) -> Imap {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect imap");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = Imap { r: BufReader::new(stream), n: 0 };
        assert!(c.line().is_some_and(|l| l.starts_with("* OK")));
        let (ok, _) = c.cmd("LOGIN bob@example.org \"the secret\"");
        assert!(ok.contains("OK"), "{ok}");
        c
    }
    /// A line; None when the server closed the connection.
    fn line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end().to_string()),
        }
    }
    /// (tagged reply, untagged lines); the tagged reply is "" when the
    /// connection ended first.
    fn cmd(&mut self, command: &str) -> (String, Vec<String>) {
        self.n += 1;
        let tag = format!("t{}", self.n);
        let _ = write!(self.r.get_mut(), "{tag} {command}\r\n");
        let mut untagged = Vec::new();
        loop {
            let Some(l) = self.line() else { return (String::new(), untagged) };
            if l.starts_with(&format!("{tag} ")) {
                return (l, untagged);
            }
            untagged.push(l);
        }
    }
    fn uidvalidity(lines: &[String]) -> u32 {
        lines
            .iter()
            .find_map(|l| l.split("UIDVALIDITY ").nth(1))
            .and_then(|v| v.split([']', ')', ' ']).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no UIDVALIDITY in {lines:?}"))
    }
    /// UID → subject of every message of the selected mailbox.
    fn subjects(&mut self) -> Vec<(u32, String)> {
        let (ok, lines) = self.cmd("UID FETCH 1:* (UID BODY.PEEK[HEADER.FIELDS (SUBJECT)])");
        assert!(ok.contains("OK"), "{ok} {lines:?}");
        let mut out = Vec::new();
        let mut uid = None;
        for l in lines {
            if let Some(u) = l.split("UID ").nth(1).and_then(|v| v.split([' ', ')']).next()) {
                uid = u.parse().ok();
            }
            if let (Some(s), Some(u)) = (l.strip_prefix("Subject: "), uid) {
                out.push((u, s.to_string()));
            }
        }
        out
    }
}

fn psql(sql: &str) {
    let out = Command::new("psql")
        .arg(database_url())
        .arg("-v")
        .arg("ON_ERROR_STOP=1")
        .arg("-qc")
        .arg(sql)
        .output()
        .expect("psql");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Drops the snapshot database, also when the test failed.
struct Snapshot(String);

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .arg(database_url())
            .arg("-qc")
            .arg(format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.0))
            .output();
    }
}

/// Delivers until the server takes it (its database connections come back
/// after the restore).
fn deliver_when_back(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match common::wire::smtp_try(addr, "bob@example.org", 0) {
            Ok((verdict, _)) if verdict.starts_with("250") => break,
            other => assert!(Instant::now() < deadline, "no delivery after the restore: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_restored_database_renews_uidvalidity_instead_of_reissuing_uids() {
    let db = TestDatabase::create_blocking("mc_rewind");
    let prefix = format!("{}:", unique("mcrewind"));
    let redis = redis_url();
    let dir = tempfile::tempdir().unwrap();
    let env = cluster_env(&db.url, &redis, &prefix, "smtp,imap");
    add_users(dir.path(), &env, &["bob@example.org"], "the secret");
    let server = ServeProcess::start(dir.path(), &env, 2);
    for subject in ["one", "two"] {
        smtp_deliver(server.addr("smtp"), "bob@example.org", subject);
    }

    // The snapshot: a dump, restored into a database of its own.
    let snapshot = Snapshot(format!("{}_snap", db.name));
    let dump = dir.path().join("snapshot.dump");
    let out = Command::new("pg_dump").arg("-Fc").arg("-f").arg(&dump).arg(&db.url).output().expect("pg_dump");
    assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
    psql(&format!("CREATE DATABASE \"{}\"", snapshot.0));
    let snapshot_url = db.url.replace(&db.name, &snapshot.0);
    let out = Command::new("pg_restore")
        .arg("--no-owner")
        .arg("-d")
        .arg(&snapshot_url)
        .arg(&dump)
        .output()
        .expect("pg_restore");
    assert!(out.status.success(), "pg_restore: {}", String::from_utf8_lossy(&out.stderr));

    // A client watches while more mail arrives.
    let mut watcher = Imap::login(server.addr("imap"));
    let (ok, lines) = watcher.cmd("SELECT INBOX");
    assert!(ok.contains("OK"), "{ok}");
    let before = Imap::uidvalidity(&lines);
    for subject in ["three", "four"] {
        smtp_deliver(server.addr("smtp"), "bob@example.org", subject);
    }
    let (_, lines) = watcher.cmd("NOOP");
    assert!(lines.iter().any(|l| l == "* 4 EXISTS"), "{lines:?}");
    let known = watcher.subjects();
    assert_eq!(known.iter().map(|(u, _)| *u).collect::<Vec<_>>(), [1, 2, 3, 4], "{known:?}");

    // The database goes back to the snapshot under the running server.
    psql(&format!("DROP DATABASE \"{}\" WITH (FORCE)", db.name));
    psql(&format!("CREATE DATABASE \"{}\" TEMPLATE \"{}\"", db.name, snapshot.0));
    deliver_when_back(server.addr("smtp"));

    // The watching session never learns a UID for another message: it is
    // ended (BYE) before it could.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let (ok, lines) = watcher.cmd("NOOP");
        seen.extend(lines);
        if ok.is_empty() || !ok.contains("OK") {
            break;
        }
        assert!(Instant::now() < deadline, "the session was never ended: {seen:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(seen.iter().any(|l| l.starts_with("* BYE")), "{seen:?}");
    assert!(!seen.iter().any(|l| l.contains("FETCH")), "no UID of the old view was reused: {seen:?}");

    // A client that comes back sees a new UIDVALIDITY, so whatever it kept of
    // UIDs 3 and 4 ("three", "four") is void; under it, the new message.
    let mut again = Imap::login(server.addr("imap"));
    let (_, status) = again.cmd("STATUS INBOX (UIDVALIDITY UIDNEXT)");
    let after = Imap::uidvalidity(&status);
    assert!(after > before, "UIDVALIDITY {before} → {after}: {status:?}");
    let (ok, lines) = again.cmd("SELECT INBOX");
    assert!(ok.contains("OK"), "{ok}");
    assert_eq!(Imap::uidvalidity(&lines), after);
    let now: Vec<String> = again.subjects().into_iter().map(|(_, s)| s).collect();
    assert_eq!(now.len(), 3, "one, two and the new one: {now:?}");
    assert!(!now.iter().any(|s| s.contains("three") || s.contains("four")), "{now:?}");
}
