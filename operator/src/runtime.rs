//! The running operator: leader election, the controller, `/metrics` and `/healthz`,
//! graceful shutdown on SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use futures::StreamExt;

use crate::children::ChildKind;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};
use mailcluster_api::{MANAGED_BY, MANAGED_BY_LABEL, MailCluster};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::image::ImageAllowlist;
use crate::leader::{LeaderElector, LeaseConfig};
use crate::metrics::Metrics;
use crate::reconcile::{Context, error_policy, reconcile};

/// The child kinds the controller watches (its `.owns(…)` calls in [`run_with`]): a
/// change to one of them reconciles its MailCluster at once. Certificate and
/// ServiceMonitor come from optional CRDs and are repaired at the periodic resync.
/// The chart grants `watch` on exactly these (operator/tests/install.rs).
pub const WATCHED: [ChildKind; 11] = [
    ChildKind::Deployment,
    ChildKind::Service,
    ChildKind::HorizontalPodAutoscaler,
    ChildKind::Job,
    ChildKind::CronJob,
    ChildKind::ConfigMap,
    ChildKind::PodDisruptionBudget,
    ChildKind::NetworkPolicy,
    ChildKind::ServiceAccount,
    ChildKind::Role,
    ChildKind::RoleBinding,
];

#[derive(Debug, Clone)]
pub struct OperatorOptions {
    /// Watch only this namespace; None = all namespaces.
    pub namespace: Option<String>,
    /// Address of `/metrics` and `/healthz`.
    pub metrics_addr: SocketAddr,
    pub leader_election: bool,
    pub lease_name: String,
    /// Namespace of the Lease; default `$POD_NAMESPACE`, else `default`.
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease; default `$POD_NAME`, else the hostname.
    pub identity: Option<String>,
    /// A Lease not renewed for this long may be taken over by another replica.
    pub lease_duration: Duration,
    /// How often the leader renews (and a candidate retries).
    pub renew_every: Duration,
    /// How often reconciles ask discovery again whether cert-manager / the Prometheus
    /// operator are installed.
    pub rediscover_every: Duration,
    /// The repositories a MailCluster's `spec.image` may come from.
    pub allowed_images: ImageAllowlist,
    /// MailDomains and MailAccounts are reconciled again after this long, in
    /// case a watch event was missed (`accounts.rs`).
    pub account_resync: Duration,
    /// Nameservers the MailDomains' DNS records are checked at; empty: the
    /// system's (the cluster's resolver in a pod).
    pub dns_nameservers: Vec<SocketAddr>,
}

