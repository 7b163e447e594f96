//! Network layer over real sockets on 127.0.0.1 and real TLS: listeners, limits,
//! PROXY protocol, implicit TLS and STARTTLS, certificate reload, shared session
//! tickets, the SIGTERM drain and the admin endpoints.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mailcluster_model::PoolStats;
use mailcluster_server::admin::{self, AdminState, Backend};
use mailcluster_server::cache::Cache;
use mailcluster_server::cache::local::LocalCache;
use mailcluster_server::metrics::Metrics;
use mailcluster_server::net::tls::{SharedTicketer, ensure_self_signed};
use mailcluster_server::net::{Keepalive, Listener, TLS_HANDSHAKE_TIMEOUT};
use mailcluster_server::net::{
    ListenerSpec, Protocol, SessionCtx, SessionStream, ShutdownController, TlsMode, TlsProvider, serve,
};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Every step of a test is bounded by this.
const STEP: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- test protocol

/// A line protocol: greets with `HELLO <remote> tls=<bool>`, echoes lines, `STARTTLS`
/// upgrades, `QUIT` ends; on shutdown it says `BYE shutting down` (unless told to
/// ignore the signal). Reports `goodbye`, `ended` or `aborted` on `events`.
struct Echo {
    events: mpsc::UnboundedSender<String>,
    ignore_shutdown: bool,
}

/// Sends `aborted` when the session future is dropped before it finished.
struct EndReport {
    events: mpsc::UnboundedSender<String>,
    finished: bool,
}

impl Drop for EndReport {
    fn drop(&mut self) {
        let _ = self.events.send(if self.finished { "ended" } else { "aborted" }.to_string());
    }
}

#[async_trait::async_trait]
impl Protocol for Echo {
    fn busy_reply(&self) -> &'static [u8] {
        b"BUSY try later\r\n"
    }

    async fn handle(&self, stream: SessionStream, mut ctx: SessionCtx) {
        let mut report = EndReport { events: self.events.clone(), finished: false };
        let tls = stream.is_tls();
        let mut io = BufReader::new(stream);
        let hello = format!("HELLO {} tls={tls}\r\n", ctx.conn.remote);
        if io.get_mut().write_all(hello.as_bytes()).await.is_err() {
            report.finished = true;
            return;
        }
        loop {
            let mut line = String::new();
            let read = tokio::select! {
                r = io.read_line(&mut line) => r,
                _ = ctx.shutdown.signalled(), if !self.ignore_shutdown => {
                    let _ = io.get_mut().write_all(b"BYE shutting down\r\n").await;
                    let _ = io.get_mut().shutdown().await;
                    let _ = self.events.send("goodbye".into());
                    report.finished = true;
                    return;
                }
            };
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let cmd = line.trim_end();
            if cmd == "QUIT" {
                let _ = io.get_mut().write_all(b"BYE\r\n").await;
                break;
            } else if cmd == "STARTTLS" {
                let Some(provider) = ctx.tls.clone() else { break };
                if io.get_mut().write_all(b"GO\r\n").await.is_err() {
                    break;
                }
                // Bytes pipelined after STARTTLS are dropped with the buffer.
                match io.into_inner().upgrade(&provider).await {
                    Ok(upgraded) => io = BufReader::new(upgraded),
                    Err(_) => {
                        report.finished = true;
                        return;
                    }
                }
                let hello = format!("HELLO {} tls={}\r\n", ctx.conn.remote, io.get_ref().is_tls());
                if io.get_mut().write_all(hello.as_bytes()).await.is_err() {
                    break;
                }
            } else {
                let reply = format!("ECHO {cmd}\r\n");
                if io.get_mut().write_all(reply.as_bytes()).await.is_err() {
                    break;
                }
            }
        }
        report.finished = true;
    }
}

fn echo(ignore_shutdown: bool) -> (Arc<dyn Protocol>, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Arc::new(Echo { events: tx, ignore_shutdown }), rx)
}

// ---------------------------------------------------------------- harness

fn spec(name: &'static str, tls: TlsMode) -> ListenerSpec {
    ListenerSpec {
        name,
        addr: "127.0.0.1:0".parse().expect("addr"),
        tls,
        max_connections: 100,
        max_connections_per_ip: 0,
        backlog: 128,
        keepalive: Some(Keepalive { idle: Duration::from_secs(30), interval: Duration::from_secs(10) }),
        proxy: None,
    }
}

struct Server {
    addr: SocketAddr,
    shutdown: ShutdownController,
    metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<()>,
}

