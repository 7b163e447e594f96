//! `MailCluster` (`mailcluster.dev/v1alpha1`): spec and status.
//!
//! Validation lives in two places on purpose:
//! - the CRD schema (types, ranges, and CEL `x-kubernetes-validations`) so the
//!   apiserver refuses bad objects at `kubectl apply` time, and
//! - the operator's own `validate` step, because a CRD may be installed from an older
//!   version, and some rules (effective ports after defaults, CIDR syntax on old
//!   apiservers, the connection budget) need more than CEL offers.
//!
//! Immutable field: `spec.redis.keyPrefix`. Every pod namespaces its shared state
//! (rate limits, notification channels, TLS ticket keys) under it; changing it on a
//! running cluster would, during the rolling update, split pods into two groups that
//! cannot see each other's IDLE notifications or ticket keys, and orphan the old keys.
//! Everything else (image, pool sizes, secret references) is rolled safely.

// Each `printcolumn(...)` of the kube derive repeats `type_ = ...`; clippy reads the
// repeated keys as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A mail system: SMTP, submission, IMAP and POP3 pods over PostgreSQL and Redis.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "mailcluster.dev",
    version = "v1alpha1",
    kind = "MailCluster",
    plural = "mailclusters",
    shortname = "mc",
    category = "mail",
    namespaced,
    status = "MailClusterStatus",
    derive = "PartialEq",
    doc = "A Kubernetes-native mail system: stateless SMTP/IMAP/POP3 pods over PostgreSQL and Redis.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "SMTP",
        type_ = "integer",
        json_path = ".status.smtp.readyReplicas",
        description = "Ready SMTP pods"
    ),
    printcolumn(
        name = "IMAP",
        type_ = "integer",
        json_path = ".status.imap.readyReplicas",
        description = "Ready IMAP pods"
    ),
    printcolumn(
        name = "Stress",
        type_ = "string",
        json_path = ".status.lastStress.verdict",
        description = "Verdict of the last stress run"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MailClusterSpec {
    /// Container image of the `mailcluster` binary (all pods and Jobs use it).
    pub image: ImageSpec,
    /// Mail domains served; the first is the primary (hostname, certificate).
    // Each item is bounded (a DNS name is at most 253 characters): the apiserver
    // estimates a CEL rule's cost from the largest list and strings it may see, and
    // rejects the whole CRD when that estimate exceeds its budget.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 253)))]
    #[x_kube(validation = Rule::new("self.all(d, self.filter(e, e == d).size() == 1)").message("domains must be unique"))]
    pub domains: Vec<Domain>,
    /// Name used in greetings and Received headers; default `mail.<first domain>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub hostname: Option<String>,
    /// Inbound SMTP (port 25). Enabled unless `enabled: false`.
    #[serde(default = "ProtocolSpec::enabled_default")]
    pub smtp: ProtocolSpec,
    /// Message submission (587 STARTTLS, 465 implicit TLS).
    #[serde(default = "ProtocolSpec::enabled_default")]
    pub submission: ProtocolSpec,
    /// IMAP (143 STARTTLS, 993 implicit TLS).
    #[serde(default = "ProtocolSpec::enabled_default")]
    pub imap: ProtocolSpec,
    /// POP3 (110 STLS, 995 implicit TLS). Disabled unless the section is present.
    #[serde(default = "ProtocolSpec::disabled_default")]
    pub pop3: ProtocolSpec,
    /// Certificate for all listeners. Absent: pods generate a self-signed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    pub postgres: PostgresSpec,
    pub redis: RedisSpec,
    /// Defaults for every protocol's autoscaler (each protocol may override).
    #[serde(default)]
    pub autoscaling: AutoscalingSpec,
    #[serde(default)]
    pub proxy_protocol: ProxyProtocolSpec,
    /// DKIM signing keys of local domains, one Secret each (`mailcluster dkim
    /// generate` writes the key and prints the DNS record to publish).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(k, self.filter(e, e.domain == k.domain).size() == 1)").message("one DKIM key per domain"))]
    pub dkim: Vec<DkimSpec>,
    /// Sending to other domains: directly to their MX hosts, or through a smarthost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelaySpec>,
    /// Content checks of incoming mail (rspamd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterSpec>,
    /// In-cluster load test: scheduled and on-demand (`mailcluster.dev/run-stress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stress: Option<ClusterStressSpec>,
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
    #[serde(default)]
    pub monitoring: MonitoringSpec,
    /// How the smtp and submission pods batch their deliveries.
    #[serde(default)]
    pub group_commit: GroupCommitSpec,
    /// Kernel settings of the mail pods' own network namespace, for many
    /// concurrent connections. Absent (the default): the pods carry no sysctls
    /// and run on any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningSpec>,
    /// Seconds sessions get to finish after SIGTERM before the server says goodbye.
    #[serde(default = "default_grace")]
    #[schemars(range(min = 1, max = 3600))]
    pub shutdown_grace_seconds: u32,
    /// Log filter directive for the pods, e.g. `info` or `mailcluster_server=debug`.
    #[serde(default = "default_log_level")]
    pub log_level: String,
    /// When true the operator changes no child object (status still reports).
    #[serde(default)]
    pub paused: bool,
    /// Accounts in the store that no MailAccount describes (made with
    /// `mailcluster user add` or an import): `Shared` (the default) reports them
    /// in `status.unmanagedAccounts` and leaves them alone; `Managed` makes the
    /// MailAccounts the whole truth and disables the others, as Argo CD's prune.
    #[serde(default, skip_serializing_if = "AccountsPolicy::is_default")]
    pub accounts: AccountsPolicy,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum AccountsPolicy {
    #[default]
    Shared,
    Managed,
}

impl AccountsPolicy {
    fn is_default(&self) -> bool {
        *self == AccountsPolicy::Shared
    }
}

/// The store's accounts that no MailAccount of the cluster describes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnmanagedAccounts {
    /// How many there are.
    pub count: u64,
    /// The first of them in address order, at most [`UNMANAGED_LISTED`].
    #[serde(default)]
    pub addresses: Vec<String>,
    /// How many of them are enabled (under `accounts: Managed`, none for long).
    pub enabled: u64,
}

/// Addresses listed in `status.unmanagedAccounts`: enough to recognise what is
/// there, bounded so that a store of a million CLI-made accounts keeps the
/// MailCluster object small.
pub const UNMANAGED_LISTED: usize = 20;

fn default_grace() -> u32 {
    25
}

fn default_log_level() -> String {
    "info".into()
}

/// A DNS domain name.
pub type Domain = String;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    #[serde(default = "default_repository")]
    pub repository: String,
    /// Tag (or `@sha256:` digest reference suffix is not accepted here; use `digest`).
    #[schemars(length(min = 1, max = 128))]
    pub tag: String,
    /// Optional digest pinning the tag (`sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<PullPolicy>,
}

