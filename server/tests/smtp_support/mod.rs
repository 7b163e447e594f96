//! Shared helpers for the SMTP tests: an App over the real store (SQLite in a temp
//! dir, or PostgreSQL in a fresh database) behind a fault-injecting wrapper, the
//! real in-process cache and Authenticator, sessions driven over an in-memory
//! duplex, and a small SMTP client reading replies.
#![allow(dead_code)]

use mailcluster_server::store::Directory;
use mailcluster_server::store::Mailboxes;
use mailcluster_server::store::Messages;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mailcluster_model::UidSet;
use mailcluster_server::app::App;
use mailcluster_server::cache::Cache;
use mailcluster_server::config::Config;
use mailcluster_server::net::{ConnInfo, Protocol, SessionCtx, SessionStream, Shutdown};
use mailcluster_server::smtp::{SmtpKind, SmtpProtocol};
use mailcluster_server::store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

pub mod faulty;
pub mod sockets;

pub use faulty::FaultyStore;

pub use mailcluster_testkit::{Backend, TestDatabase};

/// Defines one `#[tokio::test]` per backend for an `async fn name(Backend)`:
/// `name::sqlite` and `name::postgres`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::smtp_support::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::smtp_support::Backend::Postgres).await
            }
        }
    )*};
}

pub const PASSWORD: &str = "correct horse battery staple";

pub struct Harness {
    pub app: App,
    pub store: Arc<FaultyStore>,
    pub cache: Arc<dyn Cache>,
    pub mx: Arc<SmtpProtocol>,
    pub submission: Arc<SmtpProtocol>,
    pub shutdown_tx: tokio::sync::watch::Sender<bool>,
    pub shutdown: Shutdown,
    /// The database the store is on: another App on it is another pod.
    pub url: String,
    _pg_db: Option<TestDatabase>,
    _dir: tempfile::TempDir,
}

pub fn config(edit: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config { hostname: "mx.test".into(), ..Config::default() };
    edit(&mut c);
    c
}

/// A fresh database for one test: SQLite in `dir`, or a new PostgreSQL database
/// (dropped with the returned guard). Fails when PostgreSQL is unreachable.
pub async fn fresh_database(backend: Backend, dir: &std::path::Path) -> (String, Option<TestDatabase>) {
    backend.fresh_database(dir, "mc_smtp").await
}

impl Harness {
    pub async fn new(backend: Backend, config: Config) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let (url, pg_db) = fresh_database(backend, dir.path()).await;
        let real = mailcluster_server::store::open(Some(&url), dir.path(), 8, Duration::from_secs(10))
            .await
            .expect("store opens");
        real.migrate().await.expect("migrations");
        real.domain_add("example.test").await.expect("domain");
        let hash = mailcluster_server::auth::hash_password(PASSWORD).expect("hash");
        for user in ["alice@example.test", "bob@example.test"] {
            real.account_create(user, &hash).await.expect("account");
        }
        let store = Arc::new(FaultyStore::new(real));
        let cache: Arc<dyn Cache> = Arc::new(mailcluster_server::cache::local::LocalCache::new());
        let store_dyn: Arc<dyn Store> = store.clone();
        let deliverer = Arc::new(mailcluster_server::delivery::Deliverer::with_options(
            store_dyn.clone(),
            mailcluster_server::smtp::delivery_options(&config.smtp),
        ));
        let metrics = Arc::new(mailcluster_server::metrics::Metrics::new());
        // What `serve` registers at start beside `Metrics` itself.
        deliverer.register_metrics(&metrics.registry).expect("group-commit metrics register");
        let auth = mailcluster_server::auth::Authenticator::new(
            store_dyn.clone(),
            cache.clone(),
            config.auth.clone(),
        );
        let app = App::new(Arc::new(config), store_dyn, cache.clone(), metrics, Arc::new(auth), deliverer);
        let mx = Arc::new(SmtpProtocol::new(app.clone(), SmtpKind::Mx));
        let submission = Arc::new(SmtpProtocol::new(app.clone(), SmtpKind::Submission));
        let (shutdown_tx, shutdown) = Shutdown::new();
        Harness { app, store, cache, mx, submission, shutdown_tx, shutdown, url, _pg_db: pg_db, _dir: dir }
    }

    /// A second pod: its own store connections, cache, group commit and
    /// sessions over the same database (PostgreSQL: shared as pods share it).
    pub async fn peer(&self, config: Config) -> (App, Arc<SmtpProtocol>) {
        let store: Arc<dyn Store> =
            mailcluster_server::store::open(Some(&self.url), self._dir.path(), 8, Duration::from_secs(10))
                .await
                .expect("store opens");
        let cache: Arc<dyn Cache> = Arc::new(mailcluster_server::cache::local::LocalCache::new());
        let deliverer = Arc::new(mailcluster_server::delivery::Deliverer::with_options(
            store.clone(),
            mailcluster_server::smtp::delivery_options(&config.smtp),
        ));
        let metrics = Arc::new(mailcluster_server::metrics::Metrics::new());
        deliverer.register_metrics(&metrics.registry).expect("group-commit metrics register");
        let auth =
            mailcluster_server::auth::Authenticator::new(store.clone(), cache.clone(), config.auth.clone());
        let app = App::new(Arc::new(config), store, cache, metrics, Arc::new(auth), deliverer);
        let mx = Arc::new(SmtpProtocol::new(app.clone(), SmtpKind::Mx));
        (app, mx)
    }

    pub async fn add_account(&self, email: &str) {
        let hash = mailcluster_server::auth::hash_password(PASSWORD).expect("hash");
        self.store.account_create(email, &hash).await.expect("account");
    }

    pub async fn inbox_of(&self, email: &str) -> (i64, i64) {
        let account = self.store.account_get(email).await.expect("lookup").expect("account exists");
        let inbox = self.store.mailbox_get(account.id, "INBOX").await.expect("lookup").expect("INBOX");
        (account.id, inbox.id)
    }

    /// The raw messages in a user's INBOX, in UID order.
    pub async fn messages(&self, email: &str) -> Vec<bytes::Bytes> {
        let (_, inbox) = self.inbox_of(email).await;
        let rows = self.store.messages_by_uid(inbox, &UidSet::all()).await.expect("rows");
        let mut out = Vec::new();
        for row in rows {
            out.push(self.store.message_body(row.message_id).await.expect("body"));
        }
        out
    }

    /// Messages stored in all test users' INBOXes together.
    pub async fn total_messages(&self) -> usize {
        let mut n = 0;
        for user in ["alice@example.test", "bob@example.test"] {
            n += self.messages(user).await.len();
        }
        n
    }

    /// Starts a session on `proto` over an in-memory stream; returns the client end.
    pub fn connect(&self, proto: &Arc<SmtpProtocol>) -> Client {
        self.connect_from(proto, "192.0.2.10:40000".parse().expect("addr"))
    }

    /// A session on `proto` past its greeting and EHLO.
    pub async fn connect_ehlo(&self, proto: &Arc<SmtpProtocol>) -> Client {
        let mut c = self.connect(proto);
        c.ehlo().await;
        c
    }

    pub fn connect_from(&self, proto: &Arc<SmtpProtocol>, remote: SocketAddr) -> Client {
        let (client, server) = tokio::io::duplex(1 << 20);
        let ctx = SessionCtx {
            conn: ConnInfo {
                remote,
                local: "192.0.2.1:25".parse().expect("addr"),
                listener: proto.kind().listener_name(),
            },
            tls: None,
            shutdown: self.shutdown.clone(),
        };
        let proto = proto.clone();
        let task = tokio::spawn(async move { proto.handle(SessionStream::Memory(server), ctx).await });
        Client { io: client, buf: Vec::new(), task: Some(task) }
    }
}

