//! Reconcile one `MailCluster`: validate → dereference → build → apply → delete
//! orphans → status.
//!
//! Validation runs before dereferencing (unlike a strict dereference-first pipeline)
//! because our rules need nothing from the cluster: a bad spec costs no API call and
//! never waits on a Secret. Everything the build depends on from the cluster
//! (Secrets present, migration Job finished, optional CRDs installed) is read here and
//! handed to the pure [`build`] as a [`BuildContext`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use mailcluster_api::{FIELD_MANAGER, MailCluster, MailClusterStatus, Protocol};
use serde_json::json;
use tracing::{info, warn};

use crate::build::{BuildContext, Built, build, migration_job_name};
use crate::children::ChildKind;
use crate::image::ImageAllowlist;
use crate::metrics::Metrics;
use crate::names;
use crate::status::{self, Outcome, Replicas, SysctlRefusal};
use crate::validate::validate;

/// Optional CRDs found by discovery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub cert_manager: bool,
    pub service_monitor: bool,
}

impl Capabilities {
    /// Asks the apiserver which optional API groups are served; what cannot be
    /// answered now (an error other than 404) counts as absent.
    pub async fn discover(client: &Client) -> Self {
        Capabilities::default().rediscover(client).await
    }

    /// Like [`Capabilities::discover`], but an unanswered question keeps the answer
    /// known so far: an apiserver hiccup must not make the operator forget cert-manager.
    pub async fn rediscover(self, client: &Client) -> Self {
        async fn has(client: &Client, gv: &str, plural: &str, known: bool) -> bool {
            match client.list_api_group_resources(gv).await {
                Ok(list) => list.resources.iter().any(|r| r.name == plural),
                Err(kube::Error::Api(s)) if s.code == 404 => false,
                Err(e) => {
                    warn!(group_version = gv, error = %e, "discovery failed; keeping what was known");
                    known
                }
            }
        }
        Capabilities {
            cert_manager: has(client, "cert-manager.io/v1", "certificates", self.cert_manager).await,
            service_monitor: has(client, "monitoring.coreos.com/v1", "servicemonitors", self.service_monitor)
                .await,
        }
    }

    fn allows(self, kind: ChildKind) -> bool {
        match kind {
            ChildKind::Certificate => self.cert_manager,
            ChildKind::ServiceMonitor => self.service_monitor,
            _ => true,
        }
    }
}

/// The apiserver no longer serves an optional kind that discovery found earlier: its
/// CRD was uninstalled (404 for the resource path itself — an apply creates a missing
/// object, so it is never a 404 for one object) or is being deleted (403, "create
/// not allowed while custom resource definition is terminating").
fn kind_gone(kind: ChildKind, e: &kube::Error) -> bool {
    matches!(kind, ChildKind::Certificate | ChildKind::ServiceMonitor)
        && matches!(e, kube::Error::Api(s) if s.code == 404
            || (s.code == 403 && s.message.contains("custom resource definition is terminating")))
}

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// What discovery found, when, and how often to ask again (None: never).
    capabilities: tokio::sync::Mutex<(Capabilities, tokio::time::Instant)>,
    rediscover_every: Option<Duration>,
    /// Consecutive failures per object, for the error backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The repositories MailClusters may take their image from.
    allowed_images: ImageAllowlist,
}

impl Context {
    /// A context with fixed capabilities (tests, or a caller that discovered them).
    pub fn new(client: Client, metrics: Metrics, capabilities: Capabilities) -> Self {
        let reporter =
            Reporter { controller: FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            capabilities: tokio::sync::Mutex::new((capabilities, tokio::time::Instant::now())),
            rediscover_every: None,
            failures: Mutex::new(HashMap::new()),
            allowed_images: ImageAllowlist::default(),
        }
    }

    /// The same context trusting the images of `allowed` instead of the default.
    pub fn with_allowed_images(self, allowed: ImageAllowlist) -> Self {
        Context { allowed_images: allowed, ..self }
    }

    /// A context that discovers the optional CRDs now and again when its knowledge is
    /// older than `every`: installing cert-manager or the Prometheus operator after
    /// the operator started is noticed without a restart.
    pub async fn discovering(client: Client, metrics: Metrics, every: Duration) -> Self {
        let capabilities = Capabilities::discover(&client).await;
        info!(?capabilities, "optional CRDs");
        Context { rediscover_every: Some(every), ..Context::new(client, metrics, capabilities) }
    }

    /// The optional CRDs as currently known, re-discovered when due. The lock is held
    /// across discovery so concurrent reconciles ask the apiserver once.
    pub async fn capabilities(&self) -> Capabilities {
        let mut known = self.capabilities.lock().await;
        if let Some(every) = self.rediscover_every
            && known.1.elapsed() >= every
        {
            let now = known.0.rediscover(&self.client).await;
            if now != known.0 {
                info!(capabilities = ?now, "optional CRDs changed");
            }
            *known = (now, tokio::time::Instant::now());
        }
        known.0
    }

