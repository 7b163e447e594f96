//! The operator's `/metrics` and `/healthz` over a real socket.

use std::time::Duration;

use mailcluster_operator::metrics::Metrics;
use mailcluster_operator::runtime::admin_router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn metrics_and_healthz() {
    let metrics = Metrics::new();
    {
        let _t = metrics.start();
        metrics.failed("conflict");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, admin_router(metrics)).await });
    let health = tokio::time::timeout(Duration::from_secs(5), get(addr, "/healthz")).await.unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let body = tokio::time::timeout(Duration::from_secs(5), get(addr, "/metrics")).await.unwrap();
    assert!(body.contains("mailcluster_operator_reconciles_total 1"), "{body}");
    assert!(body.contains("mailcluster_operator_reconcile_failures_total{reason=\"conflict\"} 1"), "{body}");
    assert!(body.contains("mailcluster_operator_reconcile_duration_seconds_count 1"), "{body}");
    server.abort();
}
