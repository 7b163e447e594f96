//! Admin HTTP: `/metrics`, `/healthz`, `/readyz`, on their own port.
//!
//! - `/metrics`: Prometheus text of `Metrics::registry`. The pool connection gauges
//!   are read at scrape time. `mail_pool_saturation`, which the HPA scales on, is
//!   the mean over the last [`SATURATION_WINDOW`] of samples taken every
//!   [`SATURATION_SAMPLE_EVERY`]: read at one instant it was whatever the pool did
//!   at the moment of the scrape (under group commit, 0 or 1 of four connections
//!   between two commits), so the HPA scaled on a lucky sample or not at all.
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

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Encoder as _;

use crate::cache::Cache;
use crate::metrics::Metrics;
use crate::net::ShutdownController;
use crate::store::Store;
use mailcluster_model::PoolStats;

/// A readiness check that takes longer than this counts as failed: a probe must not
/// hang on a database that is down.
pub const READY_PING_TIMEOUT: Duration = Duration::from_secs(2);

/// `mail_pool_saturation` averages this much of the past: the HPA's own sync
/// period, and three of the 5 s scrapes a busy cluster uses.
pub const SATURATION_WINDOW: Duration = Duration::from_secs(15);

/// How often the pools are sampled for `mail_pool_saturation`: 150 samples a
/// window, two atomic loads each.
pub const SATURATION_SAMPLE_EVERY: Duration = Duration::from_millis(100);

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
    /// Samples behind `mail_pool_saturation`; `serve_admin` fills it.
    pub saturation: Arc<SaturationWindow>,
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
            saturation: Arc::new(SaturationWindow::new(SATURATION_WINDOW)),
        }
    }

    /// The busiest pool's in_use/max at this instant.
    fn saturation_now(&self) -> f64 {
        saturation(&self.store.pool_stats()).max(saturation(&self.cache.pool_stats()))
    }
}

/// Saturation samples of the last `window`, for a mean that does not depend on
/// the instant it is read.
pub struct SaturationWindow {
    window: Duration,
    samples: Mutex<VecDeque<(Instant, f64)>>,
}

impl SaturationWindow {
    pub fn new(window: Duration) -> SaturationWindow {
        SaturationWindow { window, samples: Mutex::new(VecDeque::new()) }
    }

    /// Adds a sample taken at `at` and forgets those older than the window.
    pub fn record(&self, at: Instant, value: f64) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back((at, value));
        while samples.front().is_some_and(|(t, _)| at.saturating_duration_since(*t) > self.window) {
            samples.pop_front();
        }
    }

    /// The mean of the window's samples; `None` before the first one.
    pub fn mean(&self) -> Option<f64> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.is_empty() {
            return None;
        }
        Some(samples.iter().map(|(_, v)| v).sum::<f64>() / samples.len() as f64)
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
    // The sampler lives exactly as long as this future: polled beside the server,
    // not spawned, so it cannot outlive an admin task that is dropped.
    let sampler = sample_saturation(state.clone());
    tokio::select! {
        served = axum::serve(listener, router(state)).with_graceful_shutdown(stop) => served?,
        never = sampler => match never {},
    }
    Ok(())
}

/// Feeds `state.saturation` every [`SATURATION_SAMPLE_EVERY`]; never returns.
async fn sample_saturation(state: AdminState) -> std::convert::Infallible {
    let mut tick = tokio::time::interval(SATURATION_SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        state.saturation.record(Instant::now(), state.saturation_now());
    }
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

/// Samples both pools into the contract gauges (see `crate::metrics`), among them
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
    // Before the sampler's first tick (a scrape right at start) the instant is all
    // there is.
    m.pool_saturation.set(state.saturation.mean().unwrap_or_else(|| state.saturation_now()));
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

    #[test]
    fn saturation_window_is_the_mean_of_its_last_samples() {
        let w = SaturationWindow::new(Duration::from_secs(10));
        assert_eq!(w.mean(), None);
        let t0 = Instant::now();
        // A pool busy one sample in four, as a scrape would catch it at random.
        for i in 0..40u32 {
            w.record(t0 + Duration::from_millis(u64::from(i) * 100), if i % 4 == 0 { 1.0 } else { 0.0 });
        }
        assert_eq!(w.mean(), Some(0.25));
        // 20 s later, only the samples of the last 10 s count.
        for i in 0..101u32 {
            w.record(t0 + Duration::from_secs(20) + Duration::from_millis(u64::from(i) * 100), 0.5);
        }
        assert_eq!(w.mean(), Some(0.5));
    }
}
