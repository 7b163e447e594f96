//! The real controller ([`mailcluster_operator::run_with`], in process) against a real
//! Kubernetes control plane (`scripts/kube-up.sh`): create → migration → Ready → drift
//! repair → spec change (orphans deleted, replicas updated) → on-demand stress run →
//! pause → delete through the garbage collector; leader election between two
//! operator instances (only the holder reconciles, takeover on release, exit on a
//! stolen Lease); cert-manager / Prometheus operator CRDs installed while the
//! operator runs.
//!
//! The cluster has no node: pods never run. Where the story needs a pod to have run,
//! the test plays the kubelet and reports the pod's status through the API; the real
//! job, ReplicaSet and Deployment controllers turn that into Job and Deployment
//! status as they would for a real kubelet. Each test works in a namespace of its
//! own and its operator watches only that namespace. The process-level test (the
//! `mailcluster operator` binary with the chart's RBAC) is cli/tests/kube_real.rs.
//!
//! The cluster is found through `MAILCLUSTER_TEST_KUBECONFIG` (scripts/test.sh starts
//! one and sets it); without it the tests are skipped locally and fail under `CI`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use mailcluster_api::{MANAGED_BY, MANAGED_BY_LABEL, MailCluster};
use mailcluster_operator::build::migration_job_name;
use mailcluster_operator::children::ChildKind;
use mailcluster_operator::metrics::Metrics;
use mailcluster_operator::{OperatorOptions, run_with};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Bound of every wait: a step takes a second or two on an idle machine; the margin
/// is for a loaded two-core CI machine running the whole suite beside the cluster.
const WAIT: Duration = Duration::from_secs(90);

/// A client of the test cluster whose default namespace is a fresh one, deleted
/// (without waiting) on drop. None when there is no cluster outside CI.
struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    async fn create(prefix: &str) -> Option<TestNamespace> {
        let path = match std::env::var("MAILCLUSTER_TEST_KUBECONFIG") {
            Ok(p) if std::path::Path::new(&p).exists() => p,
            _ => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "MAILCLUSTER_TEST_KUBECONFIG is required in CI (scripts/test.sh starts the cluster)"
                );
                eprintln!("skipping: no MAILCLUSTER_TEST_KUBECONFIG (run scripts/kube-up.sh)");
                return None;
            }
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let name = format!("{prefix}-{}-{}", std::process::id(), nanos % 100_000);
        let kubeconfig = Kubeconfig::read_from(&path).expect("test kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        config.default_namespace = name.clone();
        let client = Client::try_from(config).expect("client of the test cluster");
        install_crd(&client).await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        // The service-account controller adds `default` to a new namespace; Job and
        // Deployment pods are refused until it exists.
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        let deadline = tokio::time::Instant::now() + WAIT;
        while sas.get_opt("default").await.ok().flatten().is_none() {
            assert!(tokio::time::Instant::now() < deadline, "no default ServiceAccount in {name}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Some(TestNamespace { client, name })
    }
}

/// The generated MailCluster CRD, applied server-side and Established: these
/// tests run on a control plane of their own as well as after the install tests.
/// The field manager and forced conflicts are the install test's: the CRD's
/// version list is an atomic field owned by whoever applied it last.
async fn install_crd(client: &Client) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/mailclusters.mailcluster.dev.yaml");
    let text = std::fs::read_to_string(path).expect("crds/ readable");
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).expect("the CRD parses");
    let name = crd.name_any();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(&name, &PatchParams::apply("install-test").force(), &Patch::Apply(&crd))
        .await
        .expect("apply the MailCluster CRD");
    eventually("the MailCluster CRD established", || async {
        let c = crds.get_opt(&name).await.ok()??;
        c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
    })
    .await;
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let client = self.client.clone();
        let name = self.name.clone();
        // Drop cannot await: a short-lived runtime on its own thread does the call.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let _ = Api::<Namespace>::all(client).delete(&name, &DeleteParams::default()).await;
            });
        })
        .join();
    }
}

/// The operator's logs in the test output (`RUST_LOG=debug` for more), so a failed
/// wait shows what the controller was doing.
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// Polls `f` until it returns Some, for at most [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            eprintln!("{what}: after {:?}", WAIT - (deadline - tokio::time::Instant::now()));
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {WAIT:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn get<K>(client: &Client, name: &str) -> Option<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::default_namespaced(client.clone()).get_opt(name).await.expect("GET answered")
}

