//! Stress-run specification and result types.
//!
//! One format serves four readers: the scenario file given to `mailcluster stress
//! --file FILE` (YAML), the reference profiles shipped in `stress/profiles/`
//! ([`StressProfile`]), the `spec.stress` block of a `MailCluster` (the operator
//! embeds [`StressSpec`] in the CRD and turns it into a CronJob), and the
//! `status.lastStress` block the stress Job writes back ([`LastStress`]).
//!
//! Durations are strings such as `"500ms"`, `"30s"`, `"2m"` because that is what an
//! operator writes in YAML; the stress runner parses them. Sizes are plain byte counts
//! so the generated schema stays structural (no int-or-string unions).
//!
//! Field names are camelCase on the wire like every other Kubernetes field.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A stress run: which scenarios, against which endpoints, judged by which SLOs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StressSpec {
    /// Cron schedule for the in-cluster stress CronJob (ignored by the CLI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Endpoints to load. The operator fills these from the cluster's Services; the
    /// CLI's `--smtp/--imap/--pop3` flags override them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<TargetsSpec>,
    /// Test accounts. Defaults to `user{:04}@example.test`, 1..=100, password `pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<UsersSpec>,
    /// Scenarios, run one after the other in this order.
    #[serde(default)]
    pub scenarios: Vec<ScenarioSpec>,
    /// Run-wide service level objectives.
    #[serde(default)]
    pub slo: SloSpec,
}

/// Endpoints of the system under test.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetsSpec {
    /// SMTP endpoint used for delivery (inbound port or submission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp: Option<EndpointSpec>,
    /// Message submission with STARTTLS (port 587); scenarios reach it with
    /// `smtpTarget: submission` or the `submission` weight of `mixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<EndpointSpec>,
    /// Message submission over implicit TLS (port 465); `smtpTarget: submissions` or
    /// the `submissions` weight of `mixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submissions: Option<EndpointSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imap: Option<EndpointSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pop3: Option<EndpointSpec>,
}

/// One endpoint: `host:port`, its TLS mode and whether to verify its certificate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSpec {
    /// `host:port`.
    pub address: String,
    #[serde(default)]
    pub tls: TlsMode,
    /// Verify the server certificate (off for self-signed test certificates).
    #[serde(default = "default_true")]
    pub verify: bool,
    /// Name to send as SNI and to verify; defaults to the host part of `address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

fn default_true() -> bool {
    true
}

/// How TLS is used on a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// No TLS.
    #[default]
    Plain,
    /// Plain connect, then STARTTLS (SMTP, IMAP) or STLS (POP3).
    Starttls,
    /// TLS from the first byte (ports 465, 993, 995).
    Implicit,
}

/// Test accounts: generated from a template or read from a file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsersSpec {
    /// Name template; `{}` or `{:0N}` is replaced by the user number.
    #[serde(default = "default_template")]
    pub template: String,
    /// First user number.
    #[serde(default = "default_first")]
    pub first: u32,
    /// Number of users.
    #[serde(default = "default_count")]
    pub count: u32,
    /// Password of every generated user.
    #[serde(default = "default_password")]
    pub password: String,
    /// File with one `user password` (or `user:password`) per line; overrides the
    /// template when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

fn default_template() -> String {
    "user{:04}@example.test".into()
}
fn default_first() -> u32 {
    1
}
fn default_count() -> u32 {
    100
}
fn default_password() -> String {
    "pass".into()
}

impl Default for UsersSpec {
    fn default() -> Self {
        UsersSpec {
            template: default_template(),
            first: default_first(),
            count: default_count(),
            password: default_password(),
            file: None,
        }
    }
}

/// What a scenario does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioKind {
    /// N concurrent TCP (+TLS) connections opened, held, then closed.
    ConnectFlood,
    /// Users cycling IMAP LOGIN / AUTHENTICATE PLAIN and SMTP AUTH.
    Auth,
    /// SMTP injection (open loop when `rate` is set).
    Deliver,
    /// `UID SEARCH UNSEEN` on INBOX.
    Search,
    /// `UID FETCH BODY.PEEK[]` and `BODY.PEEK[HEADER]` of stored messages.
    Fetch,
    /// POP3 sessions: USER/PASS, STAT, LIST, RETR, QUIT.
    Pop3,
    /// A weighted mix of the above operations.
    Mixed,
    /// Fill every user's INBOX with `messagesPerUser` messages.
    Seed,
    /// SMTP NOOP round trips on persistent sessions (measures the generator itself).
    SmtpNoop,
    /// What a mail client's IMAP session does, one command per operation: LOGIN,
    /// LIST, STATUS, SELECT and a flag sync (`UID FETCH 1:* (FLAGS)`) to open it,
    /// then `opsPerConnection` commands drawn by `weights` (header lists, message
    /// bodies, flag changes, deletes with EXPUNGE, APPENDs, NOOP polls, STATUS
    /// polls), then LOGOUT.
    ImapMix,
}

