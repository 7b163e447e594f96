//! The pod configuration file the ConfigMap carries (server/src/config.rs shape).
//!
//! A mirror of the server's `Config` holding only what the operator sets; the server
//! fills in the rest with its defaults. Secrets (database and Redis URLs) never go into
//! the ConfigMap: the pods get them from Secrets through `secretKeyRef` environment.
//! A test parses every rendered file with the server's own `Config` (which denies
//! unknown keys), so a renamed server field fails the operator's tests.

use mailcluster_api::{Listener, MailCluster, Protocol};
use serde::Serialize;

use crate::names;

#[derive(Debug, Serialize)]
pub struct PodConfig {
    pub hostname: String,
    pub listen_addr: String,
    pub protocols: Vec<String>,
    pub data_dir: String,
    pub shutdown_grace_secs: u64,
    pub ports: Ports,
    pub database: Database,
    pub redis: Redis,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<Tls>,
    pub net: Net,
    pub log: Log,
}

#[derive(Debug, Serialize)]
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

#[derive(Debug, Serialize)]
pub struct Database {
    pub pool_size: u32,
    /// The migration Job owns schema changes; pods never race each other migrating.
    pub migrate_on_start: bool,
    /// Pods wait for PostgreSQL instead of crash-looping while it restarts.
    pub startup_retry_secs: u64,
}

#[derive(Debug, Serialize)]
pub struct Redis {
    pub pool_size: u32,
    pub key_prefix: String,
}

#[derive(Debug, Serialize)]
pub struct Tls {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Serialize)]
pub struct Net {
    pub max_connections: u64,
    pub max_connections_per_ip: u64,
    pub proxy_protocol: ProxyProtocol,
}

#[derive(Debug, Serialize)]
pub struct ProxyProtocol {
    pub enabled: bool,
    pub trusted_cidrs: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Log {
    pub level: String,
    pub format: String,
}

/// Pool size of the migration Job: it runs statements one at a time.
pub const MIGRATION_POOL_SIZE: u32 = 2;

fn port(l: Listener) -> u16 {
    // Container ports are the standard port + 10000 (≤ 10995): always in range.
    u16::try_from(l.container_port()).unwrap_or(0)
}

pub fn redis_key_prefix(mc: &MailCluster) -> String {
    mc.spec
        .redis
        .key_prefix
        .clone()
        .unwrap_or_else(|| format!("mc:{}:{}:", names::namespace(mc), names::cluster_name(mc)))
}

/// The config of one protocol's pods, or of the migration Job when `protocol` is None.
pub fn pod_config(mc: &MailCluster, protocol: Option<Protocol>) -> PodConfig {
    let spec = &mc.spec;
    let (protocols, max_conn, per_ip, pool) = match protocol {
        Some(p) => {
            let ps = spec.protocol(p);
            (
                p.listeners().iter().map(|l| l.name().to_string()).collect(),
                u64::from(ps.max_connections),
                u64::from(ps.max_connections_per_ip),
                spec.postgres.pool_size,
            )
        }
        None => (Vec::new(), 1, 0, MIGRATION_POOL_SIZE),
    };
    PodConfig {
        hostname: spec.hostname(),
        listen_addr: "0.0.0.0".into(),
        protocols,
        data_dir: names::DATA_DIR.into(),
        shutdown_grace_secs: u64::from(spec.shutdown_grace_seconds),
        ports: Ports {
            smtp: port(Listener::Smtp),
            submission: port(Listener::Submission),
            submissions: port(Listener::Submissions),
            imap: port(Listener::Imap),
            imaps: port(Listener::Imaps),
            pop3: port(Listener::Pop3),
            pop3s: port(Listener::Pop3s),
            admin: names::ADMIN_PORT as u16,
        },
        database: Database { pool_size: pool, migrate_on_start: false, startup_retry_secs: 120 },
        redis: Redis { pool_size: spec.redis.pool_size, key_prefix: redis_key_prefix(mc) },
        tls: spec.tls.as_ref().map(|_| Tls {
            cert: format!("{}/tls.crt", names::TLS_DIR),
            key: format!("{}/tls.key", names::TLS_DIR),
        }),
        net: Net {
            max_connections: max_conn,
            max_connections_per_ip: per_ip,
            proxy_protocol: ProxyProtocol {
                enabled: spec.proxy_protocol.enabled,
                trusted_cidrs: spec.proxy_protocol.trusted_cidrs.clone(),
            },
        },
        log: Log { level: spec.log_level.clone(), format: "json".into() },
    }
}

/// The TOML text of [`pod_config`].
pub fn render_toml(mc: &MailCluster, protocol: Option<Protocol>) -> Result<String, toml::ser::Error> {
    toml::to_string(&pod_config(mc, protocol))
}

/// ConfigMap key of a protocol's (or the migration Job's) config file.
pub fn config_key(protocol: Option<Protocol>) -> String {
    match protocol {
        Some(p) => format!("{}.toml", p.name()),
        None => "migrate.toml".into(),
    }
}
