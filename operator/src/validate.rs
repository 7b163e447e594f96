//! Validation of a `MailCluster` spec before anything is built.
//!
//! Mirrors the CRD's CEL rules (an apiserver with an older CRD, or none at all in
//! `render`, must not let a bad spec through) and adds what CEL cannot express simply:
//! effective ports after defaults, listener names per protocol, CIDR syntax, metric
//! targets. Every problem is collected, not just the first, so one status message
//! tells the user everything to fix.

use std::collections::BTreeSet;
use std::net::IpAddr;

use mailcluster_api::{AutoscalingSpec, Listener, MailCluster, TuningSpec};

use crate::names;

/// The spec cannot be built. Shown in the Degraded condition; the reconciler waits
/// for a change of the resource instead of retrying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MailCluster: {}", problems.join("; "))]
pub struct ValidationError {
    pub problems: Vec<String>,
}

impl ValidationError {
    pub fn one(p: impl Into<String>) -> Self {
        ValidationError { problems: vec![p.into()] }
    }
}

/// Equivalent of the CEL rule on `AutoscalingSpec`.
pub fn autoscaling_min_le_max(a: &AutoscalingSpec) -> bool {
    a.min_replicas <= a.max_replicas
}

/// Equivalent of the CEL rule on `SloSpec.successRate`.
pub fn success_rate_in_range(rate: f64) -> bool {
    (0.0..=100.0).contains(&rate)
}

fn valid_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

pub fn valid_cidr(s: &str) -> bool {
    let Some((addr, len)) = s.split_once('/') else { return false };
    let Ok(addr) = addr.parse::<IpAddr>() else { return false };
    let Ok(len) = len.parse::<u8>() else { return false };
    len <= if addr.is_ipv4() { 32 } else { 128 }
}

/// A 5-field cron expression (what CronJob accepts besides `@hourly`-style macros).
fn valid_schedule(s: &str) -> bool {
    let s = s.trim();
    if s.starts_with('@') {
        return ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]
            .contains(&s);
    }
    let fields: Vec<&str> = s.split_whitespace().collect();
    fields.len() == 5
        && fields.iter().all(|f| f.bytes().all(|b| b.is_ascii_alphanumeric() || b"*/,-?".contains(&b)))
}

pub fn validate(mc: &MailCluster) -> Result<(), ValidationError> {
    let spec = &mc.spec;
    let mut p = Vec::new();

    let name = names::cluster_name(mc);
    if name.is_empty() {
        p.push("metadata.name is required".to_string());
    } else if name.len() > names::MAX_NAME_LEN {
        p.push(format!("metadata.name must be at most {} characters", names::MAX_NAME_LEN));
    }
    if spec.image.tag.is_empty() {
        p.push("image.tag is required".into());
    }
    if spec.domains.is_empty() {
        p.push("at least one domain is required".into());
    }
    let mut seen = BTreeSet::new();
    for d in &spec.domains {
        if !valid_dns_name(d) {
            p.push(format!("domain {d:?} is not a valid DNS name"));
        }
        if !seen.insert(d.to_ascii_lowercase()) {
            p.push(format!("domain {d:?} is listed twice"));
        }
    }
    if spec.enabled_protocols().is_empty() {
        p.push("at least one of smtp, submission, imap, pop3 must be enabled".into());
    }

    for proto in spec.enabled_protocols() {
        let ps = spec.protocol(proto);
        let mut ports = BTreeSet::new();
        let mut names_seen = BTreeSet::new();
        for o in &ps.service.ports {
            if !proto.listeners().contains(&o.name) {
                p.push(format!(
                    "{}.service.ports: {} is not a listener of {}",
                    proto.name(),
                    o.name.name(),
                    proto.name()
                ));
            }
            if !names_seen.insert(o.name) {
                p.push(format!("{}.service.ports: {} listed twice", proto.name(), o.name.name()));
            }
        }
        for l in proto.listeners() {
            let port = ps.service.ports.iter().find(|o| o.name == *l).map_or(l.standard_port(), |o| o.port);
            if !(1..=65535).contains(&port) {
                p.push(format!("{}.service.ports: {port} out of range", proto.name()));
            }
            if !ports.insert(port) {
                p.push(format!("{}.service.ports: port {port} used twice", proto.name()));
            }
        }
        let a = spec.autoscaling_for(proto);
        if a.enabled {
            if !autoscaling_min_le_max(a) {
                p.push(format!(
                    "{}: autoscaling.minReplicas ({}) exceeds maxReplicas ({})",
                    proto.name(),
                    a.min_replicas,
                    a.max_replicas
                ));
            }
            if a.min_replicas < 1 {
                p.push(format!("{}: autoscaling.minReplicas must be at least 1", proto.name()));
            }
            if a.cpu_target().is_none()
                && a.pool_saturation_target().is_none()
                && a.connections_per_pod.is_none()
            {
                p.push(format!("{}: autoscaling needs at least one target metric", proto.name()));
            }
            // A CPU utilisation target is a percentage of the CPU request: without a
            // request the HPA cannot compute it and never scales.
            if a.cpu_target().is_some()
                && let Some(r) = &ps.resources
                && !r.requests.as_ref().is_some_and(|q| q.contains_key("cpu"))
            {
                p.push(format!(
                    "{}: resources.requests.cpu is required for a cpuUtilization target",
                    proto.name()
                ));
            }
        } else if ps.replicas.is_some_and(|r| r < 0) {
            p.push(format!("{}: replicas must not be negative", proto.name()));
        }
    }

    if let Some(tls) = &spec.tls
        && tls.secret_name.is_some() == tls.issuer_ref.is_some()
    {
        p.push("tls: set exactly one of secretName or issuerRef".into());
    }
    if spec.postgres.pool_size > spec.postgres.max_connections {
        p.push("postgres.poolSize must not exceed postgres.maxConnections".into());
    }
    if spec.proxy_protocol.enabled && spec.proxy_protocol.trusted_cidrs.is_empty() {
        p.push("proxyProtocol.trustedCidrs is required when enabled".into());
    }
    for c in &spec.proxy_protocol.trusted_cidrs {
        if !valid_cidr(c) {
            p.push(format!("proxyProtocol.trustedCidrs: {c:?} is not a CIDR"));
        }
    }
    if let Some(stress) = &spec.stress {
        if stress.slo.success_rate.is_some_and(|r| !success_rate_in_range(r)) {
            p.push("stress.slo.successRate must be within 0..100".into());
        }
        if let Some(s) = &stress.schedule
            && !valid_schedule(s)
        {
            p.push(format!("stress.schedule {s:?} is not a cron schedule"));
        }
        let mut seen = BTreeSet::new();
        for s in &stress.scenarios {
            if let Some(name) = &s.name
                && !seen.insert(name)
            {
                p.push(format!("stress.scenarios: name {name:?} used twice"));
            }
        }
    }

    if let Some(tuning) = &spec.tuning {
        p.extend(tuning_problems(tuning));
    }

    if let Some(r) = spec.filter.as_ref().and_then(|f| f.rspamd.as_ref()) {
        if r.url.is_some() == r.deploy.is_some() {
            p.push("set exactly one of filter.rspamd.url or filter.rspamd.deploy".into());
        }
        if r.deploy.is_some() && r.password_secret_ref.is_some() {
            p.push("filter.rspamd.deploy makes its own password: leave passwordSecretRef unset".into());
        }
        if let Some(d) = &r.deploy
            && d.image.trim().is_empty()
        {
            p.push("filter.rspamd.deploy.image is required".into());
        }
    }

    if p.is_empty() { Ok(()) } else { Err(ValidationError { problems: p }) }
}

