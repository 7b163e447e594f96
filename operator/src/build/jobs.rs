//! Jobs: the schema migration Job and the stress runs (CronJob + on-demand Job) with
//! the identity that lets a stress Job write its verdict into the resource's status.

use mailcluster_api::stress::{EndpointSpec, StressSpec, TargetsSpec, TlsMode, UsersSpec};
use mailcluster_api::{ClusterStressSpec, Listener, MailCluster, Protocol};
use serde_json::{Value, json};

use super::metadata;
use super::pod_config as config;
use super::workload::{
    container_security_context, pod_security_context, scratch_mounts, scratch_volumes, secret_envs,
};
use crate::names::{self, CONFIG_DIR, DATA_DIR};

/// The migration Job is named after what its pod template is made of (image,
/// database secret reference, domains): a Job's template is immutable, so a new
/// image or a domain added to the spec gets a new Job, and the same template never
/// runs twice.
pub fn migration_job_name(mc: &MailCluster) -> String {
    let r = &mc.spec.postgres.url_secret_ref;
    let image = mc.spec.image.reference();
    let mut parts = vec![image.as_str(), r.name.as_str(), r.key.as_str()];
    parts.extend(mc.spec.domains.iter().map(String::as_str));
    format!("{}-migrate-{}", names::cluster_name(mc), names::short_hash(&parts))
}

/// `migrate` and the domains to serve: the store learns `spec.domains` here, so a
/// fresh install accepts mail for them without a `domain add` by hand. Domains
/// removed from the spec stay (mail may still be in their mailboxes).
fn migration_args(mc: &MailCluster, config_file: &str) -> Vec<String> {
    let mut args = vec!["migrate".to_string(), "--config".into(), config_file.into()];
    for d in &mc.spec.domains {
        args.push("--domain".into());
        args.push(d.clone());
    }
    args
}