fn start(
    spec: ListenerSpec,
    protocol: Arc<dyn Protocol>,
    tls: Option<TlsProvider>,
    grace: Duration,
) -> Server {
    let metrics = Arc::new(Metrics::new());
    if let Some(tls) = &tls {
        tls.set_metrics(&metrics);
    }
    let listener = Listener::bind(spec).expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let shutdown = ShutdownController::new(grace);
    let task = tokio::spawn(serve(vec![(listener, protocol)], tls, metrics.clone(), shutdown.clone()));
    Server { addr, shutdown, metrics, task }
}

impl Server {
    async fn stop(self) {
        self.shutdown.trigger();
        tokio::time::timeout(STEP, self.task).await.expect("serve returns").expect("serve task");
    }
}

async fn read_line<S: AsyncRead + Unpin>(io: &mut BufReader<S>) -> String {
    let mut line = String::new();
    tokio::time::timeout(STEP, io.read_line(&mut line)).await.expect("line in time").expect("read line");
    line
}

/// Reads until EOF (or a reset): the server closed the connection.
async fn assert_closed<S: AsyncRead + Unpin>(io: &mut S) {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(STEP, io.read(&mut buf)).await.expect("close in time") {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected close, got {:?}", String::from_utf8_lossy(&buf[..n])),
    }
}

async fn connect(addr: SocketAddr) -> BufReader<TcpStream> {
    BufReader::new(
        tokio::time::timeout(STEP, TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect"),
    )
}

/// Polls `cond` until it holds (bounded).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + STEP;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- TLS helpers

struct CertPair {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

fn new_cert() -> CertPair {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("certificate");
    CertPair { cert_pem: ck.cert.pem(), key_pem: ck.signing_key.serialize_pem(), der: ck.cert.der().clone() }
}

fn write_pair(dir: &Path, pair: &CertPair) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, &pair.cert_pem).expect("write cert");
    std::fs::write(&key, &pair.key_pem).expect("write key");
    (cert, key)
}

fn client_config(trusted: &[&CertificateDer<'static>]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for der in trusted {
        roots.add((*der).clone()).expect("trust anchor");
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

async fn tls_connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> BufReader<ClientTls> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tls_handshake(tcp, config).await
}

async fn tls_handshake(tcp: TcpStream, config: Arc<rustls::ClientConfig>) -> BufReader<ClientTls> {
    let name = ServerName::try_from("localhost").expect("name");
    let tls = tokio::time::timeout(STEP, tokio_rustls::TlsConnector::from(config).connect(name, tcp))
        .await
        .expect("handshake in time")
        .expect("handshake");
    BufReader::new(tls)
}

fn peer_cert(io: &BufReader<ClientTls>) -> CertificateDer<'static> {
    io.get_ref().get_ref().1.peer_certificates().expect("server certificate")[0].clone().into_owned()
}

