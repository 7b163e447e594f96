//! Admin HTTP: `/metrics`, `/healthz`, `/readyz`, on their own port.
//!
//! - `/metrics`: Prometheus text of `Metrics::registry`. Pool gauges are sampled from
//!   the store and cache at scrape time rather than by a timer, so they are exactly
//!   as fresh as the scrape and cost nothing between scrapes.
//! - `/healthz`: 200 while the process can answer HTTP at all (liveness); its body
//!   says whether the cache answers (`cache (redis): up` or `… down: reason`).
//! - `/readyz`: 200 only when the store answers a ping within
//!   [`READY_PING_TIMEOUT`] and the pod is not draining; otherwise 503 with a
//!   one-line reason. Kubernetes stops routing to a pod whose readiness fails. The
//!   cache is not part of it: every pod shares one Redis, so a cache outage would
//!   take every pod out of its Services at once although the mail — in the store —
//!   is there; the pods serve on their stand-ins instead (`cache::resilient`).
//!
//! The admin server outlives the mail listeners during a drain (it stops on its own
//! `stop` future), so probes keep seeing the 503 until the process exits.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Encoder as _;

use crate::cache::Cache;
use crate::metrics::Metrics;
use crate::net::ShutdownController;
use crate::store::{PoolStats, Store};

/// A readiness check that takes longer than this counts as failed: a probe must not
/// hang on a database that is down.
pub const READY_PING_TIMEOUT: Duration = Duration::from_secs(2);

/// What readiness and the pool gauges need from a backend: the admin server looks
/// at the store and the cache only through this, so it can be tested against a
/// backend that fails on demand.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// For the readiness reason, e.g. "store (postgres)".
    fn describe(&self) -> String;
    async fn ping(&self) -> Result<(), String>;
    fn pool_stats(&self) -> PoolStats;
}

struct StoreBackend(Arc<dyn Store>);
struct CacheBackend(Arc<dyn Cache>);

#[async_trait::async_trait]
impl Backend for StoreBackend {
    fn describe(&self) -> String {
        format!("store ({})", self.0.backend())
    }
    async fn ping(&self) -> Result<(), String> {
        self.0.ping().await.map_err(|e| e.to_string())
    }
    fn pool_stats(&self) -> PoolStats {
        self.0.pool_stats()
    }
}

#[async_trait::async_trait]
impl Backend for CacheBackend {
    fn describe(&self) -> String {
        format!("cache ({})", self.0.backend())
    }
    async fn ping(&self) -> Result<(), String> {
        self.0.ping().await.map_err(|e| e.to_string())
    }
    fn pool_stats(&self) -> PoolStats {
        self.0.pool_stats()
    }
}

/// What the admin endpoints look at. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    /// Feeds `mail_db_pool_*`.
    pub store: Arc<dyn Backend>,
    /// Feeds `mail_cache_pool_connections`.
    pub cache: Arc<dyn Backend>,
    pub metrics: Arc<Metrics>,
    pub shutdown: ShutdownController,
}

impl AdminState {
    pub fn new(
        store: Arc<dyn Store>,
        cache: Arc<dyn Cache>,
        metrics: Arc<Metrics>,
        shutdown: ShutdownController,
    ) -> AdminState {
        AdminState {
            store: Arc::new(StoreBackend(store)),
            cache: Arc::new(CacheBackend(cache)),
            metrics,
            shutdown,
        }
    }
}

/// Binds the admin port (separately from serving, so a taken port fails start-up).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// The admin routes, for embedding or for tests.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the admin endpoints on `listener` until `stop` resolves.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    state: AdminState,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin listening");
    }
    axum::serve(listener, router(state)).with_graceful_shutdown(stop).await?;
    Ok(())
}

async fn healthz(State(state): State<AdminState>) -> String {
    let cache = match tokio::time::timeout(READY_PING_TIMEOUT, state.cache.ping()).await {
        Ok(Ok(())) => "up".to_string(),
        Ok(Err(e)) => format!("down: {}", one_line(&e)),
        Err(_) => "down: ping timed out".to_string(),
    };
    format!("ok\n{}: {cache}\n", state.cache.describe())
}

async fn readyz(State(state): State<AdminState>) -> Response {
    match readiness(&state).await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

/// `Err(one-line reason)` when the pod should not receive traffic.
pub async fn readiness(state: &AdminState) -> Result<(), String> {
    if state.shutdown.is_draining() {
        return Err("draining".into());
    }
    match tokio::time::timeout(READY_PING_TIMEOUT, state.store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{}: {}", state.store.describe(), one_line(&e))),
        Err(_) => Err(format!("{}: ping timed out", state.store.describe())),
    }
}

/// Errors from drivers can span lines; a probe body and a log line should not.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn metrics(State(state): State<AdminState>) -> Response {
    refresh_pool_gauges(&state);
    let families = state.metrics.registry.gather();
    let mut body = Vec::with_capacity(16 * 1024);
    let encoder = prometheus::TextEncoder::new();
    match encoder.encode(&families, &mut body) {
        Ok(()) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}\n")).into_response(),
    }
}

/// Samples both pools into the contract gauges (DESIGN §4), among them
/// `mail_pool_saturation`, which the HPA scales on.
pub fn refresh_pool_gauges(state: &AdminState) {
    let m = &state.metrics;
    let db = state.store.pool_stats();
    let cache = state.cache.pool_stats();
    m.db_pool_connections.with_label_values(&["idle"]).set(i64::from(db.idle));
    m.db_pool_connections.with_label_values(&["in_use"]).set(i64::from(db.in_use));
    m.db_pool_max.set(i64::from(db.max));
    m.cache_pool_connections.with_label_values(&["idle"]).set(i64::from(cache.idle));
    m.cache_pool_connections.with_label_values(&["in_use"]).set(i64::from(cache.in_use));
    m.pool_saturation.set(saturation(&db).max(saturation(&cache)));
}

/// in_use/max clamped to 0..1; a pool without a limit (max 0) is never saturated.
fn saturation(p: &PoolStats) -> f64 {
    if p.max == 0 { 0.0 } else { (f64::from(p.in_use) / f64::from(p.max)).clamp(0.0, 1.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturation_is_a_ratio_in_0_1() {
        assert_eq!(saturation(&PoolStats { max: 0, idle: 0, in_use: 3 }), 0.0);
        assert_eq!(saturation(&PoolStats { max: 4, idle: 1, in_use: 3 }), 0.75);
        assert_eq!(saturation(&PoolStats { max: 2, idle: 0, in_use: 5 }), 1.0);
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }
}