/// A mail protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Smtp,
    Imap,
    Pop3,
}

/// SMTP endpoint a scenario sends to: `smtp` (the `smtp` target, by default),
/// `submission` (587, STARTTLS) or `submissions` (465, implicit TLS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTarget {
    /// `targets.smtp` (inbound port 25, or whatever the CLI's `--smtp` names).
    #[default]
    Smtp,
    /// `targets.submission` (587, STARTTLS).
    Submission,
    /// `targets.submissions` (465, implicit TLS).
    Submissions,
}

impl SmtpTarget {
    pub const ALL: [SmtpTarget; 3] = [SmtpTarget::Smtp, SmtpTarget::Submission, SmtpTarget::Submissions];

    pub fn name(self) -> &'static str {
        match self {
            SmtpTarget::Smtp => "smtp",
            SmtpTarget::Submission => "submission",
            SmtpTarget::Submissions => "submissions",
        }
    }
}

/// IMAP or SMTP authentication mechanism.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuthMechanism {
    /// IMAP `LOGIN`; SMTP `AUTH LOGIN`; POP3 `USER`/`PASS`.
    Login,
    /// SASL PLAIN (IMAP `AUTHENTICATE PLAIN`, SMTP `AUTH PLAIN`).
    #[default]
    Plain,
    /// Alternate between both.
    Both,
    /// No authentication (SMTP only: inbound port).
    None,
}

/// One class of message sizes with its relative weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageSize {
    /// Approximate size of the whole message in bytes.
    pub bytes: u64,
    /// Relative weight among the classes.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Build the bulk of the message as a MIME attachment (base64) instead of text.
    #[serde(default)]
    pub attachment: bool,
}

fn default_weight() -> u32 {
    1
}

/// One scenario with its load shape and its own SLO thresholds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScenarioSpec {
    /// Display name; defaults to the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub kind: ScenarioKind,
    /// Protocol for `connect-flood` and `auth` (default: every configured target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Concurrent sessions (workers). For connect-flood: connections held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Operations per second, open loop (latency counted from the intended start).
    /// Unset: closed loop, each worker issues its next operation when the last ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// How long to issue operations, e.g. `"30s"`. For connect-flood: hold time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Linear ramp from 0 to the full rate / concurrency, e.g. `"10s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp_up: Option<String>,
    /// Hard cap on operations issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ops: Option<u64>,
    /// Per-operation timeout, e.g. `"10s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Size distribution of generated messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_sizes: Vec<MessageSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthMechanism>,
    /// Operations of one session before it reconnects (0: keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_per_connection: Option<u32>,
    /// `mixed`: relative weight per operation (`deliver`, `search`, `fetch`,
    /// `pop3`, `auth`, `noop`; `submission` and `submissions` deliver through those
    /// targets, so one mix can spread its sending over both submission ports).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, u32>,
    /// `seed`: messages to put in every user's INBOX.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_per_user: Option<u32>,
    /// SMTP endpoint for `deliver`, `seed`, `smtp-noop`, and for `auth` /
    /// `connect-flood` over SMTP (default `smtp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_target: Option<SmtpTarget>,
    /// Envelope sender and `From:` of generated messages. Default: the authenticated
    /// user when the SMTP session authenticates (as a mail client does; a submission
    /// server refuses any other sender with 553), otherwise another test user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 320))]
    pub sender: Option<String>,
    /// Extra thresholds for this scenario, e.g. `"deliver.p95 < 120ms"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slo: Vec<String>,
}

impl ScenarioSpec {
    /// A scenario of `kind` with every knob at its default.
    pub fn new(kind: ScenarioKind) -> Self {
        ScenarioSpec {
            name: None,
            kind,
            protocol: None,
            concurrency: None,
            rate: None,
            duration: None,
            ramp_up: None,
            max_ops: None,
            timeout: None,
            message_sizes: Vec::new(),
            auth: None,
            ops_per_connection: None,
            weights: BTreeMap::new(),
            messages_per_user: None,
            smtp_target: None,
            sender: None,
            slo: Vec::new(),
        }
    }
}

/// Run-wide objectives. Unset fields take the defaults of the design (§6).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SloSpec {
    /// Minimum share of successful operations, in percent (default 99.95).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<f64>,
    /// SMTP delivery P95 bound in ms (default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_p95_ms: Option<f64>,
    /// IMAP fetch P95 bound in ms (default 350).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imap_fetch_p95_ms: Option<f64>,
    /// Further thresholds, e.g. `"search.p99 < 500ms"`, `"pop3-session.success_rate >= 99.9%"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thresholds: Vec<String>,
}

/// Outcome of a run as written to `status.lastStress` of a MailCluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastStress {
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339.
    pub finished_at: String,
    /// `Pass` or `Fail`.
    pub verdict: String,
    /// Successful operations in percent.
    pub success_rate: f64,
    /// P95 latency in milliseconds per operation.
    #[serde(default)]
    pub p95_ms: BTreeMap<String, f64>,
    /// The load generator itself ran out of CPU; figures may understate the server.
    #[serde(default)]
    pub generator_saturated: bool,
    /// Name of the Job (or run id) that produced this result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

