//! `mailcluster stress`: load scenarios against any SMTP / IMAP / POP3 server, with
//! HDR-histogram measurement, SLO verdicts and reports.
//!
//! The crate is organised by concern:
//! - [`client`]: small SMTP/IMAP/POP3 clients over tokio (plain, STARTTLS, implicit TLS);
//! - [`engine`]: workers, open/closed-loop scheduling, the scenarios themselves;
//! - [`measure`]: histograms, error counters, per-second series;
//! - [`generator`]: the generator's own CPU and scheduling lag (saturation flag);
//! - [`slo`]: thresholds and the verdict;
//! - [`report`]: console table, JSON, CSV, HTML, Pushgateway;
//! - [`kube_report`]: `status.lastStress` of a MailCluster;
//! - [`sink`]: a minimal SMTP sink used to benchmark the generator itself.
//!
//! Exit codes: 0 every SLO met, 3 an SLO missed, 1 the run could not be carried out
//! (bad arguments, unreachable report target) or was interrupted.
#![forbid(unsafe_code)]

pub mod args;
pub mod client;
pub mod engine;
pub mod generator;
pub mod kube_report;
pub mod measure;
pub mod report;
pub mod sink;
pub mod slo;
pub mod tls;
pub mod workload;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::watch;

pub use args::StressArgs;
use engine::{Env, Plan};
use measure::{OpData, Recorder};
use report::{Report, ScenarioReport};

/// Exit code: every SLO met.
pub const EXIT_PASS: i32 = 0;
/// Exit code: the run failed to run (or was interrupted).
pub const EXIT_ERROR: i32 = 1;
/// Exit code: at least one SLO missed.
pub const EXIT_SLO_FAILED: i32 = 3;

/// Run the stress command; returns the process exit code.
pub async fn run(args: StressArgs) -> i32 {
    if args.sink.is_some() {
        return match sink::run_from_args(&args).await {
            Ok(()) => EXIT_PASS,
            Err(e) => {
                eprintln!("error: {e:#}");
                EXIT_ERROR
            }
        };
    }
    if args.print {
        return match args::print(&args) {
            Ok(text) => {
                print!("{text}");
                EXIT_PASS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                EXIT_ERROR
            }
        };
    }
    let (cancel_tx, cancel_rx) = watch::channel(false);
    // Ctrl-C stops the load; the report of what ran is still produced.
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("interrupted: stopping load, writing the partial report");
            let _ = cancel_tx.send(true);
        }
    });
    let code = match run_with_cancel(args, cancel_rx).await {
        Ok(report) => report.exit_code(),
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_ERROR
        }
    };
    ctrl_c.abort();
    code
}

/// Run everything the arguments ask for, stopping early when `cancel` turns true.
/// Writes the console report and the requested outputs; returns the report.
pub async fn run_with_cancel(args: StressArgs, cancel: watch::Receiver<bool>) -> anyhow::Result<Report> {
    let setup = args::resolve(&args)?;
    let mut env = Env::new(setup.targets, setup.users, setup.messages, &setup.run_id);
    if let Some(path) = &args.ack_log {
        env = env.with_ack_log(path)?;
    }
    let env = Arc::new(env);
    let started_at = chrono::Utc::now();
    let mut scenarios = Vec::new();
    let mut datas = Vec::new();
    for plan in setup.plans {
        if *cancel.borrow() {
            break;
        }
        let (sr, data) = run_scenario(Arc::new(plan), Arc::clone(&env), cancel.clone(), &args).await;
        scenarios.push(sr);
        datas.push(data);
    }
    let interrupted = *cancel.borrow();
    env.finish()?;
    let report = report::assemble(report::Assembly {
        run_id: setup.run_id,
        job: setup.job,
        started_at,
        finished_at: chrono::Utc::now(),
        interrupted,
        scenarios,
        datas,
        run_thresholds: setup.run_thresholds,
    });
    if !args.quiet {
        print!("{}", report::console(&report));
    }
    report::write_outputs(&args, &report).await?;
    if let Some(target) = &args.report_to {
        let (ns, name) = target
            .split_once('/')
            .with_context(|| format!("--report-to wants NAMESPACE/NAME, got {target:?}"))?;
        let client =
            kube::Client::try_default().await.context("building the in-cluster Kubernetes client")?;
        kube_report::report_to_cluster(client, ns, name, &report.last_stress()).await?;
        eprintln!("status.lastStress of {ns}/{name} updated");
    }
    Ok(report)
}

