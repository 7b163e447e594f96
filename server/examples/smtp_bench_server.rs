//! A stand-alone SMTP MX over the real store, for bench/smtp.sh: creates the
//! domain and users the benchmark sends to, then serves until killed.
//!
//! Usage: smtp_bench_server <database-url> <port> [users] [domain]
//! Prints the Prometheus text of the SMTP metrics to stderr on SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use mailcluster_server::net::{ConnInfo, Protocol, SessionCtx, SessionStream, Shutdown};
use mailcluster_server::smtp::{SmtpKind, SmtpProtocol};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).cloned().unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let port: u16 = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(12525);
    let users: usize = args.get(3).and_then(|p| p.parse().ok()).unwrap_or(1000);
    let domain = args.get(4).cloned().unwrap_or_else(|| "example.test".into());

    let store =
        mailcluster_server::store::open(Some(&url), &std::env::temp_dir(), 32, Duration::from_secs(5))
            .await?;
    store.migrate().await?;
    if !store.domain_exists(&domain).await? {
        store.domain_add(&domain).await?;
    }
    for i in 1..=users {
        let email = format!("user{i:04}@{domain}");
        if store.account_get(&email).await?.is_none() {
            store.account_create(&email, "x").await?;
        }
    }
    let cache: Arc<dyn mailcluster_server::cache::Cache> =
        Arc::new(mailcluster_server::cache::local::LocalCache::new());
    let mut config =
        mailcluster_server::config::Config { hostname: "bench.test".into(), ..Default::default() };
    config.smtp.max_connections_per_ip = 0;
    if let Ok(ms) = std::env::var("GROUP_COMMIT_WAIT_MS") {
        config.smtp.group_commit_max_wait_ms = ms.parse()?;
    }
    if let Ok(n) = std::env::var("GROUP_COMMIT_MAX_CONCURRENT") {
        config.smtp.group_commit_max_concurrent = n.parse()?;
    }
    let deliverer = Arc::new(mailcluster_server::delivery::Deliverer::with_options(
        store.clone(),
        mailcluster_server::smtp::delivery_options(&config.smtp),
    ));
    let metrics = Arc::new(mailcluster_server::metrics::Metrics::new());
    let auth = Arc::new(mailcluster_server::auth::Authenticator::new(
        store.clone(),
        cache.clone(),
        Default::default(),
    ));
    let app =
        mailcluster_server::app::App::new(Arc::new(config), store, cache, metrics.clone(), auth, deliverer);
    let proto = Arc::new(SmtpProtocol::new(app, SmtpKind::Mx));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    eprintln!("listening on {addr}");
    let (_tx, shutdown) = Shutdown::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, remote)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let proto = proto.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let ctx = SessionCtx { conn: ConnInfo { remote, local: addr, listener: "smtp" }, tls: None, shutdown };
                    proto.handle(SessionStream::Plain(tcp), ctx).await;
                });
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    let mut out = Vec::new();
    prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &metrics.registry.gather(), &mut out)?;
    eprintln!("{}", String::from_utf8_lossy(&out));
    Ok(())
}