    /// Forgets an optional kind the apiserver stopped serving, until discovery finds
    /// it again: the rest of the reconcile goes on without it.
    async fn kind_uninstalled(&self, kind: ChildKind) {
        let mut known = self.capabilities.lock().await;
        match kind {
            ChildKind::Certificate => known.0.cert_manager = false,
            ChildKind::ServiceMonitor => known.0.service_monitor = false,
            _ => return,
        }
        info!(?kind, "optional CRD uninstalled");
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
    #[error("MailCluster has no namespace or name")]
    NoIdentity,
}

impl Error {
    /// Label value for the failures metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(s)) if s.code == 422 => "invalid",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::Json(_) => "encoding",
            Error::NoIdentity => "identity",
        }
    }
}

/// Reason of the conditions of a MailCluster whose image the operator does not run.
pub const IMAGE_NOT_ALLOWED: &str = "ImageNotAllowed";

/// Requeue after success: a slow resync catches anything no watch reports.
const RESYNC: Duration = Duration::from_secs(300);
/// Requeue while something is in motion (rollout, migration, missing Secret).
const SHORT: Duration = Duration::from_secs(30);

pub async fn reconcile(mc: Arc<MailCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.start();
    let key = format!("{}/{}", mc.namespace().unwrap_or_default(), mc.name_any());
    let result = reconcile_inner(&mc, &ctx).await;
    match &result {
        Ok(_) => {
            ctx.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        }
        Err(e) => ctx.metrics.failed(e.reason()),
    }
    result
}

/// Retry failed reconciles with exponential backoff per object (5 s … 5 min).
pub fn error_policy(mc: Arc<MailCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", mc.namespace().unwrap_or_default(), mc.name_any());
    let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures.entry(key.clone()).or_insert(0);
    *n = n.saturating_add(1);
    let delay = backoff(*n);
    warn!(mailcluster = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.saturating_sub(1).min(16));
    Duration::from_secs(secs.min(300))
}

async fn reconcile_inner(mc: &MailCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = mc.namespace().ok_or(Error::NoIdentity)?;
    if mc.metadata.name.is_none() {
        return Err(Error::NoIdentity);
    }
    let (outcome, action) = if mc.spec.paused {
        (Outcome::Paused, Action::await_change())
    } else if let Err(e) = validate(mc) {
        // Retrying cannot fix a spec: wait for the user to change it.
        (Outcome::Invalid { message: e.problems.join("; ") }, Action::await_change())
    } else if let Err(message) = ctx.allowed_images.check(&mc.spec.image.reference()) {
        // The image runs with the cluster's database URL and keys: nothing is
        // created or changed for this cluster until it names a trusted one (its
        // running pods keep theirs). The allowlist changes only with a restart,
        // which reconciles everything again.
        (Outcome::Blocked { reason: IMAGE_NOT_ALLOWED.into(), message }, Action::await_change())
    } else if let Some(missing) = missing_secrets(mc, &ns, &ctx.client).await? {
        // Secrets are not watched: look again soon.
        (Outcome::Blocked { reason: "SecretMissing".into(), message: missing }, Action::requeue(SHORT))
    } else if let Some(problem) = crate::keys::ensure(mc, &ns, &ctx.client).await? {
        (Outcome::Blocked { reason: "SecretMissing".into(), message: problem }, Action::requeue(SHORT))
    } else {
        let (migrated_image, migration_failure) = observe_migration(mc, &ns, &ctx.client).await?;
        let caps = ctx.capabilities().await;
        let bctx = BuildContext {
            migrated_image: migrated_image.clone(),
            has_cert_manager: caps.cert_manager,
            has_service_monitor: caps.service_monitor,
        };
        match build(mc, &bctx) {
            Err(e) => (Outcome::Invalid { message: e.problems.join("; ") }, Action::await_change()),
            Ok(built) => {
                let (replicas, refused_creations) = apply_children(mc, &ns, &built, caps, ctx).await?;
                delete_orphans(mc, &ns, &built, caps, ctx).await?;
                let sysctl_refusals = observe_sysctl_refusals(mc, &ns, &ctx.client)
                    .await?
                    .map(|pods| refused_creations.into_iter().chain(pods).collect());
                let mut warnings = built.warnings.clone();
                if let Some(f) = migration_failure {
                    warnings.insert(0, f);
                }
                let settled =
                    built.rollout == crate::build::Rollout::Current && replicas.values().all(|r| r.settled());
                let outcome = Outcome::Applied {
                    budget: built.budget.clone(),
                    rollout: built.rollout.clone(),
                    replicas,
                    migrated_image,
                    warnings,
                    sysctl_refusals,
                };
                (outcome, Action::requeue(if settled { RESYNC } else { SHORT }))
            }
        }
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new_status = status::compute(mc, &outcome, &now);
    write_status(mc, &ns, &new_status, ctx).await?;
    publish_transitions(mc, mc.status.as_ref(), &new_status, ctx).await;
    Ok(action)
}

/// Returns a message naming every missing Secret or key, or None when all are there.
async fn missing_secrets(mc: &MailCluster, ns: &str, client: &Client) -> Result<Option<String>, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut wanted: Vec<(String, Option<String>)> = vec![
        (mc.spec.postgres.url_secret_ref.name.clone(), Some(mc.spec.postgres.url_secret_ref.key.clone())),
        (mc.spec.redis.url_secret_ref.name.clone(), Some(mc.spec.redis.url_secret_ref.key.clone())),
    ];
    if let Some(name) = mc.spec.tls.as_ref().and_then(|t| t.secret_name.clone()) {
        wanted.push((name, Some("tls.crt".into())));
    }
    let mut problems = Vec::new();
    let mut cache: HashMap<String, Option<Secret>> = HashMap::new();
    for (name, key) in wanted {
        if !cache.contains_key(&name) {
            cache.insert(name.clone(), api.get_opt(&name).await?);
        }
        match (cache.get(&name).and_then(|s| s.as_ref()), key) {
            (None, _) => problems.push(format!("Secret {name} not found")),
            (Some(s), Some(k)) if !s.data.as_ref().is_some_and(|d| d.contains_key(&k)) => {
                problems.push(format!("Secret {name} has no key {k}"))
            }
            _ => {}
        }
    }
    problems.dedup();
    Ok((!problems.is_empty()).then(|| problems.join("; ")))
}