async fn names<K>(client: &Client) -> Vec<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    // Ours only: a namespace also holds objects the cluster puts there (the
    // kube-root-ca.crt ConfigMap, the default ServiceAccount).
    let ours = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let list = Api::<K>::default_namespaced(client.clone()).list(&ours).await.expect("LIST");
    let mut v: Vec<String> = list.items.iter().map(|o| o.name_any()).collect();
    v.sort();
    v
}

/// The Ready condition as (status, reason, observedGeneration), if any.
async fn ready(client: &Client) -> Option<(String, String, Option<i64>, Option<i64>)> {
    let mc = get::<MailCluster>(client, "mail").await?;
    let c = mc.status.as_ref()?.condition("Ready")?.clone();
    Some((c.status, c.reason, c.observed_generation, mc.metadata.generation))
}

async fn put_secrets(client: &Client) {
    let api: Api<Secret> = Api::default_namespaced(client.clone());
    for name in ["mail-db", "mail-redis"] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name},
            "data": {"url": "cG9zdGdyZXM6Ly8="},
        }))
        .unwrap();
        api.create(&PostParams::default(), &s).await.expect("create Secret");
    }
}

fn cluster() -> MailCluster {
    serde_yaml_ng::from_str(
        r#"
apiVersion: mailcluster.dev/v1alpha1
kind: MailCluster
metadata: {name: mail}
spec:
  image: {tag: "0.1.0"}
  domains: [example.com]
  postgres: {urlSecretRef: {name: mail-db}}
  redis: {urlSecretRef: {name: mail-redis}}
  pop3: {enabled: true}
  stress: {schedule: "0 3 * * *"}
"#,
    )
    .expect("cluster YAML")
}

struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    metrics: Metrics,
}

impl Operator {
    fn start(client: &Client, leader: Option<&str>) -> Operator {
        let opts = OperatorOptions {
            namespace: Some(client.default_namespace().into()),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            leader_election: leader.is_some(),
            lease_name: "mailcluster-operator".into(),
            lease_namespace: Some(client.default_namespace().into()),
            identity: leader.map(String::from),
            // Short, so a takeover after release or expiry happens within the test's waits.
            lease_duration: Duration::from_secs(6),
            renew_every: Duration::from_secs(1),
            rediscover_every: Duration::from_secs(1),
            ..Default::default()
        };
        let metrics = Metrics::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run_with(client.clone(), opts, metrics.clone(), async move {
            let _ = stopped.await;
        }));
        Operator { stop: Some(stop), task, metrics }
    }

    /// Waits (bounded) for the operator to end by itself and returns its result.
    async fn exit(mut self) -> anyhow::Result<()> {
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("operator ends within the bound")
            .expect("operator task did not panic")
    }

    /// Signals shutdown and requires the operator to return Ok within the bound.
    async fn stop(mut self) {
        let _ = self.stop.take().expect("stopped once").send(());
        let result = tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("operator stops within the bound")
            .expect("operator task did not panic");
        result.expect("operator stops cleanly");
    }
}