fn handshakes(metrics: &Metrics, resumed: &str) -> u64 {
    metrics.tls_handshakes_total.with_label_values(&[resumed]).get()
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn plain_session_sees_peer_and_gauge_follows_it() {
    let (proto, _events) = echo(false);
    let server = start(spec("smtp", TlsMode::Plain), proto, None, Duration::from_secs(5));
    let mut c = connect(server.addr).await;
    let local = c.get_ref().local_addr().expect("local");
    assert_eq!(read_line(&mut c).await, format!("HELLO {local} tls=false\r\n"));
    c.get_mut().write_all(b"ping\r\n").await.expect("write");
    assert_eq!(read_line(&mut c).await, "ECHO ping\r\n");
    let gauge = server.metrics.connections_active.with_label_values(&["smtp"]);
    assert_eq!(gauge.get(), 1);
    c.get_mut().write_all(b"QUIT\r\n").await.expect("write");
    assert_eq!(read_line(&mut c).await, "BYE\r\n");
    eventually("gauge back to 0", || gauge.get() == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn dual_stack_listener_reports_ipv4_clients_plainly() {
    let (proto, _events) = echo(false);
    let spec = ListenerSpec { addr: "[::]:0".parse().expect("addr"), ..spec("smtp", TlsMode::Plain) };
    let server = start(spec, proto, None, Duration::from_secs(5));
    let mut c = connect(SocketAddr::from(([127, 0, 0, 1], server.addr.port()))).await;
    let local = c.get_ref().local_addr().expect("local");
    assert_eq!(read_line(&mut c).await, format!("HELLO {local} tls=false\r\n"));
    server.stop().await;
}

#[tokio::test]
async fn implicit_tls_and_failed_handshakes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = new_cert();
    let (cert, key) = write_pair(dir.path(), &pair);
    let tls = TlsProvider::from_files(&cert, &key).expect("provider");
    let (proto, _events) = echo(false);
    let server = start(spec("imaps", TlsMode::Implicit), proto, Some(tls), Duration::from_secs(5));

    let mut c = tls_connect(server.addr, client_config(&[&pair.der])).await;
    assert!(read_line(&mut c).await.ends_with("tls=true\r\n"));
    c.get_mut().write_all(b"x\r\n").await.expect("write");
    assert_eq!(read_line(&mut c).await, "ECHO x\r\n");
    assert_eq!(handshakes(&server.metrics, "false"), 1);

    // A plaintext client on the TLS port: the handshake fails, the connection
    // closes, nothing panics, and the failure is counted.
    let mut plain = connect(server.addr).await;
    plain.get_mut().write_all(b"EHLO not-tls\r\n\r\n").await.expect("write");
    let mut alert = Vec::new();
    let _ = tokio::time::timeout(STEP, plain.read_to_end(&mut alert)).await.expect("closed in time");
    assert!(!String::from_utf8_lossy(&alert).contains("HELLO"), "no session started");
    let failures = server.metrics.tls_handshake_failures_total.with_label_values(&["error"]);
    eventually("failure counted", || failures.get() == 1).await;

    // The TLS client is still served.
    c.get_mut().write_all(b"y\r\n").await.expect("write");
    assert_eq!(read_line(&mut c).await, "ECHO y\r\n");
    server.stop().await;
}

#[tokio::test]
async fn starttls_upgrade_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = new_cert();
    let (cert, key) = write_pair(dir.path(), &pair);
    let tls = TlsProvider::from_files(&cert, &key).expect("provider");
    let (proto, _events) = echo(false);
    let server = start(spec("submission", TlsMode::Plain), proto, Some(tls), Duration::from_secs(5));

    let mut c = connect(server.addr).await;
    assert!(read_line(&mut c).await.ends_with("tls=false\r\n"));
    c.get_mut().write_all(b"STARTTLS\r\n").await.expect("write");
    assert_eq!(read_line(&mut c).await, "GO\r\n");
    let mut t = tls_handshake(c.into_inner(), client_config(&[&pair.der])).await;
    assert!(read_line(&mut t).await.ends_with("tls=true\r\n"));
    t.get_mut().write_all(b"secret\r\n").await.expect("write");
    assert_eq!(read_line(&mut t).await, "ECHO secret\r\n");
    assert_eq!(handshakes(&server.metrics, "false"), 1, "STARTTLS handshakes are counted too");
    server.stop().await;
}

/// Kubernetes-style Secret volume: `cert.pem -> ..data/cert.pem`, `..data -> ..vN`,
/// and an update swaps the `..data` symlink atomically.
fn k8s_secret_write(dir: &Path, version: u32, pair: &CertPair) {
    let v = dir.join(format!("..v{version}"));
    std::fs::create_dir_all(&v).expect("version dir");
    write_pair(&v, pair);
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..v{version}"), &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap");
    for f in ["cert.pem", "key.pem"] {
        let link = dir.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), &link).expect("symlink");
        }
    }
}