/// The image whose migration is done, and a message if the current migration failed.
async fn observe_migration(
    mc: &MailCluster,
    ns: &str,
    client: &Client,
) -> Result<(Option<String>, Option<String>), Error> {
    let wanted = mc.spec.image.reference();
    let recorded = mc.status.as_ref().and_then(|s| s.migrated_image.clone());
    if recorded.as_deref() == Some(wanted.as_str()) {
        return Ok((recorded, None));
    }
    let name = migration_job_name(mc);
    let job = Api::<Job>::namespaced(client.clone(), ns).get_opt(&name).await?;
    let conditions =
        job.as_ref().and_then(|j| j.status.as_ref()).and_then(|s| s.conditions.clone()).unwrap_or_default();
    let has = |t: &str| conditions.iter().any(|c| c.type_ == t && c.status == "True");
    if has("Complete") {
        info!(job = %name, image = %wanted, "schema migration complete");
        Ok((Some(wanted), None))
    } else if has("Failed") {
        Ok((recorded, Some(format!("schema migration Job {name} failed; pods stay on the previous image"))))
    } else {
        Ok((recorded, None))
    }
}

/// The mail pods the kubelet refused for the sysctls the spec gives them (none
/// asked for: nothing to look at). Refused pods are Failed at once and their
/// Deployment keeps making new ones, so they are not waited for: while the
/// Deployment has fewer ready pods than it wants, reconcile comes back soon.
/// An operator whose Role lacks the pods permission (an older chart) says so in
/// the condition and carries on.
async fn observe_sysctl_refusals(
    mc: &MailCluster,
    ns: &str,
    client: &Client,
) -> Result<Result<Vec<SysctlRefusal>, String>, Error> {
    let Some(wanted) = crate::build::pod_sysctls(mc) else { return Ok(Ok(Vec::new())) };
    let selector: Vec<String> =
        names::all_pods_selector(mc).iter().map(|(k, v)| format!("{k}={v}")).collect();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    match api.list(&ListParams::default().labels(&selector.join(","))).await {
        Ok(pods) => Ok(Ok(status::refused_pods(&pods.items, &wanted))),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            warn!(namespace = ns, message = %s.message, "may not list pods; sysctl refusals unknown");
            Ok(Err(s.message))
        }
        Err(e) => Err(e.into()),
    }
}

fn apply_params() -> PatchParams {
    // force: this operator is the only writer of the fields it sets; a human's
    // `kubectl edit` of a managed field is reverted rather than wedging reconcile.
    PatchParams::apply(FIELD_MANAGER).force()
}