fn default_repository() -> String {
    "ghcr.io/mailcluster/mailcluster".into()
}

impl ImageSpec {
    /// The full image reference the pods run.
    pub fn reference(&self) -> String {
        match &self.digest {
            Some(d) => format!("{}:{}@{}", self.repository, self.tag, d),
            None => format!("{}:{}", self.repository, self.tag),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// One protocol's pods, Service and autoscaler.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Fixed replica count when autoscaling is disabled for this protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,
    /// Per-pod, per-listener connection cap; over it clients get an immediate refusal.
    #[serde(default = "default_max_connections")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_connections: u32,
    /// Per-client-IP connection cap per listener (0 = unlimited).
    #[serde(default)]
    pub max_connections_per_ip: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default)]
    pub service: ServiceSpec,
    /// Overrides `spec.autoscaling` for this protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
}

fn yes() -> bool {
    true
}

fn default_max_connections() -> u32 {
    5000
}

impl ProtocolSpec {
    pub fn enabled_default() -> Self {
        ProtocolSpec {
            enabled: true,
            replicas: None,
            max_connections: default_max_connections(),
            max_connections_per_ip: 0,
            resources: None,
            service: ServiceSpec::default(),
            autoscaling: None,
        }
    }

    pub fn disabled_default() -> Self {
        ProtocolSpec { enabled: false, ..Self::enabled_default() }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default, rename = "type")]
    pub type_: ServiceType,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Service ports per listener; listeners not named keep their standard port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    #[x_kube(validation = Rule::new("self.all(p, self.filter(q, q.port == p.port).size() == 1)").message("service ports must be unique"))]
    #[x_kube(validation = Rule::new("self.all(p, self.filter(q, q.name == p.name).size() == 1)").message("each listener may be listed once"))]
    pub ports: Vec<PortSpec>,
    /// Restrict LoadBalancer clients (cloud firewall).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub load_balancer_source_ranges: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortSpec {
    pub name: Listener,
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// A listener of the server; each has a fixed container port (standard port + 10000).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Listener {
    Smtp,
    Submission,
    Submissions,
    Imap,
    Imaps,
    Pop3,
    Pop3s,
    /// ManageSieve (RFC 5804), on the IMAP pods.
    ManageSieve,
}

