//! The mail pod's configuration: a TOML file plus `MAILCLUSTER_*` environment
//! overrides (the names are part of the pod's operational contract). Unknown keys are errors, not silently
//! ignored: a typo in a limit must not run a server with the default.
//!
//! One definition for the two sides of the file: the server reads it
//! (`Config::load`, plus the checks only a running server can make), the operator
//! writes it into each MailCluster's ConfigMap. Each section has its defaults and
//! its checks beside its fields.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Listener;

mod filter;
mod load;
mod mail;
mod protocols;
mod sieve;

pub use filter::{FailMode, FilterConfig, RspamdConfig};
pub use load::ConfigError;
pub use mail::{DkimConfig, DkimKey, DnsConfig, InboundAuthConfig, RelayConfig, split_host_port};
pub use protocols::{
    AuthConfig, ImapConfig, MIN_AUTOLOGOUT_SECS, MIN_GROUP_COMMIT_SECRET, Pop3Config, SmtpConfig,
};
pub use sieve::SieveConfig;

/// Most threads `worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Name used in greetings and Received headers.
    pub hostname: String,
    /// `MAILCLUSTER_LISTEN_ADDR`.
    pub listen_addr: IpAddr,
    /// `MAILCLUSTER_PROTOCOLS`, e.g. `["smtp", "imap"]`; empty means all.
    /// Names: smtp, submission, submissions, imap, imaps, pop3, pop3s, managesieve.
    pub protocols: Vec<Listener>,
    pub ports: Ports,
    /// `MAILCLUSTER_DATA_DIR`: embedded database and generated dev certificate.
    pub data_dir: PathBuf,
    pub database: DatabaseConfig,
    pub redis: RedisConfig,
    pub cache: CacheConfig,
    pub tls: TlsConfig,
    pub net: NetConfig,
    pub log: LogConfig,
    /// Seconds sessions get to finish after SIGTERM before they are told goodbye.
    pub shutdown_grace_secs: u64,
    /// `MAILCLUSTER_WORKER_THREADS`: threads that run sessions. 0: one per CPU
    /// this process may use (its affinity and cgroup CPU quota). A pod without a
    /// CPU limit would otherwise start one per core of its node, however small
    /// its share: the operator sets this from the container's CPU request.
    pub worker_threads: usize,
    pub smtp: SmtpConfig,
    pub imap: ImapConfig,
    pub pop3: Pop3Config,
    pub auth: AuthConfig,
    pub relay: RelayConfig,
    pub dns: DnsConfig,
    pub dkim: DkimConfig,
    pub inbound: InboundAuthConfig,
    pub sieve: SieveConfig,
    pub filter: FilterConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hostname: "localhost".into(),
            listen_addr: IpAddr::from([0, 0, 0, 0]),
            protocols: Vec::new(),
            ports: Ports::default(),
            data_dir: PathBuf::from("./mailcluster-data"),
            database: DatabaseConfig::default(),
            redis: RedisConfig::default(),
            cache: CacheConfig::default(),
            tls: TlsConfig::default(),
            net: NetConfig::default(),
            log: LogConfig::default(),
            shutdown_grace_secs: 25,
            worker_threads: 0,
            smtp: Default::default(),
            imap: Default::default(),
            pop3: Default::default(),
            auth: Default::default(),
            relay: Default::default(),
            dns: Default::default(),
            dkim: Default::default(),
            inbound: Default::default(),
            sieve: Default::default(),
            filter: Default::default(),
        }
    }
}

/// Listen ports: the standard port + 10000 so pods need no privileges; Services
/// map the standard ports onto these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Ports {
    pub smtp: u16,
    pub submission: u16,
    pub submissions: u16,
    pub imap: u16,
    pub imaps: u16,
    pub pop3: u16,
    pub pop3s: u16,
    pub managesieve: u16,
    pub admin: u16,
}

impl Default for Ports {
    fn default() -> Self {
        // Container ports are the standard port + 10000 (at most 14190).
        let port = |l: Listener| u16::try_from(l.container_port()).unwrap_or(0);
        Ports {
            smtp: port(Listener::Smtp),
            submission: port(Listener::Submission),
            submissions: port(Listener::Submissions),
            imap: port(Listener::Imap),
            imaps: port(Listener::Imaps),
            pop3: port(Listener::Pop3),
            pop3s: port(Listener::Pop3s),
            managesieve: port(Listener::ManageSieve),
            admin: 9090,
        }
    }
}

