//! Real clients against the real POP3 listeners (net layer, SQLite store,
//! in-process cache) over TCP and TLS on 127.0.0.1:0: Python's poplib (STLS and
//! implicit TLS), curl's pop3(s):// and fetchmail; and large messages through POP3 and
//! IMAP alike, which leave the server without being copied into the session.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use mailcluster_model::{FlagSet, Flags, UidSet};
use mailcluster_server::app::App;
use mailcluster_server::imap::ImapProtocol;
use mailcluster_server::net::TlsProvider;
use mailcluster_server::net::listener::TlsMode;
use mailcluster_server::pop3::Pop3Protocol;

/// Serves `pop3s` (implicit TLS) and `pop3` with the production listeners on
/// 127.0.0.1:0; returns their addresses.
fn serve(app: App, tls: TlsProvider) -> (SocketAddr, SocketAddr) {
    let addrs = serve_loopback(
        &app,
        tls,
        vec![
            ("pop3s", TlsMode::Implicit, Arc::new(Pop3Protocol::new(app.clone(), true))),
            ("pop3", TlsMode::Plain, Arc::new(Pop3Protocol::new(app.clone(), false))),
        ],
    );
    (addrs[0], addrs[1])
}

struct Setup {
    app: App,
    inbox: i64,
    pop3s: SocketAddr,
    pop3: SocketAddr,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let (app, dir) = embedded_app(|_| {}).await;
    let bob = bob_with_two_messages(&app).await;
    let inbox = app.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX").id;
    let (pop3s, pop3) = serve(app.clone(), tls_provider());
    Setup { app, inbox, pop3s, pop3, _dir: dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_poplib() {
    let s = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/poplib_session.py");
    let (ok, out) = run_client(tokio::process::Command::new("python3").args([
        script,
        &s.pop3s.port().to_string(),
        &s.pop3.port().to_string(),
    ]))
    .await;
    println!("{out}");
    assert!(ok, "poplib session failed:\n{out}");
    // What the sessions did is in the store, where IMAP sees it.
    let rows = s.app.store.messages_by_uid(s.inbox, &UidSet::all()).await.expect("rows");
    assert_eq!(rows.len(), 1, "DELE + QUIT removed the first message");
    assert_eq!(rows[0].meta.subject, "second");
    assert!(rows[0].flags.system.contains(Flags::SEEN), "RETR marked it \\Seen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_pop3() {
    let s = setup().await;
    let base = format!("pop3s://127.0.0.1:{}", s.pop3s.port());
    let curl = |url: String, extra: &[&str]| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sSk", "--max-time", "20", "-u", "bob@example.org:pw"]).args(extra).arg(url);
        c
    };
    let (ok, out) = run_client(&mut curl(format!("{base}/"), &[])).await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        ok && lines.len() == 2 && lines[0].starts_with("1 ") && lines[1].starts_with("2 "),
        "LIST: {out}"
    );
    let (ok, out) = run_client(&mut curl(format!("{base}/2"), &[])).await;
    assert!(ok && out.contains("Subject: second") && out.contains("second body"), "RETR: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/"), &["-X", "UIDL"])).await;
    assert!(ok && out.lines().count() == 2 && out.starts_with("1 "), "UIDL: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/"), &["-X", "TOP 1 0"])).await;
    assert!(ok && out.contains("Subject: first") && !out.contains("first body"), "TOP: {out}");
    // STLS on the plain port, then a DELE (no body transfer: -I).
    let (ok, out) = run_client(&mut curl(
        format!("pop3://127.0.0.1:{}/", s.pop3.port()),
        &["--ssl-reqd", "-X", "DELE 1", "-I"],
    ))
    .await;
    assert!(ok, "STLS + DELE: {out}");
    let uids = s.app.store.mailbox_uids(s.inbox).await.expect("uids");
    assert_eq!(uids.len(), 1, "DELE applied at curl's QUIT");
    // Without TLS, curl cannot log in: the server offers no plaintext login.
    let (ok, out) = run_client(&mut curl(format!("pop3://127.0.0.1:{}/", s.pop3.port()), &[])).await;
    assert!(!ok, "plaintext login must fail: {out}");
}

/// A message of about `size` octets whose lines are as `line` makes them.
fn large_message(subject: &str, size: usize, line: impl Fn(usize) -> String) -> Vec<u8> {
    let mut raw =
        format!("From: a@example.org\r\nTo: bob@example.org\r\nSubject: {subject}\r\n\r\n").into_bytes();
    let mut n = 0;
    while raw.len() < size {
        raw.extend_from_slice(line(n).as_bytes());
        n += 1;
    }
    raw
}