impl Listener {
    pub const ALL: [Listener; 8] = [
        Listener::Smtp,
        Listener::Submission,
        Listener::Submissions,
        Listener::Imap,
        Listener::Imaps,
        Listener::Pop3,
        Listener::Pop3s,
        Listener::ManageSieve,
    ];

    /// The name used in `MAILCLUSTER_PROTOCOLS`, config and port names.
    pub fn name(self) -> &'static str {
        match self {
            Listener::Smtp => "smtp",
            Listener::Submission => "submission",
            Listener::Submissions => "submissions",
            Listener::Imap => "imap",
            Listener::Imaps => "imaps",
            Listener::Pop3 => "pop3",
            Listener::Pop3s => "pop3s",
            Listener::ManageSieve => "managesieve",
        }
    }

    /// The well-known port clients use; Services expose it.
    pub fn standard_port(self) -> i32 {
        match self {
            Listener::Smtp => 25,
            Listener::Submission => 587,
            Listener::Submissions => 465,
            Listener::Imap => 143,
            Listener::Imaps => 993,
            Listener::Pop3 => 110,
            Listener::Pop3s => 995,
            Listener::ManageSieve => 4190,
        }
    }

    /// The unprivileged port the pod listens on (operational contract: standard + 10000).
    pub fn container_port(self) -> i32 {
        self.standard_port() + 10000
    }
}

/// The four protocol families, each its own Deployment and Service.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Smtp,
    Submission,
    Imap,
    Pop3,
}

impl Protocol {
    pub const ALL: [Protocol; 4] = [Protocol::Smtp, Protocol::Submission, Protocol::Imap, Protocol::Pop3];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Smtp => "smtp",
            Protocol::Submission => "submission",
            Protocol::Imap => "imap",
            Protocol::Pop3 => "pop3",
        }
    }

    /// Listeners served by this protocol's pods.
    pub fn listeners(self) -> &'static [Listener] {
        match self {
            Protocol::Smtp => &[Listener::Smtp],
            Protocol::Submission => &[Listener::Submission, Listener::Submissions],
            Protocol::Imap => &[Listener::Imap, Listener::Imaps, Listener::ManageSieve],
            Protocol::Pop3 => &[Listener::Pop3, Listener::Pop3s],
        }
    }
}

impl MailClusterSpec {
    pub fn protocol(&self, p: Protocol) -> &ProtocolSpec {
        match p {
            Protocol::Smtp => &self.smtp,
            Protocol::Submission => &self.submission,
            Protocol::Imap => &self.imap,
            Protocol::Pop3 => &self.pop3,
        }
    }

    /// The rspamd the operator runs for this cluster, if it runs one.
    pub fn rspamd_deploy(&self) -> Option<&RspamdDeploySpec> {
        self.filter.as_ref().and_then(|f| f.rspamd.as_ref()).and_then(|r| r.deploy.as_ref())
    }

    /// Enabled protocols in a fixed order.
    pub fn enabled_protocols(&self) -> Vec<Protocol> {
        Protocol::ALL.into_iter().filter(|p| self.protocol(*p).enabled).collect()
    }

    /// The autoscaling settings in force for a protocol.
    pub fn autoscaling_for(&self, p: Protocol) -> &AutoscalingSpec {
        self.protocol(p).autoscaling.as_ref().unwrap_or(&self.autoscaling)
    }

