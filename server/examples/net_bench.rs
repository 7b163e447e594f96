//! Network-layer figures on loopback: concurrent connections held open, and TLS
//! handshakes per second, full and resumed (shared session tickets).
//!
//! `cargo run --release -p mailcluster-server --example net_bench -- [CONNS] [SECS] [WORKERS]`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mailcluster_server::metrics::Metrics;
use mailcluster_server::net::{
    Listener, ListenerSpec, Protocol, SessionCtx, SessionStream, ShutdownController, TlsMode, TlsProvider,
    serve,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Greets, then waits for the client to close (or the drain).
struct Greeter;

#[async_trait::async_trait]
impl Protocol for Greeter {
    fn busy_reply(&self) -> &'static [u8] {
        b"BUSY\r\n"
    }
    async fn handle(&self, mut stream: SessionStream, mut ctx: SessionCtx) {
        if stream.write_all(b"HELLO\r\n").await.is_err() {
            return;
        }
        let mut buf = [0u8; 64];
        tokio::select! {
            _ = stream.read(&mut buf) => {}
            _ = ctx.shutdown.signalled() => {}
        }
    }
}

fn spec(name: &'static str, tls: TlsMode) -> ListenerSpec {
    ListenerSpec {
        name,
        addr: "127.0.0.1:0".parse().expect("addr"),
        tls,
        max_connections: 1_000_000,
        max_connections_per_ip: 0,
        backlog: 4096,
        keepalive: None,
        proxy: None,
    }
}

async fn greeting<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).await.is_ok() && &buf == b"HELLO\r\n"
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

async fn handshakes(
    addr: SocketAddr,
    roots: Arc<rustls::RootCertStore>,
    secs: u64,
    workers: usize,
    resume: bool,
) -> (usize, Vec<Duration>) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let roots = roots.clone();
        tasks.push(tokio::spawn(async move {
            let make = || {
                let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
                if !resume {
                    c.resumption = rustls::client::Resumption::disabled();
                }
                Arc::new(c)
            };
            let shared = make();
            let mut lat = Vec::new();
            let mut resumed = 0usize;
            while Instant::now() < deadline {
                let config = if resume { shared.clone() } else { make() };
                let start = Instant::now();
                let Ok(tcp) = TcpStream::connect(addr).await else { continue };
                let name = ServerName::try_from("localhost").expect("name");
                let Ok(mut tls) = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await else {
                    continue;
                };
                if !greeting(&mut tls).await {
                    continue;
                }
                lat.push(start.elapsed());
                if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                    resumed += 1;
                }
                let _ = tls.shutdown().await;
            }
            (resumed, lat)
        }));
    }
    let mut all = Vec::new();
    let mut resumed = 0;
    for t in tasks {
        let (r, l) = t.await.expect("worker");
        resumed += r;
        all.extend(l);
    }
    all.sort();
    (resumed, all)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let conns: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let workers: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);

    let dir = tempfile::tempdir()?;
    let (cert, key) = mailcluster_server::net::tls::ensure_self_signed(dir.path(), "localhost")?;
    let tls = TlsProvider::from_files(&cert, &key)?;
    let metrics = Arc::new(Metrics::new());
    tls.set_metrics(&metrics);
    let plain = Listener::bind(spec("plain", TlsMode::Plain))?;
    let implicit = Listener::bind(spec("tls", TlsMode::Implicit))?;
    let (plain_addr, tls_addr) = (plain.local_addr()?, implicit.local_addr()?);
    let shutdown = ShutdownController::new(Duration::from_secs(5));
    let proto: Arc<dyn Protocol> = Arc::new(Greeter);
    let server = tokio::spawn(serve(
        vec![(plain, proto.clone()), (implicit, proto)],
        Some(tls),
        metrics.clone(),
        shutdown.clone(),
    ));

    // 1. Concurrent plain connections, each greeted, held open together.
    let start = Instant::now();
    let mut opening = tokio::task::JoinSet::new();
    let per_task = 100;
    for chunk in 0..conns.div_ceil(per_task) {
        let n = per_task.min(conns - chunk * per_task);
        opening.spawn(async move {
            let mut held = Vec::with_capacity(n);
            for _ in 0..n {
                if let Ok(mut s) = TcpStream::connect(plain_addr).await
                    && greeting(&mut s).await
                {
                    held.push(s);
                }
            }
            held
        });
    }
    let mut held = Vec::new();
    while let Some(r) = opening.join_next().await {
        held.extend(r?);
    }
    let took = start.elapsed();
    let active = metrics.connections_active.with_label_values(&["plain"]).get();
    println!(
        "held {} of {conns} plain connections (server gauge {active}) in {:.2}s: {:.0} conn/s",
        held.len(),
        took.as_secs_f64(),
        held.len() as f64 / took.as_secs_f64()
    );
    drop(held);

    // 2. TLS handshakes, full then resumed.
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject as _;
    roots.add(rustls::pki_types::CertificateDer::from_pem_file(&cert)?)?;
    let roots = Arc::new(roots);
    for resume in [false, true] {
        let (resumed, lat) = handshakes(tls_addr, roots.clone(), secs, workers, resume).await;
        println!(
            "TLS {} ({workers} workers, {secs}s): {} handshakes, {:.0}/s, resumed {resumed}, p50 {:.2} ms, p99 {:.2} ms",
            if resume { "resumption on " } else { "full handshakes" },
            lat.len(),
            lat.len() as f64 / secs as f64,
            percentile(&lat, 0.5).as_secs_f64() * 1000.0,
            percentile(&lat, 0.99).as_secs_f64() * 1000.0,
        );
    }

    let start = Instant::now();
    shutdown.trigger();
    server.await?;
    println!("drain took {:.3}s", start.elapsed().as_secs_f64());
    Ok(())
}
