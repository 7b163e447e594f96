//! POP3 transcripts (RFC 1939, 2449, 2595, 3206, 5034) against the real embedded
//! store (SQLite in a temporary directory) and the in-process cache, over an
//! in-memory stream: every command, every state, every error path.

mod common;

use std::time::Duration;

use common::*;
use mailcluster_model::{FlagSet, Flags, UidSet};
use mailcluster_server::app::App;
use mailcluster_server::config::Config;
use mailcluster_server::net::{Protocol, SessionStream, Shutdown};
use mailcluster_server::pop3::Pop3Protocol;
use mailcluster_server::pop3::maildrop::lock_key;
use mailcluster_server::store;
use tokio::io::DuplexStream;

struct Fixture {
    app: App,
    inbox: i64,
    uids: Vec<u32>,
    _dir: tempfile::TempDir,
}

/// bob@example.org with three messages; the second has a line starting with a dot.
async fn fixture(tweak: impl FnOnce(&mut Config)) -> Fixture {
    let (app, dir) = embedded_app(|c| {
        c.tls.allow_plaintext_auth = true;
        tweak(c)
    })
    .await;
    let bob = account(&app, "bob@example.org", "secret pw").await;
    let mut uids = Vec::new();
    for (subject, body) in [("one", "first body"), ("two", ".dot line\r\nsecond"), ("three", "third body")] {
        uids.push(deliver(&app, &bob, "INBOX", &sample(subject, body), FlagSet::default()).await);
    }
    let inbox = app.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX").id;
    Fixture { app, inbox, uids, _dir: dir }
}

type Conn = (Client<DuplexStream>, tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>);

fn connect(app: &App) -> Conn {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (tx, shutdown) = Shutdown::new();
    let proto = Pop3Protocol::new(app.clone(), false);
    let task = tokio::spawn(async move { proto.handle(SessionStream::Memory(server), ctx(shutdown)).await });
    (Client::new(client), tx, task)
}

async fn cmd(c: &mut Client<DuplexStream>, line: &str) -> String {
    c.send(&format!("{line}\r\n")).await;
    c.line().await
}

/// Reads a multi-line response body up to the terminating ".".
async fn body(c: &mut Client<DuplexStream>) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let l = c.line().await;
        if l == "." {
            return lines;
        }
        lines.push(l);
    }
}

async fn login(app: &App) -> Conn {
    let (mut c, tx, task) = connect(app);
    assert!(c.line().await.starts_with("+OK"), "greeting");
    assert!(cmd(&mut c, "USER bob@example.org").await.starts_with("+OK"));
    let r = cmd(&mut c, "PASS secret pw").await;
    assert!(r.starts_with("+OK"), "{r}");
    (c, tx, task)
}