    /// The sysctls of the mail pods: none without `spec.tuning`.
    pub fn sysctls(&self) -> Vec<(&'static str, String)> {
        self.tuning.as_ref().map(TuningSpec::sysctls).unwrap_or_default()
    }

    pub fn hostname(&self) -> String {
        match (&self.hostname, self.domains.first()) {
            (Some(h), _) => h.clone(),
            (None, Some(d)) => format!("mail.{d}"),
            (None, None) => "localhost".into(),
        }
    }
}

/// Exactly one of `secretName` (an existing `kubernetes.io/tls` Secret) or
/// `issuerRef` (the operator requests a cert-manager Certificate).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretName) != has(self.issuerRef)").message("set exactly one of tls.secretName or tls.issuerRef"))]
pub struct TlsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
    /// Extra DNS names for the Certificate (the hostname and domains are always in it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub dns_names: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    pub name: String,
    /// `Issuer` or `ClusterIssuer`.
    #[serde(default = "default_issuer_kind")]
    pub kind: String,
    #[serde(default = "default_issuer_group")]
    pub group: String,
}

fn default_issuer_kind() -> String {
    "Issuer".into()
}

fn default_issuer_group() -> String {
    "cert-manager.io".into()
}

/// One domain's DKIM signing key.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DkimSpec {
    #[schemars(length(min = 1, max = 253))]
    pub domain: String,
    /// The `s=` selector: the key is published at `SELECTOR._domainkey.DOMAIN`.
    #[schemars(length(min = 1, max = 63))]
    pub selector: String,
    /// The Secret holding the PEM private key.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The key of that Secret.
    #[serde(default = "default_dkim_key")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_key: String,
    #[serde(default)]
    pub algorithm: DkimAlgorithm,
}

fn default_dkim_key() -> String {
    "dkim.key".into()
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DkimAlgorithm {
    /// ed25519-sha256 (RFC 8463).
    #[default]
    Ed25519,
    /// rsa-sha256.
    Rsa,
}

impl DkimAlgorithm {
    pub fn name(self) -> &'static str {
        match self {
            DkimAlgorithm::Ed25519 => "ed25519",
            DkimAlgorithm::Rsa => "rsa",
        }
    }
}

/// Outbound delivery.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelaySpec {
    /// `host:port` to send all outbound mail through (a provider's submission
    /// service); absent: straight to each domain's MX hosts on port 25.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 260))]
    pub smarthost: Option<String>,
    /// Secret with the smarthost's `username` and `password` keys (AUTH PLAIN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub smarthost_secret_name: Option<String>,
}

/// Content checks of incoming mail.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilterSpec {
    /// Every message arriving on the MX is scanned by this rspamd before it is
    /// stored (docs/filtering.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rspamd: Option<RspamdSpec>,
}

/// rspamd: run by the user (its own Deployment, Helm chart or host; `url`) or
/// by the operator (`deploy`), never both.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.url) != has(self.deploy)").message("set exactly one of filter.rspamd.url or filter.rspamd.deploy"))]
#[x_kube(validation = Rule::new("!has(self.deploy) || !has(self.passwordSecretRef)").message("filter.rspamd.deploy makes its own password: leave passwordSecretRef unset"))]
pub struct RspamdSpec {
    /// `http://host:port` of rspamd's worker, e.g. `http://rspamd.mail:11334`
    /// (the controller worker answers scans and learning alike).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 260), regex(pattern = r"^http://[^/@\s]+(/[^\s]*)?$"))]
    pub url: Option<String>,
    /// The operator runs rspamd (and a Redis of its own) for this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy: Option<RspamdDeploySpec>,
    /// Secret key holding rspamd's controller password (sent as its
    /// `Password` header), put into the pods' environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<PasswordSecretRef>,
    /// `open`: deliver unscanned (marked) when rspamd cannot answer; `closed`:
    /// 451, the sender retries.
    #[serde(default)]
    pub fail_mode: RspamdFailMode,
    /// Scan mail from authenticated users (submission) too.
    #[serde(default)]
    pub scan_submission: bool,
    /// Longest a scan may take.
    #[serde(default = "default_rspamd_timeout")]
    #[schemars(range(min = 100, max = 60000))]
    pub timeout_ms: u32,
}

