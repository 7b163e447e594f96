//! The run report and its renderings: console table, JSON, CSV (per-second series),
//! HTML (see [`html`]) and Pushgateway (see [`push`]).

pub mod html;
pub mod push;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context;
use mailcluster_api::stress::LastStress;
use serde::Serialize;

use crate::generator::{GeneratorPoint, GeneratorSummary};
use crate::measure::{OpData, OpSummary, SeriesPoint};
use crate::slo::{SloResult, Threshold, verdict};
use crate::{EXIT_ERROR, EXIT_PASS, EXIT_SLO_FAILED, ScenarioData, StressArgs};

/// One scenario's results.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub kind: String,
    pub started_at: String,
    pub elapsed_s: f64,
    pub concurrency: usize,
    /// Open-loop target rate; `None` for closed loop.
    pub rate: Option<f64>,
    /// Operations due but never started (open loop, server too slow).
    pub backlog: u64,
    pub ops: BTreeMap<String, OpSummary>,
    /// Per second: each operation's count and latency in that second.
    pub series: Vec<SeriesPoint>,
    /// Per minute, from each minute's own histogram (a soak's SLO is judged per
    /// minute, and a minute's percentiles do not follow from its seconds').
    pub minutes: Vec<SeriesPoint>,
    pub generator: GeneratorSummary,
    pub generator_series: Vec<GeneratorPoint>,
    pub slo: Vec<SloResult>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub run_id: String,
    pub job: Option<String>,
    pub started_at: String,
    pub finished_at: String,
    pub interrupted: bool,
    /// `Pass` or `Fail`.
    pub verdict: String,
    /// Percent of primary operations that succeeded, all scenarios together.
    pub success_rate: f64,
    pub generator: GeneratorSummary,
    /// Run-wide and per-scenario threshold results.
    pub slo: Vec<SloResult>,
    /// Operations merged over all scenarios.
    pub totals: BTreeMap<String, OpSummary>,
    pub scenarios: Vec<ScenarioReport>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.verdict == "Pass"
    }

    pub fn exit_code(&self) -> i32 {
        if self.interrupted {
            EXIT_ERROR
        } else if self.passed() {
            EXIT_PASS
        } else {
            EXIT_SLO_FAILED
        }
    }

    /// The block written to `status.lastStress`.
    pub fn last_stress(&self) -> LastStress {
        LastStress {
            started_at: self.started_at.clone(),
            finished_at: self.finished_at.clone(),
            verdict: self.verdict.clone(),
            success_rate: round(self.success_rate, 4),
            p95_ms: self
                .totals
                .iter()
                .filter(|(_, s)| s.primary)
                .map(|(k, s)| (k.clone(), round(s.p95_ms, 3)))
                .collect(),
            generator_saturated: self.generator.saturated,
            job: self.job.clone().or_else(|| Some(self.run_id.clone())),
        }
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// Inputs of [`assemble`].
pub struct Assembly {
    pub run_id: String,
    pub job: Option<String>,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub finished_at: chrono::DateTime<chrono::Utc>,
    pub interrupted: bool,
    pub scenarios: Vec<ScenarioReport>,
    pub datas: Vec<ScenarioData>,
    pub run_thresholds: Vec<Threshold>,
}

/// Merge scenarios, evaluate run-wide thresholds, decide the verdict.
pub fn assemble(a: Assembly) -> Report {
    let mut merged: BTreeMap<String, OpData> = BTreeMap::new();
    for d in &a.datas {
        for (k, v) in &d.ops {
            match merged.get_mut(k) {
                Some(m) => m.merge(v),
                None => {
                    merged.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let elapsed_s: f64 = a.scenarios.iter().map(|s| s.elapsed_s).sum();
    let mut slo: Vec<SloResult> =
        a.run_thresholds.iter().map(|t| t.evaluate("run", &merged, elapsed_s)).collect();
    for s in &a.scenarios {
        slo.extend(s.slo.iter().cloned());
    }
    let (ok, total) = merged
        .values()
        .filter(|d| d.primary)
        .fold((0u64, 0u64), |(o, t), d| (o + d.ok, t + d.ok + d.error_count()));
    let success_rate = if total == 0 { 0.0 } else { ok as f64 * 100.0 / total as f64 };
    // No operation at all is not a pass: a run that measured nothing proves nothing.
    let pass = verdict(&slo) && total > 0 && !a.interrupted;
    let generator =
        crate::generator::merge(&a.scenarios.iter().map(|s| s.generator.clone()).collect::<Vec<_>>());
    let totals = merged
        .iter()
        .map(|(k, d)| (k.clone(), d.summary(std::time::Duration::from_secs_f64(elapsed_s))))
        .collect();
    Report {
        run_id: a.run_id,
        job: a.job,
        started_at: a.started_at.to_rfc3339(),
        finished_at: a.finished_at.to_rfc3339(),
        interrupted: a.interrupted,
        verdict: if pass { "Pass" } else { "Fail" }.into(),
        success_rate,
        generator,
        slo,
        totals,
        scenarios: a.scenarios,
    }
}

/// Human-readable final report.
pub fn console(r: &Report) -> String {
    let mut o = String::new();
    for s in &r.scenarios {
        let mode = match s.rate {
            Some(rate) => format!("open loop {rate}/s"),
            None => "closed loop".into(),
        };
        let _ = writeln!(
            o,
            "\n== {} ({}, {} workers, {mode}, {:.1}s) ==",
            s.name, s.kind, s.concurrency, s.elapsed_s
        );
        let _ = writeln!(
            o,
            "{:<24} {:>9} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "operation",
            "count",
            "errors",
            "success",
            "ops/s",
            "p50ms",
            "p90ms",
            "p95ms",
            "p99ms",
            "p99.9ms",
            "maxms"
        );
        for (name, op) in &s.ops {
            let label = if op.primary { name.clone() } else { format!("  ({name})") };
            let _ = writeln!(
                o,
                "{:<24} {:>9} {:>7} {:>7.2}% {:>9.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                label,
                op.count,
                op.errors,
                op.success_rate,
                op.throughput,
                op.p50_ms,
                op.p90_ms,
                op.p95_ms,
                op.p99_ms,
                op.p999_ms,
                op.max_ms
            );
            for (k, n) in &op.errors_by_kind {
                let _ = writeln!(o, "{:<24}   error {k}: {n}", "");
            }
        }
        if s.backlog > 0 {
            let _ = writeln!(o, "backlog: {} operations were due and never sent", s.backlog);
        }
        let g = &s.generator;
        let _ = writeln!(
            o,
            "generator: cpu mean {:.0}% max {:.0}% of {} worker thread(s), lag p99 {:.1} ms{}",
            g.cpu_mean_percent,
            g.cpu_max_percent,
            g.worker_threads,
            g.lag_p99_ms,
            if g.saturated {
                format!(" — SATURATED: {}", g.reason.as_deref().unwrap_or(""))
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(o, "\n== SLO ==");
    for res in &r.slo {
        let _ = writeln!(o, "{res}");
    }
    let _ = writeln!(o, "success rate {:.3}%", r.success_rate);
    if r.generator.saturated {
        let _ = writeln!(
            o,
            "WARNING: the load generator was saturated ({}); latencies may be overstated",
            r.generator.reason.as_deref().unwrap_or("")
        );
    }
    if r.interrupted {
        let _ = writeln!(o, "INTERRUPTED: partial report");
    }
    let _ = writeln!(o, "verdict: {}", r.verdict);
    o
}

/// Per-second series as CSV: one row per scenario, second and operation, with the
/// generator's CPU and lag of that second.
pub fn csv(r: &Report) -> String {
    let mut o = String::from(
        "scenario,second,op,primary,ok,errors,p50_ms,p95_ms,p99_ms,max_ms,generator_cpu_percent,generator_lag_ms\n",
    );
    for s in &r.scenarios {
        let gen_at: BTreeMap<u32, &GeneratorPoint> =
            s.generator_series.iter().map(|g| (g.second, g)).collect();
        for p in &s.series {
            let g = gen_at.get(&p.second);
            let primary = s.ops.get(&p.op).is_some_and(|o| o.primary);
            let _ = writeln!(
                o,
                "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.1},{:.2}",
                csv_field(&s.name),
                p.second,
                csv_field(&p.op),
                primary,
                p.ok,
                p.errors,
                p.p50_ms,
                p.p95_ms,
                p.p99_ms,
                p.max_ms,
                g.map_or(0.0, |g| g.cpu_percent),
                g.map_or(0.0, |g| g.lag_max_ms),
            );
        }
    }
    o
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// Write every output the arguments ask for.
pub async fn write_outputs(args: &StressArgs, r: &Report) -> anyhow::Result<()> {
    if let Some(p) = &args.json {
        let data = serde_json::to_vec_pretty(r)?;
        std::fs::write(p, data).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.csv {
        std::fs::write(p, csv(r)).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.html {
        std::fs::write(p, html::render(r)).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(url) = &args.pushgateway {
        push::push(url, &args.push_job, &args.cluster, &r.run_id, r).await?;
    }
    Ok(())
}