#[tokio::test]
async fn certificate_reload_on_file_change_keeps_old_on_bad_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (new_cert(), new_cert());
    k8s_secret_write(dir.path(), 1, &a);
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let tls = TlsProvider::from_files(&cert, &key).expect("provider");
    let reloader = tls.spawn_reload(Duration::from_millis(100));
    let (proto, _events) = echo(false);
    let server = start(spec("imaps", TlsMode::Implicit), proto, Some(tls.clone()), Duration::from_secs(5));
    // A new client config per connection: a resumed session would report the
    // certificate of the session it resumes, not the one now installed.
    let client = || client_config(&[&a.der, &b.der]);

    let first = tls_connect(server.addr, client()).await;
    assert_eq!(peer_cert(&first), a.der);

    k8s_secret_write(dir.path(), 2, &b);
    let deadline = Instant::now() + STEP;
    loop {
        let c = tls_connect(server.addr, client()).await;
        if peer_cert(&c) == b.der {
            break;
        }
        assert!(Instant::now() < deadline, "new certificate never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connection made before the swap is untouched.
    let mut first = first;
    first.get_mut().write_all(b"still\r\n").await.expect("write");
    assert!(read_line(&mut first).await.starts_with("HELLO"));

    // A broken update (key of another certificate) is rejected; B stays in service.
    let c = new_cert();
    let broken = CertPair { cert_pem: c.cert_pem.clone(), key_pem: a.key_pem.clone(), der: c.der.clone() };
    reloader.abort();
    k8s_secret_write(dir.path(), 3, &broken);
    assert!(tls.reload().await.is_err(), "mismatched key is rejected");
    assert!(!tls.reload().await.expect("unchanged files"), "a rejected pair is not retried");
    let after = tls_connect(server.addr, client()).await;
    assert_eq!(peer_cert(&after), b.der);
    // Garbage is rejected too.
    std::fs::write(dir.path().join("..v3/cert.pem"), "not a certificate").expect("write");
    assert!(tls.reload().await.is_err());
    assert_eq!(peer_cert(&tls_connect(server.addr, client()).await), b.der);
    server.stop().await;
}

#[tokio::test]
async fn self_signed_default_is_generated_once_and_valid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = ensure_self_signed(dir.path(), "mail.example.test").expect("generate");
    let pem = std::fs::read(&cert).expect("read");
    let (cert2, _) = ensure_self_signed(dir.path(), "mail.example.test").expect("reuse");
    assert_eq!(std::fs::read(&cert2).expect("read"), pem, "reused on the next start");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&key).expect("meta").permissions().mode() & 0o077, 0);

    use rustls::pki_types::pem::PemObject as _;
    let der = CertificateDer::from_pem_slice(&pem).expect("pem");
    let tls = TlsProvider::from_files(&cert, &key).expect("provider");
    let (proto, _events) = echo(false);
    let server = start(spec("pop3s", TlsMode::Implicit), proto, Some(tls), Duration::from_secs(5));
    for name in ["localhost", "127.0.0.1", "mail.example.test"] {
        let tcp = TcpStream::connect(server.addr).await.expect("connect");
        let sn = ServerName::try_from(name.to_string()).expect("name");
        let mut t = tokio_rustls::TlsConnector::from(client_config(&[&der]))
            .connect(sn, tcp)
            .await
            .unwrap_or_else(|e| panic!("certificate valid for {name}: {e}"));
        let mut line = Vec::new();
        let _ = tokio::time::timeout(STEP, t.read_buf(&mut line)).await;
        assert!(line.starts_with(b"HELLO"));
    }
    server.stop().await;
}

#[tokio::test]
async fn session_tickets_resume_on_another_provider_sharing_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = new_cert();
    let (cert, key) = write_pair(dir.path(), &pair);
    let rotation = Duration::from_secs(3600);
    let ticketer = |secret: u8| {
        let t = SharedTicketer::new(rotation);
        t.install(1, &[secret; 32], None);
        Arc::new(t)
    };
    // Two "pods" sharing the secret, a third with another one.
    let pod_a = TlsProvider::from_files_with_ticketer(&cert, &key, ticketer(1)).expect("a");
    let pod_b = TlsProvider::from_files_with_ticketer(&cert, &key, ticketer(1)).expect("b");
    let pod_c = TlsProvider::from_files_with_ticketer(&cert, &key, ticketer(2)).expect("c");
    let mk = |p: TlsProvider| {
        let (proto, _events) = echo(false);
        start(spec("imaps", TlsMode::Implicit), proto, Some(p), Duration::from_secs(5))
    };
    let (a, b, c) = (mk(pod_a), mk(pod_b), mk(pod_c));

    for (cfg_first, cfg_second, expect_resumed) in [(&a, &b, true), (&a, &c, false)] {
        // A fresh client (own session cache) per case.
        let client = client_config(&[&pair.der]);
        let mut first = tls_connect(cfg_first.addr, client.clone()).await;
        // Reading the greeting also takes in the tickets sent after the handshake.
        assert!(read_line(&mut first).await.starts_with("HELLO"));
        first.get_mut().write_all(b"QUIT\r\n").await.expect("write");
        assert_eq!(read_line(&mut first).await, "BYE\r\n");

        let mut second = tls_connect(cfg_second.addr, client.clone()).await;
        assert!(read_line(&mut second).await.starts_with("HELLO"));
        let kind = second.get_ref().get_ref().1.handshake_kind();
        assert_eq!(kind == Some(rustls::HandshakeKind::Resumed), expect_resumed, "{kind:?}");
    }
    assert_eq!(handshakes(&b.metrics, "true"), 1, "server B counted the resumption");
    assert_eq!(handshakes(&c.metrics, "true"), 0);
    assert_eq!(handshakes(&c.metrics, "false"), 1);
    for s in [a, b, c] {
        s.stop().await;
    }
}

