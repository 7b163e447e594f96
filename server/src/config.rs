//! Server configuration: a TOML file plus `MAILCLUSTER_*` environment overrides
//! (DESIGN §4 operational contract). Unknown keys are errors, not silently ignored:
//! a typo in a limit must not run a server with the default.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Name used in greetings and Received headers.
    pub hostname: String,
    /// `MAILCLUSTER_LISTEN_ADDR`.
    pub listen_addr: IpAddr,
    /// `MAILCLUSTER_PROTOCOLS`, e.g. `["smtp", "imap"]`; empty means all.
    /// Names: smtp, submission, submissions, imap, imaps, pop3, pop3s.
    pub protocols: Vec<String>,
    pub ports: Ports,
    /// `MAILCLUSTER_DATA_DIR`: embedded database and generated dev certificate.
    pub data_dir: PathBuf,
    pub database: DatabaseConfig,
    pub redis: RedisConfig,
    pub tls: TlsConfig,
    pub net: NetConfig,
    pub log: LogConfig,
    /// Seconds sessions get to finish after SIGTERM before they are told goodbye.
    pub shutdown_grace_secs: u64,
    pub smtp: crate::smtp::SmtpConfig,
    pub imap: crate::imap::ImapConfig,
    pub pop3: crate::pop3::Pop3Config,
    pub auth: crate::auth::AuthConfig,
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
            tls: TlsConfig::default(),
            net: NetConfig::default(),
            log: LogConfig::default(),
            shutdown_grace_secs: 25,
            smtp: Default::default(),
            imap: Default::default(),
            pop3: Default::default(),
            auth: Default::default(),
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
    pub admin: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            smtp: 10025,
            submission: 10587,
            submissions: 10465,
            imap: 10143,
            imaps: 10993,
            pop3: 10110,
            pop3s: 10995,
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
    /// the data dir.
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
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig { url: None, pool_size: 8, connect_timeout_secs: 5, key_prefix: "mc:".into() }
    }
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
    pub backlog: u32,
    /// Per-listener connection cap; over it, clients get an immediate protocol
    /// refusal.
    pub max_connections: usize,
    /// Per-client-IP connection cap per listener (0 = unlimited).
    pub max_connections_per_ip: usize,
    pub tcp_keepalive_secs: u64,
    pub proxy_protocol: ProxyProtocolConfig,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            backlog: 1024,
            max_connections: 10_000,
            max_connections_per_ip: 0,
            tcp_keepalive_secs: 60,
            proxy_protocol: ProxyProtocolConfig::default(),
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
