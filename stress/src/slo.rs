//! SLO thresholds: parsing (`deliver.p95 < 120ms`, `success_rate >= 99.95%`) and
//! evaluation against measured operations.
//!
//! A threshold names an operation family (see [`crate::measure::select`]: `fetch`
//! covers `fetch-body` and `fetch-header`) and a metric; without an operation it
//! applies to every primary operation. A threshold whose operation never ran is
//! reported as "no data" and does not fail the run: the run-wide defaults mention
//! every scenario, and a run of only `deliver` must not fail on `fetch.p95`.

use std::collections::BTreeMap;
use std::fmt;

use mailcluster_api::stress::SloSpec;
use serde::Serialize;

use crate::measure::{OpData, select};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Metric {
    P50,
    P90,
    P95,
    P99,
    P999,
    Max,
    Mean,
    SuccessRate,
    Throughput,
    Count,
    Errors,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Cmp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
}

/// A parsed threshold. Latency bounds are held in milliseconds, rates in percent.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Threshold {
    pub text: String,
    pub op: Option<String>,
    pub metric: Metric,
    pub cmp: Cmp,
    pub value: f64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid SLO threshold {text:?}: {why}")]
pub struct ParseError {
    text: String,
    why: &'static str,
}

impl std::str::FromStr for Threshold {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Threshold, ParseError> {
        let err = |why| ParseError { text: text.to_string(), why };
        let t = text.trim();
        let (pos, cmp, len) = ["<=", ">=", "==", "<", ">"]
            .iter()
            .filter_map(|s| t.find(s).map(|p| (p, *s)))
            .min_by_key(|(p, s)| (*p, std::cmp::Reverse(s.len())))
            .map(|(p, s)| {
                let c = match s {
                    "<=" => Cmp::Le,
                    ">=" => Cmp::Ge,
                    "==" => Cmp::Eq,
                    "<" => Cmp::Lt,
                    _ => Cmp::Gt,
                };
                (p, c, s.len())
            })
            .ok_or_else(|| err("expected one of < <= > >= =="))?;
        let lhs = t[..pos].trim();
        let rhs = t[pos + len..].trim();
        // `p99.9` contains a dot, so it is recognised before splitting at the last one.
        let (op, metric_name) = if let Some(base) = lhs.strip_suffix("p99.9") {
            (base.strip_suffix('.').filter(|b| !b.is_empty()).map(String::from), "p999")
        } else {
            match lhs.rsplit_once('.') {
                Some((op, m)) if !op.is_empty() => (Some(op.to_string()), m),
                _ => (None, lhs),
            }
        };
        let metric = match metric_name.to_ascii_lowercase().as_str() {
            "p50" | "median" => Metric::P50,
            "p90" => Metric::P90,
            "p95" => Metric::P95,
            "p99" => Metric::P99,
            "p999" | "p99.9" => Metric::P999,
            "max" => Metric::Max,
            "mean" | "avg" => Metric::Mean,
            "success_rate" | "success" => Metric::SuccessRate,
            "throughput" | "rate" => Metric::Throughput,
            "count" => Metric::Count,
            "errors" => Metric::Errors,
            _ => return Err(err("unknown metric")),
        };
        let value = parse_value(rhs, metric).ok_or_else(|| err("bad value"))?;
        Ok(Threshold { text: t.to_string(), op, metric, cmp, value })
    }
}

/// Latencies: `120ms`, `1.5s`, `800us`, bare number = ms. Rates: `99.9%` or `99.9`.
fn parse_value(s: &str, metric: Metric) -> Option<f64> {
    let s = s.trim();
    let num = |x: &str| x.trim().parse::<f64>().ok().filter(|v| v.is_finite());
    match metric {
        Metric::SuccessRate => num(s.strip_suffix('%').unwrap_or(s)),
        Metric::Throughput => num(s.strip_suffix("/s").unwrap_or(s)),
        Metric::Count | Metric::Errors => num(s),
        _ => {
            if let Some(v) = s.strip_suffix("ms") {
                num(v)
            } else if let Some(v) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
                num(v).map(|v| v / 1000.0)
            } else if let Some(v) = s.strip_suffix('s') {
                num(v).map(|v| v * 1000.0)
            } else {
                num(s)
            }
        }
    }
}

