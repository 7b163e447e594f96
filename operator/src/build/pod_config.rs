//! The configuration file of each protocol's pods (and of the migration Job): the
//! server's own `Config` (`mailcluster_api::config`), filled in from the MailCluster.
//!
//! Only settings that differ from the defaults are written: the ConfigMap shows what
//! this cluster changes, and an image keeps its own defaults for everything else.
//! Secrets (database and Redis URLs) never go into the ConfigMap: the pods get them
//! from Secrets through `secretKeyRef` environment.

use std::net::IpAddr;
use std::path::PathBuf;

use mailcluster_api::config::{Config, FailMode};
use mailcluster_api::{MailCluster, Protocol, RspamdFailMode, RspamdSpec};

use crate::names;

/// Pool size of the migration Job: it runs statements one at a time.
pub const MIGRATION_POOL_SIZE: u32 = 2;

pub fn redis_key_prefix(mc: &MailCluster) -> String {
    mc.spec
        .redis
        .key_prefix
        .clone()
        .unwrap_or_else(|| format!("mc:{}:{}:", names::namespace(mc), names::cluster_name(mc)))
}

/// The config of one protocol's pods, or of the migration Job when `protocol` is None.
pub fn pod_config(mc: &MailCluster, protocol: Option<Protocol>) -> Config {
    let spec = &mc.spec;
    let mut c = Config::default();
    match protocol {
        Some(p) => {
            let ps = spec.protocol(p);
            c.protocols = p.listeners().to_vec();
            c.net.max_connections = ps.max_connections as usize;
            c.net.max_connections_per_ip = ps.max_connections_per_ip as usize;
            c.database.pool_size = spec.postgres.pool_size;
            if names::groups_commits(mc, p) {
                // Batches formed across the Deployment's pods: fewer, larger
                // transactions as it scales out (server delivery/forward/).
                c.smtp.group_commit_port = names::GROUP_COMMIT_PORT as u16;
                c.smtp.group_commit_leader = format!(
                    "{}.{}.svc:{}",
                    names::group_commit_service(mc, p),
                    names::namespace(mc),
                    names::GROUP_COMMIT_PORT
                );
            }
        }
        None => {
            // The Job serves nothing; its pool only runs the migration.
            c.net.max_connections = 1;
            c.database.pool_size = MIGRATION_POOL_SIZE;
        }
    }
    c.hostname = spec.hostname();
    // Pods are reached through their Services on every interface of the pod.
    c.listen_addr = IpAddr::from([0, 0, 0, 0]);
    c.data_dir = PathBuf::from(names::DATA_DIR);
    c.shutdown_grace_secs = u64::from(spec.shutdown_grace_seconds);
    // The migration Job owns schema changes; pods never race each other migrating.
    c.database.migrate_on_start = false;
    // Pods wait for PostgreSQL instead of crash-looping while it restarts.
    c.database.startup_retry_secs = 120;
    c.redis.pool_size = spec.redis.pool_size;
    c.redis.key_prefix = redis_key_prefix(mc);
    if spec.tls.is_some() {
        c.tls.cert = Some(PathBuf::from(format!("{}/tls.crt", names::TLS_DIR)));
        c.tls.key = Some(PathBuf::from(format!("{}/tls.key", names::TLS_DIR)));
    }
    // The listeners set keepalive on each client socket, which wins over the
    // pod's sysctls: they follow the cluster's tuning so that it reaches the
    // connections it is for.
    if let Some(t) = &spec.tuning {
        if let Some(idle) = t.tcp_keepalive_time {
            c.net.tcp_keepalive_secs = u64::from(idle);
        }
        if let Some(interval) = t.tcp_keepalive_intvl {
            c.net.tcp_keepalive_interval_secs = u64::from(interval);
        }
    }
    c.net.proxy_protocol.enabled = spec.proxy_protocol.enabled;
    // `validate` refused the spec unless every entry is a CIDR.
    c.net.proxy_protocol.trusted_cidrs =
        spec.proxy_protocol.trusted_cidrs.iter().filter_map(|s| s.parse().ok()).collect();
    // Only the pods that send mail sign it (and have the keys mounted).
    let sends = matches!(protocol, Some(Protocol::Smtp | Protocol::Submission));
    for key in spec.dkim.iter().filter(|_| sends) {
        c.dkim.keys.push(mailcluster_api::config::DkimKey {
            domain: key.domain.clone(),
            selector: key.selector.clone(),
            key_file: names::dkim_key_path(&key.domain),
            algorithm: key.algorithm.name().into(),
        });
    }
    if let Some(relay) = &spec.relay {
        c.relay.smarthost = relay.smarthost.clone();
    }
    if let Some(r) = rspamd_of(mc, protocol) {
        c.filter.rspamd.url = rspamd_url(mc, r);
        c.filter.rspamd.timeout_ms = u64::from(r.timeout_ms);
        c.filter.rspamd.scan_submission = r.scan_submission;
        c.filter.rspamd.fail_mode = match r.fail_mode {
            RspamdFailMode::Open => FailMode::Open,
            RspamdFailMode::Closed => FailMode::Closed,
        };
    }
    c.log.level = spec.log_level.clone();
    c.log.format = "json".into();
    c
}

/// The cluster's rspamd, for the pods that talk to it: smtp and submission
/// scan what they accept, imap teaches it what users file into or out of Junk.
pub(crate) fn rspamd_of(mc: &MailCluster, protocol: Option<Protocol>) -> Option<&RspamdSpec> {
    let talks = matches!(protocol, Some(Protocol::Smtp | Protocol::Submission | Protocol::Imap));
    mc.spec.filter.as_ref().and_then(|f| f.rspamd.as_ref()).filter(|_| talks)
}

/// Where the pods find rspamd: the URL given, or the operator's rspamd.
pub(crate) fn rspamd_url(mc: &MailCluster, r: &RspamdSpec) -> String {
    r.url.clone().unwrap_or_else(|| names::rspamd_url(mc))
}

/// The TOML text of [`pod_config`], without the settings left at their defaults.
pub fn render_toml(mc: &MailCluster, protocol: Option<Protocol>) -> Result<String, toml::ser::Error> {
    let config = toml::Table::try_from(pod_config(mc, protocol))?;
    let defaults = toml::Table::try_from(Config::default())?;
    toml::to_string(&changed(config, &defaults))
}

/// The entries of `table` that differ from `defaults`, sections kept only when
/// something in them changed.
fn changed(table: toml::Table, defaults: &toml::Table) -> toml::Table {
    table
        .into_iter()
        .filter_map(|(key, value)| match (value, defaults.get(&key)) {
            (toml::Value::Table(t), Some(toml::Value::Table(d))) => {
                let t = changed(t, d);
                (!t.is_empty()).then_some((key, toml::Value::Table(t)))
            }
            (v, Some(d)) if v == *d => None,
            (v, _) => Some((key, v)),
        })
        .collect()
}

/// ConfigMap key of a protocol's (or the migration Job's) config file.
pub fn config_key(protocol: Option<Protocol>) -> String {
    match protocol {
        Some(p) => format!("{}.toml", p.name()),
        None => "migrate.toml".into(),
    }
}