pub fn migration_job(mc: &MailCluster) -> Value {
    let image = mc.spec.image.reference();
    let key = config::config_key(None);
    let mut volumes = vec![json!({
        "name": "config",
        "configMap": {"name": names::config_map(mc), "items": [{"key": key, "path": key}]},
    })];
    volumes.extend(scratch_volumes());
    let mut mounts = vec![json!({"name": "config", "mountPath": CONFIG_DIR, "readOnly": true})];
    mounts.extend(scratch_mounts());
    let mut env = vec![json!({"name": "MAILCLUSTER_DATA_DIR", "value": DATA_DIR})];
    env.extend(secret_envs(mc));
    json!({
        "metadata": metadata(mc, &migration_job_name(mc), "migrate"),
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": 1800,
            "template": {
                "metadata": {"labels": names::selector_labels_for(mc, "migrate")},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": names::cluster_name(mc),
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": pod_security_context(),
                    "containers": [{
                        "name": "migrate",
                        "image": image,
                        "args": migration_args(mc, &format!("{CONFIG_DIR}/{key}")),
                        "env": env,
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                        "securityContext": container_security_context(),
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    })
}

pub fn stress_service_account(mc: &MailCluster) -> Value {
    json!({"metadata": metadata(mc, &names::stress(mc), "stress")})
}

/// The stress Job may read its MailCluster and patch its status — nothing else.
pub fn stress_role(mc: &MailCluster) -> Value {
    let name = names::cluster_name(mc);
    json!({
        "metadata": metadata(mc, &names::stress(mc), "stress"),
        "rules": [
            {"apiGroups": [mailcluster_api::GROUP], "resources": ["mailclusters"], "resourceNames": [name], "verbs": ["get"]},
            {"apiGroups": [mailcluster_api::GROUP], "resources": ["mailclusters/status"], "resourceNames": [name], "verbs": ["get", "patch"]},
        ],
    })
}

pub fn stress_role_binding(mc: &MailCluster) -> Value {
    json!({
        "metadata": metadata(mc, &names::stress(mc), "stress"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names::stress(mc)},
        "subjects": [{"kind": "ServiceAccount", "name": names::stress(mc), "namespace": names::namespace(mc)}],
    })
}

/// The scenario file of a stress run, in the stress runner's own format, with the
/// targets pointed at this cluster's Services.
///
/// A profile (`spec.stress.profile`) is resolved here, into this file, rather than
/// passed to the Job as `--profile NAME`: the Job runs the cluster's image, which may
/// be older than the operator and not know the name, whereas every image reads a
/// scenario file; the targets depend on the profile (which ports, which TLS) and only
/// the operator knows the Services; and the mounted ConfigMap shows exactly what runs,
/// with the profile's comment on where its figures come from.
pub fn stress_plan(mc: &MailCluster, stress: &ClusterStressSpec) -> StressSpec {
    // Every shipped profile parses (api's tests); an empty base would still run the
    // runner's defaults rather than nothing.
    let base = stress.profile.and_then(|p| p.spec().ok()).unwrap_or_default();
    let wanted = base.targets.clone().unwrap_or_default();
    let ns = names::namespace(mc);
    let endpoint = |p: Protocol, l: Listener, tls: TlsMode| {
        mc.spec.protocol(p).enabled.then(|| {
            let svc = &mc.spec.protocol(p).service;
            let port = svc.ports.iter().find(|o| o.name == l).map_or(l.standard_port(), |o| o.port);
            EndpointSpec {
                address: format!("{}.{ns}.svc:{port}", names::protocol_object(mc, p)),
                tls,
                // The load test measures capacity, not PKI: the certificate may come
                // from a private issuer the runner's image does not trust.
                verify: false,
                server_name: Some(mc.spec.hostname()),
            }
        })
    };
    // STARTTLS on the standard ports unless the profile asks for implicit TLS:
    // credentials never cross in the clear, and the listeners real clients use are
    // measured.
    let pick = |p: Protocol, want: &Option<EndpointSpec>, starttls: Listener, implicit: Listener| {
        if want.as_ref().is_some_and(|e| e.tls == TlsMode::Implicit) {
            endpoint(p, implicit, TlsMode::Implicit)
        } else {
            endpoint(p, starttls, TlsMode::Starttls)
        }
    };
    let domain = mc.spec.domains.first().cloned().unwrap_or_else(|| "example.test".into());
    let cluster_users = |count: Option<u32>| {
        let mut u = UsersSpec { template: format!("stress{{:04}}@{domain}"), ..Default::default() };
        if let Some(c) = count {
            u.count = c;
        }
        u
    };
    let users = match (&stress.users, &base.users) {
        (Some(u), _) => u.clone(),
        // The profile's load is sized for its number of users; the names are the
        // cluster's own test accounts.
        (None, Some(u)) => cluster_users(Some(u.count)),
        (None, None) => cluster_users(None),
    };
    let scenarios = if stress.scenarios.is_empty() { base.scenarios } else { stress.scenarios.clone() };
    let mut slo = base.slo;
    let own = &stress.slo;
    slo.success_rate = own.success_rate.or(slo.success_rate);
    slo.smtp_p95_ms = own.smtp_p95_ms.or(slo.smtp_p95_ms);
    slo.imap_fetch_p95_ms = own.imap_fetch_p95_ms.or(slo.imap_fetch_p95_ms);
    slo.thresholds.extend(own.thresholds.iter().cloned());
    StressSpec {
        schedule: None,
        targets: Some(TargetsSpec {
            smtp: endpoint(Protocol::Smtp, Listener::Smtp, TlsMode::Starttls),
            submission: endpoint(Protocol::Submission, Listener::Submission, TlsMode::Starttls),
            submissions: endpoint(Protocol::Submission, Listener::Submissions, TlsMode::Implicit),
            imap: pick(Protocol::Imap, &wanted.imap, Listener::Imap, Listener::Imaps),
            pop3: pick(Protocol::Pop3, &wanted.pop3, Listener::Pop3, Listener::Pop3s),
        }),
        users: Some(users),
        scenarios,
        slo,
    }
}

pub fn stress_config_map(mc: &MailCluster, stress: &ClusterStressSpec) -> Value {
    // A plan of strings and numbers always serializes.
    let yaml = serde_yaml_ng::to_string(&stress_plan(mc, stress)).unwrap_or_default();
    let text = match stress.profile {
        Some(p) => {
            format!("{}#\n# Profile {p}, with targets and test accounts of this cluster.\n{yaml}", p.header())
        }
        None => yaml,
    };
    json!({
        "metadata": metadata(mc, &names::stress(mc), "stress"),
        "data": {"stress.yaml": text},
    })
}

fn stress_job_spec(mc: &MailCluster, stress: &ClusterStressSpec, image: &str) -> Value {
    let mut env = vec![json!({"name": "MAILCLUSTER_DATA_DIR", "value": DATA_DIR})];
    // The runner provisions its test accounts through the store (budgeted as the
    // stress reserve; `--provision-accounts`) and reports through the Kubernetes API.
    env.extend(secret_envs(mc));
    let mut volumes = vec![json!({"name": "scenarios", "configMap": {"name": names::stress(mc)}})];
    volumes.extend(scratch_volumes());
    let mut mounts = vec![json!({"name": "scenarios", "mountPath": CONFIG_DIR, "readOnly": true})];
    mounts.extend(scratch_mounts());
    json!({
        // One attempt: a retried load test measures a different situation and would
        // report twice; a failed run is a verdict, not a glitch.
        "backoffLimit": 0,
        "activeDeadlineSeconds": stress.deadline_seconds,
        "template": {
            "metadata": {"labels": names::selector_labels_for(mc, "stress")},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": names::stress(mc),
                "enableServiceLinks": false,
                "securityContext": pod_security_context(),
                "containers": [{
                    "name": "stress",
                    "image": image,
                    "args": [
                        "stress",
                        "--report-to", format!("{}/{}", names::namespace(mc), names::cluster_name(mc)),
                        "--scenario-file", format!("{CONFIG_DIR}/stress.yaml"),
                        // The test accounts get a password for this run only.
                        "--provision-accounts",
                    ],
                    "env": env,
                    "resources": stress.resources.as_ref().map_or_else(
                        || json!({"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}),
                        |r| json!(r),
                    ),
                    "securityContext": container_security_context(),
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        },
    })
}

pub fn stress_cron_job(mc: &MailCluster, stress: &ClusterStressSpec, schedule: &str, image: &str) -> Value {
    json!({
        "metadata": metadata(mc, &names::stress(mc), "stress"),
        "spec": {
            "schedule": schedule,
            // Two overlapping load tests measure each other.
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 300,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                // Not the managed-by/cluster labels: the Jobs this template spawns belong
                // to the CronJob, and orphan deletion must never list them.
                "metadata": {"labels": names::selector_labels_for(mc, "stress")},
                "spec": stress_job_spec(mc, stress, image),
            },
        },
    })
}

/// On-demand run for annotation value `token`. It stays (and is not re-run) while the
/// annotation keeps that value; a new value is a new Job, and the old one is deleted.
pub fn stress_job(mc: &MailCluster, stress: &ClusterStressSpec, token: &str, image: &str) -> Value {
    let name = format!("{}-{}", names::stress(mc), names::short_hash(&[token]));
    let mut meta = metadata(mc, &name, "stress");
    meta["annotations"] = json!({mailcluster_api::RUN_STRESS_ANNOTATION: token});
    json!({"metadata": meta, "spec": stress_job_spec(mc, stress, image)})
}