/// A minimal SMTP client over the in-memory stream.
pub struct Client {
    pub io: DuplexStream,
    buf: Vec<u8>,
    pub task: Option<tokio::task::JoinHandle<()>>,
}

pub const STEP: Duration = Duration::from_secs(10);

impl Client {
    pub async fn send(&mut self, data: &str) {
        self.send_bytes(data.as_bytes()).await;
    }

    pub async fn send_bytes(&mut self, data: &[u8]) {
        tokio::time::timeout(STEP, self.io.write_all(data)).await.expect("write in time").expect("write");
    }

    /// Reads one complete (possibly multi-line) reply; returns its lines.
    pub async fn reply(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let line = self.line().await;
            let last = line.len() < 4 || line.as_bytes()[3] != b'-';
            lines.push(line);
            if last {
                return lines;
            }
        }
    }

    /// Reads one reply and checks that its last line starts with `prefix`.
    pub async fn expect(&mut self, prefix: &str) -> Vec<String> {
        let r = self.reply().await;
        let last = r.last().cloned().unwrap_or_default();
        assert!(last.starts_with(prefix), "expected {prefix:?}, got {r:?}");
        r
    }

    /// Sends a command and checks the reply.
    pub async fn cmd(&mut self, line: &str, prefix: &str) -> Vec<String> {
        self.send(&format!("{line}\r\n")).await;
        self.expect(prefix).await
    }

    async fn line(&mut self) -> String {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                return String::from_utf8_lossy(&line[..pos]).into_owned();
            }
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout(STEP, self.io.read(&mut chunk))
                .await
                .expect("reply in time")
                .expect("read");
            assert!(n > 0, "connection closed while waiting for a reply; buffered {:?}", self.buf);
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// One read: what the server has written so far (used to check flush batching).
    pub async fn read_once(&mut self) -> Vec<u8> {
        let mut chunk = vec![0u8; 1 << 16];
        let n =
            tokio::time::timeout(STEP, self.io.read(&mut chunk)).await.expect("read in time").expect("read");
        chunk.truncate(n);
        chunk
    }

    /// Waits for the server to close the connection.
    pub async fn expect_closed(&mut self) {
        let mut chunk = [0u8; 1024];
        loop {
            let n = tokio::time::timeout(STEP, self.io.read(&mut chunk))
                .await
                .expect("close in time")
                .unwrap_or(0);
            if n == 0 {
                break;
            }
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(STEP, t).await.expect("session ends").expect("session task");
        }
    }

    /// MAIL FROM and one RCPT TO, both accepted.
    pub async fn envelope(&mut self, from: &str, to: &str) {
        self.cmd(&format!("MAIL FROM:<{from}>"), "250 2.1.0").await;
        self.cmd(&format!("RCPT TO:<{to}>"), "250 2.1.5").await;
    }

    /// DATA, then `message` (ending in its `.` line), and the reply to it.
    pub async fn data(&mut self, message: &str, prefix: &str) -> Vec<String> {
        self.cmd("DATA", "354 ").await;
        self.send(message).await;
        self.expect(prefix).await
    }

    pub async fn ehlo(&mut self) -> Vec<String> {
        self.expect("220 ").await;
        self.cmd("EHLO client.test", "250 ").await
    }
}
