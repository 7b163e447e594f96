//! `MailDomain` and `MailAccount` (`mailcluster.dev/v1alpha1`): the domains and
//! accounts of a `MailCluster` as resources, so that they can be kept in Git next
//! to the cluster itself (docs/accounts.md).
//!
//! Both name their cluster with `spec.clusterRef`, a `MailCluster` in the same
//! namespace: the operator writes them into that cluster's store through the same
//! code the `mailcluster domain`/`user`/`alias` commands use, so an object and a
//! command never disagree on what "an account" is.
//!
//! An account's aliases are a list on the account rather than a kind of their own:
//! an alias that reaches one account is owned by that account, lives and dies with
//! it, and is reviewed in the same file; an alias that fans out to several accounts
//! (a team address) is still `mailcluster alias add`.

// Each `printcolumn(...)` of the kube derive repeats `type_ = ...`; clippy reads the
// repeated keys as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::cluster::DkimAlgorithm;

/// Finalizer the operator puts on every `MailAccount`, so that deleting the object
/// first disables the account in the store (and removes its mail under
/// `deletionPolicy: Delete`).
pub const ACCOUNT_FINALIZER: &str = "mailcluster.dev/account";

/// A mail domain served by a `MailCluster`, and the DNS records it needs.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "mailcluster.dev",
    version = "v1alpha1",
    kind = "MailDomain",
    plural = "maildomains",
    shortname = "mdom",
    category = "mail",
    namespaced,
    status = "MailDomainStatus",
    derive = "PartialEq",
    doc = "A mail domain of a MailCluster: served by its pods, with the DNS records to publish in status.",
    printcolumn(name = "Domain", type_ = "string", json_path = ".spec.domain"),
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "DKIM", type_ = "string", json_path = ".status.dkim.signing"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MailDomainSpec {
    /// Name of the MailCluster, in this namespace, that serves the domain.
    #[schemars(length(min = 1, max = 253))]
    pub cluster_ref: String,
    /// The domain, e.g. `example.com` (stored lower-cased).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == self.lowerAscii() && !self.contains('@') && !self.contains(' ')").message("domain must be a lower-case domain name"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("domain is immutable: create another MailDomain"))]
    pub domain: String,
    /// Account that receives the domain's mail for every local part that is
    /// neither an account nor an alias; it must be an account of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 320))]
    pub catch_all: Option<String>,
    /// Default storage quota of the domain's accounts in bytes (an account's own
    /// `quota` overrides it). Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub quota_bytes: Option<i64>,
    /// DKIM signing of the domain's mail. With a key for the domain in the
    /// MailCluster's `spec.dkim`, that key signs and its record is listed; without
    /// one, the operator makes the keys (Secrets owned by this MailDomain) and
    /// rotates them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dkim: Option<DomainDkim>,
    /// MTA-STS policy mode published for the domain (RFC 8461).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mta_sts: Option<MtaStsMode>,
    /// Where receivers send TLS reports (RFC 8460), e.g. `tlsrpt@example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 320))]
    pub tls_rpt: Option<String>,
}

/// A DKIM selector, key type and rotation.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainDkim {
    /// The selector of the MailCluster's key (the record is
    /// `SELECTOR._domainkey.DOMAIN`); for keys the operator makes, the start of
    /// their selectors: `SELECTOR-YYYYMMDD`, the day the key was made.
    #[schemars(length(min = 1, max = 50))]
    pub selector: String,
    /// Key algorithm. Changing it makes a new key of the new kind, which signs
    /// once its record is seen in DNS.
    #[serde(default)]
    pub algorithm: DkimAlgorithm,
    /// A made key is replaced by a new one this many days after it was made;
    /// unset: only when asked (the `mailcluster.dev/rotate-dkim` annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rotation_days: Option<u32>,
    /// A replaced key's record stays listed (and should stay published) this
    /// many days after the next key started signing, for mail on its way and
    /// messages verified later.
    #[serde(default = "default_grace_days")]
    #[schemars(range(max = 365))]
    pub grace_days: u32,
}

fn default_grace_days() -> u32 {
    7
}

/// The annotation on a MailDomain that asks for a new DKIM key now (a key
/// believed compromised): each new value makes one key.
pub const ROTATE_DKIM_ANNOTATION: &str = "mailcluster.dev/rotate-dkim";

