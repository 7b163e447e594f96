//! Measurement: per-operation HDR histograms, counters, errors by key, and
//! per-second and per-minute series.
//!
//! One `Mutex` guards all operations of a scenario. A record is a histogram
//! increment and two counter bumps (~100 ns under the lock), so even at 50,000
//! operations/s the lock is held ~0.5% of the time; per-task histograms merged at
//! the end would avoid it but lose the live per-second view for no measurable gain.
//!
//! Each operation keeps three histograms: the run total, the current one-second
//! window, which the ticker snapshots into the series and resets, and the current
//! minute, which collects the seconds' windows. A minute's percentiles come from
//! its own histogram: they cannot be derived from the seconds' percentiles, and a
//! soak's SLO is judged per minute. Latencies are
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

/// One operation during one window: a second (`series`) or a minute (`minutes`).
#[derive(Clone, Debug, Serialize)]
pub struct SeriesPoint {
    /// Seconds since the scenario started, at the end of the window (a minute's
    /// window ends at 60, 120, …; the last one at the scenario's last second).
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

/// The second being recorded and the minute that collects it.
struct Windows {
    second: Window,
    minute: Window,
}

struct Inner {
    ops: BTreeMap<&'static str, (OpData, Windows)>,
    series: Vec<SeriesPoint>,
    minutes: Vec<SeriesPoint>,
    /// The last second closed by `tick`.
    last_second: u32,
}

/// Thread-safe recorder shared by all workers of a scenario.
pub struct Recorder {
    inner: Mutex<Inner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            inner: Mutex::new(Inner {
                ops: BTreeMap::new(),
                series: Vec::new(),
                minutes: Vec::new(),
                last_second: 0,
            }),
        }
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
            let (d, w) = i.ops.entry(op).or_insert_with(|| (OpData::new(primary), Windows::new()));
            d.hist.saturating_record(us);
            d.ok += 1;
            d.bytes += bytes;
            w.second.hist.saturating_record(us);
            w.second.ok += 1;
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
            let (d, w) = i.ops.entry(op).or_insert_with(|| (OpData::new(primary), Windows::new()));
            match d.errors.get_mut(key) {
                Some(c) => *c += n,
                None => {
                    d.errors.insert(key.to_string(), n);
                }
            }
            w.second.errors += n;
        });
    }

    /// Close the current one-second window: append it to the series, add it to
    /// the current minute, and reset it; every 60th second also closes the minute.
    /// Returns (ok, errors) of primary operations in the window, for progress output.
    pub fn tick(&self, second: u32) -> (u64, u64) {
        self.with(|i| {
            let (mut ok, mut err) = (0, 0);
            let Inner { ops, series, minutes, last_second } = i;
            *last_second = second;
            for (name, (d, w)) in ops.iter_mut() {
                series.push(w.second.point(second, name));
                if d.primary {
                    ok += w.second.ok;
                    err += w.second.errors;
                }
                w.minute.absorb(&mut w.second);
                if second.is_multiple_of(60) {
                    minutes.push(w.minute.point(second, name));
                    w.minute.reset();
                }
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

    /// Take the data out at the end of the scenario: the totals, the per-second
    /// series and the per-minute one (its last, partial minute included).
    pub fn finish(&self) -> Finished {
        self.with(|i| {
            let last = i.last_second;
            for (name, (_, w)) in i.ops.iter_mut() {
                // Records after the last tick belong to the last minute too.
                w.minute.absorb(&mut w.second);
                if w.minute.ok + w.minute.errors > 0 {
                    i.minutes.push(w.minute.point(last, name));
                    w.minute.reset();
                }
            }
            Finished {
                ops: i.ops.iter().map(|(k, (d, _))| (k.to_string(), d.clone())).collect(),
                series: std::mem::take(&mut i.series),
                minutes: std::mem::take(&mut i.minutes),
            }
        })
    }
}

/// What a scenario measured, taken out of its [`Recorder`].
pub struct Finished {
    pub ops: BTreeMap<String, OpData>,
    pub series: Vec<SeriesPoint>,
    pub minutes: Vec<SeriesPoint>,
}

impl Window {
    fn new() -> Window {
        Window { hist: new_histogram(), ok: 0, errors: 0 }
    }

    fn point(&self, second: u32, op: &str) -> SeriesPoint {
        let h = &self.hist;
        let q = |x: f64| if h.is_empty() { 0.0 } else { h.value_at_quantile(x) as f64 / 1000.0 };
        SeriesPoint {
            second,
            op: op.to_string(),
            ok: self.ok,
            errors: self.errors,
            p50_ms: q(0.5),
            p95_ms: q(0.95),
            p99_ms: q(0.99),
            max_ms: if h.is_empty() { 0.0 } else { h.max() as f64 / 1000.0 },
        }
    }

    /// Adds `other` to this window and empties it.
    fn absorb(&mut self, other: &mut Window) {
        // Both have the same bounds, so adding cannot fail.
        let _ = self.hist.add(&other.hist);
        self.ok += other.ok;
        self.errors += other.errors;
        other.reset();
    }

    fn reset(&mut self) {
        self.hist.reset();
        self.ok = 0;
        self.errors = 0;
    }
}

impl Windows {
    fn new() -> Windows {
        Windows { second: Window::new(), minute: Window::new() }
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
        let Finished { ops, series, .. } = r.finish();
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
    fn minutes_have_their_own_percentiles() {
        let r = Recorder::new();
        // Minute 1: 59 seconds of 100 fast deliveries and one second of 100 slow
        // ones. That second's P95 is the slow latency; the minute's is the fast one,
        // since the slow ones are under 2 % of the minute.
        for second in 1..=60 {
            let ms = if second == 30 { 500 } else { 10 };
            for _ in 0..100 {
                r.ok("deliver", Duration::from_millis(ms), 0);
            }
            r.tick(second);
        }
        // Minute 2 ends with the scenario, after two seconds.
        for _ in 0..5 {
            r.ok("deliver", Duration::from_millis(20), 0);
        }
        r.error("deliver", "smtp-451");
        r.tick(61);
        r.ok("deliver", Duration::from_millis(20), 0);
        r.tick(62);
        let Finished { series, minutes, .. } = r.finish();
        let worst_second = series.iter().map(|p| p.p95_ms).fold(0.0, f64::max);
        assert!((worst_second - 500.0).abs() < 1.0, "{worst_second}");
        assert_eq!(minutes.len(), 2, "{minutes:?}");
        let (first, last) = (&minutes[0], &minutes[1]);
        assert_eq!((first.second, first.ok, first.errors), (60, 6000, 0));
        assert!((first.p95_ms - 10.0).abs() < 0.1, "{}", first.p95_ms);
        assert!((first.max_ms - 500.0).abs() < 1.0, "{}", first.max_ms);
        assert_eq!((last.second, last.ok, last.errors), (62, 6, 1));
        assert!((last.p50_ms - 20.0).abs() < 0.1, "{}", last.p50_ms);
    }

    #[test]
    fn records_after_the_last_tick_count_in_the_last_minute() {
        let r = Recorder::new();
        r.ok("deliver", Duration::from_millis(5), 0);
        r.tick(1);
        r.ok("deliver", Duration::from_millis(5), 0);
        let Finished { minutes, .. } = r.finish();
        assert_eq!(minutes.len(), 1);
        assert_eq!((minutes[0].second, minutes[0].ok), (1, 2));
    }

    #[test]
    fn select_merges_families() {
        let r = Recorder::new();
        r.ok("fetch-body", Duration::from_millis(10), 0);
        r.ok("fetch-header", Duration::from_millis(20), 0);
        r.ok("fetchy", Duration::from_millis(30), 0);
        let Finished { ops, .. } = r.finish();
        let m = select(&ops, "fetch").expect("matched");
        assert_eq!(m.ok, 2);
        assert!(select(&ops, "deliver").is_none());
    }
}