impl Default for OperatorOptions {
    fn default() -> Self {
        OperatorOptions {
            namespace: None,
            metrics_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            leader_election: true,
            lease_name: "mailcluster-operator".into(),
            lease_namespace: None,
            identity: None,
            // A standby takes over at most lease_duration + renew_every after the
            // leader's last renewal: 12 s, inside the 15 s the docs promise.
            lease_duration: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            rediscover_every: Duration::from_secs(300),
            allowed_images: ImageAllowlist::default(),
            account_resync: Duration::from_secs(60),
            dns_nameservers: Vec::new(),
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The admin HTTP server: `/metrics` (Prometheus text) and `/healthz`.
pub fn admin_router(metrics: Metrics) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route(
        "/metrics",
        get(move || {
            let m = metrics.clone();
            async move { m.render() }
        }),
    )
}

/// Runs the operator against the cluster of the ambient kubeconfig / service account
/// until SIGTERM or Ctrl-C.
pub async fn run(opts: OperatorOptions) -> anyhow::Result<()> {
    let client = Client::try_default().await.context("connecting to the Kubernetes API")?;
    run_with(client, opts, Metrics::new(), shutdown_signal()).await
}

/// Runs the operator with a given client until `shutdown` resolves (or leadership is
/// lost). Separate from [`run`] so a test can point the real controller at a mock API
/// server, read its metrics and stop it.
pub async fn run_with(
    client: Client,
    opts: OperatorOptions,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // One shutdown signal fans out to the HTTP server, the election and the controller.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        info!("shutdown requested");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let listener = tokio::net::TcpListener::bind(opts.metrics_addr)
        .await
        .with_context(|| format!("binding {}", opts.metrics_addr))?;
    info!(addr = %opts.metrics_addr, "serving /metrics and /healthz");
    let server =
        axum::serve(listener, admin_router(metrics.clone())).with_graceful_shutdown(stopped(stop_rx.clone()));
    let server = tokio::spawn(async move { server.await });

    let elector = if opts.leader_election {
        let identity = opts
            .identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("mailcluster-operator-{}", std::process::id()));
        let namespace = opts
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".into());
        let e = LeaderElector::new(
            client.clone(),
            LeaseConfig {
                name: opts.lease_name.clone(),
                namespace,
                identity: identity.clone(),
                lease_duration: opts.lease_duration,
                renew_every: opts.renew_every,
            },
        );
        info!(%identity, "waiting for leadership");
        tokio::select! {
            _ = e.acquire() => info!(%identity, "became leader"),
            _ = stopped(stop_rx.clone()) => {
                let _ = server.await;
                return Ok(());
            }
        }
        Some(Arc::new(e))
    } else {
        None
    };

    info!(allowed_images = %opts.allowed_images, "MailClusters may run images from these repositories");
    let ctx = Arc::new(
        Context::discovering(client.clone(), metrics, opts.rediscover_every)
            .await
            .with_allowed_images(opts.allowed_images.clone()),
    );
    let mcs: Api<MailCluster> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Children are watched by our label only: the operator's caches hold its own
    // objects, not every Deployment in the cluster.
    let owned = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    macro_rules! api {
        ($t:ty) => {
            match &opts.namespace {
                Some(ns) => Api::<$t>::namespaced(client.clone(), ns),
                None => Api::<$t>::all(client.clone()),
            }
        };
    }

    // Leadership lost (renewal impossible) stops the controller like a shutdown does.
    let (lost_tx, lost_rx) = watch::channel(false);
    // Without an elector `lost_tx` must stay alive until the end: a dropped sender
    // would read as "leadership lost" and stop the controller at once.
    let mut _lost_unused = None;
    let renewal = match elector.clone() {
        Some(e) => Some(tokio::spawn(async move {
            e.keep().await;
            let _ = lost_tx.send(true);
        })),
        None => {
            _lost_unused = Some(lost_tx);
            None
        }
    };
    let mut stop_for_controller = stop_rx.clone();
    let mut lost_for_controller = lost_rx.clone();
    let trigger = async move {
        tokio::select! {
            _ = stop_for_controller.wait_for(|s| *s) => {}
            _ = lost_for_controller.wait_for(|s| *s) => {}
        }
    };

    // The store kinds run beside, under the same leadership and shutdown.
    let (mut stop_for_accounts, mut lost_for_accounts) = (stop_rx.clone(), lost_rx.clone());
    let accounts = tokio::spawn(crate::accounts::run(
        client.clone(),
        crate::accounts::AccountOptions {
            namespace: opts.namespace.clone(),
            resync: opts.account_resync,
            dns_nameservers: opts.dns_nameservers.clone(),
            ..Default::default()
        },
        async move {
            tokio::select! {
                _ = stop_for_accounts.wait_for(|s| *s) => {}
                _ = lost_for_accounts.wait_for(|s| *s) => {}
            }
        },
    ));

    Controller::new(mcs, watcher::Config::default().any_semantic())
        .owns(api!(Deployment), owned.clone())
        .owns(api!(Service), owned.clone())
        .owns(api!(HorizontalPodAutoscaler), owned.clone())
        .owns(api!(Job), owned.clone())
        .owns(api!(CronJob), owned.clone())
        .owns(api!(ConfigMap), owned.clone())
        .owns(api!(PodDisruptionBudget), owned.clone())
        // The objects that guard the pods: a deleted NetworkPolicy or a changed Role
        // is repaired at once, not at the next resync.
        .owns(api!(NetworkPolicy), owned.clone())
        .owns(api!(ServiceAccount), owned.clone())
        .owns(api!(Role), owned.clone())
        .owns(api!(RoleBinding), owned)
        .graceful_shutdown_on(trigger)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(mailcluster = %obj, "reconciled"),
                // A change to a child of a MailCluster deleted meanwhile: nothing to do.
                Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                    tracing::debug!(mailcluster = %obj, "gone before its reconcile")
                }
                Err(e) => warn!(error = %e, "controller"),
            }
        })
        .await;
    let _ = accounts.await;

    if let Some(e) = elector {
        // Stop renewing before releasing: a renewal round after the release would see
        // an unheld Lease and take it right back.
        if let Some(r) = renewal {
            r.abort();
            let _ = r.await;
        }
        e.release().await;
    }
    if *lost_rx.borrow() {
        server.abort();
        anyhow::bail!("leadership lost; exiting so a fresh replica can take over");
    }
    let _ = server.await;
    info!("stopped");
    Ok(())
}
