//! The operator's own Prometheus metrics, served on `/metrics`.

use std::time::Instant;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: IntCounter,
    pub failures: IntCounterVec,
    pub duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconciles = IntCounter::new("mailcluster_operator_reconciles_total", "Reconciles started")
            .expect("valid metric");
        let failures = IntCounterVec::new(
            Opts::new("mailcluster_operator_reconcile_failures_total", "Reconciles that failed, by reason"),
            &["reason"],
        )
        .expect("valid metric");
        let duration = Histogram::with_opts(
            HistogramOpts::new("mailcluster_operator_reconcile_duration_seconds", "Reconcile duration")
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        )
        .expect("valid metric");
        // Registering fresh, uniquely named collectors into a new registry cannot fail.
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(failures.clone()),
            Box::new(duration.clone()),
        ] {
            registry.register(c).expect("unique metric names");
        }
        Metrics { registry, reconciles, failures, duration }
    }

    /// Counts a reconcile and times it until the returned guard drops.
    pub fn start(&self) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer { start: Instant::now(), histogram: self.duration.clone() }
    }

    pub fn failed(&self, reason: &str) {
        self.failures.with_label_values(&[reason]).inc();
    }

    pub fn render(&self) -> String {
        let mut buf = String::new();
        // The text encoder only fails on invalid metric families, which ours are not.
        let _ = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut buf);
        buf
    }
}

/// Records the reconcile duration on drop, so early returns and errors are timed too.
pub struct ReconcileTimer {
    start: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}