/// The operator's DKIM keys of a domain.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainDkimStatus {
    /// The selector mail is signed with now; unset until a key's record is seen
    /// in DNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<String>,
    /// The keys made for the domain, oldest first.
    #[serde(default)]
    pub keys: Vec<DomainKeyStatus>,
    /// The last value of the `mailcluster.dev/rotate-dkim` annotation acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_request: Option<String>,
}

/// One made key.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainKeyStatus {
    pub selector: String,
    pub algorithm: DkimAlgorithm,
    /// The Secret holding the private key (`dkim.key`).
    pub secret_name: String,
    /// When the key was made (RFC 3339).
    pub created: String,
    /// `Pending` (its record not seen in DNS yet), `Signing`, `Retired` (replaced;
    /// keep its record until `retiredUntil`) or `Expired` (its record and
    /// Secret may be removed).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_until: Option<String>,
}

/// MTA-STS policy modes (RFC 8461 §3.2).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MtaStsMode {
    Enforce,
    Testing,
    None,
}

impl MtaStsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MtaStsMode::Enforce => "enforce",
            MtaStsMode::Testing => "testing",
            MtaStsMode::None => "none",
        }
    }
}

/// What the operator observed of a `MailDomain`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailDomainStatus {
    /// `Ready`: the domain is in the cluster's store. `DnsPublished`: every
    /// record of `dnsRecords` is seen by the operator's resolver. `DkimSigning`
    /// (with keys the operator makes): a made key signs, or why none does.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The records to publish in the domain's DNS zone.
    #[serde(default)]
    pub dns_records: Vec<DnsRecord>,
    /// The DKIM keys the operator made, when it makes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dkim: Option<DomainDkimStatus>,
}

/// One DNS record to publish.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DnsRecord {
    /// Fully qualified owner name, ending in a dot.
    pub name: String,
    /// `MX`, `TXT`, …
    #[serde(rename = "type")]
    pub type_: String,
    /// The record's data as written in a zone file (TXT values quoted).
    pub value: String,
    /// What it is for, e.g. `SPF` or `MTA-STS policy`.
    pub purpose: String,
    /// Whether the operator's resolver sees the record: `True`, `False`, or
    /// `Unknown` (not checked yet, or DNS could not be asked).
    pub published: String,
    /// When `published` was last found out (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checked: Option<String>,
}

/// Inputs of the record list that do not come from the `MailDomain` itself.
#[derive(Debug, Clone, Default)]
pub struct DnsInputs<'a> {
    /// Host name of the cluster's MX (the SMTP Service's public name).
    pub mx_host: &'a str,
    /// The DKIM keys' records, in order.
    pub dkim: Vec<DkimRecord<'a>>,
}

/// A DKIM key's record.
#[derive(Debug, Clone)]
pub struct DkimRecord<'a> {
    pub selector: &'a str,
    /// The public key as its TXT value (`v=DKIM1; k=…; p=…`).
    pub txt: &'a str,
    /// `DKIM`, or what sets the key apart (`DKIM (next)`, `DKIM (retired)`).
    pub purpose: &'a str,
}

/// The records a domain needs published, in a fixed order: MX, SPF, DMARC, DKIM
/// (each key given), MTA-STS (when a mode is set: its TXT and the policy
/// host), TLS-RPT (when an address is set).
pub fn dns_records(spec: &MailDomainSpec, inputs: &DnsInputs<'_>) -> Vec<DnsRecord> {
    let domain = spec.domain.trim_end_matches('.');
    let fqdn = |prefix: &str| {
        if prefix.is_empty() { format!("{domain}.") } else { format!("{prefix}.{domain}.") }
    };
    let record = |name: String, type_: &str, value: String, purpose: &str| DnsRecord {
        name,
        type_: type_.into(),
        value,
        purpose: purpose.into(),
        published: "Unknown".into(),
        last_checked: None,
    };
    let mx_host = inputs.mx_host.trim_end_matches('.');
    let mut out = vec![
        record(fqdn(""), "MX", format!("10 {mx_host}."), "MX"),
        // Only the MX sends for the domain; everything else fails.
        record(fqdn(""), "TXT", "\"v=spf1 mx -all\"".into(), "SPF"),
        // Quarantine rather than reject: a new domain's forwarded mail breaks SPF.
        record(
            fqdn("_dmarc"),
            "TXT",
            format!("\"v=DMARC1; p=quarantine; rua=mailto:postmaster@{domain}\""),
            "DMARC",
        ),
    ];
    for key in &inputs.dkim {
        out.push(record(
            fqdn(&format!("{}._domainkey", key.selector)),
            "TXT",
            quoted_txt(key.txt),
            key.purpose,
        ));
    }
    if let Some(mode) = spec.mta_sts {
        // The id changes with the mode, so senders fetch the policy again.
        out.push(record(fqdn("_mta-sts"), "TXT", format!("\"v=STSv1; id={}\"", mode.as_str()), "MTA-STS"));
        out.push(record(
            fqdn("mta-sts"),
            "URL",
            format!("https://mta-sts.{domain}/.well-known/mta-sts.txt"),
            "MTA-STS policy",
        ));
    }
    if let Some(rua) = &spec.tls_rpt {
        out.push(record(fqdn("_smtp._tls"), "TXT", format!("\"v=TLSRPTv1; rua=mailto:{rua}\""), "TLS-RPT"));
    }
    out
}