/// Plays the kubelet of every pod in the namespace that has not been reported yet:
/// a Job's pod ran and exited 0, a Deployment's pod is running and Ready. The real
/// controllers turn that into Job completion and Deployment availability.
async fn report_pods(client: &Client) {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if phase != "Pending" || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let is_job = pod.labels().contains_key("job-name");
        let containers: Vec<_> = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
        let statuses: Vec<_> = containers
            .iter()
            .map(|c| {
                let state = if is_job {
                    json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}})
                } else {
                    json!({"running": {"startedAt": now}})
                };
                json!({"name": c.name, "image": c.image, "imageID": "", "ready": !is_job,
                       "restartCount": 0, "started": !is_job, "state": state})
            })
            .collect();
        let ready = if is_job { "False" } else { "True" };
        let status = json!({"status": {
            "phase": if is_job { "Succeeded" } else { "Running" },
            "startTime": now,
            "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
            ],
            "containerStatuses": statuses,
        }});
        // A pod may be replaced meanwhile (rollout): a failed report is retried by
        // the caller's next round.
        let _ = pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(&status)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_runs_a_cluster_from_create_to_delete() {
    init_logs();
    let Some(ns) = TestNamespace::create("ctl").await else { return };
    let client = ns.client.clone();
    put_secrets(&client).await;
    let op = Operator::start(&client, None);

    let mcs: Api<MailCluster> = Api::default_namespaced(client.clone());
    let mc = mcs.create(&PostParams::default(), &cluster()).await.expect("create MailCluster");

    // Before the schema migration: config, Services, the migration Job, the stress
    // CronJob — and no Deployments, which would start pods on an unmigrated schema.
    // One reconcile applies them one after another: each is waited for, not
    // expected at the instant the first appears.
    let job = migration_job_name(&mc);
    eventually("the migration Job", || async { get::<Job>(&client, &job).await }).await;
    eventually("the config", || async { get::<ConfigMap>(&client, "mail-config").await }).await;
    eventually("the stress CronJob", || async { get::<CronJob>(&client, "mail-stress").await }).await;
    eventually("the Services", || async {
        let want = ["mail-imap", "mail-metrics", "mail-pop3", "mail-smtp", "mail-submission"];
        (names::<Service>(&client).await == want).then_some(())
    })
    .await;
    let phase = eventually("status Pending", || async {
        let mc = get::<MailCluster>(&client, "mail").await?;
        mc.status?.phase
    })
    .await;
    assert_eq!(serde_json::to_value(phase).unwrap(), "Pending");
    assert!(names::<Deployment>(&client).await.is_empty(), "no Deployments before the migration");
    // Every child is owned by the resource (its uid as the apiserver assigned it).
    let cm = get::<ConfigMap>(&client, "mail-config").await.unwrap();
    assert_eq!(cm.owner_references()[0].uid, mc.uid().unwrap());

    // The migration pod ran (as its kubelet reports); the job controller completes
    // the Job, whose watch wakes the controller, which now creates the workloads.
    eventually("the migration Job complete", || async {
        report_pods(&client).await;
        let j = get::<Job>(&client, &job).await?;
        j.status?.conditions?.iter().any(|c| c.type_ == "Complete" && c.status == "True").then_some(())
    })
    .await;
    let protocols = ["mail-imap", "mail-pop3", "mail-smtp", "mail-submission"];
    eventually("Deployments, HPAs and PDBs", || async {
        (names::<Deployment>(&client).await == protocols
            && names::<HorizontalPodAutoscaler>(&client).await == protocols
            && names::<PodDisruptionBudget>(&client).await == protocols)
            .then_some(())
    })
    .await;
    let (status, reason, ..) = eventually("a Ready condition", || ready(&client)).await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PodsNotReady"));

    // The pods come up: Ready=True for this generation.
    eventually("Ready=True for generation 1", || async {
        report_pods(&client).await;
        let r = ready(&client).await?;
        (r.0 == "True" && r.2 == Some(1) && r.3 == Some(1)).then_some(())
    })
    .await;
    // Important transitions are reported as Events on the resource.
    let events = eventually("a Ready event", || async {
        let list =
            Api::<Event>::default_namespaced(client.clone()).list(&ListParams::default()).await.ok()?;
        let reasons: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
        reasons.iter().any(|r| r == "AllProtocolsServing").then_some(reasons)
    })
    .await;
    assert!(events.iter().any(|r| r == "MigrationRunning"), "{events:?}");

    // Drift: objects deleted behind the operator's back are recreated, each from its
    // own watch (the cluster is settled: the next resync is minutes away).
    Api::<ServiceAccount>::default_namespaced(client.clone())
        .delete("mail", &DeleteParams::default())
        .await
        .unwrap();
    eventually("ServiceAccount recreated", || get::<ServiceAccount>(&client, "mail")).await;
    Api::<ConfigMap>::default_namespaced(client.clone())
        .delete("mail-config", &DeleteParams::default())
        .await
        .unwrap();
    eventually("ConfigMap recreated", || get::<ConfigMap>(&client, "mail-config")).await;

    // Spec change: IMAP off (its objects become orphans and go), SMTP to a fixed 3.
    let change = json!({"spec": {"imap": {"enabled": false},
                                 "smtp": {"replicas": 3, "autoscaling": {"enabled": false}}}});
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap();
    eventually("IMAP objects deleted, SMTP at 3 fixed replicas", || async {
        let smtp = get::<Deployment>(&client, "mail-smtp").await?;
        let fixed = smtp.spec?.replicas == Some(3);
        let deployments = names::<Deployment>(&client).await;
        let hpas = names::<HorizontalPodAutoscaler>(&client).await;
        (fixed
            && deployments == ["mail-pop3", "mail-smtp", "mail-submission"]
            && hpas == ["mail-pop3", "mail-submission"]
            && names::<PodDisruptionBudget>(&client).await == ["mail-pop3", "mail-smtp", "mail-submission"]
            && get::<Service>(&client, "mail-imap").await.is_none())
        .then_some(())
    })
    .await;
    let events = Api::<Event>::default_namespaced(client.clone()).list(&ListParams::default()).await.unwrap();
    let deleted: Vec<String> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("OrphanDeleted"))
        .filter_map(|e| e.note.clone())
        .collect();
    assert!(deleted.iter().any(|n| n.starts_with("deleted Deployment mail-imap")), "{deleted:?}");
    eventually("Ready=True for generation 2", || async {
        report_pods(&client).await;
        let r = ready(&client).await?;
        (r.0 == "True" && r.2 == Some(2) && r.3 == Some(2)).then_some(())
    })
    .await;

    // A Job the stress CronJob spawned carries our labels (from its template) but is
    // owned by the CronJob, not by the MailCluster: orphan deletion leaves it alone.
    let cron = get::<CronJob>(&client, "mail-stress").await.expect("the stress CronJob");
    let template = cron.spec.clone().unwrap().job_template;
    let spawned: Job = serde_json::from_value(json!({
        "metadata": {
            "name": "mail-stress-manual",
            "labels": template.metadata.as_ref().and_then(|m| m.labels.clone()),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "mail-stress",
                                 "uid": cron.uid().unwrap(), "controller": true}],
        },
        "spec": template.spec,
    }))
    .unwrap();
    // Suspended: it starts no pod, so it never finishes and the CronJob's history
    // limit never removes it while the test looks.
    let mut spawned = spawned;
    spawned.spec.as_mut().unwrap().suspend = Some(true);
    Api::<Job>::default_namespaced(client.clone()).create(&PostParams::default(), &spawned).await.unwrap();

    // New image: the Deployments stay on the old one until the new image's schema
    // migration completes; the old migration Job is no longer wanted.
    let image_of = |d: Deployment| d.spec?.template.spec?.containers.first()?.image.clone();
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"image": {"tag": "0.2.0"}}})))
        .await
        .unwrap();
    let upgraded = get::<MailCluster>(&client, "mail").await.unwrap();
    let new_job = migration_job_name(&upgraded);
    eventually("phase Migrating with the new migration Job", || async {
        let st = get::<MailCluster>(&client, "mail").await?.status?;
        let migrating = serde_json::to_value(st.phase?).ok()? == "Migrating";
        (migrating
            && get::<Job>(&client, &new_job).await.is_some()
            && get::<Job>(&client, &job).await.is_none())
        .then_some(())
    })
    .await;
    let smtp = get::<Deployment>(&client, "mail-smtp").await.unwrap();
    assert_eq!(
        image_of(smtp).as_deref(),
        Some("ghcr.io/mailcluster/mailcluster:0.1.0"),
        "held for the migration"
    );
    eventually("Deployments on the new image once migrated", || async {
        report_pods(&client).await;
        let smtp = get::<Deployment>(&client, "mail-smtp").await?;
        (image_of(smtp)? == "ghcr.io/mailcluster/mailcluster:0.2.0").then_some(())
    })
    .await;
    assert!(
        get::<Job>(&client, "mail-stress-manual").await.is_some(),
        "the CronJob's Job is not ours to delete"
    );

    // On-demand stress run: the annotation's token names a Job; a new token replaces it.
    let annotate = |token: &str| json!({"metadata": {"annotations": {"mailcluster.dev/run-stress": token}}});
    let stress_jobs = || async {
        let mut v: Vec<String> = names::<Job>(&client).await.into_iter().filter(|n| *n != job).collect();
        v.retain(|n| n.starts_with("mail-stress-") && n != "mail-stress-manual");
        v
    };
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&annotate("run-1"))).await.unwrap();
    let first = eventually("a stress Job", || async { stress_jobs().await.pop() }).await;
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&annotate("run-2"))).await.unwrap();
    eventually("the stress Job of the new token only", || async {
        let v = stress_jobs().await;
        (v.len() == 1 && v[0] != first).then_some(())
    })
    .await;

    // Paused: the status says so and spec changes are not applied.
    let pause = json!({"spec": {"paused": true, "smtp": {"replicas": 4}}});
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&pause)).await.unwrap();
    eventually("phase Paused", || async {
        let st = get::<MailCluster>(&client, "mail").await?.status?;
        (serde_json::to_value(st.phase?).ok()? == "Paused").then_some(())
    })
    .await;
    let smtp = get::<Deployment>(&client, "mail-smtp").await.unwrap();
    assert_eq!(smtp.spec.unwrap().replicas, Some(3), "a paused cluster's children are left alone");

    // Every API call so far was answered as the controller expects: no reconcile failed.
    let metrics = op.metrics.render();
    assert!(!metrics.contains("mailcluster_operator_reconcile_failures_total{"), "{metrics}");

    // Delete: the garbage collector removes the children through their owner
    // references; the controller sees the deletions and keeps running quietly.
    mcs.delete("mail", &DeleteParams::default()).await.unwrap();
    eventually("children garbage-collected", || async {
        (names::<Deployment>(&client).await.is_empty()
            && names::<Service>(&client).await.is_empty()
            && names::<ConfigMap>(&client).await.is_empty())
        .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(op.metrics.reconciles.get() >= 4, "reconciles: {}", op.metrics.reconciles.get());
    op.stop().await;
    drop(ns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_reconciles() {
    init_logs();
    let Some(ns) = TestNamespace::create("ctl").await else { return };
    let client = ns.client.clone();
    put_secrets(&client).await;
    let leases: Api<Lease> = Api::default_namespaced(client.clone());
    let holder = || async {
        let l = leases.get_opt("mailcluster-operator").await.ok()??;
        let s = l.spec?;
        Some((s.holder_identity.unwrap_or_default(), s.renew_time?.0, s.lease_transitions.unwrap_or(0)))
    };

    let a = Operator::start(&client, Some("operator-a"));
    let (first, renewed, _) =
        eventually("operator-a holds the Lease", || async { holder().await.filter(|h| h.0 == "operator-a") })
            .await;
    assert_eq!(first, "operator-a");
    let b = Operator::start(&client, Some("operator-b"));

    let mcs: Api<MailCluster> = Api::default_namespaced(client.clone());
    mcs.create(&PostParams::default(), &cluster()).await.unwrap();
    eventually("the leader reconciles", || async { get::<MailCluster>(&client, "mail").await?.status }).await;
    // The leader renews; the other candidate keeps waiting and never reconciles.
    eventually("a renewal by operator-a", || async {
        holder().await.filter(|h| h.0 == "operator-a" && h.1 > renewed)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.metrics.reconciles.get() > 0);
    assert_eq!(b.metrics.reconciles.get(), 0, "operator-b reconciled without the Lease");
    assert_eq!(holder().await.unwrap().0, "operator-a");

    // The leader stops and releases the Lease; the other takes over and reconciles.
    a.stop().await;
    let (_, _, transitions) = eventually("operator-b takes the Lease over", || async {
        holder().await.filter(|h| h.0 == "operator-b")
    })
    .await;
    assert_eq!(transitions, 1, "one change of holder");
    eventually("operator-b reconciles", || async { (b.metrics.reconciles.get() > 0).then_some(()) }).await;

    // Another replica takes the Lease (as after a partition): operator-b must stop
    // on its own rather than reconcile next to the new holder, and leave the Lease be.
    let mut lease = leases.get("mailcluster-operator").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("operator-c".into());
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    leases.replace("mailcluster-operator", &PostParams::default(), &lease).await.unwrap();
    let err = b.exit().await.expect_err("operator-b exits with an error after losing the Lease");
    assert!(err.to_string().contains("leadership lost"), "{err}");
    assert_eq!(holder().await.unwrap().0, "operator-c");
    drop(ns);
}

/// cert-manager's Certificate and the Prometheus operator's ServiceMonitor: (kind,
/// version, plural, group). Their schemas do not matter here, only that the kinds are
/// served (the operator discovers them).
const OPTIONAL_CRDS: [(&str, &str, &str, &str); 2] = [
    ("Certificate", "v1", "certificates", "cert-manager.io"),
    ("ServiceMonitor", "v1", "servicemonitors", "monitoring.coreos.com"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_and_service_monitor_once_their_crds_are_installed() {
    init_logs();
    let Some(ns) = TestNamespace::create("ctl").await else { return };
    let client = ns.client.clone();
    // The optional CRDs start absent (a reused cluster may still have them).
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, _, plural, group) in OPTIONAL_CRDS {
        let _ = crds.delete(&format!("{plural}.{group}"), &DeleteParams::default()).await;
    }
    for (_, _, plural, group) in OPTIONAL_CRDS {
        let name = format!("{plural}.{group}");
        eventually("optional CRD gone", || async { crds.get_opt(&name).await.ok()?.is_none().then_some(()) })
            .await;
    }
    put_secrets(&client).await;
    let op = Operator::start(&client, None);
    let mut mc = cluster();
    // Room for every pod's pool, so no capped budget hides the warning in Degraded.
    mc.spec.postgres.max_connections = 1000;
    mc.spec.tls = Some(
        serde_json::from_value(json!({"issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer"}}))
            .unwrap(),
    );
    let mcs: Api<MailCluster> = Api::default_namespaced(client.clone());
    mcs.create(&PostParams::default(), &mc).await.unwrap();
    let degraded =
        || async { get::<MailCluster>(&client, "mail").await?.status?.condition("Degraded").cloned() };

    // No cert-manager: nothing is applied to a kind the cluster does not serve, and
    // the status says the TLS Secret must be made by hand.
    let d =
        eventually("a Degraded warning", || async { degraded().await.filter(|d| d.status == "True") }).await;
    assert_eq!(d.reason, "Warning");
    assert!(d.message.contains("cert-manager is not installed"), "{}", d.message);

    // cert-manager and the Prometheus operator are installed while the operator runs.
    for (kind, version, plural, group) in OPTIONAL_CRDS {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                          "listKind": format!("{kind}List")},
                "versions": [{"name": version, "served": true, "storage": true, "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            }
        }))
        .unwrap();
        crds.create(&PostParams::default(), &crd).await.expect("create optional CRD");
    }
    for (_, _, plural, group) in OPTIONAL_CRDS {
        let name = format!("{plural}.{group}");
        eventually("optional CRD established", || async {
            let c = crds.get_opt(&name).await.ok()??;
            c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let touch = json!({"metadata": {"annotations": {"example.com/touched": "1"}}});
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();

    let dynamic = |kind: ChildKind| {
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            client.default_namespace(),
            &kind.api_resource(),
        )
    };
    let cert = eventually("the Certificate", || async {
        dynamic(ChildKind::Certificate).get_opt("mail-tls").await.ok().flatten()
    })
    .await;
    assert_eq!(cert.data["spec"]["issuerRef"]["name"], "letsencrypt");
    assert_eq!(cert.data["spec"]["secretName"], "mail-tls");
    eventually("the ServiceMonitor", || async {
        dynamic(ChildKind::ServiceMonitor).get_opt("mail").await.ok().flatten()
    })
    .await;
    eventually("Degraded=False", || async {
        degraded().await.filter(|d| (d.status.as_str(), d.reason.as_str()) == ("False", "AsExpected"))
    })
    .await;
    op.stop().await;
    drop(ns);
}

/// Status as users read it, with the API server holding the truth: a missing Secret
/// blocks and recovers, the connection budget caps HPAs and says so, the stress Job's
/// verdict (written under its own field manager) drives SLOMet and survives the
/// operator's own status writes, and a spec the CRD admits but the operator cannot
/// build is reported, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follows_secrets_budget_and_the_stress_verdict() {
    init_logs();
    let Some(ns) = TestNamespace::create("status").await else { return };
    let client = ns.client.clone();
    let op = Operator::start(&client, None);
    let mcs: Api<MailCluster> = Api::default_namespaced(client.clone());
    let condition = |type_: &'static str| {
        let client = client.clone();
        async move {
            let c = get::<MailCluster>(&client, "mail").await?.status?.condition(type_)?.clone();
            Some((c.status, c.reason, c.message))
        }
    };

    // No Secrets yet: Degraded names both; nothing is applied.
    let mut mc = cluster();
    // 70 − 10 reserved − 2 migration = 58 connections for the pods' pools.
    mc.spec.postgres.max_connections = 70;
    mcs.create(&PostParams::default(), &mc).await.unwrap();
    let d = eventually("Degraded SecretMissing", || async {
        condition("Degraded").await.filter(|d| d.1 == "SecretMissing")
    })
    .await;
    assert!(
        d.2.contains("Secret mail-db not found") && d.2.contains("Secret mail-redis not found"),
        "{}",
        d.2
    );
    assert!(names::<ConfigMap>(&client).await.is_empty(), "nothing built without the Secrets");

    // The Secrets appear: the next look (Secrets are not watched) proceeds.
    put_secrets(&client).await;
    mcs.patch(
        "mail",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {"t": "1"}}})),
    )
    .await
    .unwrap();
    let job = eventually("the migration Job", || async {
        names::<Job>(&client).await.into_iter().find(|n| n.starts_with("mail-migrate"))
    })
    .await;
    eventually("the migration Job complete", || async {
        report_pods(&client).await;
        let j = get::<Job>(&client, &job).await?;
        j.status?.conditions?.iter().any(|c| c.type_ == "Complete" && c.status == "True").then_some(())
    })
    .await;

    // The budget caps every HPA's maxReplicas and says so in Degraded.
    let d = eventually("Degraded ConnectionBudgetCapped", || async {
        condition("Degraded").await.filter(|d| d.1 == "ConnectionBudgetCapped")
    })
    .await;
    assert!(d.2.contains("capped smtp maxReplicas 6→"), "{}", d.2);
    let hpas: Api<HorizontalPodAutoscaler> = Api::default_namespaced(client.clone());
    let smtp_max = eventually("the SMTP HPA", || async { hpas.get_opt("mail-smtp").await.ok()? }).await;
    assert!(smtp_max.spec.unwrap().max_replicas < 6, "capped below the asked 6");

    // The stress Job's verdict, applied to the status subresource under its own
    // field manager as `mailcluster stress` does in the cluster.
    let verdict = json!({
        "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailCluster",
        "status": {"lastStress": {"verdict": "Fail", "job": "mail-stress-1",
            "startedAt": "2026-11-30T03:00:00Z", "finishedAt": "2026-11-30T03:10:00Z",
            "successRate": 99.99, "p95Ms": {"smtp.deliver": 180.0}}},
    });
    let stress_manager = PatchParams::apply(mailcluster_api::STRESS_FIELD_MANAGER).force();
    mcs.patch_status("mail", &stress_manager, &Patch::Apply(&verdict)).await.expect("stress verdict applied");
    let slo =
        eventually("SLOMet=False", || async { condition("SLOMet").await.filter(|c| c.1 == "StressFailed") })
            .await;
    assert!(slo.2.contains("smtp.deliver p95 180ms"), "{}", slo.2);
    // Later operator status writes leave the verdict where the stress Job put it.
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"smtp": {"replicas": 2}}})))
        .await
        .unwrap();
    eventually("a status write for generation 2", || async {
        let st = get::<MailCluster>(&client, "mail").await?.status?;
        (st.observed_generation == Some(2)).then_some(())
    })
    .await;
    let st = get::<MailCluster>(&client, "mail").await.unwrap().status.unwrap();
    assert_eq!(st.last_stress.unwrap().job.as_deref(), Some("mail-stress-1"));

    // A domain the CRD's schema admits but no DNS name can be: Degraded InvalidSpec,
    // the children stay as they were.
    let deployments_before = names::<Deployment>(&client).await;
    mcs.patch(
        "mail",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"domains": ["not a domain"]}})),
    )
    .await
    .unwrap();
    let d = eventually("Degraded InvalidSpec", || async {
        condition("Degraded").await.filter(|d| d.1 == "InvalidSpec")
    })
    .await;
    assert!(d.2.contains("is not a valid DNS name"), "{}", d.2);
    assert_eq!(names::<Deployment>(&client).await, deployments_before);
    let metrics = op.metrics.render();
    assert!(!metrics.contains("mailcluster_operator_reconcile_failures_total{"), "{metrics}");
    op.stop().await;
    drop(ns);
}