async fn apply_children(
    mc: &MailCluster,
    ns: &str,
    built: &Built,
    caps: Capabilities,
    ctx: &Context,
) -> Result<(BTreeMap<Protocol, Replicas>, Vec<SysctlRefusal>), Error> {
    let mut replicas = BTreeMap::new();
    let mut refused = Vec::new();
    for child in &built.children {
        if !caps.allows(child.kind) {
            continue;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), ns, &child.kind.api_resource());
        let applied = match api.patch(child.name(), &apply_params(), &Patch::Apply(&child.object)).await {
            Ok(a) => a,
            Err(e) if kind_gone(child.kind, &e) => {
                ctx.kind_uninstalled(child.kind).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if child.kind == ChildKind::Deployment
            && let Some(p) = mc
                .spec
                .enabled_protocols()
                .into_iter()
                .find(|p| names::protocol_object(mc, *p) == child.name())
        {
            let d: Deployment = serde_json::from_value(serde_json::to_value(&applied)?)?;
            refused.extend(status::refused_creation(&d));
            let generation = d.metadata.generation;
            let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let s = d.status.unwrap_or_default();
            replicas.insert(
                p,
                Replicas {
                    desired,
                    replicas: s.replicas.unwrap_or(0),
                    ready: s.ready_replicas.unwrap_or(0),
                    updated: s.updated_replicas.unwrap_or(0),
                    observed: s.observed_generation.is_some() && s.observed_generation >= generation,
                },
            );
        }
    }
    Ok((replicas, refused))
}

/// Deletes objects this operator made for this cluster that the spec no longer asks
/// for. Two checks guard against deleting what is not ours: the managed-by/cluster
/// labels, and a controller owner reference to this very resource (Jobs spawned by
/// the stress CronJob are owned by the CronJob, not by us, and are left to it).
async fn delete_orphans(
    mc: &MailCluster,
    ns: &str,
    built: &Built,
    caps: Capabilities,
    ctx: &Context,
) -> Result<(), Error> {
    let wanted: HashSet<(ChildKind, &str)> = built.children.iter().map(|c| (c.kind, c.name())).collect();
    let uid = mc.meta().uid.clone();
    let lp = ListParams::default().labels(&names::owned_selector(mc));
    for kind in ChildKind::ALL {
        if !caps.allows(kind) {
            continue;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &kind.api_resource());
        let objects = match api.list(&lp).await {
            Ok(list) => list,
            Err(e) if kind_gone(kind, &e) => {
                ctx.kind_uninstalled(kind).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for obj in objects {
            let name = obj.name_any();
            let ours = obj
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref());
            if ours && !wanted.contains(&(kind, name.as_str())) {
                info!(kind = ?kind, %name, "deleting object no longer wanted");
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {
                        // Removing a Service or Deployment is what a user most wants to
                        // see explained on the resource, next to the condition changes.
                        let note =
                            format!("deleted {} {name}: the spec no longer asks for it", kind.gvk().kind);
                        // The deleted object as `related`: the recorder folds events that
                        // differ only in their note into one series.
                        let related = Some(obj.object_ref(&kind.api_resource()));
                        publish(mc, ctx, EventType::Normal, "OrphanDeleted", note, "Delete", related).await;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

async fn write_status(
    mc: &MailCluster,
    ns: &str,
    st: &MailClusterStatus,
    ctx: &Context,
) -> Result<(), Error> {
    if mc.status.as_ref() == Some(st) {
        return Ok(());
    }
    let mut status = serde_json::to_value(st)?;
    // lastStress belongs to the stress Job's field manager, unmanagedAccounts to
    // the accounts reconciler's; applying our (possibly stale) copy would
    // overwrite what they wrote since we read the object.
    if let Some(o) = status.as_object_mut() {
        o.remove("lastStress");
        o.remove("unmanagedAccounts");
    }
    let patch = json!({
        "apiVersion": format!("{}/{}", mailcluster_api::GROUP, mailcluster_api::VERSION),
        "kind": "MailCluster",
        "status": status,
    });
    let api: Api<MailCluster> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(&mc.name_any(), &apply_params(), &Patch::Apply(&patch)).await?;
    Ok(())
}

async fn publish_transitions(
    mc: &MailCluster,
    old: Option<&MailClusterStatus>,
    new: &MailClusterStatus,
    ctx: &Context,
) {
    for c in status::transitions(old, new) {
        let bad = (c.type_ == status::DEGRADED && c.status == "True")
            || (c.type_ != status::DEGRADED && c.type_ != status::PROGRESSING && c.status == "False");
        let type_ = if bad { EventType::Warning } else { EventType::Normal };
        let note = format!("{} is {}: {}", c.type_, c.status, c.message);
        publish(mc, ctx, type_, &c.reason, note, "Reconcile", None).await;
    }
}

/// Publishes an Event about `mc`. Events are best effort: a failed event must not
/// fail or repeat the reconcile.
async fn publish(
    mc: &MailCluster,
    ctx: &Context,
    type_: EventType,
    reason: &str,
    note: String,
    action: &str,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
) {
    let ev =
        Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: related };
    if let Err(e) = ctx.recorder.publish(&ev, &mc.object_ref(&())).await {
        warn!(error = %e, "publishing event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let secs: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(u32::MAX).as_secs(), 300);
    }
}