/// A value that never shows in logs, `Debug` or `--print-config`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `MAILCLUSTER_DATABASE_URL`: postgres:// or sqlite://; unset → SQLite file in
    /// the data dir. PostgreSQL TLS follows the URL's `sslmode` (`prefer` when
    /// unset, except plain TCP to a server on loopback).
    pub url: Option<Secret>,
    /// Maximum pool connections per process.
    pub pool_size: u32,
    /// Run migrations at start (the operator runs a migration Job and turns this off).
    pub migrate_on_start: bool,
    pub connect_timeout_secs: u64,
    /// Keep retrying an unreachable database at start for this long (0 = fail fast).
    pub startup_retry_secs: u64,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: None,
            pool_size: 20,
            migrate_on_start: true,
            connect_timeout_secs: 5,
            startup_retry_secs: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `MAILCLUSTER_REDIS_URL`; unset → in-process cache (single pod only).
    pub url: Option<Secret>,
    pub pool_size: u32,
    pub connect_timeout_secs: u64,
    /// Prefix for every key, so several clusters can share one Redis.
    pub key_prefix: String,
    /// Longest a request waits on Redis before the pod's stand-in answers
    /// (`cache::resilient`): a slow or dead Redis never holds a session longer.
    /// A miss also opens the breaker, so the budget must stay above what a busy
    /// pod's own scheduling adds to a Redis round trip: at 50 ms, a pod whose
    /// cores were full missed it every few seconds, and its logins, served by the
    /// stand-in, each ran argon2 (bench/RESULTS.md, IMAP session mix runs 8-9).
    pub request_budget_ms: u64,
    /// After a Redis failure the pod stops calling Redis and probes it this often
    /// until it answers again.
    pub retry_after_secs: u64,
    /// Values read far more often than they change (SMTP recipient lookups, DNS
    /// answers) are kept in the pod, this many keys at most, and read there
    /// without a round trip. Redis tells the pod when one changes or expires
    /// (server-assisted client-side caching: `CLIENT TRACKING` over RESP3, Redis
    /// 6 or later), so a copy is never older than the change plus its
    /// notification. 0 reads every value from Redis (for a Redis-compatible
    /// server without tracking).
    pub client_cache_keys: usize,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: None,
            pool_size: 8,
            connect_timeout_secs: 5,
            key_prefix: "mc:".into(),
            request_budget_ms: 250,
            retry_after_secs: 2,
            client_cache_keys: 10_000,
        }
    }
}

/// `[cache]`: how the pod trusts what it reads back from the shared cache.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// `MAILCLUSTER_CACHE__MAC_KEY`: the key of the MAC on every cached value that
    /// selects a mailbox or a message, and of the credential cache's keys. It is
    /// never stored in the cache, so whoever can write Redis cannot forge them.
    /// Unset: derived from the database URL (every pod has the same, and it
    /// carries the database password); a key of its own is better.
    pub mac_key: Option<Secret>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// `MAILCLUSTER_TLS_CERT` / `MAILCLUSTER_TLS_KEY`: PEM files. Unset → a
    /// self-signed certificate is generated in the data dir (with a warning).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// How often to look for changed certificate files.
    pub reload_interval_secs: u64,
    /// Allow AUTH/LOGIN/USER over unencrypted connections (off by default).
    pub allow_plaintext_auth: bool,
    /// Rotate session-ticket keys (shared through the cache) this often.
    pub ticket_rotation_secs: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: None,
            key: None,
            reload_interval_secs: 10,
            allow_plaintext_auth: false,
            ticket_rotation_secs: 6 * 3600,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// Listen backlog of every listener: connections the kernel has accepted and
    /// the server has not yet taken. 0 (the default): the pod's
    /// `net.core.somaxconn`, which caps any larger value anyway.
    pub backlog: u32,
    /// Per-listener connection cap; over it, clients get an immediate protocol
    /// refusal.
    pub max_connections: usize,
    /// Per-client-IP connection cap per listener (0 = unlimited).
    pub max_connections_per_ip: usize,
    /// Seconds a client connection is idle before the first keepalive probe; 0
    /// sends none.
    pub tcp_keepalive_secs: u64,
    /// Seconds between keepalive probes (the kernel's `tcp_keepalive_probes`
    /// unanswered ones drop the connection).
    pub tcp_keepalive_interval_secs: u64,
    pub proxy_protocol: ProxyProtocolConfig,
    /// The pod's memory limit in bytes (the operator passes the container's
    /// limit through the downward API). 0: read from the cgroup
    /// (`/sys/fs/cgroup/memory.max`).
    pub memory_limit_bytes: u64,
    /// Bytes of client input the pod holds at once in transfers (IMAP literals,
    /// SMTP DATA and BDAT, POP3 command lines); when it is spent, new transfers
    /// get a temporary error instead of more memory. 0: a quarter of the memory
    /// limit, or 256 MiB when no limit is known.
    pub transfer_budget_bytes: u64,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            backlog: 0,
            max_connections: 10_000,
            max_connections_per_ip: 0,
            tcp_keepalive_secs: 60,
            tcp_keepalive_interval_secs: 10,
            proxy_protocol: ProxyProtocolConfig::default(),
            memory_limit_bytes: 0,
            transfer_budget_bytes: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyProtocolConfig {
    pub enabled: bool,
    /// Peers allowed to send a PROXY header (v1 or v2); others are refused.
    pub trusted_cidrs: Vec<ipnet::IpNet>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// An `EnvFilter` directive, e.g. `info` or `mailcluster_server=debug`.
    pub level: String,
    /// `auto` (JSON when stdout is not a terminal), `json` or `text`.
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into(), format: "auto".into() }
    }
}

