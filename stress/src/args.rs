//! Command-line arguments and their resolution, together with an optional scenario
//! file, into concrete [`Plan`]s.
//!
//! Precedence: command-line flag > scenario file > per-kind default. Per-kind
//! defaults follow the seed profile and are sized so that a bare `mailcluster stress --smtp
//! … --imap … --pop3 …` finishes in about three minutes.

use anyhow::{Context, bail};
use mailcluster_api::stress::{
    AuthMechanism, EndpointSpec, MessageSize, Protocol, ScenarioKind, ScenarioSpec, SmtpTarget,
    StressProfile, StressSpec, TargetsSpec, TlsMode, UsersSpec,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::client::Endpoint;
use crate::engine::{ImapCmd, Op, Plan, Targets};
use crate::slo::{Threshold, run_thresholds};
use crate::tls::TlsSettings;
use crate::workload::{Messages, Users, parse_duration, parse_size};

const EXIT_HELP: &str = "\
Exit status:
  0  every SLO threshold met
  3  at least one SLO threshold missed (the report says which)
  1  the run could not be carried out (bad arguments, report target unreachable) or was interrupted

Thresholds look like `deliver.p95 < 120ms`, `fetch.p99.9 <= 1s`, `success_rate >= 99.95%`,
`pop3-session.errors == 0`, `deliver.throughput >= 500`. An operation name also matches
its family (`fetch` = `fetch-body` + `fetch-header`).";

/// Arguments of `mailcluster stress`.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(after_help = EXIT_HELP)]
pub struct StressArgs {
    /// Scenario file (YAML: targets, users, scenarios, slo) — the `spec.stress` format.
    #[arg(short = 'f', long = "file", visible_alias = "scenario-file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// A reference profile shipped with the runner, used like a scenario file:
    /// whitepaper, whitepaper-short, submission-pop3 (stress/profiles/). Flags
    /// override it as they override a file.
    #[arg(long, value_name = "NAME", value_parser = parse_profile, conflicts_with = "file")]
    pub profile: Option<StressProfile>,
    /// Print the resolved run (targets, users, every scenario with every knob, SLOs)
    /// as a scenario file, and exit without sending anything.
    #[arg(long)]
    pub print: bool,
    /// Scenarios to run (comma-separated) when no file is given: connect-flood, auth,
    /// deliver, search, fetch, pop3, mixed, imap-mix, seed, smtp-noop. Default: deliver, auth,
    /// search, fetch, pop3, connect-flood (those whose targets are given).
    #[arg(short = 's', long, value_delimiter = ',', value_parser = parse_kind)]
    pub scenarios: Vec<ScenarioKind>,

    /// SMTP target host:port.
    #[arg(long, value_name = "HOST:PORT")]
    pub smtp: Option<String>,
    /// TLS mode of the SMTP target: plain, starttls, implicit.
    #[arg(long, value_parser = parse_tls, value_name = "MODE")]
    pub smtp_tls: Option<TlsMode>,
    /// Submission target host:port (STARTTLS unless --submission-tls says otherwise);
    /// used by `--smtp-target submission` and the `submission` weight.
    #[arg(long, value_name = "HOST:PORT")]
    pub submission: Option<String>,
    #[arg(long, value_parser = parse_tls, value_name = "MODE")]
    pub submission_tls: Option<TlsMode>,
    /// Submission over implicit TLS, host:port; used by `--smtp-target submissions`
    /// and the `submissions` weight.
    #[arg(long, value_name = "HOST:PORT")]
    pub submissions: Option<String>,
    #[arg(long, value_parser = parse_tls, value_name = "MODE")]
    pub submissions_tls: Option<TlsMode>,
    /// IMAP target host:port.
    #[arg(long, value_name = "HOST:PORT")]
    pub imap: Option<String>,
    #[arg(long, value_parser = parse_tls, value_name = "MODE")]
    pub imap_tls: Option<TlsMode>,
    /// POP3 target host:port.
    #[arg(long, value_name = "HOST:PORT")]
    pub pop3: Option<String>,
    #[arg(long, value_parser = parse_tls, value_name = "MODE")]
    pub pop3_tls: Option<TlsMode>,
    /// Do not verify server certificates (self-signed test certificates).
    #[arg(short = 'k', long)]
    pub insecure: bool,
    /// Extra CA certificate(s) (PEM) to trust when verifying.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// TLS server name (SNI) instead of the target's host.
    #[arg(long)]
    pub server_name: Option<String>,

    /// User name template; `{:04}` is replaced by the user number.
    #[arg(long, value_name = "TEMPLATE")]
    pub users_template: Option<String>,
    /// First user number.
    #[arg(long)]
    pub users_first: Option<u32>,
    /// Number of users.
    #[arg(long)]
    pub users_count: Option<u32>,
    /// Password of the generated users.
    #[arg(long, env = "MAILCLUSTER_STRESS_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// File of `user password` lines (overrides the template).
    #[arg(long, value_name = "FILE")]
    pub users_file: Option<PathBuf>,
    /// Before the run, make the run's users exist in the mail store that `serve`
    /// would open (MAILCLUSTER_DATABASE_URL, or the embedded default) and give them
    /// all a password made for this run; afterwards, replace it with one nobody
    /// knows. The in-cluster stress Job runs this way: its accounts never carry a
    /// password that outlives the run. The users' domain must already be served.
    #[arg(long, conflicts_with_all = ["users_file", "password"])]
    pub provision_accounts: bool,

    /// Concurrent sessions (connections held, for connect-flood).
    #[arg(short = 'c', long)]
    pub concurrency: Option<u32>,
    /// Open-loop rate in operations/s (latency counted from the intended send time).
    #[arg(short = 'r', long)]
    pub rate: Option<f64>,
    /// Closed loop: ignore any rate of the scenario file.
    #[arg(long, conflicts_with = "rate")]
    pub closed_loop: bool,
    /// Duration of each scenario (e.g. 30s, 2m); hold time for connect-flood.
    #[arg(short = 'd', long)]
    pub duration: Option<String>,
    /// Linear ramp-up before the full rate / concurrency (e.g. 10s).
    #[arg(long)]
    pub ramp_up: Option<String>,
    /// Cap on operations per scenario.
    #[arg(long)]
    pub max_ops: Option<u64>,
    /// Per-operation timeout (e.g. 10s).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Message size class `SIZE[:WEIGHT][:attach]` (repeatable), e.g. `4k:80 64k:15:attach 1M:5:attach`.
    #[arg(long = "message-size", value_name = "SIZE[:W][:attach]")]
    pub message_sizes: Vec<String>,
    /// Authentication mechanism: login, plain, both, none.
    #[arg(long, value_parser = parse_auth)]
    pub auth: Option<AuthMechanism>,
    /// Protocol for connect-flood / auth: smtp, imap, pop3.
    #[arg(long, value_parser = parse_protocol)]
    pub protocol: Option<Protocol>,
    /// SMTP endpoint of deliveries: smtp, submission, submissions.
    #[arg(long, value_parser = parse_smtp_target, value_name = "TARGET")]
    pub smtp_target: Option<SmtpTarget>,
    /// Envelope sender and From: of every message. Default: the authenticated user
    /// with --auth (a submission server refuses any other), else another test user.
    #[arg(long, value_name = "ADDRESS")]
    pub sender: Option<String>,
    /// Deliver to the same local parts at this domain instead of to the users
    /// themselves: outbound mail, which the server relays to another domain.
    #[arg(long, value_name = "DOMAIN")]
    pub recipient_domain: Option<String>,
    /// Operations per session before reconnecting (0 = keep the session).
    #[arg(long)]
    pub ops_per_connection: Option<u32>,
    /// Weights of `mixed`, e.g. `deliver=60,fetch=25,search=15`.
    #[arg(long, value_delimiter = ',')]
    pub weights: Vec<String>,
    /// `seed`: messages per user INBOX.
    #[arg(long)]
    pub messages_per_user: Option<u32>,

    /// Extra SLO threshold (repeatable), e.g. `deliver.p99 < 300ms`.
    #[arg(long = "slo", value_name = "THRESHOLD")]
    pub slo: Vec<String>,
    /// Required success rate in percent (default 99.95).
    #[arg(long)]
    pub success_rate: Option<f64>,

    /// Write the full report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the per-second series as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the Message-ID of every message the server acknowledged (250 to the
    /// end of DATA), one per line: what an exactly-once check compares the store with.
    #[arg(long, value_name = "FILE")]
    pub ack_log: Option<PathBuf>,
    /// Write a self-contained HTML report with plots.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Push summary metrics to this Prometheus Pushgateway (http://host:port).
    #[arg(long, value_name = "URL")]
    pub pushgateway: Option<String>,
    /// Pushgateway grouping: job name.
    #[arg(long, default_value = "mailcluster-stress")]
    pub push_job: String,
    /// Pushgateway grouping: cluster name.
    #[arg(long, default_value = "default")]
    pub cluster: String,
    /// Run identifier (default: start time).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Write the verdict into `status.lastStress` of this MailCluster (NAMESPACE/NAME),
    /// using the in-cluster Kubernetes configuration.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub report_to: Option<String>,
    /// Job name recorded in `status.lastStress.job`.
    #[arg(long, env = "MAILCLUSTER_STRESS_JOB")]
    pub job_name: Option<String>,
    /// No progress output.
    #[arg(long)]
    pub no_progress: bool,
    /// No console report (outputs and exit code only).
    #[arg(short = 'q', long)]
    pub quiet: bool,

    /// Benchmark helper: run a minimal SMTP sink on this address instead of a load.
    #[arg(long, hide = true, value_name = "ADDR")]
    pub sink: Option<String>,
    /// Sink: implicit TLS with a generated self-signed certificate.
    #[arg(long, hide = true)]
    pub sink_tls: bool,
    /// Sink: stop after this long (default: forever).
    #[arg(long, hide = true)]
    pub sink_for: Option<String>,
}

fn parse_kind(s: &str) -> Result<ScenarioKind, String> {
    serde_yaml_ng::from_str(s).map_err(|_| format!("unknown scenario {s:?}"))
}
fn parse_tls(s: &str) -> Result<TlsMode, String> {
    serde_yaml_ng::from_str(s).map_err(|_| format!("TLS mode must be plain, starttls or implicit, not {s:?}"))
}
fn parse_auth(s: &str) -> Result<AuthMechanism, String> {
    serde_yaml_ng::from_str(s).map_err(|_| format!("auth must be login, plain, both or none, not {s:?}"))
}
fn parse_protocol(s: &str) -> Result<Protocol, String> {
    serde_yaml_ng::from_str(s).map_err(|_| format!("protocol must be smtp, imap or pop3, not {s:?}"))
}
fn parse_smtp_target(s: &str) -> Result<SmtpTarget, String> {
    serde_yaml_ng::from_str(s)
        .map_err(|_| format!("SMTP target must be smtp, submission or submissions, not {s:?}"))
}
fn parse_profile(s: &str) -> Result<StressProfile, String> {
    StressProfile::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = StressProfile::ALL.iter().map(|p| p.name()).collect();
        format!("unknown profile {s:?} (known: {})", names.join(", "))
    })
}

