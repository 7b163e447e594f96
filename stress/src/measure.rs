//! Measurement: per-operation HDR histograms, counters, errors by key, and a
//! per-second series.
//!
//! One `Mutex` guards all operations of a scenario. A record is a histogram
//! increment and two counter bumps (~100 ns under the lock), so even at 50,000
//! operations/s the lock is held ~0.5% of the time; per-task histograms merged at
//! the end would avoid it but lose the live per-second view for no measurable gain.
//!
//! Each operation keeps two histograms: the run total and the current one-second
//! window, which the ticker snapshots into the series and resets. Latencies are
//! recorded in microseconds from the *intended* start time of the operation (see
//! `engine`), so queueing behind a stalled server is part of the latency.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest trackable latency: one hour, in microseconds. Values above are clamped.
const MAX_US: u64 = 3_600_000_000;

pub fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts; failure would be a bug here.
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// Everything measured for one operation name.
#[derive(Clone)]
pub struct OpData {
    pub hist: Histogram<u64>,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub bytes: u64,
    /// Primary operations count toward the success rate; auxiliary ones (connection
    /// setup, SELECT) are reported for insight only, so a connect is not counted once
    /// as its own success and again inside the operation that needed it.
    pub primary: bool,
}

impl OpData {
    fn new(primary: bool) -> OpData {
        OpData { hist: new_histogram(), ok: 0, errors: BTreeMap::new(), bytes: 0, primary }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn merge(&mut self, other: &OpData) {
        let _ = self.hist.add(&other.hist);
        self.ok += other.ok;
        self.bytes += other.bytes;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        self.primary |= other.primary;
    }

    pub fn summary(&self, elapsed: Duration) -> OpSummary {
        let h = &self.hist;
        let ms = |q: f64| if h.is_empty() { 0.0 } else { h.value_at_quantile(q) as f64 / 1000.0 };
        let total = self.ok + self.error_count();
        OpSummary {
            count: total,
            ok: self.ok,
            errors: self.error_count(),
            errors_by_kind: self.errors.clone(),
            success_rate: if total == 0 { 100.0 } else { self.ok as f64 * 100.0 / total as f64 },
            throughput: if elapsed.is_zero() { 0.0 } else { self.ok as f64 / elapsed.as_secs_f64() },
            bytes: self.bytes,
            mean_ms: if h.is_empty() { 0.0 } else { h.mean() / 1000.0 },
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p95_ms: ms(0.95),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: if h.is_empty() { 0.0 } else { h.max() as f64 / 1000.0 },
            primary: self.primary,
        }
    }
}

/// Totals of one operation, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct OpSummary {
    pub count: u64,
    pub ok: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Percent.
    pub success_rate: f64,
    /// Successful operations per second over the scenario.
    pub throughput: f64,
    pub bytes: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub primary: bool,
}

/// One operation during one second.
#[derive(Clone, Debug, Serialize)]
pub struct SeriesPoint {
    /// Seconds since the scenario started (end of the window).
    pub second: u32,
    pub op: String,
    pub ok: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

struct Window {
    hist: Histogram<u64>,
    ok: u64,
    errors: u64,
}

struct Inner {
    ops: BTreeMap<&'static str, (OpData, Window)>,
    series: Vec<SeriesPoint>,
}

/// Thread-safe recorder shared by all workers of a scenario.
pub struct Recorder {
    inner: Mutex<Inner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder { inner: Mutex::new(Inner { ops: BTreeMap::new(), series: Vec::new() }) }
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic while holding the lock cannot leave counters inconsistent in a way
        // that matters for a report, so a poisoned lock is simply taken over.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// A successful primary operation.
    pub fn ok(&self, op: &'static str, latency: Duration, bytes: u64) {
        self.record(op, true, latency, bytes);
    }

    /// A successful auxiliary operation (connect, select, ...).
    pub fn ok_aux(&self, op: &'static str, latency: Duration) {
        self.record(op, false, latency, 0);
    }

    fn record(&self, op: &'static str, primary: bool, latency: Duration, bytes: u64) {
        let us = (latency.as_micros() as u64).clamp(1, MAX_US);
        self.with(|i| {
            let (d, w) = i.ops.entry(op).or_insert_with(|| (OpData::new(primary), Window::new()));
            d.hist.saturating_record(us);
            d.ok += 1;
            d.bytes += bytes;
            w.hist.saturating_record(us);
            w.ok += 1;
        });
    }

    /// A failed operation, counted under its error key.
    pub fn error(&self, op: &'static str, key: &str) {
        self.error_n(op, key, 1, true);
    }

