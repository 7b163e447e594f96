//! Two `mailcluster serve` processes over one PostgreSQL database and one Redis key
//! prefix, as two pods of a cluster would run:
//!
//! - an IDLE session on one process is woken by a delivery, an APPEND, a STORE and
//!   an EXPUNGE made through the other, via the cache's notifications;
//! - two sessions, one per process, pipelining FETCH / STORE / SEARCH / EXPUNGE on
//!   the same mailbox keep to RFC 3501 §7.4.1 and keep their sequence-number ↔ UID
//!   maps in step with the store;
//! - when one process loses Redis, its IDLE sessions fall back to polling the store.
//!
//! The clients here are deliberately naive line readers over plain TCP: every
//! untagged response is checked against what the session has been told so far.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestDatabase;
use common::cluster::{ServeProcess, block_on, smtp_deliver};
use common::{redis_url, unique};
use sqlx::Connection;

const USER: &str = "alice@example.com";
const PASSWORD: &str = "multi process";

/// A fresh PostgreSQL database with the schema, the domain and the test user,
/// dropped again when the test ends.
struct Database {
    _pg: TestDatabase,
    url: String,
    dir: tempfile::TempDir,
}

impl Database {
    fn create() -> Database {
        let pg = TestDatabase::create_blocking("mc_imapmp");
        let url = pg.url.clone();
        let dir = tempfile::tempdir().unwrap();
        let env = [("MAILCLUSTER_DATABASE_URL", url.as_str())];
        common::run(dir.path(), &["migrate"], &env).ok();
        common::run(dir.path(), &["domain", "add", "example.com"], &env).ok();
        common::run(dir.path(), &["user", "add", USER, "--password", PASSWORD], &env).ok();
        Database { _pg: pg, url, dir }
    }

    /// The UIDs of the user's INBOX as the store has them: the truth every
    /// session's map must converge to.
    fn inbox_uids(&self) -> Vec<u32> {
        self.inbox_uids_where(None)
    }

    /// UIDs of the INBOX whose system flags include `bit` (1 \Seen, 2 \Answered,
    /// 4 \Flagged, 8 \Deleted), from the store.
    fn inbox_uids_with(&self, bit: i32) -> Vec<u32> {
        self.inbox_uids_where(Some(bit))
    }

    fn inbox_uids_where(&self, bit: Option<i32>) -> Vec<u32> {
        block_on(async {
            let mut conn = sqlx::PgConnection::connect(&self.url).await.expect("connect");
            let rows: Vec<(i64,)> = sqlx::query_as(
                "SELECT mm.uid FROM mailbox_messages mm \
                 JOIN mailboxes m ON m.id = mm.mailbox_id \
                 JOIN accounts a ON a.id = m.account_id \
                 WHERE a.email = $1 AND m.name = 'INBOX' AND ($2::int IS NULL OR mm.flags & $2 <> 0) \
                 ORDER BY mm.uid",
            )
            .bind(USER)
            .bind(bit)
            .fetch_all(&mut conn)
            .await
            .expect("query uids");
            rows.into_iter().map(|(u,)| u32::try_from(u).expect("uid fits u32")).collect()
        })
    }
}

/// One `mailcluster serve` process (SMTP and IMAP on ephemeral ports) of the
/// shared database and Redis prefix.
struct Server {
    process: ServeProcess,
    smtp: SocketAddr,
    imap: SocketAddr,
}

impl Server {
    fn start(db: &Database, redis: &str, prefix: &str, extra: &[(&str, &str)]) -> Server {
        let mut env = vec![
            ("MAILCLUSTER_DATABASE_URL", db.url.as_str()),
            ("MAILCLUSTER_DATABASE__MIGRATE_ON_START", "false"),
            ("MAILCLUSTER_REDIS_URL", redis),
            ("MAILCLUSTER_REDIS__KEY_PREFIX", prefix),
            ("MAILCLUSTER_PROTOCOLS", "smtp,imap"),
            ("MAILCLUSTER_LISTEN_ADDR", "127.0.0.1"),
            ("MAILCLUSTER_LOG_LEVEL", "info"),
            ("MAILCLUSTER_SMTP_PORT", "0"),
            ("MAILCLUSTER_IMAP_PORT", "0"),
            ("MAILCLUSTER_ADMIN_PORT", "0"),
            ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
        ];
        env.extend_from_slice(extra);
        let process = ServeProcess::start(db.dir.path(), &env, 2);
        Server { smtp: process.addr("smtp"), imap: process.addr("imap"), process }
    }
}