/// A TXT value as zone files take it: quoted strings of at most 255 characters
/// (RFC 1035 §3.3.14; an RSA key is longer), which resolvers join back.
fn quoted_txt(value: &str) -> String {
    let chunks: Vec<String> =
        value.as_bytes().chunks(255).map(|c| format!("\"{}\"", String::from_utf8_lossy(c))).collect();
    chunks.join(" ")
}

/// A mail account of a `MailCluster`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "mailcluster.dev",
    version = "v1alpha1",
    kind = "MailAccount",
    plural = "mailaccounts",
    shortname = "macc",
    category = "mail",
    namespaced,
    status = "MailAccountStatus",
    derive = "PartialEq",
    doc = "A mail account of a MailCluster: its address, password (from a Secret), aliases and senders.",
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterRef"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Used", type_ = "integer", json_path = ".status.usedBytes"),
    printcolumn(name = "Last login", type_ = "date", json_path = ".status.lastLogin"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MailAccountSpec {
    /// Name of the MailCluster, in this namespace, whose store holds the account.
    #[schemars(length(min = 1, max = 253))]
    pub cluster_ref: String,
    /// The account's address, `user@domain`; its domain must be served (a MailDomain).
    #[schemars(length(min = 3, max = 320))]
    #[x_kube(validation = Rule::new("self.contains('@')").message("address must be user@domain"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("address is immutable: create another MailAccount"))]
    pub address: String,
    /// The name shown for the account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub display_name: Option<String>,
    /// Storage quota in bytes. Unset: the domain's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub quota_bytes: Option<i64>,
    /// Further addresses whose mail reaches this account.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub aliases: Vec<String>,
    /// Addresses the account may also send as (besides its own and its aliases).
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub send_as: Vec<String>,
    /// Off: logins fail and mail to the account is refused; its mail is kept.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The Secret key with the password: plain text (hashed by the operator), or
    /// an argon2 PHC hash (`$argon2id$…`) kept as given.
    pub password_secret_ref: PasswordSecretRef,
    /// What deleting the MailAccount does to the account: `Retain` disables it and
    /// keeps its mail, `Delete` removes it with its mail.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// The account's Sieve filter (RFC 5228), run on its mail at delivery. Kept
    /// in the store as the account's script named `kubernetes`, and active
    /// while this is set (scripts the user uploads over ManageSieve stay, but
    /// are not active); removing it removes that script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sieve: Option<SieveSource>,
}

/// Where a MailAccount's Sieve script is: exactly one of the two.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.inline) != has(self.configMapRef)").message("give exactly one of inline and configMapRef"))]
pub struct SieveSource {
    /// The script itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub inline: Option<String>,
    /// A key of a ConfigMap in the MailAccount's namespace that holds the
    /// script; a change of the ConfigMap is stored within seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeyRef>,
}

/// A key of a ConfigMap in the object's namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// The name a MailAccount's script has in the store.
pub const MANAGED_SIEVE_SCRIPT: &str = "kubernetes";

fn default_true() -> bool {
    true
}

/// A key of a Secret in the MailAccount's namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// See `MailAccountSpec::deletion_policy`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Retain,
    Delete,
}