/// `spec.filter.rspamd.deploy` on a real API server: the operator makes the
/// Secret of rspamd's passwords once (the include file rspamd reads names the
/// same password the pods send), runs rspamd and its Redis with their
/// Services and ConfigMap, points the scanning pods at them, and removes them
/// when the spec names an rspamd of the user's instead. The API server itself
/// refuses a spec naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_rspamd_comes_and_goes_with_the_spec() {
    init_logs();
    let Some(ns) = TestNamespace::create("rspamd").await else { return };
    let client = ns.client.clone();
    put_secrets(&client).await;
    let mcs: Api<MailCluster> = Api::default_namespaced(client.clone());

    let mut both = cluster();
    both.spec.filter = Some(
        serde_yaml_ng::from_str(
            "rspamd: {url: 'http://rspamd:11334', deploy: {image: 'rspamd/rspamd:3.12'}}",
        )
        .unwrap(),
    );
    let refused = mcs.create(&PostParams::default(), &both).await.expect_err("url and deploy refused");
    assert!(
        refused.to_string().contains("exactly one of filter.rspamd.url or filter.rspamd.deploy"),
        "{refused}"
    );

    let op = Operator::start(&client, None);
    let mut mc = cluster();
    mc.spec.filter =
        Some(serde_yaml_ng::from_str("rspamd: {deploy: {image: 'rspamd/rspamd:3.12'}}").unwrap());
    mcs.create(&PostParams::default(), &mc).await.expect("create MailCluster");

    let secret = eventually("rspamd's Secret", || get::<Secret>(&client, "mail-rspamd")).await;
    let data = secret.data.clone().unwrap();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    let password = text("password");
    assert_eq!(password.len(), 64);
    assert!(text("controller.inc").contains(&format!("password = \"{password}\";")));
    assert!(text("redis.inc").contains(&format!("password = \"{}\";", text("redis-password"))));
    eventually("rspamd, its Redis and their Services", || async {
        let want = ["mail-rspamd", "mail-rspamd-redis"];
        (names::<Deployment>(&client).await == want
            && get::<Service>(&client, "mail-rspamd").await.is_some()
            && get::<Service>(&client, "mail-rspamd-redis").await.is_some()
            && get::<ConfigMap>(&client, "mail-rspamd").await.is_some())
        .then_some(())
    })
    .await;
    let config = eventually("the pods' config", || get::<ConfigMap>(&client, "mail-config")).await;
    let smtp = &config.data.unwrap()["smtp.toml"];
    assert!(smtp.contains(&format!("url = \"http://mail-rspamd.{}.svc:11334\"", ns.name)), "{smtp}");

    // The user's rspamd instead: the operator's goes, its Secret stays (the
    // MailCluster owns it) and is the same when `deploy` comes back.
    let change =
        json!({"spec": {"filter": {"rspamd": {"deploy": null, "url": "http://rspamd.elsewhere:11334"}}}});
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap();
    eventually("rspamd's objects deleted", || async {
        (names::<Deployment>(&client).await.iter().all(|n| !n.contains("rspamd"))
            && get::<Service>(&client, "mail-rspamd").await.is_none()
            && get::<Service>(&client, "mail-rspamd-redis").await.is_none()
            && get::<ConfigMap>(&client, "mail-rspamd").await.is_none())
        .then_some(())
    })
    .await;
    let config = eventually("the pods' config", || async {
        let cm = get::<ConfigMap>(&client, "mail-config").await?;
        let smtp = cm.data?.remove("smtp.toml")?;
        smtp.contains("http://rspamd.elsewhere:11334").then_some(smtp)
    })
    .await;
    assert!(!config.contains("mail-rspamd"), "{config}");
    let kept = get::<Secret>(&client, "mail-rspamd").await.expect("Secret kept");
    assert_eq!(kept.data, secret.data, "never rewritten");
    op.stop().await;
}