/// rspamd run by the operator: a Deployment of `image` whose controller
/// worker (port 11334) the pods use, with a password the operator generates,
/// and a Redis Deployment for its statistics, greylisting and rate data.
/// The image sees every message the MX scans (never the database URL, the
/// Redis of the mail pods or the cluster's keys).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RspamdDeploySpec {
    /// An rspamd image whose entrypoint runs rspamd in the foreground with
    /// its configuration in `configDir`, e.g. `rspamd/rspamd:3.12`.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Where the image's rspamd reads its configuration: the operator mounts
    /// its files into `local.d/` and `override.d/` there.
    #[serde(default = "default_rspamd_config_dir")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^/[^\s]*$"))]
    pub config_dir: String,
    #[serde(default = "default_rspamd_replicas")]
    #[schemars(range(min = 1, max = 100))]
    pub replicas: i32,
    /// rspamd processes per pod answering scans and learning (its controller
    /// worker's `count`): about one per core the pod may use.
    #[serde(default = "default_rspamd_workers")]
    #[schemars(range(min = 1, max = 64))]
    pub workers: i32,
    /// rspamd's container; default requests 500m CPU and 512Mi, limit 1Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The Redis image rspamd's own Redis runs (one replica; append-only
    /// file on an emptyDir: kept across container restarts, not rescheduling).
    #[serde(default = "default_rspamd_redis_image")]
    #[schemars(length(min = 1, max = 512))]
    pub redis_image: String,
}

fn default_rspamd_config_dir() -> String {
    "/etc/rspamd".into()
}

fn default_rspamd_replicas() -> i32 {
    1
}

fn default_rspamd_workers() -> i32 {
    2
}

fn default_rspamd_redis_image() -> String {
    "redis:7.4-alpine".into()
}

fn default_rspamd_timeout() -> u32 {
    3000
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RspamdFailMode {
    #[default]
    Open,
    Closed,
}

/// A key in a Secret holding a password.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default = "default_password_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_password_key() -> String {
    "password".into()
}

/// A key in a Secret in the MailCluster's namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default = "default_url_key")]
    pub key: String,
}

fn default_url_key() -> String {
    "url".into()
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.poolSize) || !has(self.maxConnections) || self.poolSize <= self.maxConnections").message("postgres.poolSize must not exceed postgres.maxConnections"))]
pub struct PostgresSpec {
    /// Secret key holding the `postgres://` URL.
    pub url_secret_ref: SecretKeyRef,
    /// Connections per pod.
    #[serde(default = "default_pool_size")]
    #[schemars(range(min = 1, max = 1000))]
    pub pool_size: u32,
    /// The server's `max_connections`: the budget every pod, Job and admin shares.
    #[serde(default = "default_pg_max")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_connections: u32,
    /// Connections kept free for superusers, backups and humans.
    #[serde(default = "default_pg_reserved")]
    pub reserved_connections: u32,
}

/// Defaults fit a stock PostgreSQL (`max_connections = 100`): three protocols at
/// their default maximum (6 pods + 1 surge) × 4 = 84 of the 88 left after the
/// reserve and the migration Job.
fn default_pool_size() -> u32 {
    4
}

fn default_pg_max() -> u32 {
    100
}

fn default_pg_reserved() -> u32 {
    10
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.keyPrefix) ? self.keyPrefix : '') == (has(oldSelf.keyPrefix) ? oldSelf.keyPrefix : '')").message("redis.keyPrefix is immutable"))]
pub struct RedisSpec {
    /// Secret key holding the `redis://` URL.
    pub url_secret_ref: SecretKeyRef,
    #[serde(default = "default_redis_pool")]
    #[schemars(range(min = 1, max = 1000))]
    pub pool_size: u32,
    /// Prefix of every key; default `mc:<namespace>:<name>:`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub key_prefix: Option<String>,
}

fn default_redis_pool() -> u32 {
    8
}