/// Two "pods" built the way `serve` builds them, over one data dir (the generated
/// self-signed certificate) and one cache (the ticket key): a client that got a
/// ticket from the first resumes on the second.
async fn resumes_across_pods(cache_a: Arc<dyn Cache>, cache_b: Arc<dyn Cache>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = mailcluster_server::config::Config {
        data_dir: dir.path().to_path_buf(),
        hostname: "mx.example.test".into(),
        ..Default::default()
    };
    let metrics_a = Metrics::new();
    let pod_a = TlsProvider::from_app_config(&config, cache_a, &metrics_a).await.expect("pod a");
    let metrics_b = Metrics::new();
    let pod_b = TlsProvider::from_app_config(&config, cache_b, &metrics_b).await.expect("pod b");
    assert!(dir.path().join("tls/cert.pem").exists() && dir.path().join("tls/key.pem").exists());
    assert_eq!(metrics_a.tls_handshakes_total.with_label_values(&["true"]).get(), 0, "series exists");

    use rustls::pki_types::pem::PemObject as _;
    let der = CertificateDer::from_pem_file(dir.path().join("tls/cert.pem")).expect("pem");
    let (proto_a, _ea) = echo(false);
    let (proto_b, _eb) = echo(false);
    let a = start(spec("imaps", TlsMode::Implicit), proto_a, Some(pod_a), Duration::from_secs(5));
    let b = start(spec("imaps", TlsMode::Implicit), proto_b, Some(pod_b), Duration::from_secs(5));
    let client = client_config(&[&der]);
    let mut first = tls_connect(a.addr, client.clone()).await;
    assert!(read_line(&mut first).await.starts_with("HELLO"));
    let mut second = tls_connect(b.addr, client).await;
    assert!(read_line(&mut second).await.starts_with("HELLO"));
    assert_eq!(second.get_ref().get_ref().1.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    // Counted where `from_app_config` was told to count.
    assert_eq!(handshakes(&metrics_b, "true"), 1);
    assert_eq!(handshakes(&metrics_a, "false"), 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn tickets_shared_through_the_local_cache() {
    let cache: Arc<dyn Cache> = Arc::new(LocalCache::new());
    resumes_across_pods(cache.clone(), cache).await;
}

/// The cluster case: each pod has its own Redis connection, same key prefix.
#[tokio::test]
async fn tickets_shared_through_redis() {
    let url = mailcluster_testkit::redis_url();
    let prefix = format!("nettest-{}:", std::process::id() as u64 * 1_000_003 + rand_suffix());
    let open = || mailcluster_server::cache::open(Some(&url), &prefix, Duration::from_secs(5));
    let cache_a = open().await.expect("Redis reachable (REDIS_URL)");
    let cache_b = open().await.expect("Redis reachable (REDIS_URL)");
    resumes_across_pods(cache_a, cache_b).await;
    // Leave nothing behind in the shared Redis.
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let key = format!("{prefix}secret:{}", mailcluster_server::net::tls::TICKET_SECRET_NAME);
    let deleted: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await.expect("DEL");
    assert_eq!(deleted, 1, "the ticket key lived in Redis under {key}");
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0)
}

#[tokio::test]
async fn proxy_header_precedes_implicit_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = new_cert();
    let (cert, key) = write_pair(dir.path(), &pair);
    let tls = TlsProvider::from_files(&cert, &key).expect("provider");
    let (proto, _events) = echo(false);
    let spec = ListenerSpec { tls: TlsMode::Implicit, ..proxy_spec("127.0.0.1/32") };
    let server = start(spec, proto, Some(tls), Duration::from_secs(5));
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(b"PROXY TCP6 2001:db8::9 2001:db8::1 40001 993\r\n").await.expect("write");
    let mut t = tls_handshake(tcp, client_config(&[&pair.der])).await;
    assert_eq!(read_line(&mut t).await, "HELLO [2001:db8::9]:40001 tls=true\r\n");
    server.stop().await;
}

fn proxy_spec(trusted: &str) -> ListenerSpec {
    ListenerSpec { proxy: Some(vec![trusted.parse().expect("cidr")]), ..spec("smtp", TlsMode::Plain) }
}

#[tokio::test]
async fn proxy_v1_and_v2_from_trusted_peer_set_the_remote() {
    let (proto, _events) = echo(false);
    let server = start(proxy_spec("127.0.0.0/8"), proto, None, Duration::from_secs(5));

    let mut c = connect(server.addr).await;
    // Header and first protocol line in one segment: the line must survive.
    c.get_mut().write_all(b"PROXY TCP4 203.0.113.5 127.0.0.1 4242 25\r\nfirst\r\n").await.expect("write");
    assert_eq!(read_line(&mut c).await, "HELLO 203.0.113.5:4242 tls=false\r\n");
    assert_eq!(read_line(&mut c).await, "ECHO first\r\n");

    let src: SocketAddr = "[2001:db8::7]:5151".parse().expect("addr");
    let dst: SocketAddr = "[2001:db8::1]:25".parse().expect("addr");
    let mut header = ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Proxy,
        ppp::v2::Protocol::Stream,
        (src, dst),
    )
    .build()
    .expect("v2 header");
    header.extend_from_slice(b"second\r\n");
    let mut c2 = connect(server.addr).await;
    c2.get_mut().write_all(&header).await.expect("write");
    assert_eq!(read_line(&mut c2).await, "HELLO [2001:db8::7]:5151 tls=false\r\n");
    assert_eq!(read_line(&mut c2).await, "ECHO second\r\n");

    // A trusted peer without a header is closed.
    let mut c3 = connect(server.addr).await;
    c3.get_mut().write_all(b"EHLO no-header\r\n").await.expect("write");
    assert_closed(&mut c3).await;
    server.stop().await;
}

