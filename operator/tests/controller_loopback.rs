//! The real controller ([`mailcluster_operator::run_with`]) against a Kubernetes API
//! server on loopback: create → migration → Ready → drift repair → spec change
//! (orphans deleted, replicas updated) → on-demand stress run → pause → delete; leader
//! election between two operator instances (only the holder reconciles, takeover on
//! release, exit on a stolen Lease); cert-manager / Prometheus operator CRDs installed
//! while the operator runs.
//!
//! The API server is `tests/support/kube_api_mock.py`, built on PyPI `kmock`. kmock
//! supplies the HTTP server, Kubernetes URL parsing, discovery endpoints and `Status`
//! error bodies; its in-memory emulator is replaced there by a small store with what
//! kube-rs relies on and the emulator lacks (server-side apply, resourceVersion /
//! generation / uid, status subresource, label selectors, resumable watches with
//! bookmarks, optimistic concurrency on replace, owner-reference garbage collection).
//! We chose kmock over a bespoke Rust server so the mock stays an independent
//! implementation of the API (not written against the same kube-rs types it tests)
//! and over a real apiserver (envtest, kind) because those need downloads and
//! minutes; this runs offline in seconds.
//!
//! Nothing marks Deployments ready or Jobs complete on its own: the test plays the
//! kubelet and the job controller by patching their status through the API, and
//! every wait is bounded. Without python3 + kmock the tests are skipped locally, and
//! fail when `CI` is set (scripts/test.sh installs kmock).

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Config, ResourceExt};
use mailcluster_api::MailCluster;
use mailcluster_operator::build::migration_job_name;
use mailcluster_operator::children::ChildKind;
use mailcluster_operator::metrics::Metrics;
use mailcluster_operator::{OperatorOptions, run_with};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "mail";
/// Bound of every wait. Each step takes well under a second on an idle machine; the
/// margin is for shared, overloaded CI machines.
const WAIT: Duration = Duration::from_secs(30);

/// The mock API server process; killed on drop.
struct MockApi {
    child: Child,
    port: u16,
}

impl MockApi {
    /// None when python3/kmock are missing outside CI (the test is then skipped).
    fn start() -> Option<MockApi> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/kube_api_mock.py");
        let has_kmock = Command::new("python3")
            .args(["-c", "import kmock"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_kmock {
            assert!(
                std::env::var_os("CI").is_none(),
                "python3 with PyPI kmock is required in CI (scripts/test.sh installs it)"
            );
            eprintln!("skipping: python3 with PyPI kmock not available (pip install kmock)");
            return None;
        }
        // stdin stays a pipe we never write: the server exits when it closes, so it
        // cannot outlive this process even if the test is killed before Drop runs.
        let mut child = Command::new("python3")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the mock API server");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut lines = std::io::BufReader::new(stdout).lines();
            let port = lines.next().and_then(Result::ok).and_then(|l| l.strip_prefix("PORT ")?.parse().ok());
            let _ = tx.send(port);
            // Keep draining so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let port: Option<u16> = rx.recv_timeout(WAIT).ok().flatten();
        let mut mock = MockApi { child, port: 0 };
        mock.port = port.expect("the mock API server did not report its port");
        Some(mock)
    }

    async fn client(&self) -> Client {
        let url = format!("http://127.0.0.1:{}", self.port).parse().expect("valid URL");
        let mut config = Config::new(url);
        config.default_namespace = NS.into();
        Client::try_from(config).expect("client for the mock API server")
    }
}

impl Drop for MockApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        // Not faster: the single-threaded mock serves the controller too.
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
    Api::<K>::namespaced(client.clone(), NS).get_opt(name).await.expect("GET answered")
}

async fn names<K>(client: &Client) -> Vec<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let list = Api::<K>::namespaced(client.clone(), NS).list(&ListParams::default()).await.expect("LIST");
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
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
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
metadata: {name: mail, namespace: mail}
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
            namespace: Some(NS.into()),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            leader_election: leader.is_some(),
            lease_name: "mailcluster-operator".into(),
            lease_namespace: Some(NS.into()),
            identity: leader.map(String::from),
            // Short, so a takeover after release or expiry happens within the test's waits.
            lease_duration: Duration::from_secs(3),
            renew_every: Duration::from_millis(500),
            rediscover_every: Duration::from_secs(1),
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