/// The reply to one command: its untagged lines and its tagged status line.
#[derive(Debug)]
struct Reply {
    untagged: Vec<String>,
    status: String,
}

impl Reply {
    fn ok(&self) -> bool {
        self.status.split_whitespace().nth(1) == Some("OK")
    }
}

/// An IMAP client that keeps the session's view of the selected mailbox exactly as
/// the server has told it (`uids[seq - 1]`, 0 while the UID is not yet known) and
/// checks every untagged response against that view.
struct Imap {
    name: &'static str,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    tag: u32,
    uids: Vec<u32>,
    /// Last flags the server reported per UID.
    flags: HashMap<u32, String>,
    /// Untagged EXPUNGE / FETCH responses seen, to show the run exercised them.
    expunges: usize,
    fetches: usize,
}

impl Imap {
    fn connect(name: &'static str, addr: SocketAddr) -> Imap {
        let stream = TcpStream::connect(addr).expect("connect imap");
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let writer = stream.try_clone().unwrap();
        let mut c = Imap {
            name,
            reader: BufReader::new(stream),
            writer,
            tag: 0,
            uids: Vec::new(),
            flags: HashMap::new(),
            expunges: 0,
            fetches: 0,
        };
        let greeting = c.line().expect("greeting");
        assert!(greeting.starts_with("* OK"), "{greeting}");
        c
    }

    fn login_select(name: &'static str, addr: SocketAddr) -> Imap {
        let mut c = Imap::connect(name, addr);
        let r = c.command(&format!("LOGIN {USER} \"{PASSWORD}\""));
        assert!(r.ok(), "{r:?}");
        let r = c.command("SELECT INBOX");
        assert!(r.ok(), "{r:?}");
        c
    }