#[tokio::test]
async fn proxy_header_from_untrusted_peer_is_refused() {
    let (proto, mut events) = echo(false);
    let server = start(proxy_spec("10.0.0.0/8"), proto, None, Duration::from_secs(5));
    let mut c = connect(server.addr).await;
    c.get_mut().write_all(b"PROXY TCP4 203.0.113.5 127.0.0.1 4242 25\r\n").await.expect("write");
    assert_closed(&mut c).await;
    let refused = server.metrics.connections_refused_total.with_label_values(&["smtp", "proxy"]);
    eventually("refusal counted", || refused.get() == 1).await;
    assert!(events.try_recv().is_err(), "no session was started");
    server.stop().await;
}

#[tokio::test]
async fn connection_cap_refuses_at_once_with_busy_reply() {
    let (proto, _events) = echo(false);
    let spec = ListenerSpec { max_connections: 2, ..spec("imap", TlsMode::Plain) };
    let server = start(spec, proto, None, Duration::from_secs(5));
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = connect(server.addr).await;
        assert!(read_line(&mut c).await.starts_with("HELLO"));
        held.push(c);
    }
    let mut over = connect(server.addr).await;
    assert_eq!(read_line(&mut over).await, "BUSY try later\r\n");
    assert_closed(&mut over).await;

    // A slot frees when a session ends.
    drop(held.pop());
    let deadline = Instant::now() + STEP;
    loop {
        let mut c = connect(server.addr).await;
        let line = read_line(&mut c).await;
        if line.starts_with("HELLO") {
            break;
        }
        assert_eq!(line, "BUSY try later\r\n");
        assert!(Instant::now() < deadline, "slot never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn per_ip_cap_counts_the_proxied_client() {
    let (proto, _events) = echo(false);
    let spec = ListenerSpec { max_connections_per_ip: 1, ..proxy_spec("127.0.0.0/8") };
    let server = start(spec, proto, None, Duration::from_secs(5));
    let open = |ip: &'static str| async move {
        let mut c = connect(server.addr).await;
        c.get_mut()
            .write_all(format!("PROXY TCP4 {ip} 127.0.0.1 1000 25\r\n").as_bytes())
            .await
            .expect("write");
        let line = read_line(&mut c).await;
        (c, line)
    };
    let (_first, line) = open("192.0.2.1").await;
    assert!(line.starts_with("HELLO 192.0.2.1:1000"));
    let (mut second, line) = open("192.0.2.1").await;
    assert_eq!(line, "BUSY try later\r\n");
    assert_closed(&mut second).await;
    let (_other, line) = open("192.0.2.2").await;
    assert!(line.starts_with("HELLO 192.0.2.2:1000"), "another client IP is not affected");
    let refused =
        server.metrics.connections_refused_total.with_label_values(&["smtp", "max_connections_per_ip"]);
    assert_eq!(refused.get(), 1);
    server.stop().await;
}

#[tokio::test]
async fn drain_signals_sessions_and_stops_accepting() {
    let (proto, mut events) = echo(false);
    let server = start(spec("pop3", TlsMode::Plain), proto, None, Duration::from_secs(5));
    let addr = server.addr;
    let mut c = connect(addr).await;
    assert!(read_line(&mut c).await.starts_with("HELLO"));

    let started = Instant::now();
    server.shutdown.trigger();
    assert!(server.shutdown.is_draining());
    assert_eq!(read_line(&mut c).await, "BYE shutting down\r\n");
    assert_closed(&mut c).await;
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("returns within grace")
        .expect("task");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(events.recv().await.as_deref(), Some("goodbye"));
    assert_eq!(events.recv().await.as_deref(), Some("ended"));
    assert!(TcpStream::connect(addr).await.is_err(), "listening socket closed");
}

