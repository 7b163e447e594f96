//! The pure build step: `MailCluster` + what was observed → every object to apply.
//!
//! No client, no clock, no randomness: the same input gives byte-identical objects,
//! which is what makes server-side apply a no-op when nothing changed and lets the
//! tests compare objects field by field. Objects are typed k8s-openapi structs, so a
//! misspelt field does not compile; the two kinds of optional CRDs are JSON. A test
//! validates every object against the Kubernetes OpenAPI schemas (strict: unknown
//! fields fail).

mod jobs;
pub mod pod_config;
pub mod rspamd;
mod workload;

use mailcluster_api::{MailCluster, RUN_STRESS_ANNOTATION, Scaler};
use serde::Serialize;
use serde_json::Value;

use crate::budget::{self, Budget};
use crate::children::{Child, ChildKind};
use crate::names::{self, metadata};
use crate::validate::{self, ValidationError};

pub use jobs::migration_job_name;
pub use workload::pod_sysctls;

/// What the reconciler observed in the cluster, as far as building depends on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildContext {
    /// The image whose schema migration Job has completed. Deployments run it; a
    /// newer `spec.image` waits until its own migration Job has succeeded.
    pub migrated_image: Option<String>,
    /// cert-manager's Certificate CRD is installed.
    pub has_cert_manager: bool,
    /// Prometheus operator's ServiceMonitor CRD is installed.
    pub has_service_monitor: bool,
}

impl BuildContext {
    /// The context of `render`: migrations done, optional CRDs present, so the output
    /// shows the steady state of everything the spec asks for.
    pub fn steady_state(mc: &MailCluster) -> Self {
        BuildContext {
            migrated_image: Some(mc.spec.image.reference()),
            has_cert_manager: true,
            has_service_monitor: true,
        }
    }
}

/// Where the rollout stands with respect to the schema migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// Deployments run the spec's image.
    Current,
    /// Deployments stay on `running` until the migration Job for `wanted` completes.
    HeldForMigration { running: String, wanted: String },
    /// First install: no Deployments until the first migration completes.
    AwaitingFirstMigration { wanted: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    /// In apply order.
    pub children: Vec<Child>,
    pub budget: Budget,
    pub rollout: Rollout,
    pub migration_job: String,
    /// Things worth a Warning condition/event that do not stop the build.
    pub warnings: Vec<String>,
}

impl Built {
    pub fn get(&self, kind: ChildKind, name: &str) -> Option<&Child> {
        self.children.iter().find(|c| c.kind == kind && c.name() == name)
    }

    pub fn of_kind(&self, kind: ChildKind) -> impl Iterator<Item = &Child> {
        self.children.iter().filter(move |c| c.kind == kind)
    }
}

/// The on-demand stress token, if the annotation asks for a run.
pub fn stress_token(mc: &MailCluster) -> Option<&str> {
    mc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RUN_STRESS_ANNOTATION))
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
}

/// A built object as JSON, for the one apply path of every kind.
fn value<T: Serialize>(object: &T) -> Value {
    // k8s-openapi structs and JSON values always serialize.
    serde_json::to_value(object).unwrap_or_default()
}

