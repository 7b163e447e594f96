//! Real clients against the real server (net listeners, SQLite store, in-process
//! cache) over TCP and TLS on 127.0.0.1:0: Python's imaplib (implicit TLS,
//! STARTTLS, IDLE on a raw socket) and curl's imap(s)://.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mailcluster_server::app::App;
use mailcluster_server::cache::local::LocalCache;
use mailcluster_server::imap::ImapProtocol;
use mailcluster_server::net::listener::{Listener, ListenerSpec, TlsMode};
use mailcluster_server::net::server::{self, ShutdownController};
use mailcluster_server::net::{Protocol, TlsProvider};
use mailcluster_server::store::{self, FlagSet};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

fn tls_provider() -> TlsProvider {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let cert = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .expect("server config");
    TlsProvider::from_config(Arc::new(config))
}

/// Serves `imaps` (implicit TLS) and `imap` (STARTTLS) with the production
/// listeners of `net` on 127.0.0.1:0; returns their addresses.
async fn serve(app: App, tls: TlsProvider) -> (SocketAddr, SocketAddr) {
    let spec = |name: &'static str, mode: TlsMode| {
        let mut s = ListenerSpec::from_config(name, 0, mode, &app.config);
        s.addr = "127.0.0.1:0".parse().expect("addr");
        s
    };
    let imaps = Listener::bind(spec("imaps", TlsMode::Implicit)).expect("bind imaps");
    let imap = Listener::bind(spec("imap", TlsMode::Plain)).expect("bind imap");
    let addrs = (imaps.local_addr().expect("addr"), imap.local_addr().expect("addr"));
    let listeners: Vec<(Listener, Arc<dyn Protocol>)> = vec![
        (imaps, Arc::new(ImapProtocol::new(app.clone(), true))),
        (imap, Arc::new(ImapProtocol::new(app.clone(), false))),
    ];
    let shutdown = ShutdownController::new(Duration::from_secs(1));
    tokio::spawn(server::serve(listeners, Some(tls), app.metrics.clone(), shutdown));
    addrs
}

/// The real embedded store (SQLite in a temporary directory) and in-process cache.
async fn setup() -> (App, SocketAddr, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store::open(None, dir.path(), 4, Duration::from_secs(5)).await.expect("open store");
    store.migrate().await.expect("migrate");
    store.domain_add("example.org").await.expect("domain");
    let app = app_with(store, Arc::new(LocalCache::new()), false);
    let bob = account(&app, "bob@example.org", "pw").await;
    deliver(&app, &bob, "INBOX", &sample("first", "first body"), FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &sample("second", "second body"), FlagSet::default()).await;
    let (imaps, imap) = serve(app.clone(), tls_provider()).await;
    (app, imaps, imap, dir)
}

async fn run(cmd: &mut tokio::process::Command) -> (bool, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("client finished within 60 s")
        .expect("client started");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib() {
    let (_app, imaps, imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_session.py");
    let (ok, out) = run(tokio::process::Command::new("python3").args([
        script,
        &imaps.port().to_string(),
        &imap.port().to_string(),
    ]))
    .await;
    println!("{out}");
    assert!(ok, "imaplib session failed:\n{out}");
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
    let (ok, out) = run(&mut curl(format!("{base}/"), &[])).await;
    assert!(ok && out.contains("* LIST (\\HasNoChildren) \"/\" \"INBOX\""), "LIST: {out}");
    let (ok, out) = run(&mut curl(format!("{base}/"), &["-X", "EXAMINE INBOX"])).await;
    assert!(ok && out.contains("* 2 EXISTS") && out.contains("* OK [UIDVALIDITY "), "EXAMINE: {out}");
    let (ok, out) = run(&mut curl(format!("{base}/INBOX"), &["-X", "UID SEARCH UNSEEN"])).await;
    assert!(ok && out.contains("* SEARCH 1 2"), "UID SEARCH: {out}");
    let (ok, out) = run(&mut curl(format!("{base}/INBOX;UID=2"), &[])).await;
    assert!(ok && out.contains("Subject: second") && out.contains("second body"), "FETCH: {out}");
    let (ok, out) = run(&mut curl(format!("{base}/INBOX?UNSEEN"), &[])).await;
    assert!(ok && out.contains("* SEARCH 1"), "SEARCH after fetch: {out}");
    // STARTTLS on the plain port.
    let (ok, out) = run(&mut curl(
        format!("imap://127.0.0.1:{}/INBOX", imap.port()),
        &["--ssl-reqd", "-X", "UID SEARCH ALL"],
    ))
    .await;
    assert!(ok && out.contains("* SEARCH 1 2"), "STARTTLS: {out}");
}