/// Plays the Deployment controller and kubelet: every Deployment reports all its
/// replicas (or 2 when an HPA owns the count) ready and updated.
async fn mark_deployments_available(client: &Client) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    for d in api.list(&ListParams::default()).await.unwrap() {
        let n = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(2);
        let status = json!({"status": {
            "observedGeneration": d.metadata.generation,
            "replicas": n, "readyReplicas": n, "updatedReplicas": n, "availableReplicas": n,
            "conditions": [{"type": "Available", "status": "True"}],
        }});
        api.patch_status(&d.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_runs_a_cluster_from_create_to_delete() {
    init_logs();
    let Some(mock) = MockApi::start() else { return };
    let client = mock.client().await;
    put_secrets(&client).await;
    let op = Operator::start(&client, None);

    let mcs: Api<MailCluster> = Api::namespaced(client.clone(), NS);
    let mc = mcs.create(&PostParams::default(), &cluster()).await.expect("create MailCluster");

    // Before the schema migration: config, Services, the migration Job, the stress
    // CronJob — and no Deployments, which would start pods on an unmigrated schema.
    let job = migration_job_name(&mc);
    eventually("the migration Job", || async { get::<Job>(&client, &job).await }).await;
    assert!(get::<ConfigMap>(&client, "mail-config").await.is_some());
    assert!(get::<CronJob>(&client, "mail-stress").await.is_some());
    assert_eq!(
        names::<Service>(&client).await,
        ["mail-imap", "mail-metrics", "mail-pop3", "mail-smtp", "mail-submission"]
    );
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

    // The job controller reports the migration done: the Job watch wakes the
    // controller, which now creates the workloads.
    let done = json!({"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}});
    Api::<Job>::namespaced(client.clone(), NS)
        .patch_status(&job, &PatchParams::default(), &Patch::Merge(&done))
        .await
        .unwrap();
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
    mark_deployments_available(&client).await;
    eventually("Ready=True for generation 1", || async {
        let r = ready(&client).await?;
        (r.0 == "True" && r.2 == Some(1) && r.3 == Some(1)).then_some(())
    })
    .await;
    // Important transitions are reported as Events on the resource.
    let events = eventually("a Ready event", || async {
        let list = Api::<Event>::namespaced(client.clone(), NS).list(&ListParams::default()).await.ok()?;
        let reasons: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
        reasons.iter().any(|r| r == "AllProtocolsServing").then_some(reasons)
    })
    .await;
    assert!(events.iter().any(|r| r == "MigrationRunning"), "{events:?}");

    // Drift: objects deleted behind the operator's back are recreated, each from its
    // own watch (the cluster is settled: the next resync is minutes away).
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .delete("mail", &DeleteParams::default())
        .await
        .unwrap();
    eventually("ServiceAccount recreated", || get::<ServiceAccount>(&client, "mail")).await;
    Api::<ConfigMap>::namespaced(client.clone(), NS)
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
    let events = Api::<Event>::namespaced(client.clone(), NS).list(&ListParams::default()).await.unwrap();
    let deleted: Vec<String> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("OrphanDeleted"))
        .filter_map(|e| e.note.clone())
        .collect();
    assert!(deleted.iter().any(|n| n.starts_with("deleted Deployment mail-imap")), "{deleted:?}");
    mark_deployments_available(&client).await;
    eventually("Ready=True for generation 2", || async {
        let r = ready(&client).await?;
        (r.0 == "True" && r.2 == Some(2) && r.3 == Some(2)).then_some(())
    })
    .await;

    // On-demand stress run: the annotation's token names a Job; a new token replaces it.
    let annotate = |token: &str| json!({"metadata": {"annotations": {"mailcluster.dev/run-stress": token}}});
    let stress_jobs = || async {
        let mut v: Vec<String> = names::<Job>(&client).await.into_iter().filter(|n| *n != job).collect();
        v.retain(|n| n.starts_with("mail-stress-"));
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
    drop(mock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_reconciles() {
    init_logs();
    let Some(mock) = MockApi::start() else { return };
    let client = mock.client().await;
    put_secrets(&client).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
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

    let mcs: Api<MailCluster> = Api::namespaced(client.clone(), NS);
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
    drop(mock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_and_service_monitor_once_their_crds_are_installed() {
    init_logs();
    let Some(mock) = MockApi::start() else { return };
    let client = mock.client().await;
    put_secrets(&client).await;
    let op = Operator::start(&client, None);
    let mut mc = cluster();
    // Room for every pod's pool, so no capped budget hides the warning in Degraded.
    mc.spec.postgres.max_connections = 1000;
    mc.spec.tls = Some(
        serde_json::from_value(json!({"issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer"}}))
            .unwrap(),
    );
    let mcs: Api<MailCluster> = Api::namespaced(client.clone(), NS);
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
    let install = http::Request::post("/mock/optional-crds").body(Vec::new()).unwrap();
    client.request_text(install).await.expect("installing the CRDs in the mock");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let touch = json!({"metadata": {"annotations": {"example.com/touched": "1"}}});
    mcs.patch("mail", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();

    let dynamic =
        |kind: ChildKind| Api::<DynamicObject>::namespaced_with(client.clone(), NS, &kind.api_resource());
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
    drop(mock);
}