/// Connections the kernel completed before the drain but the server had not yet
/// accepted are answered with the protocol's goodbye, not reset when the
/// listening socket closes. The test runtime has one thread: the accept loop
/// cannot run between these blocking connects and the trigger, so all of them
/// are still in the backlog when the drain starts.
#[tokio::test]
async fn connections_in_the_backlog_at_the_drain_get_the_goodbye() {
    let (proto, _events) = echo(false);
    let server = start(spec("smtp", TlsMode::Plain), proto, None, Duration::from_secs(5));
    let queued: Vec<std::net::TcpStream> =
        (0..5).map(|_| std::net::TcpStream::connect(server.addr).expect("connect")).collect();
    server.shutdown.trigger();
    for tcp in queued {
        tcp.set_nonblocking(true).expect("nonblocking");
        let mut c = BufReader::new(TcpStream::from_std(tcp).expect("tokio stream"));
        assert!(read_line(&mut c).await.starts_with("HELLO"));
        assert_eq!(read_line(&mut c).await, "BYE shutting down\r\n");
        assert_closed(&mut c).await;
    }
    tokio::time::timeout(STEP, server.task).await.expect("serve returns").expect("task");
    assert!(TcpStream::connect(server.addr).await.is_err(), "listening socket closed");
}

#[tokio::test]
async fn session_ignoring_the_signal_is_aborted_after_grace() {
    let (proto, mut events) = echo(true);
    let grace = Duration::from_millis(300);
    let server = start(spec("imap", TlsMode::Plain), proto, None, grace);
    let mut c = connect(server.addr).await;
    assert!(read_line(&mut c).await.starts_with("HELLO"));
    let started = Instant::now();
    server.shutdown.trigger();
    tokio::time::timeout(STEP, server.task).await.expect("serve returns").expect("task");
    let took = started.elapsed();
    assert!(took >= grace && took < grace + Duration::from_secs(3), "{took:?}");
    assert_eq!(events.recv().await.as_deref(), Some("aborted"));
    assert_closed(&mut c).await;
    assert_eq!(server.metrics.connections_active.with_label_values(&["imap"]).get(), 0);
}

#[tokio::test]
async fn silent_client_on_implicit_tls_is_timed_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), &new_cert());
    let tls = TlsProvider::from_files(&cert, &key).expect("provider");
    assert_eq!(tls.handshake_timeout(), TLS_HANDSHAKE_TIMEOUT);
    tls.set_handshake_timeout(Duration::from_millis(300));
    let (proto, _events) = echo(false);
    let server = start(spec("imaps", TlsMode::Implicit), proto, Some(tls), Duration::from_secs(5));
    let started = Instant::now();
    let mut c = connect(server.addr).await;
    assert_closed(&mut c).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    let timeouts = server.metrics.tls_handshake_failures_total.with_label_values(&["timeout"]);
    eventually("timeout counted", || timeouts.get() == 1).await;
    assert_eq!(server.metrics.connections_active.with_label_values(&["imaps"]).get(), 0);
    server.stop().await;
}

// ---------------------------------------------------------------- admin

/// A backend whose ping result the test controls.
struct FakeBackend {
    name: &'static str,
    fail: Mutex<Option<String>>,
    stats: PoolStats,
}

