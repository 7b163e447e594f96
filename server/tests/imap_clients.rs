//! Real clients against the real server (net listeners, SQLite store, in-process
//! cache) over TCP and TLS on 127.0.0.1:0: Python's imaplib (implicit TLS,
//! STARTTLS, IDLE on a raw socket) and curl's imap(s)://.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use mailcluster_server::app::App;
use mailcluster_server::imap::ImapProtocol;
use mailcluster_server::net::TlsProvider;
use mailcluster_server::net::listener::TlsMode;

/// Serves `imaps` (implicit TLS) and `imap` with the production listeners on
/// 127.0.0.1:0; returns their addresses.
fn serve(app: App, tls: TlsProvider) -> (SocketAddr, SocketAddr) {
    let addrs = serve_loopback(
        &app,
        tls,
        vec![
            ("imaps", TlsMode::Implicit, Arc::new(ImapProtocol::new(app.clone(), true))),
            ("imap", TlsMode::Plain, Arc::new(ImapProtocol::new(app.clone(), false))),
        ],
    );
    (addrs[0], addrs[1])
}

/// The real embedded store (SQLite in a temporary directory) and in-process cache.
async fn setup() -> (App, SocketAddr, SocketAddr, tempfile::TempDir) {
    let (app, dir) = embedded_app(|_| {}).await;
    bob_with_two_messages(&app).await;
    let (imaps, imap) = serve(app.clone(), tls_provider());
    (app, imaps, imap, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib() {
    let (_app, imaps, imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_session.py");
    let (ok, out) = run_client(tokio::process::Command::new("python3").args([
        script,
        &imaps.port().to_string(),
        &imap.port().to_string(),
    ]))
    .await;
    println!("{out}");
    assert!(ok, "imaplib session failed:\n{out}");
}

/// COMPRESS=DEFLATE (RFC 4978) with a client built on Python's zlib, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_compress_deflate() {
    let (_app, imaps, _imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imap_compress.py");
    let (ok, out) =
        run_client(tokio::process::Command::new("python3").args([script, &imaps.port().to_string()])).await;
    println!("{out}");
    assert!(ok, "compressed session failed:\n{out}");
}

/// CONDSTORE/QRESYNC (RFC 7162) through imaplib, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib_condstore_qresync() {
    let (_app, imaps, _imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_condstore.py");
    let (ok, out) =
        run_client(tokio::process::Command::new("python3").args([script, &imaps.port().to_string()])).await;
    println!("{out}");
    assert!(ok, "imaplib CONDSTORE/QRESYNC session failed:\n{out}");
}

/// QUOTA (RFC 9208) through imaplib, over TLS, with a limit of 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib_quota() {
    let (app, imaps, _imap, _dir) = setup().await;
    let limit = 64 * 1024;
    app.store.account_set_quota("bob@example.org", Some(limit)).await.expect("set quota");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_quota.py");
    let (ok, out) = run_client(tokio::process::Command::new("python3").args([
        script,
        &imaps.port().to_string(),
        &limit.to_string(),
    ]))
    .await;
    println!("{out}");
    assert!(ok, "imaplib QUOTA session failed:\n{out}");
}

/// UTF8=ACCEPT (RFC 9755) through imaplib's UTF-8 mode, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib_utf8_accept() {
    let (_app, imaps, _imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_utf8.py");
    let (ok, out) =
        run_client(tokio::process::Command::new("python3").args([script, &imaps.port().to_string()])).await;
    println!("{out}");
    assert!(ok, "imaplib UTF8=ACCEPT session failed:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_imaps() {
    let (_app, imaps, imap, _dir) = setup().await;
    let base = format!("imaps://127.0.0.1:{}", imaps.port());
    let curl = |url: String, extra: &[&str]| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sSk", "--max-time", "20", "-u", "bob@example.org:pw"]).args(extra).arg(url);
        c
    };
    let (ok, out) = run_client(&mut curl(format!("{base}/"), &[])).await;
    assert!(ok && out.contains("* LIST (\\HasNoChildren) \"/\" \"INBOX\""), "LIST: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/"), &["-X", "EXAMINE INBOX"])).await;
    assert!(ok && out.contains("* 2 EXISTS") && out.contains("* OK [UIDVALIDITY "), "EXAMINE: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/INBOX"), &["-X", "UID SEARCH UNSEEN"])).await;
    assert!(ok && out.contains("* SEARCH 1 2"), "UID SEARCH: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/INBOX;UID=2"), &[])).await;
    assert!(ok && out.contains("Subject: second") && out.contains("second body"), "FETCH: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/INBOX?UNSEEN"), &[])).await;
    assert!(ok && out.contains("* SEARCH 1"), "SEARCH after fetch: {out}");
    // STARTTLS on the plain port.
    let (ok, out) = run_client(&mut curl(
        format!("imap://127.0.0.1:{}/INBOX", imap.port()),
        &["--ssl-reqd", "-X", "UID SEARCH ALL"],
    ))
    .await;
    assert!(ok && out.contains("* SEARCH 1 2"), "STARTTLS: {out}");
}