/// Messages far above the size that is copied into the session's output (those
/// are written from the shared body, net/output.rs) reach real clients whole and
/// in order: one as SMTP stores mail (CRLF, no leading dots), which POP3 sends as
/// stored; and one with leading dots, a bare LF and no final line end, which POP3
/// must dot-stuff and complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_reach_imaplib_and_poplib_whole() {
    let (app, dir) = embedded_app(|_| {}).await;
    let bob = account(&app, "bob@example.org", "pw").await;
    let clean = large_message("clean", 300_000, |n| format!("line {n} of a message as SMTP stores it\r\n"));
    let mut awkward = large_message("awkward", 200_000, |n| match n % 50 {
        0 => format!(".{n} starts with a dot\r\n"),
        1 => ".\r\n".to_string(),
        _ => format!("line {n}\r\n"),
    });
    awkward.extend_from_slice(b"a bare LF\nand no final line end");
    let small = b"From: a@example.org\r\nSubject: small\r\n\r\nbody\r\n".to_vec();
    let messages = [clean, awkward, small];
    let mut files = Vec::new();
    for (i, raw) in messages.iter().enumerate() {
        deliver(&app, &bob, "INBOX", raw, FlagSet::default()).await;
        let path = dir.path().join(format!("message-{i}.eml"));
        std::fs::write(&path, raw).expect("write message file");
        files.push(path);
    }
    let addrs = serve_loopback(
        &app,
        tls_provider(),
        vec![
            ("imaps", TlsMode::Implicit, Arc::new(ImapProtocol::new(app.clone(), true))),
            ("imap", TlsMode::Plain, Arc::new(ImapProtocol::new(app.clone(), false))),
            ("pop3s", TlsMode::Implicit, Arc::new(Pop3Protocol::new(app.clone(), true))),
            ("pop3", TlsMode::Plain, Arc::new(Pop3Protocol::new(app.clone(), false))),
        ],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/large_bodies.py");
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(script).args(addrs.iter().map(|a| a.port().to_string())).args(&files);
    let (ok, out) = run_client(&mut cmd).await;
    println!("{out}");
    assert!(ok && out.contains("large bodies: ok"), "large-message session failed:\n{out}");
}

/// fetchmail, the POP3 retriever, over implicit TLS, delivering to a command
/// (its MDA): with `uidl` and `keep`, a second run takes nothing it already
/// took; without `keep`, a run takes the rest and deletes what it took, and the
/// maildrop is empty after. Bodies arrive whole, dot-stuffed lines restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetchmail_keeps_then_deletes() {
    let s = setup().await;
    let bob = s.app.store.account_get("bob@example.org").await.expect("get").expect("bob");
    let big: String = (0..4000).map(|i| format!("line {i}\r\n.line starting with a dot {i}\r\n")).collect();
    let raw =
        format!("From: alice@example.com\r\nSubject: big\r\nMessage-ID: <big@example.com>\r\n\r\n{big}");
    deliver(&s.app, &bob, "INBOX", raw.as_bytes(), FlagSet::default()).await;
    let work = tempfile::tempdir().expect("tempdir");
    let out = work.path().join("out");
    std::fs::create_dir(&out).expect("out");
    let rc = work.path().join("fetchmailrc");
    let write_rc = |keep: &str| {
        std::fs::write(
            &rc,
            format!(
                "set no bouncemail\npoll 127.0.0.1 service {} protocol pop3 uidl timeout 30\n  \
                 user \"bob@example.org\" password \"pw\" ssl no sslcertck {keep}\n  \
                 mda \"/bin/sh -c 'cat > $(mktemp {}/msg.XXXXXX)'\"\n",
                s.pop3s.port(),
                out.display()
            ),
        )
        .expect("write rc");
        // fetchmail refuses a run control file others can read.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&rc, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    };
    let run = |expect: i32| {
        let (rc, ids, home) = (rc.clone(), work.path().join("fetchids"), work.path().to_path_buf());
        async move {
            let out = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                tokio::process::Command::new("fetchmail")
                    .env("HOME", &home)
                    .arg("-f")
                    .arg(&rc)
                    .arg("-i")
                    .arg(&ids)
                    .args(["--nosyslog", "--nodetach", "-v"])
                    .output(),
            )
            .await
            .expect("fetchmail within 60 s")
            .expect("fetchmail started");
            let text =
                format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            // 0: mail retrieved; 1: no mail.
            assert_eq!(out.status.code(), Some(expect), "fetchmail:\n{text}");
            text
        }
    };
    let fetched = || -> Vec<String> {
        let mut all: Vec<String> = std::fs::read_dir(&out)
            .expect("out")
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).expect("read"))
            .collect();
        all.sort();
        all
    };

    write_rc("keep");
    run(0).await;
    let first = fetched();
    assert_eq!(first.len(), 3, "{} messages", first.len());
    let whole = first.iter().find(|m| m.contains("Subject: big")).expect("the big one");
    assert!(whole.contains(&big.replace("\r\n", "\n")) || whole.contains(&big), "body intact, dots restored");
    assert!(
        first.iter().any(|m| m.contains("first body")) && first.iter().any(|m| m.contains("second body"))
    );
    // Kept on the server, and known by UIDL: the next run takes nothing.
    let text = run(1).await;
    assert_eq!(fetched().len(), 3, "{text}");
    assert_eq!(s.app.store.mailbox_status(s.inbox).await.expect("status").messages, 3);

    // A new message, then a run that deletes what it takes: only the new one
    // is taken and deleted; then `flush` deletes the old ones too.
    deliver(&s.app, &bob, "INBOX", &sample("fourth", "fourth body"), FlagSet::default()).await;
    write_rc("no keep");
    run(0).await;
    let all = fetched();
    assert_eq!(all.len(), 4);
    assert_eq!(all.iter().filter(|m| m.contains("fourth body")).count(), 1);
    let left = || async { s.app.store.mailbox_status(s.inbox).await.expect("status").messages };
    assert_eq!(left().await, 3, "the one taken is deleted");
    write_rc("no keep flush");
    run(1).await;
    assert_eq!(left().await, 0, "flushed");
    assert_eq!(fetched().len(), 4, "nothing taken twice");
}