/// Everything a run needs, resolved and validated.
pub struct Setup {
    pub targets: Targets,
    pub users: Users,
    pub messages: Messages,
    pub plans: Vec<Plan>,
    pub run_thresholds: Vec<Threshold>,
    pub run_id: String,
    pub job: Option<String>,
    /// The run as a scenario file, every knob resolved (what `--print` shows).
    pub resolved: StressSpec,
}

/// Upper bounds that keep a typo from turning into a runaway run.
const MAX_CONCURRENCY: u32 = 200_000;
const MAX_OPS_CLOSED: u64 = 100_000_000;

/// The run's users: the scenario file's (or profile's) `users`, with the flags
/// applied on top.
fn users_of(args: &StressArgs, spec: Option<UsersSpec>) -> anyhow::Result<(UsersSpec, Users)> {
    let mut u = spec.unwrap_or_default();
    if let Some(v) = &args.users_template {
        u.template = v.clone();
    }
    if let Some(v) = args.users_first {
        u.first = v;
    }
    if let Some(v) = args.users_count {
        u.count = v;
    }
    if let Some(v) = &args.password {
        u.password = v.clone();
    }
    if let Some(v) = &args.users_file {
        u.file = Some(v.display().to_string());
    }
    let users = Users::from_spec(&u)?;
    Ok((u, users))
}