async fn inbox_uids(f: &Fixture) -> Vec<u32> {
    f.app.store.mailbox_uids(f.inbox).await.expect("uids")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greeting_capa_and_plaintext_refused_without_tls() {
    let f = fixture(|c| c.tls.allow_plaintext_auth = false).await;
    let (mut c, _tx, _task) = connect(&f.app);
    let greeting = c.line().await;
    assert!(greeting.starts_with("+OK "), "{greeting}");
    assert_eq!(cmd(&mut c, "CAPA").await, "+OK Capability list follows");
    let caps = body(&mut c).await;
    for cap in ["TOP", "UIDL", "RESP-CODES", "AUTH-RESP-CODE", "PIPELINING"] {
        assert!(caps.iter().any(|l| l == cap), "{cap} in {caps:?}");
    }
    assert!(
        !caps.iter().any(|l| l == "USER" || l.starts_with("SASL")),
        "no plaintext auth offered: {caps:?}"
    );
    assert!(!caps.iter().any(|l| l == "STLS"), "no certificate, no STLS: {caps:?}");
    let r = cmd(&mut c, "USER bob@example.org").await;
    assert!(r.starts_with("-ERR [AUTH]") && r.contains("TLS"), "{r}");
    let r = cmd(&mut c, "AUTH PLAIN AGJvYkBleGFtcGxlLm9yZwBzZWNyZXQgcHc=").await;
    assert!(r.starts_with("-ERR [AUTH]"), "{r}");
    assert!(cmd(&mut c, "STLS").await.starts_with("-ERR"), "STLS without a certificate");
    assert!(cmd(&mut c, "QUIT").await.starts_with("+OK"));
    assert!(c.closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_pass_and_transaction_commands() {
    // Every error path in one session: more than the default error budget.
    let f = fixture(|c| c.pop3.max_errors = 50).await;
    let (mut c, _tx, _task) = connect(&f.app);
    c.line().await;
    let caps = {
        assert!(cmd(&mut c, "CAPA").await.starts_with("+OK"));
        body(&mut c).await
    };
    assert!(caps.iter().any(|l| l == "USER") && caps.iter().any(|l| l == "SASL PLAIN"), "{caps:?}");
    // wrong state and wrong order
    assert_eq!(cmd(&mut c, "STAT").await, "-ERR Not logged in");
    assert_eq!(cmd(&mut c, "PASS secret pw").await, "-ERR USER first");
    assert!(cmd(&mut c, "APOP bob 0123").await.starts_with("-ERR"));
    // wrong password: [AUTH], and USER must be given again
    assert!(cmd(&mut c, "USER bob@example.org").await.starts_with("+OK"));
    assert_eq!(cmd(&mut c, "PASS nope").await, "-ERR [AUTH] Invalid credentials");
    assert_eq!(cmd(&mut c, "PASS secret pw").await, "-ERR USER first");
    assert!(cmd(&mut c, "USER nobody@example.org").await.starts_with("+OK"), "existence not revealed");
    assert_eq!(cmd(&mut c, "PASS secret pw").await, "-ERR [AUTH] Invalid credentials");
    assert!(cmd(&mut c, "user bob@example.org").await.starts_with("+OK"), "keywords are case-insensitive");
    let r = cmd(&mut c, "pass secret pw").await;
    assert!(r.starts_with("+OK") && r.contains("3 messages"), "{r}");

    let sizes: Vec<u32> = {
        let rows = f.app.store.messages_by_uid(f.inbox, &UidSet::all()).await.expect("rows");
        rows.iter().map(|r| r.meta.size).collect()
    };
    let total: u32 = sizes.iter().sum();
    assert_eq!(cmd(&mut c, "STAT").await, format!("+OK 3 {total}"));
    assert_eq!(cmd(&mut c, "LIST").await, format!("+OK 3 messages ({total} octets)"));
    assert_eq!(
        body(&mut c).await,
        vec![format!("1 {}", sizes[0]), format!("2 {}", sizes[1]), format!("3 {}", sizes[2])]
    );
    assert_eq!(cmd(&mut c, "LIST 2").await, format!("+OK 2 {}", sizes[1]));
    assert_eq!(cmd(&mut c, "LIST 4").await, "-ERR No such message");
    assert!(cmd(&mut c, "LIST 0").await.starts_with("-ERR Syntax error"));
    assert!(cmd(&mut c, "LIST x").await.starts_with("-ERR Syntax error"));

    // UIDL: UIDVALIDITY and UID, the same names IMAP uses
    let validity = f.app.store.mailbox_get_by_id(f.inbox).await.expect("get").expect("INBOX").uid_validity;
    let uid_of = |uid: u32| format!("{validity:08x}{uid:08x}");
    assert_eq!(cmd(&mut c, "UIDL").await, "+OK Unique-ID listing follows");
    let listing = body(&mut c).await;
    assert_eq!(listing, (0..3).map(|i| format!("{} {}", i + 1, uid_of(f.uids[i]))).collect::<Vec<_>>());
    assert_eq!(cmd(&mut c, "UIDL 3").await, format!("+OK 3 {}", uid_of(f.uids[2])));

    // RETR: exact octet count, dot-stuffed body, terminating line
    assert_eq!(cmd(&mut c, "RETR 2").await, format!("+OK {} octets", sizes[1]));
    let msg = body(&mut c).await;
    assert!(msg.iter().any(|l| l == "Subject: two"), "{msg:?}");
    assert!(msg.iter().any(|l| l == "..dot line"), "dot-stuffed: {msg:?}");
    assert_eq!(msg.last().map(String::as_str), Some("second"));
    // TOP: headers, blank line, n body lines
    assert_eq!(cmd(&mut c, "TOP 2 0").await, "+OK Top of message follows");
    let top = body(&mut c).await;
    assert_eq!(top.last().map(String::as_str), Some(""), "headers and the blank line only: {top:?}");
    assert!(cmd(&mut c, "TOP 2 1").await.starts_with("+OK"));
    assert_eq!(body(&mut c).await.last().map(String::as_str), Some("..dot line"));
    assert!(cmd(&mut c, "TOP 2").await.starts_with("-ERR Syntax error"));
    assert_eq!(cmd(&mut c, "RETR 9").await, "-ERR No such message");

    // DELE marks; the message disappears from the session's views only
    assert_eq!(cmd(&mut c, "DELE 1").await, "+OK Message 1 deleted");
    assert_eq!(cmd(&mut c, "DELE 1").await, "-ERR Message 1 already deleted");
    assert_eq!(cmd(&mut c, "RETR 1").await, "-ERR No such message");
    assert_eq!(cmd(&mut c, "LIST 1").await, "-ERR No such message");
    assert_eq!(cmd(&mut c, "STAT").await, format!("+OK 2 {}", sizes[1] + sizes[2]));
    assert!(cmd(&mut c, "LIST").await.starts_with("+OK 2 messages"));
    assert_eq!(
        body(&mut c).await,
        vec![format!("2 {}", sizes[1]), format!("3 {}", sizes[2])],
        "numbers keep their place"
    );
    assert_eq!(inbox_uids(&f).await.len(), 3, "nothing removed before QUIT");
    // RSET unmarks
    assert!(cmd(&mut c, "RSET").await.starts_with("+OK Maildrop has 3 messages"));
    assert_eq!(cmd(&mut c, "NOOP").await, "+OK ");
    assert!(cmd(&mut c, "USER bob@example.org").await.starts_with("-ERR"), "no USER in TRANSACTION");
    assert!(cmd(&mut c, "STLS").await.starts_with("-ERR"), "no STLS in TRANSACTION");
    assert_eq!(cmd(&mut c, "DELE 3").await, "+OK Message 3 deleted");
    assert_eq!(cmd(&mut c, "QUIT").await, "+OK Mailcluster POP3 server signing off (2 messages left)");
    assert!(c.closed().await);

    // UPDATE: message 3 removed; RETR'd message 2 is \Seen for IMAP; 1 untouched
    assert_eq!(inbox_uids(&f).await, vec![f.uids[0], f.uids[1]]);
    let rows = f.app.store.messages_by_uid(f.inbox, &UidSet::all()).await.expect("rows");
    assert!(!rows[0].flags.system.contains(Flags::SEEN));
    assert!(rows[1].flags.system.contains(Flags::SEEN), "RETR marks \\Seen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_plain_variants() {
    let f = fixture(|_| {}).await;
    let (mut c, _tx, _task) = connect(&f.app);
    c.line().await;
    assert_eq!(cmd(&mut c, "AUTH").await, "+OK Supported SASL mechanisms follow");
    assert_eq!(body(&mut c).await, vec!["PLAIN"]);
    assert!(cmd(&mut c, "AUTH CRAM-MD5").await.starts_with("-ERR"));
    // continuation, then cancel
    assert_eq!(cmd(&mut c, "AUTH PLAIN").await, "+ ");
    assert_eq!(cmd(&mut c, "*").await, "-ERR Authentication cancelled");
    // malformed and wrong credentials
    assert!(cmd(&mut c, "AUTH PLAIN !!!").await.starts_with("-ERR [AUTH]"));
    let bad = b64("\0bob@example.org\0wrong");
    assert_eq!(cmd(&mut c, &format!("AUTH PLAIN {bad}")).await, "-ERR [AUTH] Invalid credentials");
    let proxy = b64("alice@example.org\0bob@example.org\0secret pw");
    assert_eq!(
        cmd(&mut c, &format!("AUTH PLAIN {proxy}")).await,
        "-ERR [AUTH] Authorization as another identity is not supported",
        "no proxy authorization, and not called malformed"
    );
    // continuation with the right response
    assert_eq!(cmd(&mut c, "AUTH PLAIN").await, "+ ");
    let r = cmd(&mut c, &b64("\0bob@example.org\0secret pw")).await;
    assert!(r.starts_with("+OK Logged in"), "{r}");
    assert!(cmd(&mut c, "AUTH PLAIN").await.starts_with("-ERR"), "no AUTH in TRANSACTION");
    assert!(cmd(&mut c, "QUIT").await.starts_with("+OK"));

    // initial response (RFC 5034)
    let (mut c, _tx, _task) = connect(&f.app);
    c.line().await;
    let ir = b64("bob@example.org\0bob@example.org\0secret pw");
    assert!(cmd(&mut c, &format!("AUTH PLAIN {ir}")).await.starts_with("+OK Logged in"));
    assert!(cmd(&mut c, "STAT").await.starts_with("+OK 3 "));
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_errors_then_disconnect() {
    let f = fixture(|c| c.pop3.max_errors = 4).await;
    let (mut c, _tx, _task) = connect(&f.app);
    c.line().await;
    assert_eq!(cmd(&mut c, "FROB").await, "-ERR Unknown command");
    // an oversized line is dropped without being held, and the session goes on
    let long = "X".repeat(1 << 20);
    assert_eq!(cmd(&mut c, &format!("USER {long}")).await, "-ERR Command line too long");
    assert!(cmd(&mut c, "CAPA").await.starts_with("+OK"));
    body(&mut c).await;
    assert!(cmd(&mut c, "RETR one").await.starts_with("-ERR"));
    assert!(cmd(&mut c, "\u{7f}\u{1}").await.starts_with("-ERR"));
    assert_eq!(c.line().await, "-ERR Too many errors; closing connection");
    assert!(c.closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_commands_are_answered_in_order() {
    let f = fixture(|_| {}).await;
    let (mut c, _tx, _task) = connect(&f.app);
    c.line().await;
    c.send("USER bob@example.org\r\nPASS secret pw\r\nSTAT\r\nLIST 1\r\nDELE 1\r\nRETR 3\r\nQUIT\r\n").await;
    assert!(c.line().await.starts_with("+OK"));
    assert!(c.line().await.starts_with("+OK Logged in"));
    assert!(c.line().await.starts_with("+OK 3 "));
    assert!(c.line().await.starts_with("+OK 1 "));
    assert_eq!(c.line().await, "+OK Message 1 deleted");
    assert!(c.line().await.ends_with(" octets"));
    assert!(body(&mut c).await.iter().any(|l| l == "third body"));
    assert!(c.line().await.starts_with("+OK Mailcluster POP3 server signing off"));
    assert!(c.closed().await);
    assert_eq!(inbox_uids(&f).await, vec![f.uids[1], f.uids[2]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_per_maildrop() {
    let f = fixture(|_| {}).await;
    let (mut a, _tx_a, _task_a) = login(&f.app).await;
    let (mut b, _tx_b, _task_b) = connect(&f.app);
    b.line().await;
    assert!(cmd(&mut b, "USER bob@example.org").await.starts_with("+OK"));
    assert_eq!(cmd(&mut b, "PASS secret pw").await, "-ERR [IN-USE] Maildrop is in use by another session");
    // QUIT releases the lock before it answers
    assert!(cmd(&mut a, "QUIT").await.starts_with("+OK"));
    assert!(cmd(&mut b, "USER bob@example.org").await.starts_with("+OK"));
    assert!(cmd(&mut b, "PASS secret pw").await.starts_with("+OK Logged in"));

    // a dropped connection (no QUIT) releases it too, and deletes nothing
    assert!(cmd(&mut b, "DELE 1").await.starts_with("+OK"));
    drop(b);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (mut c, _tx, _task) = connect(&f.app);
        c.line().await;
        cmd(&mut c, "USER bob@example.org").await;
        let r = cmd(&mut c, "PASS secret pw").await;
        if r.starts_with("+OK") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "lock not released after disconnect: {r}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(inbox_uids(&f).await.len(), 3, "no UPDATE state without QUIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_lock_expires() {
    let f = fixture(|c| c.pop3.lock_ttl_secs = 1).await;
    let bob = f.app.store.account_get("bob@example.org").await.expect("get").expect("bob");
    // What a pod that died while holding the maildrop leaves behind.
    let stale = f.app.cache.lock_try(&lock_key(bob.id), Duration::from_millis(800)).await.expect("lock");
    assert!(stale.is_some());
    let (mut c, _tx, _task) = connect(&f.app);
    c.line().await;
    cmd(&mut c, "USER bob@example.org").await;
    assert!(cmd(&mut c, "PASS secret pw").await.starts_with("-ERR [IN-USE]"));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cmd(&mut c, "USER bob@example.org").await;
    assert!(cmd(&mut c, "PASS secret pw").await.starts_with("+OK Logged in"));
    // The live session renews its own lock past the TTL.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (mut other, _tx2, _task2) = connect(&f.app);
    other.line().await;
    cmd(&mut other, "USER bob@example.org").await;
    assert!(cmd(&mut other, "PASS secret pw").await.starts_with("-ERR [IN-USE]"), "renewed lock still held");
    assert!(cmd(&mut c, "DELE 2").await.starts_with("+OK"));
    assert!(cmd(&mut c, "QUIT").await.starts_with("+OK"), "the renewed lock is still ours at QUIT");
    assert_eq!(inbox_uids(&f).await, vec![f.uids[0], f.uids[2]]);
}

/// An account whose INBOX is gone (removed behind the server's back) gets a
/// permanent error, not a temporary one a client would retry for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_maildrop_is_a_permanent_error() {
    use sqlx::Connection as _;
    let f = fixture(|_| {}).await;
    account(&f.app, "empty@example.org", "secret pw").await;
    let db = format!("sqlite://{}", f._dir.path().join(store::SQLITE_FILE).display());
    let mut conn = sqlx::SqliteConnection::connect(&db).await.expect("open the store's database");
    sqlx::query(
        "DELETE FROM mailboxes WHERE name = 'INBOX' AND account_id = \
         (SELECT id FROM accounts WHERE email = 'empty@example.org')",
    )
    .execute(&mut conn)
    .await
    .expect("remove INBOX");
    let (mut c, _tx, _task) = connect(&f.app);
    c.line().await;
    cmd(&mut c, "USER empty@example.org").await;
    assert_eq!(cmd(&mut c, "PASS secret pw").await, "-ERR [SYS/PERM] This account has no maildrop");
    // The lock was given back: the next attempt gets the same answer, not [IN-USE].
    cmd(&mut c, "USER empty@example.org").await;
    assert!(cmd(&mut c, "PASS secret pw").await.starts_with("-ERR [SYS/PERM]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_rules_with_imap_changes() {
    let f = fixture(|_| {}).await;
    let (mut c, _tx, _task) = login(&f.app).await;
    // Meanwhile an IMAP client expunges message 1 and a new message arrives.
    f.app.store.expunge(f.inbox, Some(&UidSet::single(f.uids[0]))).await.expect("expunge");
    let bob = f.app.store.account_get("bob@example.org").await.expect("get").expect("bob");
    deliver(&f.app, &bob, "INBOX", &sample("four", "late"), FlagSet::default()).await;
    assert!(cmd(&mut c, "STAT").await.starts_with("+OK 3 "), "the snapshot does not change");
    let r = cmd(&mut c, "RETR 1").await;
    assert_eq!(r, "-ERR Message was removed by another session");
    assert!(cmd(&mut c, "DELE 1").await.starts_with("+OK"));
    assert!(cmd(&mut c, "DELE 2").await.starts_with("+OK"));
    assert!(cmd(&mut c, "QUIT").await.starts_with("+OK"));
    let left = inbox_uids(&f).await;
    assert_eq!(left.len(), 2, "message 3 and the new one stay: {left:?}");
    assert_eq!(left[0], f.uids[2]);
    // the next session sees the new message
    let (mut c, _tx, _task) = login(&f.app).await;
    assert!(cmd(&mut c, "STAT").await.starts_with("+OK 2 "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_and_autologout_close_without_deleting() {
    let f = fixture(|c| c.pop3.autologout_secs = 1).await;
    let (mut c, tx, task) = login(&f.app).await;
    assert!(cmd(&mut c, "DELE 1").await.starts_with("+OK"));
    tx.send(true).expect("shutdown");
    assert_eq!(c.line().await, "-ERR [SYS/TEMP] Server shutting down");
    assert!(c.closed().await);
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("session ended").expect("no panic");
    assert_eq!(inbox_uids(&f).await.len(), 3);

    let (mut c, _tx, _task) = login(&f.app).await;
    assert!(cmd(&mut c, "DELE 1").await.starts_with("+OK"));
    assert_eq!(c.line().await, "-ERR Autologout; idle for too long");
    assert!(c.closed().await);
    assert_eq!(inbox_uids(&f).await.len(), 3);
    // the lock went with the session
    let (mut c, _tx, _task) = login(&f.app).await;
    assert!(cmd(&mut c, "QUIT").await.starts_with("+OK"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_pop3_commands() {
    let f = fixture(|_| {}).await;
    let (mut c, _tx, _task) = login(&f.app).await;
    cmd(&mut c, "STAT").await;
    cmd(&mut c, "RETR 7").await;
    cmd(&mut c, "QUIT").await;
    assert!(c.closed().await);
    let m = &f.app.metrics;
    assert_eq!(m.commands_total.with_label_values(&["pop3", "STAT", "ok"]).get(), 1);
    assert_eq!(m.commands_total.with_label_values(&["pop3", "RETR", "err"]).get(), 1);
    assert_eq!(m.commands_total.with_label_values(&["pop3", "PASS", "ok"]).get(), 1);
    assert!(m.command_duration.with_label_values(&["pop3", "QUIT"]).get_sample_count() >= 1);
}

#[test]
fn config_enforces_rfc_minimums() {
    let mut config = Config::default();
    config.pop3.autologout_secs = 60;
    config.pop3.max_line_bytes = 100;
    let err = config.validate().expect_err("invalid").to_string();
    assert!(err.contains("pop3.autologout_secs must be at least 600"), "{err}");
    assert!(err.contains("pop3.max_line_bytes must be at least 255"), "{err}");
    assert!(Config::default().validate().is_ok());
}

/// RETR and TOP read bodies through the process's body cache, the one IMAP FETCH
/// uses: a message read once (over either protocol) is served from memory after,
/// byte for byte the same. Counted by `mail_imap_body_cache_total`.
#[tokio::test]
async fn retr_reads_bodies_through_the_shared_body_cache() {
    let f = fixture(|_| {}).await;
    let cache = |result: &str| f.app.metrics.imap.body_cache.with_label_values(&[result]).get();
    let (mut c, _tx, _task) = login(&f.app).await;
    assert!(cmd(&mut c, "RETR 2").await.starts_with("+OK"));
    let first = body(&mut c).await;
    assert_eq!((cache("hit"), cache("miss")), (0, 1));
    assert!(cmd(&mut c, "RETR 2").await.starts_with("+OK"));
    assert_eq!(body(&mut c).await, first);
    assert!(cmd(&mut c, "TOP 2 0").await.starts_with("+OK"));
    let top = body(&mut c).await;
    assert_eq!(top[..], first[..top.len()], "TOP 2 0 is the header of RETR 2");
    assert_eq!((cache("hit"), cache("miss")), (2, 1));
    // The dot-stuffed line of the stored body, still stuffed on the way out.
    assert!(first.iter().any(|l| l == "..dot line"), "{first:?}");
    cmd(&mut c, "QUIT").await;
}