/// The whitespace-separated numbers of a sysctl list value, when it is `count` of them.
fn sysctl_numbers(value: &str, count: usize) -> Option<Vec<u64>> {
    let numbers: Vec<u64> = value.split_whitespace().map(|n| n.parse().ok()).collect::<Option<_>>()?;
    (numbers.len() == count).then_some(numbers)
}

/// Values the kernel would refuse, or that would break the pods, in `spec.tuning`.
/// A sysctl the kernel refuses does not fail the pod cleanly: its sandbox is never
/// created and it waits in ContainerCreating, so the operator refuses the spec instead.
pub fn tuning_problems(t: &TuningSpec) -> Vec<String> {
    let mut p = Vec::new();
    // The CRD's ranges, for a CRD installed from an older version.
    for (field, value, max) in [
        ("tcpKeepaliveTime", t.tcp_keepalive_time, 32767),
        ("tcpKeepaliveIntvl", t.tcp_keepalive_intvl, 32767),
        ("tcpKeepaliveProbes", t.tcp_keepalive_probes, 127),
        ("tcpFinTimeout", t.tcp_fin_timeout, 600),
        ("somaxconn", t.somaxconn, 65535),
    ] {
        if let Some(v) = value
            && !(1..=max).contains(&v)
        {
            p.push(format!("tuning.{field} must be within 1..{max} (got {v})"));
        }
    }
    if let Some(range) = &t.ip_local_port_range {
        match sysctl_numbers(range, 2).as_deref() {
            Some(&[low, high]) if (1024..=65535).contains(&low) && (low..=65535).contains(&high) => {
                // An outgoing connection that takes a listening port before the
                // listener binds it keeps the pod from starting.
                let listening = Listener::ALL
                    .iter()
                    .map(|l| l.container_port())
                    .chain([names::ADMIN_PORT, names::GROUP_COMMIT_PORT])
                    .filter(|port| (low..=high).contains(&(*port as u64)))
                    .map(|port| port.to_string())
                    .collect::<Vec<_>>();
                if !listening.is_empty() {
                    p.push(format!(
                        "tuning.ipLocalPortRange {range:?} contains ports the pods listen on: {}",
                        listening.join(", ")
                    ));
                }
            }
            _ => p.push(format!(
                "tuning.ipLocalPortRange {range:?} must be \"LOW HIGH\" with 1024 <= LOW <= HIGH <= 65535"
            )),
        }
    }
    for (field, value) in [("tcpRmem", &t.tcp_rmem), ("tcpWmem", &t.tcp_wmem)] {
        let Some(value) = value else { continue };
        match sysctl_numbers(value, 3).as_deref() {
            Some(&[min, default, max]) if 1 <= min && min <= default && default <= max && max <= i32::MAX as u64 => {}
            _ => p.push(format!(
                "tuning.{field} {value:?} must be \"MIN DEFAULT MAX\" bytes with 1 <= MIN <= DEFAULT <= MAX <= {}",
                i32::MAX
            )),
        }
    }
    p
}