/// Horizontal Pod Autoscaler settings.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas").message("autoscaling.minReplicas must not exceed autoscaling.maxReplicas"))]
pub struct AutoscalingSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub min_replicas: i32,
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// Target average CPU utilisation, percent of requests; 0 turns the CPU target
    /// off (a cluster without metrics-server: an HPA whose CPU metric is missing
    /// scales up on its other targets but never down).
    #[serde(default = "default_cpu", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_utilization: Option<i32>,
    /// Target average `mail_pool_saturation`, percent (metric 0..1 × 100); 0 turns
    /// this target off.
    #[serde(default = "default_pool_saturation", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub pool_saturation: Option<i32>,
    /// Target average `mail_connections_active` per pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub connections_per_pod: Option<i32>,
    /// What sets the replica count: the operator's HorizontalPodAutoscaler on the
    /// targets above, or an outside scaler (e.g. a KEDA ScaledObject) that owns
    /// `replicas` within min/maxReplicas; then no HPA is made and the Deployment's
    /// `replicas` is never written, and maxReplicas still counts in the connection budget.
    #[serde(default, skip_serializing_if = "Scaler::is_default")]
    pub scaler: Scaler,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum Scaler {
    #[default]
    HorizontalPodAutoscaler,
    External,
}

impl Scaler {
    fn is_default(&self) -> bool {
        *self == Scaler::HorizontalPodAutoscaler
    }
}

fn default_min_replicas() -> i32 {
    2
}

fn default_max_replicas() -> i32 {
    6
}

fn default_cpu() -> Option<i32> {
    Some(70)
}

fn default_pool_saturation() -> Option<i32> {
    Some(70)
}

impl AutoscalingSpec {
    /// The CPU utilisation target in force (`cpuUtilization: 0` is none).
    pub fn cpu_target(&self) -> Option<i32> {
        self.cpu_utilization.filter(|v| *v > 0)
    }

    /// The pool saturation target in force, percent (`poolSaturation: 0` is none).
    pub fn pool_saturation_target(&self) -> Option<i32> {
        self.pool_saturation.filter(|v| *v > 0)
    }
}

impl Default for AutoscalingSpec {
    fn default() -> Self {
        AutoscalingSpec {
            enabled: true,
            min_replicas: default_min_replicas(),
            max_replicas: default_max_replicas(),
            cpu_utilization: default_cpu(),
            pool_saturation: default_pool_saturation(),
            connections_per_pod: None,
            scaler: Scaler::HorizontalPodAutoscaler,
        }
    }
}

/// PROXY protocol (v1/v2) in front of the listeners, e.g. behind a TCP load balancer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.enabled) || !self.enabled || (has(self.trustedCidrs) && self.trustedCidrs.size() > 0)").message("proxyProtocol.trustedCidrs is required when enabled: a PROXY header from anyone lets clients forge their address"))]
pub struct ProxyProtocolSpec {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub trusted_cidrs: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupCommitSpec {
    /// Off (the default): each pod commits the mail it receives, so a pod
    /// added adds no hop. On: each pod hands its deliveries to one pod of its
    /// Deployment (the lowest ready address of a headless Service, port 7025),
    /// which commits them in its batches: PostgreSQL then commits as many
    /// transactions for N pods as for one (a third less of its CPU with two
    /// pods), at the cost of a hop between pods per message (up to 0.4 ms of
    /// P95). On suits a database short of CPU, and mail that goes to a few
    /// busy mailboxes (the pods' batches then share their rows).
    #[serde(default)]
    pub across_pods: bool,
}

/// Namespaced sysctls of the mail pods (`securityContext.sysctls`), each set only
/// when given; the kernel's own value stands for the others.
///
/// The kubelet starts a pod only when every sysctl it carries is in its safe set
/// or in its `--allowed-unsafe-sysctls`: `ipLocalPortRange` and the keepalive and
/// FIN settings are safe from Kubernetes 1.29, `tcpRmem` and `tcpWmem` from 1.32,
/// and `somaxconn` never is. A pod refused for a sysctl fails (reason
/// `SysctlForbidden`) and the MailCluster's `SysctlsAllowed` condition says which.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TuningSpec {
    /// `net.ipv4.ip_local_port_range`: the ports outgoing connections (PostgreSQL,
    /// Redis, relayed mail) take, `"LOW HIGH"`, e.g. `"16384 65535"`. The kernel
    /// refuses a range below 1024, and it must leave out the ports the pods
    /// listen on: 7025, 9090, and 10000 + each mail port (10025, 10110, 10143,
    /// 10465, 10587, 10993, 10995, 14190).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^[0-9]{1,5}[ \t]+[0-9]{1,5}$"))]
    pub ip_local_port_range: Option<String>,
    /// `net.ipv4.tcp_keepalive_time`: seconds a connection is idle before the first
    /// keepalive probe. The mail listeners use it for their connections too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32767))]
    pub tcp_keepalive_time: Option<u32>,
    /// `net.ipv4.tcp_keepalive_intvl`: seconds between keepalive probes. The mail
    /// listeners use it for their connections too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32767))]
    pub tcp_keepalive_intvl: Option<u32>,
    /// `net.ipv4.tcp_keepalive_probes`: unanswered probes before the connection is
    /// dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 127))]
    pub tcp_keepalive_probes: Option<u32>,
    /// `net.ipv4.tcp_fin_timeout`: seconds a connection closed by the pod waits
    /// in FIN-WAIT-2 for the peer's FIN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub tcp_fin_timeout: Option<u32>,
    /// `net.ipv4.tcp_rmem`: receive buffer per socket, bytes, `"MIN DEFAULT MAX"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), regex(pattern = r"^[0-9]{1,10}[ \t]+[0-9]{1,10}[ \t]+[0-9]{1,10}$"))]
    pub tcp_rmem: Option<String>,
    /// `net.ipv4.tcp_wmem`: send buffer per socket, bytes, `"MIN DEFAULT MAX"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), regex(pattern = r"^[0-9]{1,10}[ \t]+[0-9]{1,10}[ \t]+[0-9]{1,10}$"))]
    pub tcp_wmem: Option<String>,
    /// `net.core.somaxconn`: the longest queue of accepted-but-not-yet-taken
    /// connections a listener may have; the mail listeners size theirs to it.
    /// Unsafe for the kubelet: every node that may run the pods needs
    /// `--allowed-unsafe-sysctls=net.core.somaxconn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub somaxconn: Option<u32>,
}

