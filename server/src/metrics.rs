//! The Prometheus registry and the metrics named in the operational contract
//! (DESIGN §4): the operator's HPA rules and dashboards depend on these names.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

pub struct Metrics {
    pub registry: Registry,
    /// `mail_connections_active{protocol}`
    pub connections_active: IntGaugeVec,
    /// `mail_command_duration_seconds{protocol,command}`
    pub command_duration: HistogramVec,
    /// `mail_commands_total{protocol,command,result}`
    pub commands_total: IntCounterVec,
    /// `mail_deliveries_total{result}`
    pub deliveries_total: IntCounterVec,
    /// `mail_db_pool_connections{state}`
    pub db_pool_connections: IntGaugeVec,
    /// `mail_db_pool_max`
    pub db_pool_max: IntGauge,
    /// `mail_db_pool_acquire_seconds`
    pub db_pool_acquire: Histogram,
    /// `mail_cache_pool_connections{state}`
    pub cache_pool_connections: IntGaugeVec,
    /// `mail_pool_saturation`, scaled 0..1000 is avoided: a float gauge.
    pub pool_saturation: prometheus::Gauge,
    /// `mail_tls_handshakes_total{resumed}`
    pub tls_handshakes_total: IntCounterVec,
    /// `mail_tls_handshake_failures_total{reason}` (error|timeout): implicit TLS and
    /// STARTTLS handshakes that did not complete.
    pub tls_handshake_failures_total: IntCounterVec,
    /// `mail_connections_refused_total{protocol,reason}`: connections closed by the
    /// network layer before a session started (limits, PROXY header problems).
    pub connections_refused_total: IntCounterVec,
}

/// Latency buckets from 0.5 ms to 10 s: mail commands span both ends.
pub const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let connections_active =
            IntGaugeVec::new(Opts::new("mail_connections_active", "Open client connections"), &["protocol"])
                .expect("valid metric");
        let command_duration = HistogramVec::new(
            HistogramOpts::new("mail_command_duration_seconds", "Time to answer a command")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["protocol", "command"],
        )
        .expect("valid metric");
        let commands_total = IntCounterVec::new(
            Opts::new("mail_commands_total", "Commands answered"),
            &["protocol", "command", "result"],
        )
        .expect("valid metric");
        let deliveries_total =
            IntCounterVec::new(Opts::new("mail_deliveries_total", "Message deliveries"), &["result"])
                .expect("valid metric");
        let db_pool_connections = IntGaugeVec::new(
            Opts::new("mail_db_pool_connections", "Database pool connections by state"),
            &["state"],
        )
        .expect("valid metric");
        let db_pool_max =
            IntGauge::new("mail_db_pool_max", "Database pool size limit").expect("valid metric");
        let db_pool_acquire = Histogram::with_opts(
            HistogramOpts::new("mail_db_pool_acquire_seconds", "Time to get a database connection")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let cache_pool_connections = IntGaugeVec::new(
            Opts::new("mail_cache_pool_connections", "Cache connections by state"),
            &["state"],
        )
        .expect("valid metric");
        let pool_saturation =
            prometheus::Gauge::new("mail_pool_saturation", "in_use/max of the busiest pool (0..1)")
                .expect("valid metric");
        let tls_handshakes_total = IntCounterVec::new(
            Opts::new("mail_tls_handshakes_total", "Completed TLS handshakes"),
            &["resumed"],
        )
        .expect("valid metric");
        let tls_handshake_failures_total = IntCounterVec::new(
            Opts::new("mail_tls_handshake_failures_total", "TLS handshakes that failed or timed out"),
            &["reason"],
        )
        .expect("valid metric");
        let connections_refused_total = IntCounterVec::new(
            Opts::new("mail_connections_refused_total", "Connections refused before a session started"),
            &["protocol", "reason"],
        )
        .expect("valid metric");
        for c in [
            Box::new(connections_active.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(command_duration.clone()),
            Box::new(commands_total.clone()),
            Box::new(deliveries_total.clone()),
            Box::new(db_pool_connections.clone()),
            Box::new(db_pool_max.clone()),
            Box::new(db_pool_acquire.clone()),
            Box::new(cache_pool_connections.clone()),
            Box::new(pool_saturation.clone()),
            Box::new(tls_handshakes_total.clone()),
            Box::new(tls_handshake_failures_total.clone()),
            Box::new(connections_refused_total.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Metrics {
            registry,
            connections_active,
            command_duration,
            commands_total,
            deliveries_total,
            db_pool_connections,
            db_pool_max,
            db_pool_acquire,
            cache_pool_connections,
            pool_saturation,
            tls_handshakes_total,
            tls_handshake_failures_total,
            connections_refused_total,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
