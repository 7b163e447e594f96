//! Shared helpers for IMAP session tests: an App over a given store, an in-memory
//! or TCP client that speaks line by line, and message fixtures.
#![allow(dead_code)]

pub mod gated;
pub mod mem;

use std::sync::Arc;
use std::time::Duration;

use mailcluster_model::message::parse_meta;
use mailcluster_model::{Account, FlagSet, NewDelivery};
use mailcluster_server::app::App;
use mailcluster_server::auth::Authenticator;
use mailcluster_server::cache::Cache;
use mailcluster_server::config::Config;
use mailcluster_server::delivery::{Deliverer, DeliveryOptions};
use mailcluster_server::imap::ImapProtocol;
use mailcluster_server::metrics::Metrics;
use mailcluster_server::net::listener::{Listener, ListenerSpec, TlsMode};
use mailcluster_server::net::server::ShutdownController;
use mailcluster_server::net::{ConnInfo, Protocol, SessionCtx, SessionStream, Shutdown, TlsProvider};
use mailcluster_server::store::Store;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// An argon2id hash with tiny parameters (8 KiB, one pass): verification cost is
/// irrelevant here, debug builds would otherwise spend seconds per login, and
/// verification reads the parameters from the hash, so the windowed rate-limit
/// tests do not depend on how fast this (shared, loaded) machine hashes.
pub fn cheap_hash(password: &str) -> String {
    use argon2::PasswordHasher as _;
    let params = argon2::Params::new(8, 1, 1, None).expect("params");
    argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
        .hash_password(password.as_bytes())
        .expect("hash")
        .to_string()
}

pub fn app_with(store: Arc<dyn Store>, cache: Arc<dyn Cache>, plaintext_auth: bool) -> App {
    app_configured(store, cache, |c| c.tls.allow_plaintext_auth = plaintext_auth)
}

pub fn app_configured(store: Arc<dyn Store>, cache: Arc<dyn Cache>, tweak: impl FnOnce(&mut Config)) -> App {
    app_delivering(store, cache, DeliveryOptions::default(), tweak)
}

/// [`app_configured`] with its group commit tuned by `delivery`.
pub fn app_delivering(
    store: Arc<dyn Store>,
    cache: Arc<dyn Cache>,
    delivery: DeliveryOptions,
    tweak: impl FnOnce(&mut Config),
) -> App {
    let mut config = Config::default();
    config.imap.max_literal_bytes = 1024 * 1024;
    tweak(&mut config);
    let auth = Arc::new(Authenticator::new(store.clone(), cache.clone(), Default::default()));
    let deliverer = Arc::new(Deliverer::with_options(store.clone(), delivery));
    App::new(Arc::new(config), store, cache, Arc::new(Metrics::new()), auth, deliverer)
}

pub async fn account(app: &App, email: &str, password: &str) -> Account {
    app.store.account_create(email, &cheap_hash(password)).await.expect("account")
}

pub fn sample(subject: &str, body: &str) -> Vec<u8> {
    format!(
        "From: Alice <alice@example.com>\r\nTo: bob@example.org\r\nSubject: {subject}\r\nDate: Tue, 1 Jul 2003 10:52:37 +0200\r\nMessage-ID: <{subject}@example.com>\r\n\r\n{body}\r\n"
    )
    .into_bytes()
}

/// Delivers `raw` into the account's mailbox `name`; returns the UID.
pub async fn deliver(app: &App, account: &Account, name: &str, raw: &[u8], flags: FlagSet) -> u32 {
    let mb = app.store.mailbox_get(account.id, name).await.expect("get").expect("mailbox");
    let d = NewDelivery {
        raw: bytes::Bytes::copy_from_slice(raw),
        meta: parse_meta(raw),
        internal_date: chrono::Utc::now(),
        targets: vec![mb.id],
        flags,
    };
    let out = app.store.deliver_batch(&[d]).await.expect("deliver");
    out[0][0].uid
}

pub struct Client<S> {
    pub io: BufReader<S>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    pub fn new(s: S) -> Self {
        Client { io: BufReader::new(s) }
    }

    pub async fn send(&mut self, data: &str) {
        self.send_bytes(data.as_bytes()).await;
    }