    pub fn error_aux(&self, op: &'static str, key: &str) {
        self.error_n(op, key, 1, false);
    }

    pub fn error_n(&self, op: &'static str, key: &str, n: u64, primary: bool) {
        if n == 0 {
            return;
        }
        self.with(|i| {
            let (d, w) = i.ops.entry(op).or_insert_with(|| (OpData::new(primary), Window::new()));
            match d.errors.get_mut(key) {
                Some(c) => *c += n,
                None => {
                    d.errors.insert(key.to_string(), n);
                }
            }
            w.errors += n;
        });
    }

    /// Close the current one-second window: append it to the series and reset it.
    /// Returns (ok, errors) of primary operations in the window, for progress output.
    pub fn tick(&self, second: u32) -> (u64, u64) {
        self.with(|i| {
            let (mut ok, mut err) = (0, 0);
            let Inner { ops, series } = i;
            for (name, (d, w)) in ops.iter_mut() {
                let q = |x: f64| {
                    if w.hist.is_empty() { 0.0 } else { w.hist.value_at_quantile(x) as f64 / 1000.0 }
                };
                series.push(SeriesPoint {
                    second,
                    op: name.to_string(),
                    ok: w.ok,
                    errors: w.errors,
                    p50_ms: q(0.5),
                    p95_ms: q(0.95),
                    p99_ms: q(0.99),
                    max_ms: if w.hist.is_empty() { 0.0 } else { w.hist.max() as f64 / 1000.0 },
                });
                if d.primary {
                    ok += w.ok;
                    err += w.errors;
                }
                w.hist.reset();
                w.ok = 0;
                w.errors = 0;
            }
            (ok, err)
        })
    }

    /// Totals so far of primary operations: (ok, errors, p95 ms of the busiest op).
    pub fn totals(&self) -> (u64, u64) {
        self.with(|i| {
            i.ops
                .values()
                .filter(|(d, _)| d.primary)
                .fold((0, 0), |(o, e), (d, _)| (o + d.ok, e + d.error_count()))
        })
    }

    /// Take the data out at the end of the scenario.
    pub fn finish(&self) -> (BTreeMap<String, OpData>, Vec<SeriesPoint>) {
        self.with(|i| {
            let ops = i.ops.iter().map(|(k, (d, _))| (k.to_string(), d.clone())).collect();
            (ops, std::mem::take(&mut i.series))
        })
    }
}

impl Window {
    fn new() -> Window {
        Window { hist: new_histogram(), ok: 0, errors: 0 }
    }
}

/// Merge the operations of `name` or `name-*` (e.g. `fetch` → `fetch-body` +
/// `fetch-header`); `None` when nothing matched.
pub fn select<'a>(ops: impl IntoIterator<Item = (&'a String, &'a OpData)>, name: &str) -> Option<OpData> {
    let mut out: Option<OpData> = None;
    for (k, d) in ops {
        let hit = k == name || (k.starts_with(name) && k.as_bytes().get(name.len()) == Some(&b'-'));
        if hit {
            match &mut out {
                Some(o) => o.merge(d),
                None => out = Some(d.clone()),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_summarises() {
        let r = Recorder::new();
        for ms in 1..=100 {
            r.ok("deliver", Duration::from_millis(ms), 10);
        }
        r.error("deliver", "smtp-451");
        r.error("deliver", "smtp-451");
        r.ok_aux("smtp-connect", Duration::from_millis(3));
        assert_eq!(r.tick(1), (100, 2));
        let (ops, series) = r.finish();
        let s = ops["deliver"].summary(Duration::from_secs(10));
        assert_eq!((s.count, s.ok, s.errors), (102, 100, 2));
        assert_eq!(s.errors_by_kind["smtp-451"], 2);
        assert!((s.p95_ms - 95.0).abs() < 0.5, "{}", s.p95_ms);
        assert!((s.max_ms - 100.0).abs() < 0.5);
        assert!((s.throughput - 10.0).abs() < 1e-9);
        assert_eq!(series.len(), 2);
        assert!(!ops["smtp-connect"].primary);
    }

    #[test]
    fn select_merges_families() {
        let r = Recorder::new();
        r.ok("fetch-body", Duration::from_millis(10), 0);
        r.ok("fetch-header", Duration::from_millis(20), 0);
        r.ok("fetchy", Duration::from_millis(30), 0);
        let (ops, _) = r.finish();
        let m = select(&ops, "fetch").expect("matched");
        assert_eq!(m.ok, 2);
        assert!(select(&ops, "deliver").is_none());
    }
}