/// A reference load profile shipped with the runner (`stress/profiles/NAME.yaml`,
/// compiled into the binary): `whitepaper`, `whitepaper-short` or `submission-pop3`.
/// `mailcluster stress --profile NAME` runs it; in a MailCluster its scenarios,
/// number of users and SLOs apply unless `scenarios`, `users` or `slo` say
/// otherwise, and its targets' TLS modes pick the Service ports (implicit:
/// 465/993/995).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StressProfile {
    /// The reference stress white paper's suite at full length (about 50 minutes).
    Whitepaper,
    /// The same suite in minutes, for CI and demos.
    WhitepaperShort,
    /// Authenticated submission on 465 and 587 with attachments, 60/40 with POP3 on 995.
    SubmissionPop3,
}

impl StressProfile {
    pub const ALL: [StressProfile; 3] =
        [StressProfile::Whitepaper, StressProfile::WhitepaperShort, StressProfile::SubmissionPop3];

    pub fn name(self) -> &'static str {
        match self {
            StressProfile::Whitepaper => "whitepaper",
            StressProfile::WhitepaperShort => "whitepaper-short",
            StressProfile::SubmissionPop3 => "submission-pop3",
        }
    }

    pub fn from_name(name: &str) -> Option<StressProfile> {
        StressProfile::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The profile file as shipped, comments (its source figures) included.
    pub fn text(self) -> &'static str {
        match self {
            StressProfile::Whitepaper => include_str!("../../stress/profiles/whitepaper.yaml"),
            StressProfile::WhitepaperShort => include_str!("../../stress/profiles/whitepaper-short.yaml"),
            StressProfile::SubmissionPop3 => include_str!("../../stress/profiles/submission-pop3.yaml"),
        }
    }

    /// The leading comment block of the file: where the figures come from.
    pub fn header(self) -> String {
        self.text().lines().take_while(|l| l.starts_with('#')).map(|l| format!("{l}\n")).collect()
    }

    /// The profile as a scenario file.
    pub fn spec(self) -> Result<StressSpec, serde_yaml_ng::Error> {
        serde_yaml_ng::from_str(self.text())
    }
}

impl std::fmt::Display for StressProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_file_round_trips() {
        let yaml = r#"
targets:
  smtp: {address: "127.0.0.1:2526", tls: starttls, verify: false}
users: {template: "user{:04}@example.test", count: 10, password: pass}
scenarios:
  - kind: deliver
    rate: 200
    duration: 30s
    messageSizes: [{bytes: 4096, weight: 9}, {bytes: 65536, attachment: true}]
    slo: ["deliver.p95 < 120ms"]
  - kind: mixed
    weights: {deliver: 60, fetch: 40}
slo: {successRate: 99.9}
"#;
        let spec: StressSpec = serde_yaml_ng::from_str(yaml).expect("parse");
        assert_eq!(spec.scenarios.len(), 2);
        assert_eq!(spec.scenarios[0].kind, ScenarioKind::Deliver);
        assert_eq!(spec.scenarios[0].message_sizes[1].weight, 1);
        assert!(spec.scenarios[0].message_sizes[1].attachment);
        assert_eq!(
            spec.targets.as_ref().and_then(|t| t.smtp.as_ref()).map(|e| e.tls),
            Some(TlsMode::Starttls)
        );
        assert_eq!(spec.slo.success_rate, Some(99.9));
        assert_eq!(spec.users.as_ref().map(|u| u.first), Some(1));
        let back: StressSpec =
            serde_yaml_ng::from_str(&serde_yaml_ng::to_string(&spec).expect("ser")).expect("reparse");
        assert_eq!(back, spec);
    }

    #[test]
    fn unknown_kind_is_rejected() {
        let err = serde_yaml_ng::from_str::<ScenarioSpec>("kind: explode").unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }

    #[test]
    fn every_profile_parses_and_names_round_trip() {
        for p in StressProfile::ALL {
            let spec = p.spec().unwrap_or_else(|e| panic!("profile {p}: {e}"));
            assert!(!spec.scenarios.is_empty(), "profile {p} has no scenario");
            assert!(p.header().lines().count() >= 3, "profile {p} documents its source figures");
            assert_eq!(StressProfile::from_name(p.name()), Some(p));
            let wire: StressProfile = serde_yaml_ng::from_str(p.name()).expect("serde name");
            assert_eq!(wire, p);
        }
        assert_eq!(StressProfile::from_name("whitepaper-long"), None);
    }

    #[test]
    fn schema_names_camel_case_fields() {
        let schema = serde_json::to_string(&schemars::schema_for!(StressSpec)).expect("schema");
        assert!(schema.contains("messagesPerUser"));
        assert!(schema.contains("imapFetchP95Ms"));
    }
}