/// Result of one threshold.
#[derive(Clone, Debug, Serialize)]
pub struct SloResult {
    /// `run` or the scenario name.
    pub scope: String,
    pub threshold: String,
    pub actual: Option<f64>,
    /// `None`: the operation did not run (not evaluated).
    pub pass: Option<bool>,
}

impl fmt::Display for SloResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.pass {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "no data",
        };
        match self.actual {
            Some(a) => write!(f, "{:<8} {:<14} {:<36} actual {a:.3}", status, self.scope, self.threshold),
            None => write!(f, "{:<8} {:<14} {}", status, self.scope, self.threshold),
        }
    }
}

impl Threshold {
    /// Evaluate against the operations of a scope; `elapsed_s` converts counts to rates.
    pub fn evaluate(&self, scope: &str, ops: &BTreeMap<String, OpData>, elapsed_s: f64) -> SloResult {
        let data = match &self.op {
            Some(name) => select(ops, name),
            None => {
                let mut all: Option<OpData> = None;
                for d in ops.values().filter(|d| d.primary) {
                    match &mut all {
                        Some(a) => a.merge(d),
                        None => all = Some(d.clone()),
                    }
                }
                all
            }
        };
        let actual = data.and_then(|d| self.actual(&d, elapsed_s));
        let pass = actual.map(|a| match self.cmp {
            Cmp::Lt => a < self.value,
            Cmp::Le => a <= self.value,
            Cmp::Gt => a > self.value,
            Cmp::Ge => a >= self.value,
            Cmp::Eq => (a - self.value).abs() < 1e-9,
        });
        SloResult { scope: scope.to_string(), threshold: self.text.clone(), actual, pass }
    }

    fn actual(&self, d: &OpData, elapsed_s: f64) -> Option<f64> {
        let total = d.ok + d.error_count();
        if total == 0 {
            return None;
        }
        let h = &d.hist;
        let q = |x: f64| (!h.is_empty()).then(|| h.value_at_quantile(x) as f64 / 1000.0);
        match self.metric {
            Metric::SuccessRate => Some(d.ok as f64 * 100.0 / total as f64),
            Metric::Count => Some(total as f64),
            Metric::Errors => Some(d.error_count() as f64),
            Metric::Throughput => Some(if elapsed_s > 0.0 { d.ok as f64 / elapsed_s } else { 0.0 }),
            // Every operation failed: no latency exists, and a latency bound cannot be
            // said to hold; report it as failed with an infinite latency.
            _ if h.is_empty() => Some(f64::INFINITY),
            Metric::P50 => q(0.5),
            Metric::P90 => q(0.9),
            Metric::P95 => q(0.95),
            Metric::P99 => q(0.99),
            Metric::P999 => q(0.999),
            Metric::Max => Some(h.max() as f64 / 1000.0),
            Metric::Mean => Some(h.mean() / 1000.0),
        }
    }
}

/// Run-wide thresholds: the seed profile's defaults, overridden by the spec, plus the
/// spec's and the command line's extra thresholds.
/// Run-wide defaults of the seed profile.
pub const DEFAULT_SUCCESS_RATE: f64 = 99.95;
pub const DEFAULT_SMTP_P95_MS: f64 = 120.0;
pub const DEFAULT_IMAP_FETCH_P95_MS: f64 = 350.0;

pub fn run_thresholds(spec: &SloSpec, extra: &[String]) -> Result<Vec<Threshold>, ParseError> {
    let mut out = vec![
        format!("success_rate >= {}%", spec.success_rate.unwrap_or(DEFAULT_SUCCESS_RATE)),
        format!("deliver.p95 <= {}ms", spec.smtp_p95_ms.unwrap_or(DEFAULT_SMTP_P95_MS)),
        format!("fetch.p95 <= {}ms", spec.imap_fetch_p95_ms.unwrap_or(DEFAULT_IMAP_FETCH_P95_MS)),
        "search.p95 <= 350ms".to_string(),
    ];
    out.extend(spec.thresholds.iter().cloned());
    out.extend(extra.iter().cloned());
    out.iter().map(|s| s.parse()).collect()
}

