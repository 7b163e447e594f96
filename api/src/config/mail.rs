//! The sections of mail exchange with other domains: `[relay]` (sending),
//! `[dns]` (the resolver both directions use), `[dkim]` (signing) and `[inbound]`
//! (SPF, DKIM, DMARC and ARC checks on the MX).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Secret;

/// `[relay]`: the workers that deliver the outbound queue to other domains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelayConfig {
    /// Run relay workers in this pod (the pods that serve SMTP, by default).
    pub enabled: bool,
    /// Messages in delivery at once in this pod.
    pub concurrency: usize,
    /// Connections at once to one destination (domain or smarthost) from this pod
    /// (20: Postfix's default_destination_concurrency_limit).
    pub max_connections_per_destination: usize,
    /// Messages sent over one connection before it is closed.
    pub max_messages_per_connection: usize,
    /// How long a claimed message stays this pod's: another pod takes it over
    /// after this when the claiming pod died mid-delivery.
    pub lease_secs: u64,
    /// How often an idle worker looks at the queue (a message queued by this pod
    /// wakes the workers at once).
    pub poll_interval_ms: u64,
    /// Seconds after the first attempt at which each retry happens; the last value
    /// repeats until the message expires (`smtp.queue_expiry_secs`).
    pub retry_schedule_secs: Vec<u64>,
    /// A delay notice (DSN action=delayed) goes to the sender once a message has
    /// waited this long; 0 = never.
    pub delay_notice_secs: u64,
    /// MX hosts tried per domain (a domain with more is cut at this many, in
    /// preference order).
    pub max_mx_hosts: usize,
    /// The port remote MX hosts are reached at. 25 in the real world; tests point
    /// it at their own servers.
    pub remote_port: u16,
    /// `host:port` to send all outbound mail through instead of to MX hosts
    /// (`MAILCLUSTER_RELAY__SMARTHOST`).
    pub smarthost: Option<String>,
    pub smarthost_username: Option<String>,
    pub smarthost_password: Option<Secret>,
    /// TLS to the smarthost: "required" (STARTTLS, or implicit on port 465),
    /// "none" (only for a smarthost on a trusted network).
    pub smarthost_tls: String,
    /// Certificates of remote servers are checked against the web PKI roots:
    /// `false` accepts any certificate on opportunistic STARTTLS to MX hosts
    /// (RFC 7435: encryption without authentication beats clear text; the usual
    /// practice of MTAs without MTA-STS or DANE). Smarthosts are always verified
    /// unless `smarthost_tls_verify` is false.
    pub smarthost_tls_verify: bool,
    /// Waiting for a connection to open.
    pub connect_timeout_secs: u64,
    /// Waiting for any reply but the one after the message content.
    pub command_timeout_secs: u64,
    /// Waiting for the reply after the message content (RFC 5321 §4.5.3.2.6:
    /// 10 minutes).
    pub data_timeout_secs: u64,
    /// Longest reply (all lines together) taken from a remote server.
    pub max_reply_bytes: usize,
    /// Name sent in EHLO; empty: the server's hostname.
    pub helo_name: String,
    /// Honour MTA-STS policies (RFC 8461) of receiving domains.
    pub mta_sts: bool,
    /// The port MTA-STS policies are fetched from (443; tests point it elsewhere).
    pub mta_sts_port: u16,
    /// More trusted roots (PEM) for verified TLS: to a smarthost and to MX hosts
    /// under an MTA-STS policy (a private PKI, or tests).
    pub tls_ca_file: Option<PathBuf>,
    /// Networks the relay may reach MX hosts (and a domain's A/AAAA fallback)
    /// on although their addresses are not global: loopback, private (RFC 1918,
    /// ULA), link-local, unspecified, multicast, reserved. Empty: only global
    /// addresses, so that a DNS answer cannot point the relay at the cluster's
    /// own services. A configured smarthost is always reached.
    pub allowed_private_networks: Vec<ipnet::IpNet>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            enabled: true,
            concurrency: 64,
            max_connections_per_destination: 20,
            max_messages_per_connection: 100,
            lease_secs: 600,
            poll_interval_ms: 1000,
            // 5 min, 15 min, 30 min, 1 h, 2 h, 4 h, then every 4 h.
            retry_schedule_secs: vec![300, 900, 1800, 3600, 7200, 14400],
            delay_notice_secs: 4 * 3600,
            max_mx_hosts: 10,
            remote_port: 25,
            smarthost: None,
            smarthost_username: None,
            smarthost_password: None,
            smarthost_tls: "required".into(),
            smarthost_tls_verify: true,
            connect_timeout_secs: 30,
            command_timeout_secs: 300,
            data_timeout_secs: 600,
            max_reply_bytes: 64 * 1024,
            helo_name: String::new(),
            mta_sts: true,
            mta_sts_port: 443,
            tls_ca_file: None,
            allowed_private_networks: Vec::new(),
        }
    }
}

/// `[dns]`: the resolver of MX lookups and sender authentication.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsConfig {
    /// Name servers (`ip:port`); empty: the system's (`/etc/resolv.conf`).
    pub nameservers: Vec<SocketAddr>,
    /// One query's timeout.
    pub timeout_ms: u64,
    /// Attempts per query.
    pub attempts: usize,
    /// Answers kept per record type in this pod (bounded by their TTL), and as many
    /// "no such record" answers (bounded by the zone's SOA minimum, at most 10 min).
    pub cache_entries: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig { nameservers: Vec::new(), timeout_ms: 2000, attempts: 2, cache_entries: 10_000 }
    }
}