    /// One line without CRLF; `None` on read timeout.
    fn line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => panic!("{}: connection closed", self.name),
            Ok(_) => {
                // Only FLAGS/UID/SEARCH data is asked for: no literal may appear.
                assert!(!line.trim_end().ends_with('}'), "{}: unexpected literal: {line}", self.name);
                Some(line.trim_end_matches(['\r', '\n']).to_string())
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                None
            }
            Err(e) => panic!("{}: read: {e}", self.name),
        }
    }

    fn next_tag(&mut self) -> String {
        self.tag += 1;
        format!("{}{}", self.name, self.tag)
    }

    fn command(&mut self, cmd: &str) -> Reply {
        self.pipeline(&[cmd.to_string()]).pop().expect("one reply").1
    }

    /// Sends every command at once, then reads the replies in order, checking each
    /// untagged line against the view as it stood at that point.
    fn pipeline(&mut self, cmds: &[String]) -> Vec<(String, Reply)> {
        let tags: Vec<String> = cmds.iter().map(|_| self.next_tag()).collect();
        let mut wire = String::new();
        for (tag, cmd) in tags.iter().zip(cmds) {
            wire.push_str(&format!("{tag} {cmd}\r\n"));
        }
        self.writer.write_all(wire.as_bytes()).unwrap();
        let mut replies = Vec::new();
        for (tag, cmd) in tags.iter().zip(cmds) {
            let mut untagged = Vec::new();
            let status = loop {
                let line = self.line().unwrap_or_else(|| panic!("{}: no reply to {cmd}", self.name));
                if let Some(rest) = line.strip_prefix(tag.as_str()).and_then(|r| r.strip_prefix(' ')) {
                    break format!("{tag} {rest}");
                }
                assert!(
                    line.starts_with("* "),
                    "{}: unexpected line {line:?} while waiting for {tag}",
                    self.name
                );
                self.observe(&line, cmd);
                untagged.push(line);
            };
            replies.push((cmd.clone(), Reply { untagged, status }));
        }
        replies
    }

    /// Applies one untagged response to the view, asserting RFC 3501 §7.4.1 and
    /// §7.2–7.4 along the way. `during` is the command being answered, if any.
    fn observe(&mut self, line: &str, during: &str) {
        let name = self.name;
        let words: Vec<&str> = line.split_whitespace().collect();
        let verb = during.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
        let n = self.uids.len() as u32;
        match words.get(2).map(|w| w.to_ascii_uppercase()) {
            Some(w) if w == "EXISTS" => {
                let count: u32 = words[1].parse().unwrap();
                assert!(count >= n, "{name}: EXISTS {count} shrank the mailbox from {n} without EXPUNGE");
                self.uids.resize(count as usize, 0);
            }
            Some(w) if w == "EXPUNGE" => {
                assert!(
                    !matches!(verb.as_str(), "FETCH" | "STORE" | "SEARCH"),
                    "{name}: EXPUNGE while answering {during:?} (RFC 3501 §7.4.1)"
                );
                let seq: u32 = words[1].parse().unwrap();
                assert!((1..=n).contains(&seq), "{name}: EXPUNGE {seq} beyond the {n} messages it knows");
                let uid = self.uids.remove(seq as usize - 1);
                self.flags.remove(&uid);
                self.expunges += 1;
            }
            Some(w) if w == "FETCH" => {
                let seq: u32 = words[1].parse().unwrap();
                assert!(
                    (1..=n).contains(&seq),
                    "{name}: FETCH for {seq} beyond the {n} messages it knows: {line}"
                );
                self.fetches += 1;
                let upper = line.to_ascii_uppercase();
                if let Some(uid) = upper.split("UID ").nth(1).and_then(|r| r.split([' ', ')']).next()) {
                    let uid: u32 = uid.parse().unwrap();
                    let known = self.uids[seq as usize - 1];
                    assert!(known == 0 || known == uid, "{name}: seq {seq} was UID {known}, now UID {uid}");
                    self.uids[seq as usize - 1] = uid;
                    if let Some(flags) = line.split("FLAGS (").nth(1).and_then(|r| r.split(')').next()) {
                        self.flags.insert(uid, flags.to_string());
                    }
                }
            }
            // Sequence numbers only when the command was a plain SEARCH (UID
            // SEARCH answers with UIDs).
            _ if verb == "SEARCH" && words.get(1).is_some_and(|w| w.eq_ignore_ascii_case("SEARCH")) => {
                for w in &words[2..] {
                    let seq: u32 = w.parse().unwrap();
                    assert!((1..=n).contains(&seq), "{name}: SEARCH names {seq} beyond {n}");
                }
            }
            _ => {}
        }
    }

    /// NOOP, then the full seq → UID map: the view must have no gaps and equal
    /// the store's UIDs.
    fn check_against(&mut self, truth: &[u32]) {
        let r = self.command("NOOP");
        assert!(r.ok(), "{r:?}");
        let r = self.command("FETCH 1:* (UID FLAGS)");
        assert!(r.ok() || truth.is_empty(), "{r:?}");
        assert_eq!(self.uids, truth, "{}: seq → UID map differs from the store", self.name);
    }

    fn uid_search(&mut self, criteria: &str) -> Vec<u32> {
        let r = self.command(&format!("UID SEARCH {criteria}"));
        assert!(r.ok(), "{}: UID SEARCH {criteria}: {r:?}", self.name);
        r.untagged
            .iter()
            .find_map(|l| l.strip_prefix("* SEARCH"))
            .map(|rest| rest.split_whitespace().map(|w| w.parse().unwrap()).collect())
            .unwrap_or_default()
    }

    /// The flags this session reports (FETCH FLAGS and flag SEARCH, both answered
    /// from the server's per-session flag map) against the store's rows.
    fn check_flags_against(&mut self, db: &Database) {
        for (bit, flag, key) in
            [(1, "\\Seen", "SEEN"), (4, "\\Flagged", "FLAGGED"), (8, "\\Deleted", "DELETED")]
        {
            let truth = db.inbox_uids_with(bit);
            let mut fetched: Vec<u32> =
                self.flags.iter().filter(|(_, f)| f.contains(flag)).map(|(&u, _)| u).collect();
            fetched.sort_unstable();
            assert_eq!(fetched, truth, "{}: FETCH FLAGS {flag} differ from the store", self.name);
            let found = self.uid_search(key);
            assert_eq!(found, truth, "{}: UID SEARCH {key} differs from the store", self.name);
            let not_found = self.uid_search(&format!("UN{key}"));
            assert_eq!(
                found.len() + not_found.len(),
                self.uids.len(),
                "{}: {key} and UN{key} split",
                self.name
            );
        }
    }

    /// Waits (in IDLE) for an untagged line satisfying `want`; returns how long it took.
    fn wait_for(&mut self, started: Instant, limit: Duration, want: impl Fn(&str) -> bool) -> Duration {
        loop {
            assert!(started.elapsed() < limit, "{}: nothing within {limit:?}", self.name);
            if let Some(line) = self.line() {
                self.observe(&line, "IDLE");
                if want(&line) {
                    return started.elapsed();
                }
            }
        }
    }

    /// Enters IDLE; returns its tag for [`Imap::done`].
    fn idle(&mut self) -> String {
        let tag = self.next_tag();
        write!(self.writer, "{tag} IDLE\r\n").unwrap();
        loop {
            let line = self.line().expect("IDLE continuation");
            if line.starts_with("+ ") {
                break;
            }
            self.observe(&line, "IDLE");
        }
        // Short reads so that `wait_for` checks its deadline often.
        self.reader.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        tag
    }

    fn done(&mut self, tag: &str) {
        self.reader.get_ref().set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        self.writer.write_all(b"DONE\r\n").unwrap();
        loop {
            let line = self.line().expect("IDLE completion");
            if let Some(rest) = line.strip_prefix(tag) {
                assert!(rest.starts_with(" OK"), "{line}");
                return;
            }
            self.observe(&line, "IDLE");
        }
    }
}

