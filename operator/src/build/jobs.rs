//! Jobs: the schema migration Job and the stress runs (CronJob + on-demand Job) with
//! the identity that lets a stress Job write its verdict into the resource's status.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, PodSpec, PodTemplateSpec, ServiceAccount, Volume,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mailcluster_api::stress::{EndpointSpec, StressSpec, TargetsSpec, TlsMode, UsersSpec};
use mailcluster_api::{ClusterStressSpec, Listener, MailCluster, Protocol};

use super::metadata;
use super::pod_config as config;
use super::workload::{
    config_map_volume, container_security_context, env, mount, pod_security_context, resources,
    scratch_mounts, scratch_volumes, secret_envs,
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

/// The pod of a Job: one container, never restarted in place (the Job retries).
fn job_pod(
    mc: &MailCluster,
    component: &str,
    service_account: String,
    container: Container,
    volumes: Vec<Volume>,
) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(names::selector_labels_for(mc, component)),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            service_account_name: Some(service_account),
            enable_service_links: Some(false),
            security_context: Some(pod_security_context()),
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        }),
    }
}

pub fn migration_job(mc: &MailCluster) -> Job {
    let key = config::config_key(None);
    let mut volumes = vec![config_map_volume("config", names::config_map(mc), &key)];
    volumes.extend(scratch_volumes());
    let mut mounts = vec![mount("config", CONFIG_DIR, true)];
    mounts.extend(scratch_mounts());
    let mut envs = vec![env("MAILCLUSTER_DATA_DIR", DATA_DIR)];
    envs.extend(secret_envs(mc));
    let container = Container {
        name: "migrate".into(),
        image: Some(mc.spec.image.reference()),
        args: Some(migration_args(mc, &format!("{CONFIG_DIR}/{key}"))),
        env: Some(envs),
        resources: Some(resources("50m", "64Mi", "256Mi")),
        security_context: Some(container_security_context()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut template = job_pod(mc, "migrate", names::cluster_name(mc).to_string(), container, volumes);
    if let Some(pod) = template.spec.as_mut() {
        pod.automount_service_account_token = Some(false);
    }
    Job {
        metadata: metadata(mc, &migration_job_name(mc), "migrate"),
        spec: Some(JobSpec {
            backoff_limit: Some(3),
            active_deadline_seconds: Some(1800),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn stress_service_account(mc: &MailCluster) -> ServiceAccount {
    ServiceAccount { metadata: metadata(mc, &names::stress(mc), "stress"), ..Default::default() }
}

/// The stress Job may read its MailCluster and patch its status — nothing else.
pub fn stress_role(mc: &MailCluster) -> Role {
    let name = names::cluster_name(mc).to_string();
    let rule = |resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![mailcluster_api::GROUP.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: Some(vec![name.clone()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    };
    Role {
        metadata: metadata(mc, &names::stress(mc), "stress"),
        rules: Some(vec![rule("mailclusters", &["get"]), rule("mailclusters/status", &["get", "patch"])]),
    }
}

pub fn stress_role_binding(mc: &MailCluster) -> RoleBinding {
    RoleBinding {
        metadata: metadata(mc, &names::stress(mc), "stress"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: names::stress(mc),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: names::stress(mc),
            namespace: Some(names::namespace(mc).to_string()),
            ..Default::default()
        }]),
    }
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
        // Given a count (and the default template, which names a domain no cluster
        // serves): that many of the cluster's own test accounts.
        (Some(u), _) if u.template == UsersSpec::default().template && u.file.is_none() => {
            UsersSpec { template: cluster_users(None).template, ..u.clone() }
        }
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

pub fn stress_config_map(mc: &MailCluster, stress: &ClusterStressSpec) -> ConfigMap {
    // A plan of strings and numbers always serializes.
    let yaml = serde_yaml_ng::to_string(&stress_plan(mc, stress)).unwrap_or_default();
    let text = match stress.profile {
        Some(p) => {
            format!("{}#\n# Profile {p}, with targets and test accounts of this cluster.\n{yaml}", p.header())
        }
        None => yaml,
    };
    ConfigMap {
        metadata: metadata(mc, &names::stress(mc), "stress"),
        data: Some(BTreeMap::from([("stress.yaml".to_string(), text)])),
        ..Default::default()
    }
}

fn stress_job_spec(mc: &MailCluster, stress: &ClusterStressSpec, image: &str) -> JobSpec {
    let mut envs = vec![env("MAILCLUSTER_DATA_DIR", DATA_DIR)];
    // The runner provisions its test accounts through the store (budgeted as the
    // stress reserve; `--provision-accounts`) and reports through the Kubernetes API.
    envs.extend(secret_envs(mc));
    let mut volumes = vec![Volume {
        name: "scenarios".into(),
        config_map: Some(ConfigMapVolumeSource { name: names::stress(mc), ..Default::default() }),
        ..Default::default()
    }];
    volumes.extend(scratch_volumes());
    let mut mounts = vec![mount("scenarios", CONFIG_DIR, true)];
    mounts.extend(scratch_mounts());
    let args = [
        "stress".to_string(),
        "--report-to".into(),
        format!("{}/{}", names::namespace(mc), names::cluster_name(mc)),
        "--scenario-file".into(),
        format!("{CONFIG_DIR}/stress.yaml"),
        // The test accounts get a password for this run only.
        "--provision-accounts".into(),
    ];
    let container = Container {
        name: "stress".into(),
        image: Some(image.into()),
        args: Some(args.to_vec()),
        env: Some(envs),
        resources: Some(stress.resources.clone().unwrap_or_else(|| resources("500m", "256Mi", "1Gi"))),
        security_context: Some(container_security_context()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    JobSpec {
        // One attempt: a retried load test measures a different situation and would
        // report twice; a failed run is a verdict, not a glitch.
        backoff_limit: Some(0),
        active_deadline_seconds: Some(stress.deadline_seconds),
        template: job_pod(mc, "stress", names::stress(mc), container, volumes),
        ..Default::default()
    }
}

pub fn stress_cron_job(mc: &MailCluster, stress: &ClusterStressSpec, schedule: &str, image: &str) -> CronJob {
    CronJob {
        metadata: metadata(mc, &names::stress(mc), "stress"),
        spec: Some(CronJobSpec {
            schedule: schedule.into(),
            // Two overlapping load tests measure each other.
            concurrency_policy: Some("Forbid".into()),
            starting_deadline_seconds: Some(300),
            successful_jobs_history_limit: Some(3),
            failed_jobs_history_limit: Some(3),
            job_template: JobTemplateSpec {
                // Not the managed-by/cluster labels: the Jobs this template spawns belong
                // to the CronJob, and orphan deletion must never list them.
                metadata: Some(ObjectMeta {
                    labels: Some(names::selector_labels_for(mc, "stress")),
                    ..Default::default()
                }),
                spec: Some(stress_job_spec(mc, stress, image)),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// On-demand run for annotation value `token`. It stays (and is not re-run) while the
/// annotation keeps that value; a new value is a new Job, and the old one is deleted.
pub fn stress_job(mc: &MailCluster, stress: &ClusterStressSpec, token: &str, image: &str) -> Job {
    let name = format!("{}-{}", names::stress(mc), names::short_hash(&[token]));
    let mut meta = metadata(mc, &name, "stress");
    meta.annotations =
        Some(BTreeMap::from([(mailcluster_api::RUN_STRESS_ANNOTATION.to_string(), token.to_string())]));
    Job { metadata: meta, spec: Some(stress_job_spec(mc, stress, image)), ..Default::default() }
}