    pub async fn send_bytes(&mut self, data: &[u8]) {
        self.io.get_mut().write_all(data).await.expect("write");
        self.io.get_mut().flush().await.expect("flush");
    }

    /// One response line (CRLF stripped); literals arrive as further lines.
    pub async fn line(&mut self) -> String {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(10), self.io.read_until(b'\n', &mut buf))
            .await
            .expect("response within 10 s")
            .expect("read");
        assert!(n > 0, "connection closed");
        let s = String::from_utf8_lossy(&buf).into_owned();
        s.trim_end_matches(['\r', '\n']).to_string()
    }

    /// Reads until the tagged response of `tag`; all lines, tagged one last.
    pub async fn until_tag(&mut self, tag: &str) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let l = self.line().await;
            let done = l.starts_with(&format!("{tag} "));
            lines.push(l);
            if done {
                return lines;
            }
        }
    }

    /// Sends `tag command` and returns the response lines.
    pub async fn cmd(&mut self, tag: &str, command: &str) -> Vec<String> {
        self.send(&format!("{tag} {command}\r\n")).await;
        self.until_tag(tag).await
    }

    /// True when the peer closed (EOF within 5 s).
    pub async fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.io.read_to_end(&mut rest)).await,
            Ok(Ok(_))
        )
    }
}

pub fn ctx(shutdown: Shutdown) -> SessionCtx {
    SessionCtx {
        conn: ConnInfo {
            remote: "127.0.0.1:40000".parse().expect("addr"),
            local: "127.0.0.1:10143".parse().expect("addr"),
            listener: "imap",
        },
        tls: None,
        shutdown,
    }
}

/// Starts a session over an in-memory stream; returns the client side and the
/// shutdown trigger.
pub fn connect(app: &App) -> (Client<tokio::io::DuplexStream>, tokio::sync::watch::Sender<bool>) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (tx, shutdown) = Shutdown::new();
    let proto = ImapProtocol::new(app.clone(), false);
    tokio::spawn(async move { proto.handle(SessionStream::Memory(server), ctx(shutdown)).await });
    (Client::new(client), tx)
}

/// Connects and logs in; the greeting and login responses are checked.
pub async fn login(
    app: &App,
    user: &str,
    password: &str,
) -> (Client<tokio::io::DuplexStream>, tokio::sync::watch::Sender<bool>) {
    let (mut c, tx) = connect(app);
    let greeting = c.line().await;
    assert!(greeting.starts_with("* OK [CAPABILITY IMAP4rev1"), "{greeting}");
    let r = c.cmd("L1", &format!("LOGIN {user} {password}")).await;
    assert!(r.last().expect("tagged").starts_with("L1 OK"), "{r:?}");
    (c, tx)
}

/// A TLS provider with a fresh self-signed certificate for "localhost".
pub fn tls_provider() -> TlsProvider {
    tls_provider_with_pem().0
}

/// [`tls_provider`] and its certificate in PEM, for clients told to trust it.
pub fn tls_provider_with_pem() -> (TlsProvider, String) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let pem = ck.cert.pem();
    let cert = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .expect("server config");
    (TlsProvider::from_config(Arc::new(config)), pem)
}

