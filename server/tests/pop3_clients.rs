//! Real clients against the real POP3 listeners (net layer, SQLite store,
//! in-process cache) over TCP and TLS on 127.0.0.1:0: Python's poplib (STLS and
//! implicit TLS) and curl's pop3(s)://.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use mailcluster_server::app::App;
use mailcluster_server::net::TlsProvider;
use mailcluster_server::net::listener::TlsMode;
use mailcluster_server::pop3::Pop3Protocol;
use mailcluster_server::store::{Flags, UidSet};

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