/// `[dkim]`: signing keys of local domains.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DkimConfig {
    pub keys: Vec<DkimKey>,
}

/// One signing key: mail whose `From:` is at `domain` (or a subdomain without
/// a key of its own) is signed with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DkimKey {
    pub domain: String,
    pub selector: String,
    /// PEM (PKCS#8) private key, as `mailcluster dkim generate` writes it; a
    /// mounted Secret in a cluster.
    pub key_file: PathBuf,
    /// "ed25519" (ed25519-sha256, RFC 8463) or "rsa" (rsa-sha256).
    pub algorithm: String,
}

/// `[inbound]`: who the sender of mail arriving on the MX port really is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboundAuthConfig {
    /// Check SPF, DKIM, DMARC and ARC and add `Authentication-Results`.
    pub enabled: bool,
    /// Honour the sender domain's DMARC policy: p=reject → 550 5.7.1,
    /// p=quarantine → the recipient's Junk mailbox.
    pub enforce_dmarc: bool,
    /// All DNS work for one message together; past it the message is deferred
    /// (451) rather than held or passed unchecked.
    pub dns_budget_ms: u64,
    /// Name in `Authentication-Results` (the authserv-id); empty: the hostname.
    pub authserv_id: String,
    /// Clients whose mail is not checked (the cluster's own senders, local
    /// tools): by default loopback only.
    pub trusted_networks: Vec<ipnet::IpNet>,
    /// Failure reports (bounces) to one address whose sender passed neither SPF
    /// nor DMARC, per hour; past it they are dropped (counted in
    /// `mail_smtp_bounces_dropped_total`). 0: none are sent.
    pub bounces_per_address_per_hour: u64,
    /// The same for all addresses of one domain together.
    pub bounces_per_domain_per_hour: u64,
}

impl Default for InboundAuthConfig {
    fn default() -> Self {
        InboundAuthConfig {
            enabled: true,
            enforce_dmarc: true,
            dns_budget_ms: 10_000,
            authserv_id: String::new(),
            trusted_networks: vec!["127.0.0.0/8".parse().expect("valid"), "::1/128".parse().expect("valid")],
            bounces_per_address_per_hour: 5,
            bounces_per_domain_per_hour: 50,
        }
    }
}

impl RelayConfig {
    pub(super) fn problems(&self, out: &mut Vec<String>) {
        for (name, value) in [
            ("relay.concurrency", self.concurrency as u64),
            ("relay.max_connections_per_destination", self.max_connections_per_destination as u64),
            ("relay.max_messages_per_connection", self.max_messages_per_connection as u64),
            ("relay.lease_secs", self.lease_secs),
            ("relay.poll_interval_ms", self.poll_interval_ms),
            ("relay.max_mx_hosts", self.max_mx_hosts as u64),
            ("relay.remote_port", u64::from(self.remote_port)),
            ("relay.connect_timeout_secs", self.connect_timeout_secs),
            ("relay.command_timeout_secs", self.command_timeout_secs),
            ("relay.data_timeout_secs", self.data_timeout_secs),
            ("relay.mta_sts_port", u64::from(self.mta_sts_port)),
        ] {
            if value == 0 {
                out.push(format!("{name} must be greater than 0"));
            }
        }
        if self.retry_schedule_secs.is_empty() || self.retry_schedule_secs.contains(&0) {
            out.push("relay.retry_schedule_secs must list at least one delay, each greater than 0".into());
        }
        if self.max_reply_bytes < 512 {
            out.push("relay.max_reply_bytes must be at least 512 (RFC 5321 §4.5.3.1.5)".into());
        }
        if !["required", "none"].contains(&self.smarthost_tls.as_str()) {
            out.push(format!("relay.smarthost_tls must be required or none (got {:?})", self.smarthost_tls));
        }
        if let Some(host) = &self.smarthost
            && split_host_port(host).is_none()
        {
            out.push(format!("relay.smarthost must be host:port (got {host:?})"));
        }
        if self.smarthost_username.is_some() != self.smarthost_password.is_some() {
            out.push("relay.smarthost_username and relay.smarthost_password must be set together".into());
        }
    }
}

impl DnsConfig {
    pub(super) fn problems(&self, out: &mut Vec<String>) {
        if self.timeout_ms == 0 || self.attempts == 0 {
            out.push("dns.timeout_ms and dns.attempts must be greater than 0".into());
        }
    }
}

impl DkimConfig {
    pub(super) fn problems(&self, out: &mut Vec<String>) {
        for (i, key) in self.keys.iter().enumerate() {
            if key.domain.trim().is_empty() || key.selector.trim().is_empty() {
                out.push(format!("dkim.keys[{i}]: domain and selector must not be empty"));
            }
            if !["ed25519", "rsa"].contains(&key.algorithm.as_str()) {
                out.push(format!(
                    "dkim.keys[{i}].algorithm must be ed25519 or rsa (got {:?})",
                    key.algorithm
                ));
            }
            if self.keys[..i].iter().any(|k| k.domain.eq_ignore_ascii_case(&key.domain)) {
                out.push(format!("dkim.keys: domain {} has two keys", key.domain));
            }
        }
    }
}

/// `host:port` → (host, port); a bracketed IPv6 literal keeps no brackets.
pub fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port))
}