/// A TCP forwarder in front of Redis that the test can cut, so that one process
/// loses Redis while the other keeps it. After `cut`, existing connections are
/// shut down and new ones are closed as soon as they are accepted.
struct CuttableProxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl CuttableProxy {
    fn start(upstream: &str) -> CuttableProxy {
        let upstream = upstream
            .strip_prefix("redis://")
            .expect("REDIS_URL starts with redis://")
            .trim_end_matches('/')
            .rsplit('@')
            .next()
            .unwrap()
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (cut2, open2) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if cut2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else { continue };
                let mut sockets = open2.lock().unwrap();
                sockets.push(client.try_clone().unwrap());
                sockets.push(server.try_clone().unwrap());
                for (mut from, mut to) in
                    [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        CuttableProxy { addr, cut, open }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn message(subject: &str) -> String {
    format!("From: b@example.com\r\nTo: {USER}\r\nSubject: {subject}\r\n\r\nBody of {subject}.\r\n")
}

/// APPEND with a non-synchronising literal (LITERAL+), so it pipelines like any
/// other command.
fn append_cmd(subject: &str) -> String {
    let msg = message(subject);
    format!("APPEND INBOX {{{}+}}\r\n{msg}", msg.len())
}

fn is_untagged(line: &str, what: &str) -> bool {
    line.starts_with("* ") && line.to_ascii_uppercase().contains(what)
}

/// What one process changes wakes an IDLE session on the other within a bounded
/// time. The IDLE poll interval is set far beyond the bound so that only the
/// cache's notifications can explain a wake-up. The target is 100 ms (measured by
/// the benchmark); the assertion leaves room for a loaded CI machine.
#[test]
fn idle_on_one_process_is_woken_by_changes_on_the_other() {
    let db = Database::create();
    let prefix = format!("{}:", unique("mc_imapmp"));
    let no_poll = [("MAILCLUSTER_IMAP__IDLE_POLL_SECS", "600")];
    let a = Server::start(&db, &redis_url(), &prefix, &no_poll);
    let b = Server::start(&db, &redis_url(), &prefix, &no_poll);
    let bound = Duration::from_secs(1);

    let mut idler = Imap::login_select("A", a.imap);
    let idle_tag = idler.idle();
    let mut writer = Imap::login_select("B", b.imap);

    let started = smtp_deliver(b.smtp, USER, "delivered on B");
    let took = idler.wait_for(started, Duration::from_secs(10), |l| is_untagged(l, " EXISTS"));
    println!("IDLE wake-up after SMTP delivery on the other process: {took:?}");
    assert!(took < bound, "SMTP delivery took {took:?}");

    let started = Instant::now();
    let r = writer.command(&append_cmd("appended on B"));
    assert!(r.ok(), "{r:?}");
    let took = idler.wait_for(started, Duration::from_secs(10), |l| is_untagged(l, " EXISTS"));
    println!("IDLE wake-up after APPEND on the other process: {took:?}");
    assert!(took < bound, "APPEND took {took:?}");
    assert_eq!(idler.uids.len(), 2);

    writer.command("NOOP");
    let started = Instant::now();
    let r = writer.command("STORE 1 +FLAGS (\\Flagged)");
    assert!(r.ok(), "{r:?}");
    let took = idler
        .wait_for(started, Duration::from_secs(10), |l| is_untagged(l, " FETCH") && l.contains("\\Flagged"));
    println!("IDLE wake-up after STORE on the other process: {took:?}");
    assert!(took < bound, "STORE took {took:?}");

    let r = writer.command("STORE 2 +FLAGS.SILENT (\\Deleted)");
    assert!(r.ok(), "{r:?}");
    idler.wait_for(Instant::now(), Duration::from_secs(10), |l| l.contains("\\Deleted"));
    let started = Instant::now();
    let r = writer.command("EXPUNGE");
    assert!(r.ok() && r.untagged.iter().any(|l| l == "* 2 EXPUNGE"), "{r:?}");
    let took = idler.wait_for(started, Duration::from_secs(10), |l| l == "* 2 EXPUNGE");
    println!("IDLE wake-up after EXPUNGE on the other process: {took:?}");
    assert!(took < bound, "EXPUNGE took {took:?}");

    idler.done(&idle_tag);
    idler.check_against(&db.inbox_uids());
    writer.check_against(&db.inbox_uids());
    assert_eq!(idler.uids.len(), 1);
}

/// A random but reproducible pipeline for one round: every command uses sequence
/// numbers the session knows when the pipeline is sent; the only command that may
/// shrink the mailbox (EXPUNGE) comes last.
fn round(rng: &mut u64, known: u32, who: &str, round: u32) -> Vec<String> {
    let mut next = |bound: u32| {
        // xorshift64: no dependency, and a failing seed can be replayed.
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        (*rng % u64::from(bound.max(1))) as u32
    };
    let mut cmds = Vec::new();
    if known > 0 {
        let lo = next(known) + 1;
        let hi = lo + next(known - lo + 1);
        cmds.push(format!("FETCH {lo}:{hi} (UID FLAGS)"));
        cmds.push(format!("STORE {} +FLAGS (\\Seen)", next(known) + 1));
        cmds.push("SEARCH UNSEEN".to_string());
        cmds.push(format!("STORE {} -FLAGS.SILENT (\\Seen)", next(known) + 1));
        cmds.push(format!("FETCH {} (FLAGS)", next(known) + 1));
        if next(3) == 0 {
            cmds.push(format!("STORE {} +FLAGS.SILENT (\\Deleted)", next(known) + 1));
        }
    }
    cmds.push(append_cmd(&format!("{who} round {round}")));
    cmds.push("UID SEARCH ALL".to_string());
    cmds.push("FETCH 1:* (UID)".to_string());
    if next(2) == 0 {
        cmds.push("EXPUNGE".to_string());
    } else {
        cmds.push("NOOP".to_string());
    }
    cmds
}

/// Two sessions, one per process, pipelining on the same mailbox at the same time.
#[test]
fn concurrent_sessions_on_two_processes_keep_rfc3501_sequence_rules() {
    let db = Database::create();
    let prefix = format!("{}:", unique("mc_imapmp"));
    let a = Server::start(&db, &redis_url(), &prefix, &[]);
    let b = Server::start(&db, &redis_url(), &prefix, &[]);
    {
        let mut seed = Imap::login_select("S", a.imap);
        let appends: Vec<String> = (0..20).map(|i| append_cmd(&format!("seed {i}"))).collect();
        for (cmd, r) in seed.pipeline(&appends) {
            assert!(r.ok(), "{cmd}: {r:?}");
        }
    }

    let run = |name: &'static str, addr: SocketAddr, seed: u64| {
        std::thread::spawn(move || {
            let mut c = Imap::login_select(name, addr);
            let mut rng = seed;
            for i in 0..12 {
                let cmds = round(&mut rng, c.uids.len() as u32, name, i);
                for (cmd, r) in c.pipeline(&cmds) {
                    // A message expunged by the other session may still be named
                    // (its number stays valid until we are told); the server may
                    // refuse to change it, but must not answer BAD.
                    assert!(!r.status.contains(" BAD "), "{name}: {cmd}: {r:?}");
                }
            }
            c
        })
    };
    let ta = run("A", a.imap, 0x9e37_79b9_7f4a_7c15);
    let tb = run("B", b.imap, 0xd1b5_4a32_d192_ed03);
    let mut ca = ta.join().expect("session on A");
    let mut cb = tb.join().expect("session on B");

    for c in [&ca, &cb] {
        println!("{}: {} untagged EXPUNGE, {} untagged FETCH", c.name, c.expunges, c.fetches);
        assert!(c.expunges > 0, "{}: the run never expunged", c.name);
    }

    // Quiescent now: after a NOOP each map must equal the store's.
    let truth = db.inbox_uids();
    assert!(!truth.is_empty());
    ca.check_against(&truth);
    cb.check_against(&truth);
    ca.check_flags_against(&db);
    cb.check_flags_against(&db);
    // A new session on each process selects from that process's cached message
    // list (taken when the first sessions selected, before all of the above) plus
    // what changed since: it must see exactly the store.
    for (name, addr) in [("A2", a.imap), ("B2", b.imap)] {
        let mut late = Imap::login_select(name, addr);
        late.check_against(&truth);
        late.check_flags_against(&db);
    }

    // A flag set through one process shows up on the other with its next command.
    // (Different flags each way: setting one already set changes nothing.)
    flag_is_visible(&mut ca, &mut cb, "\\Flagged");
    flag_is_visible(&mut cb, &mut ca, "\\Answered");
}

fn flag_is_visible(from: &mut Imap, to: &mut Imap, flag: &str) {
    let uid = *from.uids.last().unwrap();
    let r = from.command(&format!("UID STORE {uid} +FLAGS.SILENT ({flag})"));
    assert!(r.ok(), "{r:?}");
    let r = to.command("NOOP");
    let seq = to.uids.iter().position(|&u| u == uid).unwrap() + 1;
    assert!(
        r.untagged.iter().any(|l| l.starts_with(&format!("* {seq} FETCH")) && l.contains(flag)),
        "{}: {flag} set on {} not visible: {r:?}",
        to.name,
        from.name
    );
    assert!(to.flags[&uid].contains(flag));
}

/// With Redis gone from one process, its IDLE sessions poll the store instead and
/// still see a delivery made through the other process. (A process cannot start
/// without its cache; losing Redis while running is the case that matters.)
#[test]
fn idle_falls_back_to_polling_when_redis_is_lost() {
    let db = Database::create();
    let prefix = format!("{}:", unique("mc_imapmp"));
    let proxy = CuttableProxy::start(&redis_url());
    let a = Server::start(&db, &proxy.url(), &prefix, &[("MAILCLUSTER_IMAP__IDLE_POLL_SECS", "1")]);
    let b = Server::start(&db, &redis_url(), &prefix, &[]);

    let mut idler = Imap::login_select("A", a.imap);
    let idle_tag = idler.idle();
    smtp_deliver(b.smtp, USER, "before the cut");
    idler.wait_for(Instant::now(), Duration::from_secs(10), |l| is_untagged(l, " EXISTS"));

    proxy.cut();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.process.log_contains("Redis pub/sub connection closed") {
        assert!(Instant::now() < deadline, "A did not notice losing Redis:\n{}", a.process.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = smtp_deliver(b.smtp, USER, "after the cut");
    let took = idler.wait_for(started, Duration::from_secs(10), |l| l == "* 2 EXISTS");
    println!("IDLE wake-up by polling (every 1 s) without Redis: {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    idler.done(&idle_tag);
    idler.check_against(&db.inbox_uids());
}

/// \Recent across pods (RFC 3501 §2.3.2): sessions on two processes select the same
/// INBOX at the same moment; every new message is recent for exactly one of them,
/// and the RECENT counts they were told add up to the messages delivered.
#[test]
fn each_new_message_is_recent_for_exactly_one_session_across_processes() {
    const MESSAGES: usize = 12;
    const PER_PROCESS: usize = 4;
    let db = Database::create();
    let prefix = format!("{}:", unique("mc_imapmp"));
    let a = Server::start(&db, &redis_url(), &prefix, &[]);
    let b = Server::start(&db, &redis_url(), &prefix, &[]);
    for i in 0..MESSAGES {
        smtp_deliver(if i % 2 == 0 { a.smtp } else { b.smtp }, USER, &format!("recent {i}"));
    }
    let names = ["A1", "A2", "A3", "A4", "B1", "B2", "B3", "B4"];
    let barrier = Arc::new(std::sync::Barrier::new(2 * PER_PROCESS));
    let sessions: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, &name)| {
            let addr = if i < PER_PROCESS { a.imap } else { b.imap };
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut c = Imap::connect(name, addr);
                assert!(c.command(&format!("LOGIN {USER} \"{PASSWORD}\"")).ok());
                barrier.wait();
                let select = c.command("SELECT INBOX");
                assert!(select.ok(), "{select:?}");
                let told: usize = select
                    .untagged
                    .iter()
                    .find_map(|l| l.strip_suffix(" RECENT").and_then(|l| l.strip_prefix("* ")))
                    .expect("RECENT in the SELECT reply")
                    .parse()
                    .expect("a count");
                let search = c.uid_search("RECENT");
                assert_eq!(search.len(), told, "{name}: SEARCH RECENT agrees with * n RECENT");
                let fetch = c.command("UID FETCH 1:* (FLAGS)");
                let flagged: Vec<u32> = fetch
                    .untagged
                    .iter()
                    .filter(|l| l.contains("\\Recent"))
                    .filter_map(|l| l.split("UID ").nth(1)?.split([' ', ')']).next()?.parse().ok())
                    .collect();
                assert_eq!(flagged, search, "{name}: FETCH FLAGS \\Recent agrees with SEARCH RECENT");
                (name, told, search)
            })
        })
        .collect();
    let mut owner: HashMap<u32, &str> = HashMap::new();
    let mut total = 0;
    for handle in sessions {
        let (name, told, uids) = handle.join().expect("session");
        total += told;
        for uid in uids {
            if let Some(other) = owner.insert(uid, name) {
                panic!("UID {uid} is recent for both {other} and {name}");
            }
        }
    }
    assert_eq!(total, MESSAGES, "every message recent for one session: {owner:?}");
    assert_eq!(owner.len(), MESSAGES);
}