/// The users a run with these arguments logs in as, without resolving anything
/// else (what `--provision-accounts` creates before the run).
pub fn planned_users(args: &StressArgs) -> anyhow::Result<Users> {
    let mut spec = load_spec(args)?;
    Ok(users_of(args, spec.users.take())?.1)
}

/// The scenario file or profile the arguments name (an empty spec when neither).
fn load_spec(args: &StressArgs) -> anyhow::Result<StressSpec> {
    Ok(match (&args.file, args.profile) {
        (Some(f), _) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", f.display()))?
        }
        (None, Some(p)) => p.spec().with_context(|| format!("parsing profile {p}"))?,
        (None, None) => StressSpec::default(),
    })
}

pub fn resolve(args: &StressArgs) -> anyhow::Result<Setup> {
    let mut spec = load_spec(args)?;
    // Targets.
    let mut t = spec.targets.take().unwrap_or_default();
    override_endpoint(&mut t.smtp, &args.smtp, args.smtp_tls, TlsMode::Plain);
    override_endpoint(&mut t.submission, &args.submission, args.submission_tls, TlsMode::Starttls);
    override_endpoint(&mut t.submissions, &args.submissions, args.submissions_tls, TlsMode::Implicit);
    override_endpoint(&mut t.imap, &args.imap, args.imap_tls, TlsMode::Plain);
    override_endpoint(&mut t.pop3, &args.pop3, args.pop3_tls, TlsMode::Plain);
    let ca = match &args.ca_file {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let endpoint = |e: &Option<EndpointSpec>| -> anyhow::Result<Option<Endpoint>> {
        let Some(e) = e else { return Ok(None) };
        let host = e.address.rsplit_once(':').map_or(e.address.as_str(), |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name =
            args.server_name.clone().or_else(|| e.server_name.clone()).unwrap_or_else(|| host.to_string());
        let tls = TlsSettings::new(&name, e.verify && !args.insecure, ca.as_deref())?;
        Ok(Some(Endpoint { address: e.address.clone(), tls_mode: e.tls, tls }))
    };
    let targets = Targets {
        smtp: endpoint(&t.smtp)?,
        submission: endpoint(&t.submission)?,
        submissions: endpoint(&t.submissions)?,
        imap: endpoint(&t.imap)?,
        pop3: endpoint(&t.pop3)?,
    };
    if [&targets.smtp, &targets.submission, &targets.submissions, &targets.imap, &targets.pop3]
        .iter()
        .all(|e| e.is_none())
    {
        bail!(
            "no target: give --smtp, --submission(s), --imap and/or --pop3 (or targets in the scenario file)"
        );
    }

    let (u, users) = users_of(args, spec.users.take())?;
    if let Some(sender) = &args.sender {
        check_sender(sender)?;
    }

    // Scenarios.
    let mut scenarios = if !args.scenarios.is_empty() {
        args.scenarios.iter().map(|k| ScenarioSpec::new(*k)).collect()
    } else if !spec.scenarios.is_empty() {
        std::mem::take(&mut spec.scenarios)
    } else {
        default_scenarios(&targets)
    };
    if scenarios.is_empty() {
        bail!("no scenario to run for the given targets");
    }
    let cli_sizes =
        args.message_sizes.iter().map(|s| parse_size_class(s)).collect::<anyhow::Result<Vec<_>>>()?;
    for s in &scenarios {
        if let Some(sender) = &s.sender {
            check_sender(sender).with_context(|| format!("scenario {}", s.name.as_deref().unwrap_or("?")))?;
        }
    }
    let mut plans = Vec::new();
    let mut all_sizes = Vec::new();
    for s in scenarios.iter_mut() {
        let plan = plan_for(s, args, &cli_sizes, &users)?;
        check_targets(&plan, &targets)?;
        all_sizes.extend(plan.sizes.iter().cloned());
        plans.push(plan);
    }
    // One message pool for the run; per-scenario sizes differ rarely enough that a
    // pool per scenario is not worth the memory.
    let messages = Messages::build(&all_sizes)?;

    let mut slo_spec = spec.slo.clone();
    if let Some(r) = args.success_rate {
        slo_spec.success_rate = Some(r);
    }
    let run_thresholds = run_thresholds(&slo_spec, &args.slo)?;
    let run_id =
        args.run_id.clone().unwrap_or_else(|| chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string());
    let resolved = resolved_spec(&t, &u, &plans, &slo_spec, &args.slo, args.insecure);
    Ok(Setup {
        targets,
        users,
        messages,
        plans,
        run_thresholds,
        run_id,
        job: args.job_name.clone(),
        resolved,
    })
}

/// `--print`: the resolved run as a scenario file, after the profile's own comment
/// (its source figures) when a profile was asked for.
pub fn print(args: &StressArgs) -> anyhow::Result<String> {
    let setup = resolve(args)?;
    let mut out = String::new();
    if let Some(p) = args.profile {
        out.push_str(&p.header());
        out.push_str(&format!("#\n# Resolved from profile {p}; every knob shown with its value.\n"));
    }
    out.push_str(&serde_yaml_ng::to_string(&setup.resolved).context("rendering the resolved run")?);
    Ok(out)
}

/// The run as a scenario file with every knob at its resolved value. The password is
/// never printed.
fn resolved_spec(
    t: &TargetsSpec,
    u: &UsersSpec,
    plans: &[Plan],
    slo: &mailcluster_api::stress::SloSpec,
    extra_slo: &[String],
    insecure: bool,
) -> StressSpec {
    let mut targets = t.clone();
    for e in [
        &mut targets.smtp,
        &mut targets.submission,
        &mut targets.submissions,
        &mut targets.imap,
        &mut targets.pop3,
    ]
    .into_iter()
    .flatten()
    {
        e.verify &= !insecure;
    }
    let mut slo = slo.clone();
    slo.success_rate = slo.success_rate.or(Some(crate::slo::DEFAULT_SUCCESS_RATE));
    slo.smtp_p95_ms = slo.smtp_p95_ms.or(Some(crate::slo::DEFAULT_SMTP_P95_MS));
    slo.imap_fetch_p95_ms = slo.imap_fetch_p95_ms.or(Some(crate::slo::DEFAULT_IMAP_FETCH_P95_MS));
    slo.thresholds.extend(extra_slo.iter().cloned());
    StressSpec {
        schedule: None,
        targets: Some(targets),
        users: Some(UsersSpec { password: "(not shown)".into(), ..u.clone() }),
        scenarios: plans.iter().map(scenario_of).collect(),
        slo,
    }
}

fn scenario_of(p: &Plan) -> ScenarioSpec {
    // Knobs a scenario cannot use are left out, so the listing reads as the load.
    let sends = p.kind != ScenarioKind::ConnectFlood
        && p.mix.iter().any(|(op, _)| matches!(op, Op::Deliver(_) | Op::Seed));
    let smtp = sends
        || p.mix.iter().any(|(op, _)| *op == Op::Noop)
        || (matches!(p.kind, ScenarioKind::ConnectFlood | ScenarioKind::Auth)
            && !matches!(p.protocol, Some(Protocol::Imap | Protocol::Pop3)));
    let mut weights = BTreeMap::new();
    if matches!(p.kind, ScenarioKind::Mixed | ScenarioKind::ImapMix) {
        let mut prev = 0;
        for (op, cum) in &p.mix {
            weights.insert(op_weight_name(*op).to_string(), (*cum - prev) as u32);
            prev = *cum;
        }
    }
    ScenarioSpec {
        name: Some(p.name.clone()),
        kind: p.kind,
        protocol: p.protocol,
        concurrency: Some(p.concurrency as u32),
        rate: p.rate,
        duration: Some(format_duration(p.duration)),
        ramp_up: Some(format_duration(p.ramp_up)),
        // The closed-loop budget is a backstop, not a property of the run.
        max_ops: (p.max_ops < MAX_OPS_CLOSED).then_some(p.max_ops),
        timeout: Some(format_duration(p.timeout)),
        message_sizes: if sends { p.sizes.clone() } else { Vec::new() },
        auth: Some(p.auth),
        ops_per_connection: Some(p.ops_per_connection),
        weights,
        messages_per_user: (p.kind == ScenarioKind::Seed).then_some(p.messages_per_user),
        smtp_target: smtp.then_some(p.smtp_target),
        sender: p.sender.clone(),
        slo: p.slo.iter().map(|t| t.text.clone()).collect(),
    }
}

/// The `weights` key of an operation (inverse of [`Op::parse`]).
fn op_weight_name(op: Op) -> &'static str {
    match op {
        Op::Deliver(None) | Op::Deliver(Some(SmtpTarget::Smtp)) => "deliver",
        Op::Deliver(Some(SmtpTarget::Submission)) => "submission",
        Op::Deliver(Some(SmtpTarget::Submissions)) => "submissions",
        Op::Noop => "noop",
        Op::Auth => "auth",
        Op::Search => "search",
        Op::Fetch => "fetch",
        Op::Pop3 => "pop3",
        Op::Seed => "seed",
        Op::Imap(cmd) => cmd.name(),
    }
}

/// `90s`, `30m`, `1h`, `1500ms`: the largest unit that states the value exactly.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// A sender goes into `MAIL FROM:<…>` and a `From:` line as it is: one address,
/// nothing that could end the line or the path.
fn check_sender(sender: &str) -> anyhow::Result<()> {
    let bad = sender.is_empty()
        || sender.len() > 320
        || !sender.contains('@')
        || sender.chars().any(|c| c.is_control() || c.is_whitespace() || matches!(c, '<' | '>'));
    if bad {
        bail!("sender {sender:?} is not a mail address");
    }
    Ok(())
}

/// A flag's address replaces the file's (keeping its TLS mode and verification) or
/// adds the endpoint with `new_tls`; a flag's TLS mode wins either way.
fn override_endpoint(
    slot: &mut Option<EndpointSpec>,
    addr: &Option<String>,
    tls: Option<TlsMode>,
    new_tls: TlsMode,
) {
    if let Some(a) = addr {
        match slot {
            Some(e) => e.address = a.clone(),
            None => {
                *slot =
                    Some(EndpointSpec { address: a.clone(), tls: new_tls, verify: true, server_name: None })
            }
        }
    }
    if let (Some(e), Some(m)) = (slot.as_mut(), tls) {
        e.tls = m;
    }
}

fn default_scenarios(t: &Targets) -> Vec<ScenarioSpec> {
    let mut out = Vec::new();
    if t.smtp.is_some() {
        out.push(ScenarioSpec::new(ScenarioKind::Deliver));
    }
    if t.smtp.is_some() || t.imap.is_some() {
        out.push(ScenarioSpec::new(ScenarioKind::Auth));
    }
    if t.imap.is_some() {
        out.push(ScenarioSpec::new(ScenarioKind::Search));
        out.push(ScenarioSpec::new(ScenarioKind::Fetch));
    }
    if t.pop3.is_some() {
        out.push(ScenarioSpec::new(ScenarioKind::Pop3));
    }
    out.push(ScenarioSpec::new(ScenarioKind::ConnectFlood));
    out
}

/// `64k:15:attach` → MessageSize.
fn parse_size_class(s: &str) -> anyhow::Result<MessageSize> {
    let mut parts = s.split(':');
    let bytes = parse_size(parts.next().unwrap_or_default())?;
    let mut m = MessageSize { bytes, weight: 1, attachment: false };
    for p in parts {
        if p.eq_ignore_ascii_case("attach") || p.eq_ignore_ascii_case("attachment") {
            m.attachment = true;
        } else {
            m.weight = p.parse().with_context(|| format!("bad weight in message size {s:?}"))?;
        }
    }
    Ok(m)
}

struct Defaults {
    concurrency: u32,
    rate: Option<f64>,
    duration: &'static str,
    ramp: &'static str,
    ops_per_connection: u32,
    auth: AuthMechanism,
}

fn defaults(kind: ScenarioKind) -> Defaults {
    let d = |concurrency, rate, duration, ramp, ops_per_connection, auth| Defaults {
        concurrency,
        rate,
        duration,
        ramp,
        ops_per_connection,
        auth,
    };
    use AuthMechanism as A;
    use ScenarioKind as K;
    match kind {
        K::ConnectFlood => d(500, None, "10s", "2s", 0, A::None),
        K::Auth => d(10, None, "30s", "0s", 0, A::Both),
        K::Deliver => d(20, Some(100.0), "30s", "0s", 0, A::None),
        K::Search | K::Fetch => d(10, None, "30s", "0s", 200, A::Login),
        K::Pop3 => d(10, None, "30s", "0s", 0, A::Login),
        K::Mixed => d(20, Some(100.0), "60s", "10s", 200, A::None),
        K::Seed => d(10, None, "10m", "0s", 0, A::None),
        K::SmtpNoop => d(50, None, "10s", "0s", 0, A::None),
        K::ImapMix => d(50, None, "60s", "0s", 50, A::Login),
    }
}

fn plan_for(
    s: &ScenarioSpec,
    args: &StressArgs,
    cli_sizes: &[MessageSize],
    users: &Users,
) -> anyhow::Result<Plan> {
    let d = defaults(s.kind);
    let name = s.name.clone().unwrap_or_else(|| kind_name(s.kind));
    let concurrency = args.concurrency.or(s.concurrency).unwrap_or(d.concurrency);
    if concurrency == 0 || concurrency > MAX_CONCURRENCY {
        bail!("{name}: concurrency must be 1..={MAX_CONCURRENCY}");
    }
    let rate = if args.closed_loop || s.kind == ScenarioKind::Seed || s.kind == ScenarioKind::ConnectFlood {
        None
    } else {
        args.rate.or(s.rate).or(d.rate)
    };
    if let Some(r) = rate
        && !(r.is_finite() && r > 0.0 && r <= 10_000_000.0)
    {
        bail!("{name}: rate must be > 0 and at most 10,000,000/s");
    }
    let duration = parse_duration(args.duration.as_deref().or(s.duration.as_deref()).unwrap_or(d.duration))?;
    let ramp_up = parse_duration(args.ramp_up.as_deref().or(s.ramp_up.as_deref()).unwrap_or(d.ramp))?;
    let timeout = parse_duration(args.timeout.as_deref().or(s.timeout.as_deref()).unwrap_or("10s"))?;
    if timeout.is_zero() {
        bail!("{name}: timeout must be positive");
    }
    let messages_per_user = args.messages_per_user.or(s.messages_per_user).unwrap_or(20);
    let natural = match (s.kind, rate) {
        (ScenarioKind::Seed, _) => users.len() as u64 * messages_per_user as u64,
        (ScenarioKind::ConnectFlood, _) => concurrency as u64,
        // The schedule itself stops at the deadline; the budget is a backstop.
        (_, Some(r)) => ((ramp_up.as_secs_f64() / 2.0 + duration.as_secs_f64()) * r).ceil() as u64 + 1,
        (_, None) => MAX_OPS_CLOSED,
    };
    let max_ops = args.max_ops.or(s.max_ops).map_or(natural, |m| m.min(natural));
    let weights: Vec<(String, u32)> = if !args.weights.is_empty() {
        args.weights
            .iter()
            .map(|w| {
                let (k, v) = w.split_once('=').with_context(|| format!("weight {w:?} is not op=N"))?;
                Ok((k.trim().to_string(), v.trim().parse().with_context(|| format!("weight {w:?}"))?))
            })
            .collect::<anyhow::Result<_>>()?
    } else if !s.weights.is_empty() {
        s.weights.iter().map(|(k, v)| (k.clone(), *v)).collect()
    } else if s.kind == ScenarioKind::ImapMix {
        ImapCmd::DEFAULT_WEIGHTS.iter().map(|(k, w)| (k.to_string(), *w)).collect()
    } else {
        vec![("deliver".into(), 60), ("fetch".into(), 25), ("search".into(), 15)]
    };
    let mix = match s.kind {
        ScenarioKind::Mixed | ScenarioKind::ImapMix => {
            let mut acc = 0u64;
            let mut mix = Vec::new();
            for (k, w) in &weights {
                let op =
                    Op::parse(k).with_context(|| format!("{name}: unknown operation {k:?} in weights"))?;
                // A client session draws only its own commands.
                if s.kind == ScenarioKind::ImapMix && !matches!(op, Op::Imap(_)) {
                    bail!("{name}: imap-mix weights name IMAP client commands (imap-…), not {k:?}");
                }
                if *w > 0 {
                    acc += *w as u64;
                    mix.push((op, acc));
                }
            }
            if mix.is_empty() {
                bail!("{name}: weights are all zero");
            }
            mix
        }
        k => vec![(single_op(k), 1)],
    };
    let sizes = if !cli_sizes.is_empty() {
        cli_sizes.to_vec()
    } else if !s.message_sizes.is_empty() {
        s.message_sizes.clone()
    } else {
        // The seed profile's mix: MIME with attachments of mixed sizes.
        vec![
            MessageSize { bytes: 4 * 1024, weight: 70, attachment: false },
            MessageSize { bytes: 32 * 1024, weight: 25, attachment: true },
            MessageSize { bytes: 256 * 1024, weight: 5, attachment: true },
        ]
    };
    let mut slo: Vec<Threshold> =
        default_scenario_slo(s.kind).iter().map(|t| t.parse()).collect::<Result<_, _>>()?;
    for t in &s.slo {
        slo.push(t.parse()?);
    }
    Ok(Plan {
        name,
        kind: s.kind,
        protocol: args.protocol.or(s.protocol),
        concurrency: concurrency as usize,
        rate,
        duration,
        ramp_up,
        max_ops,
        timeout,
        auth: args.auth.or(s.auth).unwrap_or(d.auth),
        ops_per_connection: args.ops_per_connection.or(s.ops_per_connection).unwrap_or(d.ops_per_connection),
        smtp_target: args.smtp_target.or(s.smtp_target).unwrap_or_default(),
        sender: args.sender.clone().or_else(|| s.sender.clone()),
        recipient_domain: args.recipient_domain.clone(),
        mix,
        messages_per_user,
        sizes,
        slo,
    })
}

/// The default SLO of each scenario (the seed profile's).
fn default_scenario_slo(kind: ScenarioKind) -> &'static [&'static str] {
    match kind {
        ScenarioKind::ConnectFlood | ScenarioKind::Auth | ScenarioKind::Pop3 | ScenarioKind::Seed => {
            &["success_rate >= 99.95%"]
        }
        ScenarioKind::Deliver => &["deliver.p95 <= 120ms", "success_rate >= 99.95%"],
        ScenarioKind::Search => &["search.p95 <= 350ms", "success_rate >= 99.95%"],
        ScenarioKind::Fetch => &["fetch.p95 <= 350ms", "success_rate >= 99.95%"],
        ScenarioKind::Mixed => {
            &["deliver.p95 <= 120ms", "fetch.p95 <= 350ms", "search.p95 <= 350ms", "success_rate >= 99.95%"]
        }
        ScenarioKind::SmtpNoop => &[],
        ScenarioKind::ImapMix => &["success_rate >= 99.95%"],
    }
}