/// What the operator observed of a `MailAccount`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailAccountStatus {
    /// `Ready`: the account in the store matches the spec; when `False`, the
    /// reason says why (e.g. `UnsupportedHash`, `SecretMissing`, `ClusterMissing`).
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `resourceVersion` of the password Secret last written to the store: while
    /// it stays the same the password is not hashed or verified again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_version: Option<String>,
    /// Octets the account's mail takes, as the store counts it against the
    /// quota (read again at every reconcile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<i64>,
    /// The storage limit in effect: the account's own `quota` or its domain's
    /// default; unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_bytes: Option<i64>,
    /// When the account last logged in (RFC 3339), as the mail pods record it:
    /// at most every five minutes per pod and account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_login: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MailDomainSpec {
        MailDomainSpec {
            cluster_ref: "mail".into(),
            domain: "example.com".into(),
            catch_all: None,
            quota_bytes: None,
            dkim: None,
            mta_sts: None,
            tls_rpt: None,
        }
    }

    fn kinds(records: &[DnsRecord]) -> Vec<(&str, &str, &str)> {
        records.iter().map(|r| (r.purpose.as_str(), r.name.as_str(), r.type_.as_str())).collect()
    }

    #[test]
    fn a_bare_domain_gets_mx_spf_and_dmarc() {
        let records = dns_records(&spec(), &DnsInputs { mx_host: "mx.example.net.", dkim: vec![] });
        assert_eq!(
            kinds(&records),
            [
                ("MX", "example.com.", "MX"),
                ("SPF", "example.com.", "TXT"),
                ("DMARC", "_dmarc.example.com.", "TXT")
            ]
        );
        assert_eq!(records[0].value, "10 mx.example.net.");
        assert_eq!(records[1].value, "\"v=spf1 mx -all\"");
        assert!(records[2].value.starts_with("\"v=DMARC1; p=quarantine;"));
        assert!(records.iter().all(|r| r.published == "Unknown"));
    }

    #[test]
    fn each_dkim_key_given_is_listed_in_order() {
        let no_key = dns_records(&spec(), &DnsInputs { mx_host: "mx", dkim: vec![] });
        assert!(no_key.iter().all(|r| !r.purpose.starts_with("DKIM")), "no key yet: nothing to publish");
        let key = "v=DKIM1; k=ed25519; p=AAAA";
        let next = "v=DKIM1; k=rsa; p=BBBB";
        let dkim = vec![
            DkimRecord { selector: "s1", txt: key, purpose: "DKIM" },
            DkimRecord { selector: "s1-20261207", txt: next, purpose: "DKIM (next)" },
        ];
        let records = dns_records(&spec(), &DnsInputs { mx_host: "mx", dkim });
        let listed: Vec<(&str, &str, &str)> = records
            .iter()
            .filter(|r| r.purpose.starts_with("DKIM"))
            .map(|r| (r.name.as_str(), r.value.as_str(), r.purpose.as_str()))
            .collect();
        assert_eq!(
            listed,
            [
                ("s1._domainkey.example.com.", "\"v=DKIM1; k=ed25519; p=AAAA\"", "DKIM"),
                ("s1-20261207._domainkey.example.com.", "\"v=DKIM1; k=rsa; p=BBBB\"", "DKIM (next)"),
            ]
        );
        let long = "p=".to_string() + &"A".repeat(300);
        let dkim = vec![DkimRecord { selector: "s1", txt: &long, purpose: "DKIM" }];
        let records = dns_records(&spec(), &DnsInputs { mx_host: "mx", dkim });
        let dkim = records.iter().find(|r| r.purpose == "DKIM").unwrap();
        assert_eq!(dkim.value, format!("\"{}\" \"{}\"", &long[..255], &long[255..]), "split at 255");
    }

    #[test]
    fn mta_sts_and_tls_rpt_follow_the_spec() {
        let mut full = spec();
        full.mta_sts = Some(MtaStsMode::Enforce);
        full.tls_rpt = Some("tlsrpt@example.com".into());
        let records = dns_records(&full, &DnsInputs { mx_host: "mx.example.com", dkim: vec![] });
        assert_eq!(
            kinds(&records)[3..],
            [
                ("MTA-STS", "_mta-sts.example.com.", "TXT"),
                ("MTA-STS policy", "mta-sts.example.com.", "URL"),
                ("TLS-RPT", "_smtp._tls.example.com.", "TXT")
            ]
        );
        assert_eq!(records[3].value, "\"v=STSv1; id=enforce\"");
        assert_eq!(records[4].value, "https://mta-sts.example.com/.well-known/mta-sts.txt");
        assert_eq!(records[5].value, "\"v=TLSRPTv1; rua=mailto:tlsrpt@example.com\"");
    }
}