pub fn build(mc: &MailCluster, ctx: &BuildContext) -> Result<Built, ValidationError> {
    validate::validate(mc)?;
    let token = stress_token(mc);
    let stress_enabled = mc.spec.stress.is_some() || token.is_some();
    let budget = budget::plan(mc, stress_enabled)?;
    let mut warnings = Vec::new();

    let wanted = mc.spec.image.reference();
    let rollout = match &ctx.migrated_image {
        Some(img) if *img == wanted => Rollout::Current,
        Some(img) => Rollout::HeldForMigration { running: img.clone(), wanted: wanted.clone() },
        None => Rollout::AwaitingFirstMigration { wanted: wanted.clone() },
    };
    let running_image = match &rollout {
        Rollout::Current => Some(wanted.as_str()),
        Rollout::HeldForMigration { running, .. } => Some(running.as_str()),
        Rollout::AwaitingFirstMigration { .. } => None,
    };

    let mut out: Vec<(ChildKind, Value)> = Vec::new();
    let config_map = workload::config_map(mc);
    out.push((ChildKind::ServiceAccount, value(&workload::service_account(mc))));
    out.push((ChildKind::ConfigMap, value(&config_map)));
    out.push((ChildKind::Service, value(&workload::metrics_service(mc))));
    out.push((ChildKind::Job, value(&jobs::migration_job(mc))));

    for p in mc.spec.enabled_protocols() {
        out.push((ChildKind::Service, value(&workload::service(mc, p))));
        if names::groups_commits(mc, p) {
            out.push((ChildKind::Service, value(&workload::group_commit_service(mc, p))));
        }
        let Some(image) = running_image else { continue };
        let pb = &budget.protocols[&p];
        out.push((ChildKind::Deployment, value(&workload::deployment(mc, p, image, &config_map, pb))));
        // An external scaler owns replicas: no HPA of ours may target the same Deployment
        // (two HPAs on one target both stop scaling).
        if pb.autoscaled && mc.spec.autoscaling_for(p).scaler == Scaler::HorizontalPodAutoscaler {
            out.push((ChildKind::HorizontalPodAutoscaler, value(&workload::hpa(mc, p, pb))));
        }
        out.push((ChildKind::PodDisruptionBudget, value(&workload::pdb(mc, p))));
    }
    if mc.spec.network_policy.enabled {
        out.push((ChildKind::NetworkPolicy, value(&workload::network_policy(mc))));
    }
    if let Some(d) = mc.spec.rspamd_deploy() {
        let config_map = rspamd::config_map(mc, d);
        out.push((ChildKind::Deployment, value(&rspamd::deployment(mc, d, &config_map))));
        out.push((ChildKind::ConfigMap, value(&config_map)));
        out.push((ChildKind::Service, value(&rspamd::rspamd_service(mc))));
        out.push((ChildKind::Deployment, value(&rspamd::redis_deployment(mc, d))));
        out.push((ChildKind::Service, value(&rspamd::redis_service(mc))));
        if mc.spec.network_policy.enabled {
            out.push((ChildKind::NetworkPolicy, value(&rspamd::rspamd_network_policy(mc))));
            out.push((ChildKind::NetworkPolicy, value(&rspamd::redis_network_policy(mc))));
        }
    }

    if stress_enabled {
        let stress = mc.spec.stress.clone().unwrap_or_default();
        out.push((ChildKind::ServiceAccount, value(&jobs::stress_service_account(mc))));
        out.push((ChildKind::Role, value(&jobs::stress_role(mc))));
        out.push((ChildKind::RoleBinding, value(&jobs::stress_role_binding(mc))));
        out.push((ChildKind::ConfigMap, value(&jobs::stress_config_map(mc, &stress))));
        // The stress Job tests the pods; it runs the image the pods run.
        let image = running_image.unwrap_or(&wanted);
        if let Some(schedule) = &stress.schedule {
            out.push((ChildKind::CronJob, value(&jobs::stress_cron_job(mc, &stress, schedule, image))));
        }
        if let Some(token) = token {
            out.push((ChildKind::Job, value(&jobs::stress_job(mc, &stress, token, image))));
        }
    }

    if let Some(tls) = &mc.spec.tls
        && let Some(issuer) = &tls.issuer_ref
    {
        if ctx.has_cert_manager {
            out.push((ChildKind::Certificate, value(&workload::certificate(mc, tls, issuer))));
        } else {
            warnings.push(format!(
                "tls.issuerRef is set but cert-manager is not installed; Secret {} must be created by hand",
                names::tls_secret_from_issuer(mc)
            ));
        }
    }
    if mc.spec.monitoring.service_monitor && ctx.has_service_monitor {
        out.push((ChildKind::ServiceMonitor, value(&workload::service_monitor(mc))));
    }
    if budget.capped() {
        warnings.push(budget.summary());
    }

    // Stable apply order: by kind (dependencies first), then as built.
    out.sort_by_key(|(k, _)| ChildKind::ALL.iter().position(|x| x == k).unwrap_or(usize::MAX));
    let children = out
        .into_iter()
        .map(|(k, v)| Child::from_typed(k, &v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ValidationError::one(format!("internal: built object does not decode: {e}")))?;
    Ok(Built { children, budget, rollout, migration_job: jobs::migration_job_name(mc), warnings })
}