#[async_trait::async_trait]
impl Backend for FakeBackend {
    fn describe(&self) -> String {
        self.name.to_string()
    }
    async fn ping(&self) -> Result<(), String> {
        match self.fail.lock().expect("lock").clone() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
    fn pool_stats(&self) -> PoolStats {
        self.stats
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(STEP, tcp.read_to_end(&mut buf)).await.expect("response in time").expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn admin_endpoints() {
    let store = Arc::new(FakeBackend {
        name: "store (test)",
        fail: Mutex::new(None),
        stats: PoolStats { max: 10, idle: 4, in_use: 6 },
    });
    let cache = Arc::new(FakeBackend {
        name: "cache (test)",
        fail: Mutex::new(None),
        stats: PoolStats { max: 8, idle: 1, in_use: 7 },
    });
    let metrics = Arc::new(Metrics::new());
    let shutdown = ShutdownController::new(Duration::from_secs(1));
    let state = AdminState {
        store: store.clone(),
        cache: cache.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        saturation: Arc::new(admin::SaturationWindow::new(admin::SATURATION_WINDOW)),
    };
    let listener = admin::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(admin::serve_admin(listener, state, async move {
        let _ = stop_rx.await;
    }));

    // Labelled families only show once they have a child; touch them the way the
    // sessions do, so the check covers that they are registered where /metrics reads.
    metrics.connections_active.with_label_values(&["smtp"]).set(3);
    metrics.command_duration.with_label_values(&["smtp", "EHLO"]).observe(0.001);
    metrics.commands_total.with_label_values(&["smtp", "EHLO", "ok"]).inc();
    metrics.deliveries_total.with_label_values(&["ok"]).inc();
    metrics.tls_handshakes_total.with_label_values(&["true"]).inc();
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "mail_connections_active{protocol=\"smtp\"} 3",
        "mail_db_pool_connections{state=\"idle\"} 4",
        "mail_db_pool_connections{state=\"in_use\"} 6",
        "mail_db_pool_max 10",
        "mail_cache_pool_connections{state=\"in_use\"} 7",
        "mail_pool_saturation 0.875",
        "mail_command_duration_seconds_bucket{command=\"EHLO\",protocol=\"smtp\",le=\"0.001\"} 1",
        "mail_commands_total{command=\"EHLO\",protocol=\"smtp\",result=\"ok\"} 1",
        "mail_deliveries_total{result=\"ok\"} 1",
        "# TYPE mail_db_pool_acquire_seconds histogram",
        "mail_tls_handshakes_total{resumed=\"true\"} 1",
    ] {
        assert!(body.contains(name), "missing {name:?} in\n{body}");
    }

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(http_get(addr, "/readyz").await, (200, "ready\n".to_string()));

    // What Prometheus and kubelet-style probes see, through a real HTTP client.
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "-D", "-", &format!("http://{addr}/metrics")])
        .output()
        .await
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{text}");
    assert!(text.contains("mail_pool_saturation 0.875"));

    *store.fail.lock().expect("lock") = Some("connection\nrefused".into());
    assert_eq!(http_get(addr, "/readyz").await, (503, "store (test): connection refused\n".to_string()));
    *store.fail.lock().expect("lock") = None;
    assert_eq!(http_get(addr, "/healthz").await, (200, "ok\ncache (test): up\n".to_string()));
    // The cache down: the pod stays ready (its stand-ins serve); liveness says why.
    *cache.fail.lock().expect("lock") = Some("connection\nrefused".into());
    assert_eq!(http_get(addr, "/readyz").await, (200, "ready\n".to_string()));
    assert_eq!(
        http_get(addr, "/healthz").await,
        (200, "ok\ncache (test): down: connection refused\n".to_string())
    );
    *cache.fail.lock().expect("lock") = None;
    assert_eq!(http_get(addr, "/readyz").await.0, 200);

    shutdown.trigger();
    assert_eq!(http_get(addr, "/readyz").await, (503, "draining\n".to_string()));
    assert_eq!(http_get(addr, "/healthz").await.0, 200, "alive while draining");

    let _ = stop_tx.send(());
    tokio::time::timeout(STEP, task).await.expect("admin stops").expect("task").expect("serve ok");
}

/// The admin server over the real embedded store (SQLite) and in-process cache.
#[tokio::test]
async fn admin_over_real_embedded_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        mailcluster_server::store::open(None, dir.path(), 3, Duration::from_secs(5)).await.expect("sqlite");
    store.migrate().await.expect("migrate");
    let cache: Arc<dyn Cache> = Arc::new(LocalCache::new());
    let metrics = Arc::new(Metrics::new());
    let shutdown = ShutdownController::new(Duration::from_secs(1));
    let state = AdminState::new(store.clone(), cache, metrics.clone(), shutdown.clone());
    let listener = admin::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(admin::serve_admin(listener, state, async move {
        let _ = stop_rx.await;
    }));
    assert_eq!(http_get(addr, "/readyz").await, (200, "ready\n".to_string()));
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let max = store.pool_stats().max;
    assert!(body.contains(&format!("mail_db_pool_max {max}")), "{body}");
    assert!(body.contains("mail_db_pool_connections{state=\"idle\"}"), "{body}");
    assert!(body.contains("mail_pool_saturation "), "{body}");
    shutdown.trigger();
    assert_eq!(http_get(addr, "/readyz").await.0, 503);
    let _ = stop_tx.send(());
    tokio::time::timeout(STEP, task).await.expect("admin stops").expect("task").expect("serve ok");
}