fn single_op(kind: ScenarioKind) -> Op {
    match kind {
        ScenarioKind::Auth => Op::Auth,
        ScenarioKind::Search => Op::Search,
        ScenarioKind::Fetch => Op::Fetch,
        ScenarioKind::Pop3 => Op::Pop3,
        ScenarioKind::SmtpNoop => Op::Noop,
        ScenarioKind::Seed => Op::Seed,
        _ => Op::Deliver(None),
    }
}

pub fn kind_name(kind: ScenarioKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| format!("{kind:?}"))
}

fn check_targets(plan: &Plan, t: &Targets) -> anyhow::Result<()> {
    let need = |ok: bool, what: &str| {
        if ok { Ok(()) } else { Err(anyhow::anyhow!("scenario {} needs a {what} target", plan.name)) }
    };
    // connect-flood has no operation mix: it needs whichever target it floods.
    let mix: &[(Op, u64)] = if plan.kind == ScenarioKind::ConnectFlood { &[] } else { &plan.mix };
    let smtp = |via: Option<SmtpTarget>| {
        let target = via.unwrap_or(plan.smtp_target);
        let what = match target {
            SmtpTarget::Smtp => "SMTP",
            SmtpTarget::Submission => "submission (--submission)",
            SmtpTarget::Submissions => "submissions (--submissions)",
        };
        need(t.smtp_target(target).is_some(), what)
    };
    for (op, _) in mix {
        match op {
            Op::Deliver(via) => smtp(*via)?,
            Op::Noop | Op::Seed => smtp(None)?,
            Op::Search | Op::Fetch | Op::Imap(_) => need(t.imap.is_some(), "IMAP")?,
            Op::Pop3 => need(t.pop3.is_some(), "POP3")?,
            Op::Auth => need(t.imap.is_some() || t.smtp_target(plan.smtp_target).is_some(), "IMAP or SMTP")?,
        }
    }
    match plan.protocol {
        Some(Protocol::Smtp) => smtp(None),
        Some(Protocol::Imap) => need(t.imap.is_some(), "IMAP"),
        Some(Protocol::Pop3) => need(t.pop3.is_some(), "POP3"),
        None => Ok(()),
    }
}