impl Config {
    /// Checks what the type system cannot: that the enabled listeners fit together
    /// and the values are usable. Reports every problem at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(problems.join("; "))) }
    }

    /// Every problem [`Config::validate`] reports, one message each (a server adds
    /// the checks that need its own parsers, e.g. of Redis URLs and log filters).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();

        if self.hostname.trim().is_empty() {
            problems.push("hostname must not be empty".to_string());
        }

        for (i, listener) in self.protocols.iter().enumerate() {
            if self.protocols[..i].contains(listener) {
                problems.push(format!("protocol {:?} is listed twice", listener.name()));
            }
        }

        // Two listeners on one port would fail at bind time with a less helpful
        // message; port 0 (pick a free port) may repeat.
        let mut by_port: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
        for listener in self.enabled_listeners() {
            by_port.entry(self.ports.get(listener)).or_default().push(listener.name());
        }
        by_port.entry(self.ports.admin).or_default().push("admin");
        for (port, names) in by_port {
            if port != 0 && names.len() > 1 {
                problems.push(format!("port {port} is used by several listeners: {}", names.join(", ")));
            }
        }

        if self.tls.cert.is_some() != self.tls.key.is_some() {
            problems.push(
                "tls.cert and tls.key must be set together (or neither, for a generated certificate)".into(),
            );
        }

        if let Some(url) = &self.database.url {
            let url = url.expose();
            if !(url.starts_with("postgres://")
                || url.starts_with("postgresql://")
                || url.starts_with("sqlite:"))
            {
                problems.push(format!(
                    "database.url must start with postgres://, postgresql:// or sqlite: (got {})",
                    redact_url(url)
                ));
            }
        }
        for (name, value) in [
            ("database.pool_size", u64::from(self.database.pool_size)),
            ("database.connect_timeout_secs", self.database.connect_timeout_secs),
            ("redis.pool_size", u64::from(self.redis.pool_size)),
            ("redis.connect_timeout_secs", self.redis.connect_timeout_secs),
            ("redis.request_budget_ms", self.redis.request_budget_ms),
            ("redis.retry_after_secs", self.redis.retry_after_secs),
            ("net.max_connections", self.net.max_connections as u64),
            ("net.tcp_keepalive_interval_secs", self.net.tcp_keepalive_interval_secs),
            ("tls.reload_interval_secs", self.tls.reload_interval_secs),
            ("tls.ticket_rotation_secs", self.tls.ticket_rotation_secs),
            ("imap.connection_lease_secs", self.imap.connection_lease_secs),
            ("imap.tombstone_prune_interval_secs", self.imap.tombstone_prune_interval_secs),
            ("imap.preauth_timeout_secs", self.imap.preauth_timeout_secs),
            ("pop3.preauth_timeout_secs", self.pop3.preauth_timeout_secs),
            ("smtp.preauth_timeout_secs", self.smtp.preauth_timeout_secs),
            ("smtp.data_deadline_secs", self.smtp.data_deadline_secs),
        ] {
            if value == 0 {
                problems.push(format!("{name} must be greater than 0"));
            }
        }

        if self.pop3.autologout_secs < MIN_AUTOLOGOUT_SECS {
            problems
                .push(format!("pop3.autologout_secs must be at least {} (RFC 1939 §3)", MIN_AUTOLOGOUT_SECS));
        }
        // RFC 2449 §4: commands may be up to 255 octets; shorter limits break clients.
        if self.pop3.max_line_bytes < 255 {
            problems.push("pop3.max_line_bytes must be at least 255 (RFC 2449 §4)".into());
        }
        // LOGIN with a quoted user name and password, or an AUTHENTICATE line.
        if self.imap.preauth_max_command_bytes < 1024 {
            problems.push("imap.preauth_max_command_bytes must be at least 1024".into());
        }
        if self.auth.failure_delay_ms > self.auth.max_failure_delay_ms {
            problems.push("auth.failure_delay_ms must not exceed auth.max_failure_delay_ms".into());
        }
        if self.cache.mac_key.as_ref().is_some_and(|k| !k.expose().is_empty() && k.expose().len() < 16) {
            problems.push("cache.mac_key must be at least 16 characters (or unset)".into());
        }

        if self.pop3.lock_ttl_secs == 0 {
            problems.push("pop3.lock_ttl_secs must be greater than 0".into());
        }

        // A PROXY header from an untrusted peer is refused, so enabling the protocol
        // with nobody trusted would refuse every connection.
        if self.net.proxy_protocol.enabled && self.net.proxy_protocol.trusted_cidrs.is_empty() {
            problems.push("net.proxy_protocol.enabled needs at least one entry in trusted_cidrs".into());
        }
        // The group-commit handshake is only as strong as the key both sides prove.
        if let Some(secret) = &self.smtp.group_commit_secret
            && secret.expose().len() < MIN_GROUP_COMMIT_SECRET
        {
            problems.push(format!(
                "smtp.group_commit_secret must be at least {MIN_GROUP_COMMIT_SECRET} characters (or unset: no group commit across pods)"
            ));
        }

        // A thread per connection is not the model: more workers than cores only
        // add switching, and a number this large is a typo (a millicore value).
        if self.worker_threads > MAX_WORKER_THREADS {
            problems.push(format!("worker_threads must be at most {MAX_WORKER_THREADS} (0: one per CPU)"));
        }

        if !["auto", "json", "text"].contains(&self.log.format.as_str()) {
            problems.push(format!("log.format must be auto, json or text (got {:?})", self.log.format));
        }
        self.relay.problems(&mut problems);
        self.dns.problems(&mut problems);
        self.dkim.problems(&mut problems);
        self.sieve.problems(&mut problems);
        self.filter.problems(&mut problems);
        problems
    }

    /// The listeners to start: `protocols` as given, or all of them when empty.
    pub fn enabled_listeners(&self) -> Vec<Listener> {
        Listener::ALL
            .into_iter()
            .filter(|l| self.protocols.is_empty() || self.protocols.contains(l))
            .collect()
    }

    /// `(listener, address)` for every enabled protocol listener.
    pub fn listen_addrs(&self) -> Vec<(Listener, SocketAddr)> {
        self.enabled_listeners()
            .into_iter()
            .map(|l| (l, SocketAddr::new(self.listen_addr, self.ports.get(l))))
            .collect()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::new(self.listen_addr, self.ports.admin)
    }

    /// The effective configuration as TOML, secrets replaced by `<redacted>`
    /// (what `serve --print-config` shows).
    pub fn to_redacted_toml(&self) -> String {
        // Serializing plain data into TOML only fails for shapes TOML cannot hold
        // (e.g. a None inside an array), which this struct does not have.
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }
}

impl Ports {
    /// The port of a listener.
    pub fn get(&self, listener: Listener) -> u16 {
        match listener {
            Listener::Smtp => self.smtp,
            Listener::Submission => self.submission,
            Listener::Submissions => self.submissions,
            Listener::Imap => self.imap,
            Listener::Imaps => self.imaps,
            Listener::Pop3 => self.pop3,
            Listener::Pop3s => self.pop3s,
            Listener::ManageSieve => self.managesieve,
        }
    }
}

/// Passwords in URLs (`user:***@host`, `?password=***`) hidden, for messages that
/// must name the server they could not reach.
pub fn redact_url(url: &str) -> String {
    let mut out = match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(authority_end);
            match authority.rsplit_once('@') {
                Some((userinfo, host)) => {
                    let user = match userinfo.split_once(':') {
                        Some((user, _)) => format!("{user}:***"),
                        None => userinfo.to_string(),
                    };
                    format!("{scheme}://{user}@{host}{tail}")
                }
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    };
    // `?password=...` is accepted by libpq-style URLs too
    if let Some(i) = out.find("password=") {
        let start = i + "password=".len();
        let end = out[start..].find('&').map_or(out.len(), |e| start + e);
        out.replace_range(start..end, "***");
    }
    out
}