/// Overall verdict: every evaluated threshold passed.
pub fn verdict(results: &[SloResult]) -> bool {
    results.iter().all(|r| r.pass != Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Recorder;
    use std::time::Duration;

    #[test]
    fn parses_forms() {
        let t: Threshold = "deliver.p95 < 120ms".parse().expect("parse");
        assert_eq!(
            (t.op.as_deref(), t.metric, t.cmp, t.value),
            (Some("deliver"), Metric::P95, Cmp::Lt, 120.0)
        );
        let t: Threshold = "success_rate >= 99.95%".parse().expect("parse");
        assert_eq!((t.op, t.metric, t.cmp, t.value), (None, Metric::SuccessRate, Cmp::Ge, 99.95));
        let t: Threshold = "fetch.p99<=1.5s".parse().expect("parse");
        assert_eq!((t.cmp, t.value), (Cmp::Le, 1500.0));
        let t: Threshold = "fetch.p99.9 < 2s".parse().expect("parse");
        assert_eq!((t.op.as_deref(), t.metric, t.value), (Some("fetch"), Metric::P999, 2000.0));
        let t: Threshold = "pop3-session.errors == 0".parse().expect("parse");
        assert_eq!((t.metric, t.cmp), (Metric::Errors, Cmp::Eq));
        assert!("deliver.p95 120ms".parse::<Threshold>().is_err());
        assert!("deliver.p42 < 1ms".parse::<Threshold>().is_err());
        assert!("deliver.p95 < fast".parse::<Threshold>().is_err());
    }

    fn ops(latencies_ms: &[u64], errors: u64) -> BTreeMap<String, OpData> {
        let r = Recorder::new();
        for &l in latencies_ms {
            r.ok("deliver", Duration::from_millis(l), 0);
        }
        r.error_n("deliver", "smtp-451", errors, true);
        r.ok_aux("smtp-connect", Duration::from_millis(1));
        r.finish().ops
    }

    #[test]
    fn evaluates_latency_and_rate() {
        let lat: Vec<u64> = (1..=100).collect();
        let o = ops(&lat, 0);
        let pass: Threshold = "deliver.p95 < 120ms".parse().expect("parse");
        let fail: Threshold = "deliver.p95 < 90ms".parse().expect("parse");
        assert_eq!(pass.evaluate("run", &o, 10.0).pass, Some(true));
        let r = fail.evaluate("run", &o, 10.0);
        assert_eq!(r.pass, Some(false));
        assert!((r.actual.expect("actual") - 95.0).abs() < 0.5);
        let o = ops(&lat, 1);
        let sr: Threshold = "success_rate >= 99.95%".parse().expect("parse");
        let r = sr.evaluate("run", &o, 10.0);
        assert_eq!(r.pass, Some(false));
        assert!((r.actual.expect("actual") - 100.0 * 100.0 / 101.0).abs() < 1e-9);
        let tp: Threshold = "deliver.throughput >= 10".parse().expect("parse");
        assert_eq!(tp.evaluate("run", &o, 10.0).pass, Some(true));
    }

    #[test]
    fn missing_op_is_not_evaluated_and_all_failed_fails() {
        let o = ops(&[5], 0);
        let t: Threshold = "fetch.p95 < 350ms".parse().expect("parse");
        let r = t.evaluate("run", &o, 1.0);
        assert_eq!(r.pass, None);
        assert!(verdict(&[r]));
        let o = ops(&[], 3);
        let t: Threshold = "deliver.p95 < 350ms".parse().expect("parse");
        let r = t.evaluate("run", &o, 1.0);
        assert_eq!(r.pass, Some(false));
        assert!(!verdict(&[r]));
    }

    #[test]
    fn defaults_follow_design() {
        let t = run_thresholds(&SloSpec::default(), &[]).expect("defaults");
        let texts: Vec<_> = t.iter().map(|t| t.text.as_str()).collect();
        assert!(texts.contains(&"success_rate >= 99.95%"));
        assert!(texts.contains(&"deliver.p95 <= 120ms"));
        assert!(texts.contains(&"fetch.p95 <= 350ms"));
        let spec = SloSpec { smtp_p95_ms: Some(80.0), ..Default::default() };
        let t = run_thresholds(&spec, &["x.p99 < 1s".into()]).expect("parse");
        assert!(t.iter().any(|t| t.text == "deliver.p95 <= 80ms"));
        assert_eq!(t.last().map(|t| t.value), Some(1000.0));
    }
}