/// Serves each (listener name, TLS mode, protocol) with the production listeners
/// of `net` on 127.0.0.1:0; returns their addresses in the same order.
pub fn serve_loopback(
    app: &App,
    tls: TlsProvider,
    listeners: Vec<(&'static str, TlsMode, Arc<dyn Protocol>)>,
) -> Vec<std::net::SocketAddr> {
    let mut addrs = Vec::new();
    let mut bound = Vec::new();
    for (name, mode, protocol) in listeners {
        let mut spec = ListenerSpec::from_config(name, 0, mode, &app.config);
        spec.addr = "127.0.0.1:0".parse().expect("addr");
        let listener = Listener::bind(spec).expect("bind");
        addrs.push(listener.local_addr().expect("addr"));
        bound.push((listener, protocol));
    }
    let shutdown = ShutdownController::new(Duration::from_secs(1));
    tokio::spawn(mailcluster_server::net::server::serve(bound, Some(tls), app.metrics.clone(), shutdown));
    addrs
}

/// Runs a client program (bounded to 60 s); returns success and stdout+stderr.
pub async fn run_client(cmd: &mut tokio::process::Command) -> (bool, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("client finished within 60 s")
        .expect("client started");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The embedded store: SQLite in a temporary directory (kept alive by the returned
/// guard), migrated, with the domains example.org and example.com.
pub async fn sqlite_store() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = mailcluster_server::store::open(None, dir.path(), 4, Duration::from_secs(5))
        .await
        .expect("open store");
    store.migrate().await.expect("migrate");
    for domain in ["example.org", "example.com"] {
        store.domain_add(domain).await.expect("domain");
    }
    (store, dir)
}

/// The embedded default: [`sqlite_store`] and the in-process cache.
pub async fn embedded_app(tweak: impl FnOnce(&mut Config)) -> (App, tempfile::TempDir) {
    let (store, dir) = sqlite_store().await;
    let cache = Arc::new(mailcluster_server::cache::local::LocalCache::new());
    (app_configured(store, cache, tweak), dir)
}

/// [`embedded_app`] taking plaintext logins, with bob@example.org (password "pw").
pub async fn embedded_app_with_bob() -> (App, tempfile::TempDir, Account) {
    let (app, dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    let bob = account(&app, "bob@example.org", "pw").await;
    (app, dir, bob)
}

/// One pod of a PostgreSQL database (`url`): its own store pool and its own Redis
/// connection under `prefix` (plaintext logins allowed).
#[allow(dead_code)] // not every test binary runs over PostgreSQL
pub async fn pg_pod(url: &str, prefix: &str, dir: &std::path::Path) -> App {
    let connect = Duration::from_secs(10);
    let store = mailcluster_server::store::open(Some(url), dir, 4, connect).await.expect("open pg");
    store.migrate().await.expect("migrate");
    let cache = mailcluster_server::cache::redis::RedisCache::connect(
        &mailcluster_testkit::redis_url(),
        prefix,
        connect,
        mailcluster_server::config::RedisConfig::default().client_cache_keys,
    )
    .await
    .expect("Redis is reachable");
    app_with(store, Arc::new(cache), true)
}

/// bob@example.org (password "pw") with "first" and "second" in his INBOX, as the
/// real-client scripts expect.
pub async fn bob_with_two_messages(app: &App) -> Account {
    let bob = account(app, "bob@example.org", "pw").await;
    deliver(app, &bob, "INBOX", &sample("first", "first body"), FlagSet::default()).await;
    deliver(app, &bob, "INBOX", &sample("second", "second body"), FlagSet::default()).await;
    bob
}

/// Runs `clients/imap_consistency.py` (many sessions on bob@example.org's
/// INBOX, each checking the server's answers against the others' commands,
/// while a sender per SMTP port delivers to him and a client per POP3 port
/// reads and deletes) over the given plain IMAP ports for MAILCLUSTER_CONSISTENCY_SECS seconds
/// (default 8), seed MAILCLUSTER_CONSISTENCY_SEED (default random, printed),
/// MAILCLUSTER_CONSISTENCY_CLIENTS sessions (default 6).
#[allow(dead_code)] // not every test binary serves IMAP over TCP
pub async fn imap_consistency(ports: &[u16], smtp_ports: &[u16], pop3_ports: &[u16]) {
    let secs = std::env::var("MAILCLUSTER_CONSISTENCY_SECS").unwrap_or_else(|_| "8".into());
    let seed = std::env::var("MAILCLUSTER_CONSISTENCY_SEED")
        .unwrap_or_else(|_| (rand::random::<u32>() % 1_000_000).to_string());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imap_consistency.py");
    let mut cmd = tokio::process::Command::new("python3");
    cmd.args([script, &secs, &seed, "bob@example.org", "pw"]);
    cmd.args(ports.iter().map(u16::to_string));
    cmd.args(smtp_ports.iter().map(|p| format!("smtp={p}")));
    cmd.args(pop3_ports.iter().map(|p| format!("pop3={p}")));
    let (ok, out) = run_client(&mut cmd).await;
    println!("{out}");
    assert!(ok, "sessions disagreed (MAILCLUSTER_CONSISTENCY_SEED={seed}):\n{out}");
}