impl TuningSpec {
    /// The sysctls the pods carry, by kernel name, in a fixed order, with lists
    /// written as the kernel prints them (one space between numbers).
    pub fn sysctls(&self) -> Vec<(&'static str, String)> {
        let list =
            |s: &Option<String>| s.as_ref().map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "));
        let number = |n: Option<u32>| n.map(|n| n.to_string());
        [
            ("net.ipv4.ip_local_port_range", list(&self.ip_local_port_range)),
            ("net.ipv4.tcp_keepalive_time", number(self.tcp_keepalive_time)),
            ("net.ipv4.tcp_keepalive_intvl", number(self.tcp_keepalive_intvl)),
            ("net.ipv4.tcp_keepalive_probes", number(self.tcp_keepalive_probes)),
            ("net.ipv4.tcp_fin_timeout", number(self.tcp_fin_timeout)),
            ("net.ipv4.tcp_rmem", list(&self.tcp_rmem)),
            ("net.ipv4.tcp_wmem", list(&self.tcp_wmem)),
            ("net.core.somaxconn", number(self.somaxconn)),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect()
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// On (the default): the mail pods take mail on their mail ports from
    /// anywhere, the admin port (9090: metrics, health) only from the
    /// namespaces below, and the group-commit port (7025) only from the
    /// cluster's own delivering pods.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Namespaces, by name, allowed to reach the admin port (9090), e.g. the
    /// one Prometheus runs in. Pods of the cluster's own namespace are not
    /// allowed unless it is listed.
    #[serde(default = "default_metrics_namespaces")]
    #[schemars(length(max = 16), inner(length(max = 63)))]
    pub metrics_namespaces: Vec<String>,
    /// Namespaces, by their labels (all of them must match), also allowed to
    /// reach the admin port.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub metrics_namespace_labels: BTreeMap<String, String>,
    /// Also restrict what the mail pods may connect to: DNS (53), SMTP to other
    /// servers (25, 465, 587), PostgreSQL (5432), Redis (6379, Sentinel 26379) and
    /// `egressPorts`, anywhere. For namespaces whose egress is denied by default,
    /// this is what the relay and the stores need.
    #[serde(default)]
    pub restrict_egress: bool,
    /// More TCP ports the pods may connect to (a PostgreSQL or Redis on another port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(range(min = 1, max = 65535)))]
    pub egress_ports: Vec<i32>,
}

fn default_metrics_namespaces() -> Vec<String> {
    vec!["monitoring".into()]
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        NetworkPolicySpec {
            enabled: true,
            metrics_namespaces: default_metrics_namespaces(),
            metrics_namespace_labels: BTreeMap::new(),
            restrict_egress: false,
            egress_ports: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Create a Prometheus-operator ServiceMonitor when its CRD is installed.
    #[serde(default = "yes")]
    pub service_monitor: bool,
    #[serde(default = "default_scrape_interval")]
    pub interval: String,
}

fn default_scrape_interval() -> String {
    "30s".into()
}

impl Default for MonitoringSpec {
    fn default() -> Self {
        MonitoringSpec { service_monitor: true, interval: default_scrape_interval() }
    }
}

/// In-cluster load test: the stress runner's own scenario format
/// ([`crate::stress`]) plus what only the cluster needs (schedule, bounds, resources).
/// The operator fills in the targets from the cluster's Services.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.slo) || !has(self.slo.successRate) || (self.slo.successRate >= 0.0 && self.slo.successRate <= 100.0)").message("stress.slo.successRate is a percentage (0..100)"))]
pub struct ClusterStressSpec {
    /// Cron schedule of the recurring run; absent: on-demand runs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// A reference load profile (see [`crate::stress::StressProfile`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::stress::StressProfile>,
    /// Test accounts; default `stress{:04}@<first domain>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<crate::stress::UsersSpec>,
    /// Scenarios run in order; empty: the profile's, else the runner's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub scenarios: Vec<crate::stress::ScenarioSpec>,
    #[serde(default)]
    pub slo: crate::stress::SloSpec,
    /// Hard bound on one run; the Job is killed after it.
    #[serde(default = "default_stress_deadline")]
    #[schemars(range(min = 60, max = 86400))]
    pub deadline_seconds: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

fn default_stress_deadline() -> i64 {
    3600
}

impl Default for ClusterStressSpec {
    /// On-demand runs without a `stress` section use the stress runner's default scenarios.
    fn default() -> Self {
        ClusterStressSpec {
            schedule: None,
            profile: None,
            users: None,
            scenarios: Vec::new(),
            slo: Default::default(),
            deadline_seconds: default_stress_deadline(),
            resources: None,
        }
    }
}

/// Observed state, written by the operator (and `lastStress` by the stress Job).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Ready, Progressing, Degraded, SLOMet; SysctlsAllowed while `spec.tuning`
    /// gives the pods sysctls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp: Option<ProtocolStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<ProtocolStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imap: Option<ProtocolStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pop3: Option<ProtocolStatus>,
    /// Image whose schema migration has completed; Deployments run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrated_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stress: Option<crate::stress::LastStress>,
    /// Accounts in the store without a MailAccount (written by the accounts
    /// reconciler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmanaged_accounts: Option<UnmanagedAccounts>,
}

impl MailClusterStatus {
    pub fn protocol(&self, p: Protocol) -> Option<&ProtocolStatus> {
        match p {
            Protocol::Smtp => self.smtp.as_ref(),
            Protocol::Submission => self.submission.as_ref(),
            Protocol::Imap => self.imap.as_ref(),
            Protocol::Pop3 => self.pop3.as_ref(),
        }
    }

    pub fn protocol_mut(&mut self, p: Protocol) -> &mut Option<ProtocolStatus> {
        match p {
            Protocol::Smtp => &mut self.smtp,
            Protocol::Submission => &mut self.submission,
            Protocol::Imap => &mut self.imap,
            Protocol::Pop3 => &mut self.pop3,
        }
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Waiting for Secrets or the first schema migration.
    Pending,
    /// A migration Job for a new image is running; pods stay on the old image.
    Migrating,
    /// Children applied; see the Ready condition for pod readiness.
    Running,
    /// The spec is invalid or cannot be applied.
    Degraded,
    /// `spec.paused`: children are left alone.
    Paused,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolStatus {
    pub replicas: i32,
    pub ready_replicas: i32,
    /// The HPA's maxReplicas in force (after connection-budget capping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i32>,
}
