//! The generator watching itself: process CPU time and scheduling lag.
//!
//! A load generator that runs out of CPU reports the server as slower than it is,
//! so every run measures its own CPU (user + system time from `/proc/self/stat`,
//! parsed without libc) and the lag of a 10 ms timer task (how late the runtime
//! wakes a ready task). The run is flagged `saturated` when the mean CPU reaches 90%
//! of the worker threads, or the P99 timer lag exceeds 50 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Clock ticks per second of `/proc/<pid>/stat` times. `sysconf(_SC_CLK_TCK)` needs
/// libc; it is 100 on every Linux architecture that matters (USER_HZ is fixed by the
/// kernel ABI), so the constant is used.
const CLK_TCK: f64 = 100.0;

/// CPU seconds (user + system) of this process, if `/proc` is available.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat_cpu(&stat)
}

/// Fields 14 (utime) and 15 (stime), counted after the `(comm)` field, which may
/// itself contain spaces and parentheses, hence the search for the last `)`.
fn parse_stat_cpu(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // After ")" the first field is field 3 (state); utime is field 14 → index 11.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / CLK_TCK)
}

/// Samples CPU and lag once per second.
pub struct Monitor {
    start_cpu: Option<f64>,
    last_cpu: Option<f64>,
    last_at: Instant,
    start_at: Instant,
    lag_max_us: Arc<AtomicU64>,
    lag_hist: Arc<std::sync::Mutex<hdrhistogram::Histogram<u64>>>,
    probe: tokio::task::JoinHandle<()>,
    pub threads: usize,
    pub points: Vec<GeneratorPoint>,
}

/// One second of the generator's own state.
#[derive(Clone, Debug, Serialize)]
pub struct GeneratorPoint {
    pub second: u32,
    /// Percent of one core (200 = two cores busy).
    pub cpu_percent: f64,
    pub lag_max_ms: f64,
}

/// Generator totals and the saturation flag.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GeneratorSummary {
    pub worker_threads: usize,
    pub cpu_seconds: f64,
    pub cpu_mean_percent: f64,
    pub cpu_max_percent: f64,
    pub lag_p99_ms: f64,
    pub lag_max_ms: f64,
    pub saturated: bool,
    pub reason: Option<String>,
}

impl Monitor {
    pub fn start() -> Monitor {
        let threads = tokio::runtime::Handle::try_current().map(|h| h.metrics().num_workers()).unwrap_or(1);
        let lag_max_us = Arc::new(AtomicU64::new(0));
        let lag_hist = Arc::new(std::sync::Mutex::new(crate::measure::new_histogram()));
        let (m, h) = (Arc::clone(&lag_max_us), Arc::clone(&lag_hist));
        let probe = tokio::spawn(async move {
            let period = Duration::from_millis(10);
            loop {
                let before = Instant::now();
                tokio::time::sleep(period).await;
                let lag = before.elapsed().saturating_sub(period).as_micros() as u64;
                m.fetch_max(lag, Ordering::Relaxed);
                if let Ok(mut g) = h.lock() {
                    g.saturating_record(lag.max(1));
                }
            }
        });
        let cpu = process_cpu_seconds();
        Monitor {
            start_cpu: cpu,
            last_cpu: cpu,
            last_at: Instant::now(),
            start_at: Instant::now(),
            lag_max_us,
            lag_hist,
            probe,
            threads,
            points: Vec::new(),
        }
    }

    /// Close one second.
    pub fn tick(&mut self, second: u32) -> GeneratorPoint {
        let now = Instant::now();
        let cpu = process_cpu_seconds();
        let wall = now.duration_since(self.last_at).as_secs_f64();
        let cpu_percent = match (cpu, self.last_cpu) {
            (Some(c), Some(l)) if wall > 0.0 => (c - l) * 100.0 / wall,
            _ => 0.0,
        };
        self.last_cpu = cpu;
        self.last_at = now;
        let lag = self.lag_max_us.swap(0, Ordering::Relaxed);
        let p = GeneratorPoint { second, cpu_percent, lag_max_ms: lag as f64 / 1000.0 };
        self.points.push(p.clone());
        p
    }

    pub fn finish(self) -> (GeneratorSummary, Vec<GeneratorPoint>) {
        self.probe.abort();
        let wall = self.start_at.elapsed().as_secs_f64();
        let cpu_seconds = match (process_cpu_seconds(), self.start_cpu) {
            (Some(c), Some(s)) => c - s,
            _ => 0.0,
        };
        let (lag_p99_ms, lag_max_ms) = match self.lag_hist.lock() {
            Ok(h) if !h.is_empty() => (h.value_at_quantile(0.99) as f64 / 1000.0, h.max() as f64 / 1000.0),
            _ => (0.0, 0.0),
        };
        let mut s = GeneratorSummary {
            worker_threads: self.threads,
            cpu_seconds,
            cpu_mean_percent: if wall > 0.0 { cpu_seconds * 100.0 / wall } else { 0.0 },
            cpu_max_percent: self.points.iter().map(|p| p.cpu_percent).fold(0.0, f64::max),
            lag_p99_ms,
            lag_max_ms,
            saturated: false,
            reason: None,
        };
        judge(&mut s);
        (s, self.points)
    }
}

/// Apply the saturation rule (module doc).
pub fn judge(s: &mut GeneratorSummary) {
    let cpu_limit = 90.0 * s.worker_threads.max(1) as f64;
    if s.cpu_mean_percent >= cpu_limit {
        s.saturated = true;
        s.reason = Some(format!(
            "generator CPU {:.0}% >= 90% of {} worker thread(s)",
            s.cpu_mean_percent, s.worker_threads
        ));
    } else if s.lag_p99_ms > 50.0 {
        s.saturated = true;
        s.reason = Some(format!("scheduling lag P99 {:.0} ms > 50 ms", s.lag_p99_ms));
    }
}

/// Merge the summaries of several scenarios (worst case wins).
pub fn merge(all: &[GeneratorSummary]) -> GeneratorSummary {
    let mut out = GeneratorSummary::default();
    for s in all {
        out.worker_threads = out.worker_threads.max(s.worker_threads);
        out.cpu_seconds += s.cpu_seconds;
        out.cpu_mean_percent = out.cpu_mean_percent.max(s.cpu_mean_percent);
        out.cpu_max_percent = out.cpu_max_percent.max(s.cpu_max_percent);
        out.lag_p99_ms = out.lag_p99_ms.max(s.lag_p99_ms);
        out.lag_max_ms = out.lag_max_ms.max(s.lag_max_ms);
        if s.saturated && !out.saturated {
            out.saturated = true;
            out.reason = s.reason.clone();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_with_odd_comm() {
        let line = "1234 (we ird) name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100 0 0";
        assert_eq!(parse_stat_cpu(line), Some(3.0));
        assert_eq!(parse_stat_cpu("garbage"), None);
    }

    #[test]
    fn own_cpu_is_readable() {
        assert!(process_cpu_seconds().is_some());
    }

    #[test]
    fn saturation_rule() {
        let mut s = GeneratorSummary { worker_threads: 2, cpu_mean_percent: 185.0, ..Default::default() };
        judge(&mut s);
        assert!(s.saturated);
        let mut s = GeneratorSummary { worker_threads: 2, cpu_mean_percent: 120.0, ..Default::default() };
        judge(&mut s);
        assert!(!s.saturated);
        let mut s = GeneratorSummary { worker_threads: 4, lag_p99_ms: 80.0, ..Default::default() };
        judge(&mut s);
        assert!(s.saturated);
    }
}