/// Measured data of one scenario, kept for run-wide merging and SLOs.
pub struct ScenarioData {
    pub ops: BTreeMap<String, OpData>,
}

async fn run_scenario(
    plan: Arc<Plan>,
    env: Arc<Env>,
    cancel: watch::Receiver<bool>,
    args: &StressArgs,
) -> (ScenarioReport, ScenarioData) {
    let rec = Arc::new(Recorder::new());
    let mut monitor = generator::Monitor::start();
    let started_at = chrono::Utc::now();
    let t0 = Instant::now();
    let total = plan.ramp_up + plan.duration;
    let mut progress = Progress::new(&plan.name, total, args.quiet || args.no_progress);
    let mut drive = tokio::spawn(engine::drive(Arc::clone(&plan), env, Arc::clone(&rec), cancel));
    let mut ticker = tokio::time::interval_at((t0 + Duration::from_secs(1)).into(), Duration::from_secs(1));
    let mut second = 0u32;
    let backlog = loop {
        tokio::select! {
            r = &mut drive => break r.unwrap_or(0),
            _ = ticker.tick() => {
                second += 1;
                let (ok, err) = rec.tick(second);
                let g = monitor.tick(second);
                progress.update(second, ok, err, &rec, g.cpu_percent);
            }
        }
    };
    // The last, partial second.
    second += 1;
    rec.tick(second);
    monitor.tick(second);
    progress.finish();
    let elapsed = t0.elapsed();
    let measure::Finished { ops, series, minutes } = rec.finish();
    let (generator, generator_series) = monitor.finish();
    let elapsed_s = elapsed.as_secs_f64();
    let slo = plan.slo.iter().map(|t| t.evaluate(&plan.name, &ops, elapsed_s)).collect();
    let summaries = ops.iter().map(|(k, d)| (k.clone(), d.summary(elapsed))).collect();
    let sr = ScenarioReport {
        name: plan.name.clone(),
        kind: format!("{:?}", plan.kind),
        started_at: started_at.to_rfc3339(),
        elapsed_s,
        concurrency: plan.concurrency,
        rate: plan.rate,
        backlog,
        ops: summaries,
        series,
        minutes,
        generator,
        generator_series,
        slo,
    };
    (sr, ScenarioData { ops })
}

/// Live progress: a bar on a terminal, a plain line every 5 s otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    name: String,
}

impl Progress {
    fn new(name: &str, total: Duration, quiet: bool) -> Progress {
        if quiet {
            return Progress { bar: None, plain: false, name: name.into() };
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total.as_secs().max(1));
            let style = ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos}/{len}s {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(name.to_string());
            Progress { bar: Some(bar), plain: false, name: name.into() }
        } else {
            Progress { bar: None, plain: true, name: name.into() }
        }
    }

    fn update(&mut self, second: u32, ok: u64, err: u64, rec: &Recorder, cpu: f64) {
        let (tok, terr) = rec.totals();
        let msg = format!("{ok} ok/s {err} err/s | total {tok} ok {terr} err | cpu {cpu:.0}%");
        if let Some(bar) = &self.bar {
            bar.set_position(second as u64);
            bar.set_message(msg);
        } else if self.plain && second.is_multiple_of(5) {
            eprintln!("[{}] t={second}s {msg}", self.name);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
