//! Reconcile call sequences against a mock API server (`tower_test::mock`).
//!
//! The mock is a small in-memory apiserver: it stores what is applied, serves gets and
//! label-filtered lists, deletes, and records every call, so each test can both drive
//! several reconciles in a row and assert the exact calls (method, path, body).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use mailcluster_api::MailCluster;
use mailcluster_operator::metrics::Metrics;
use mailcluster_operator::reconcile::{Capabilities, Context, reconcile};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Call {
    method: String,
    /// Path without the query string.
    path: String,
    query: String,
    body: Option<Value>,
}

impl Call {
    /// Events are written by POST, or PATCH when the recorder extends a series.
    fn is_event(&self) -> bool {
        self.path.contains("/events")
    }

    fn is(&self, method: &str, path_suffix: &str) -> bool {
        self.method == method && self.path.ends_with(path_suffix)
    }
}

#[derive(Default)]
struct State {
    /// (collection path, name) → object. Collection path: e.g. `/apis/apps/v1/namespaces/mail/deployments`.
    objects: BTreeMap<(String, String), Value>,
    calls: Vec<Call>,
    /// Status the "cluster" reports for Deployments on apply (ready pods).
    deployment_status: Value,
}

#[derive(Clone)]
struct FakeApi(Arc<Mutex<State>>);

fn split(path: &str) -> (String, Option<String>, bool) {
    // .../namespaces/{ns}/{plural}[/{name}[/status]]
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let Some(i) = parts.iter().position(|p| *p == "namespaces") else {
        return (path.to_string(), None, false);
    };
    let collection = parts[..(i + 3).min(parts.len())].join("/");
    let name = parts.get(i + 3).map(|s| s.to_string());
    let status = parts.get(i + 4) == Some(&"status");
    (collection, name, status)
}

fn not_found(name: &str) -> (u16, Value) {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("\"{name}\" not found"), "reason": "NotFound", "code": 404}),
    )
}

fn label_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.replace("%3D", "=").replace("%2C", ",").replace("%2F", "/"))
    })
}

impl FakeApi {
    fn new() -> Self {
        let state = State {
            deployment_status: json!({"observedGeneration": 1, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}),
            ..Default::default()
        };
        FakeApi(Arc::new(Mutex::new(state)))
    }

    fn put(&self, collection: &str, obj: Value) {
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        self.0.lock().unwrap().objects.insert((collection.to_string(), name), obj);
    }

    fn get(&self, collection: &str, name: &str) -> Option<Value> {
        self.0.lock().unwrap().objects.get(&(collection.to_string(), name.to_string())).cloned()
    }

    fn names(&self, collection: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .objects
            .keys()
            .filter(|(c, _)| c == collection)
            .map(|(_, n)| n.clone())
            .collect()
    }

    fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.0.lock().unwrap().calls)
    }

    fn handle(&self, method: &str, path: &str, query: &str, body: Option<Value>) -> (u16, Value) {
        let mut st = self.0.lock().unwrap();
        st.calls.push(Call {
            method: method.into(),
            path: path.into(),
            query: query.into(),
            body: body.clone(),
        });
        let (collection, name, status) = split(path);
        match (method, name) {
            ("GET", Some(name)) => match st.objects.get(&(collection, name.clone())) {
                Some(o) => (200, o.clone()),
                None => not_found(&name),
            },
            ("GET", None) => {
                let sel = query_param(query, "labelSelector").unwrap_or_default();
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|((c, _), o)| *c == collection && label_match(o, &sel))
                    .map(|(_, o)| o.clone())
                    .collect();
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            ("PATCH", Some(name)) => {
                let body = body.unwrap_or(Value::Null);
                let key = (collection.clone(), name.clone());
                if status {
                    let Some(obj) = st.objects.get_mut(&key) else { return not_found(&name) };
                    // Apply semantics for our one manager: its status fields replace the
                    // old ones, fields of other managers (lastStress) stay.
                    let mut merged = obj["status"].as_object().cloned().unwrap_or_default();
                    for k in [
                        "observedGeneration",
                        "phase",
                        "conditions",
                        "smtp",
                        "submission",
                        "imap",
                        "pop3",
                        "migratedImage",
                    ] {
                        merged.remove(k);
                    }
                    for (k, v) in body["status"].as_object().cloned().unwrap_or_default() {
                        merged.insert(k, v);
                    }
                    obj["status"] = Value::Object(merged);
                    return (200, obj.clone());
                }
                let mut obj = body;
                if let Some(old_status) = st.objects.get(&key).and_then(|o| o.get("status").cloned()) {
                    obj["status"] = old_status;
                }
                if collection.ends_with("/deployments") {
                    obj["status"] = st.deployment_status.clone();
                }
                obj["metadata"]["uid"] = json!(format!("uid-{name}"));
                st.objects.insert(key, obj.clone());
                (200, obj)
            }
            ("DELETE", Some(name)) => match st.objects.remove(&(collection, name.clone())) {
                Some(o) => (200, o),
                None => not_found(&name),
            },
            ("POST", _) => (201, body.unwrap_or(Value::Null)),
            _ => (405, json!({"kind": "Status", "code": 405})),
        }
    }

    /// A client whose requests this fake answers until the client is dropped.
    fn client(&self) -> Client {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let me = self.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                let query = req.uri().query().unwrap_or("").to_string();
                let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
                let body = serde_json::from_slice(&bytes).ok();
                let (code, resp) = me.handle(&method, &path, &query, body);
                let resp = Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&resp).unwrap()))
                    .unwrap();
                send.send_response(resp);
            }
        });
        Client::new(svc, "default")
    }
}

const NS: &str = "/api/v1/namespaces/mail";
const MC: &str = "/apis/mailcluster.dev/v1alpha1/namespaces/mail/mailclusters";
const JOBS: &str = "/apis/batch/v1/namespaces/mail/jobs";
const DEPLOYS: &str = "/apis/apps/v1/namespaces/mail/deployments";
const SERVICES: &str = "/api/v1/namespaces/mail/services";
const HPAS: &str = "/apis/autoscaling/v2/namespaces/mail/horizontalpodautoscalers";

fn fixture(name: &str) -> MailCluster {
    let path = format!("{}/tests/fixtures/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn secret(name: &str, key: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "mail"},
           "data": {key: "cG9zdGdyZXM6Ly8="}})
}

fn fake_with_secrets() -> FakeApi {
    let fake = FakeApi::new();
    fake.put(&format!("{NS}/secrets"), secret("mail-db", "url"));
    fake.put(&format!("{NS}/secrets"), secret("mail-redis", "url"));
    fake
}

async fn run(fake: &FakeApi, mc: &MailCluster) -> Action {
    fake.put(MC, serde_json::to_value(mc).unwrap());
    let ctx = Arc::new(Context::new(fake.client(), Metrics::new(), Capabilities::default()));
    tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(mc.clone()), ctx))
        .await
        .expect("reconcile finishes")
        .expect("reconcile succeeds")
}

/// The resource as the fake apiserver now holds it (status included).
fn stored(fake: &FakeApi, mc: &MailCluster) -> MailCluster {
    serde_json::from_value(fake.get(MC, &mc.name_any()).unwrap()).unwrap()
}

fn condition<'a>(
    mc: &'a MailCluster,
    t: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    mc.status.as_ref().unwrap().condition(t).unwrap_or_else(|| panic!("condition {t}"))
}

fn applies(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.method == "PATCH" && !c.path.ends_with("/status") && !c.is_event())
        .map(|c| {
            let (coll, name, _) = split(&c.path);
            format!("{}/{}", coll.rsplit('/').next().unwrap(), name.unwrap())
        })
        .collect()
}

fn complete_job(fake: &FakeApi, name: &str) {
    let mut job = fake.get(JOBS, name).expect("migration job applied");
    job["status"] = json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]});
    fake.put(JOBS, job);
}

#[tokio::test]
async fn create_applies_children_then_status() {
    let fake = fake_with_secrets();
    let mc = fixture("minimal");
    let job = mailcluster_operator::build::migration_job_name(&mc);

    // First reconcile: secrets read, migration Job created, no Deployments yet.
    let action = run(&fake, &mc).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    let calls = fake.take_calls();
    assert!(calls[0].is("GET", "/secrets/mail-db"), "{:?}", calls[0]);
    assert!(calls[1].is("GET", "/secrets/mail-redis"));
    assert!(calls[2].is("GET", &format!("/jobs/{job}")));
    assert_eq!(
        applies(&calls),
        [
            "serviceaccounts/mail".to_string(),
            "configmaps/mail-config".into(),
            "services/mail-metrics".into(),
            "services/mail-smtp".into(),
            "services/mail-submission".into(),
            "services/mail-imap".into(),
            format!("jobs/{job}"),
        ]
    );
    for c in calls.iter().filter(|c| c.method == "PATCH") {
        assert!(c.query.contains("fieldManager=mailcluster-operator"), "{}", c.query);
        assert!(c.query.contains("force=true"), "{}", c.query);
    }
    // Lists for orphans, by our labels, one per built-in kind.
    let lists: Vec<&Call> =
        calls.iter().filter(|c| c.method == "GET" && c.query.contains("labelSelector")).collect();
    assert_eq!(lists.len(), 11);
    assert_eq!(
        query_param(&lists[0].query, "labelSelector").as_deref(),
        Some("app.kubernetes.io/managed-by=mailcluster-operator,mailcluster.dev/cluster=mail")
    );
    // Status last among API writes (events are best effort after it).
    let status_idx =
        calls.iter().position(|c| c.is("PATCH", "/mailclusters/mail/status")).expect("status patch");
    assert!(calls[status_idx + 1..].iter().all(Call::is_event));
    let body = calls[status_idx].body.as_ref().unwrap();
    assert_eq!(body["kind"], "MailCluster");
    assert!(body["status"].get("lastStress").is_none(), "never applies the stress Job's field");
    let now = stored(&fake, &mc);
    assert_eq!(now.status.as_ref().unwrap().phase, Some(mailcluster_api::Phase::Pending));
    assert_eq!(condition(&now, "Progressing").reason, "MigrationRunning");
    assert_eq!(now.status.as_ref().unwrap().observed_generation, Some(1));

    // The Job completes; next reconcile rolls out Deployments and records the image.
    complete_job(&fake, &job);
    let action = run(&fake, &now).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let calls = fake.take_calls();
    let applied = applies(&calls);
    for d in ["deployments/mail-smtp", "deployments/mail-submission", "deployments/mail-imap"] {
        assert!(applied.contains(&d.to_string()), "{d} in {applied:?}");
    }
    for h in ["horizontalpodautoscalers/mail-imap", "poddisruptionbudgets/mail-imap"] {
        assert!(applied.contains(&h.to_string()), "{h}");
    }
    // Apply order: the Job before the Deployments it gates.
    let job_pos = applied.iter().position(|a| a.starts_with("jobs/")).unwrap();
    let dep_pos = applied.iter().position(|a| a.starts_with("deployments/")).unwrap();
    assert!(job_pos < dep_pos);
    let now = stored(&fake, &now);
    let st = now.status.as_ref().unwrap();
    assert_eq!(st.phase, Some(mailcluster_api::Phase::Running));
    assert_eq!(st.migrated_image.as_deref(), Some("ghcr.io/mailcluster/mailcluster:0.1.0"));
    assert_eq!(st.smtp.as_ref().unwrap().ready_replicas, 2);
    assert_eq!(st.imap.as_ref().unwrap().max_replicas, Some(6));
    assert!(st.pop3.is_none());
    assert_eq!(condition(&now, "Ready").status, "True");
    assert_eq!(condition(&now, "Progressing").reason, "Stable");
    assert_eq!(condition(&now, "Degraded").status, "False");
    assert_eq!(condition(&now, "SLOMet").status, "Unknown");
    // Transitions were announced.
    let events: Vec<&Call> =
        calls.iter().filter(|c| c.method == "POST" && c.path.contains("/events")).collect();
    assert!(events.iter().any(|e| e.body.as_ref().unwrap()["reason"] == "AllProtocolsServing"), "{events:?}");

    // Third reconcile with nothing changed: same applies, no status write, no events.
    let ready_since = condition(&now, "Ready").last_transition_time.clone();
    run(&fake, &now).await;
    let calls = fake.take_calls();
    assert!(!calls.iter().any(|c| c.path.ends_with("/status")), "unchanged status is not rewritten");
    assert!(!calls.iter().any(Call::is_event));
    assert!(!calls.iter().any(|c| c.method == "DELETE"));
    assert_eq!(condition(&stored(&fake, &now), "Ready").last_transition_time, ready_since);
}

async fn running(fake: &FakeApi, mc: &MailCluster) -> MailCluster {
    run(fake, mc).await;
    complete_job(fake, &mailcluster_operator::build::migration_job_name(mc));
    let now = stored(fake, mc);
    run(fake, &now).await;
    fake.take_calls();
    stored(fake, mc)
}

#[tokio::test]
async fn spec_change_updates_children_and_deletes_orphans() {
    let fake = fake_with_secrets();
    let mc = running(&fake, &fixture("minimal")).await;
    // A CronJob-spawned Job carries no owner reference to us: never deleted.
    fake.put(
        JOBS,
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "mail-stress-2911", "namespace": "mail",
               "labels": {"app.kubernetes.io/managed-by": "mailcluster-operator", "mailcluster.dev/cluster": "mail"},
               "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "mail-stress", "uid": "other", "controller": true}]}}),
    );

    let mut changed = mc.clone();
    changed.spec.submission.enabled = false;
    changed.spec.imap.max_connections = 777;
    changed.metadata.generation = Some(2);
    run(&fake, &changed).await;
    let calls = fake.take_calls();
    let applied = applies(&calls);
    assert!(!applied.iter().any(|a| a.contains("submission")), "{applied:?}");
    let imap = calls.iter().find(|c| c.is("PATCH", "/configmaps/mail-config")).unwrap();
    assert!(
        imap.body.as_ref().unwrap()["data"]["imap.toml"].as_str().unwrap().contains("max_connections = 777")
    );

    let deleted: Vec<&str> = calls.iter().filter(|c| c.method == "DELETE").map(|c| c.path.as_str()).collect();
    assert_eq!(
        deleted,
        [
            "/api/v1/namespaces/mail/services/mail-submission",
            "/apis/apps/v1/namespaces/mail/deployments/mail-submission",
            "/apis/autoscaling/v2/namespaces/mail/horizontalpodautoscalers/mail-submission",
            "/apis/policy/v1/namespaces/mail/poddisruptionbudgets/mail-submission",
        ]
    );
    let del = calls.iter().find(|c| c.method == "DELETE").unwrap();
    assert_eq!(del.body.as_ref().unwrap()["propagationPolicy"], "Background");
    assert!(fake.names(JOBS).contains(&"mail-stress-2911".to_string()));
    assert!(!fake.names(DEPLOYS).contains(&"mail-submission".to_string()));
    assert!(!fake.names(SERVICES).contains(&"mail-submission".to_string()));
    assert!(!fake.names(HPAS).contains(&"mail-submission".to_string()));
    let now = stored(&fake, &changed);
    assert!(now.status.as_ref().unwrap().submission.is_none());
    assert_eq!(now.status.as_ref().unwrap().observed_generation, Some(2));

    // New image: the old Deployments stay on the old image until the new migration Job completes.
    let mut upgraded = now.clone();
    upgraded.spec.image.tag = "0.2.0".into();
    run(&fake, &upgraded).await;
    let calls = fake.take_calls();
    let new_job = mailcluster_operator::build::migration_job_name(&upgraded);
    assert!(applies(&calls).contains(&format!("jobs/{new_job}")));
    let dep = calls.iter().find(|c| c.is("PATCH", "/deployments/mail-smtp")).unwrap();
    let image = &dep.body.as_ref().unwrap()["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(image, "ghcr.io/mailcluster/mailcluster:0.1.0");
    // The old migration Job is no longer wanted.
    let old_job = mailcluster_operator::build::migration_job_name(&mc);
    assert!(calls.iter().any(|c| c.method == "DELETE" && c.path.ends_with(&format!("/jobs/{old_job}"))));
    let held = stored(&fake, &upgraded);
    assert_eq!(held.status.as_ref().unwrap().phase, Some(mailcluster_api::Phase::Migrating));

    complete_job(&fake, &new_job);
    run(&fake, &held).await;
    let calls = fake.take_calls();
    let dep = calls.iter().find(|c| c.is("PATCH", "/deployments/mail-smtp")).unwrap();
    let image = &dep.body.as_ref().unwrap()["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(image, "ghcr.io/mailcluster/mailcluster:0.2.0");
}

#[tokio::test]
async fn invalid_spec_sets_degraded_and_builds_nothing() {
    let fake = fake_with_secrets();
    let mc = fixture("invalid");
    let action = run(&fake, &mc).await;
    assert_eq!(action, Action::await_change());
    let calls = fake.take_calls();
    let writes: Vec<&Call> = calls.iter().filter(|c| !c.is_event()).collect();
    assert_eq!(writes.len(), 1, "only the status patch: {writes:?}");
    assert!(writes[0].is("PATCH", "/mailclusters/broken/status"));
    let now = stored(&fake, &mc);
    let d = condition(&now, "Degraded");
    assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "InvalidSpec"));
    assert!(d.message.contains("tls: set exactly one"), "{}", d.message);
    assert_eq!(now.status.as_ref().unwrap().phase, Some(mailcluster_api::Phase::Degraded));
    let warning = calls.iter().find(|c| c.is_event()).expect("event");
    assert_eq!(warning.body.as_ref().unwrap()["type"], "Warning");
}

#[tokio::test]
async fn budget_capping_is_reported() {
    let fake = fake_with_secrets();
    let mut mc = fixture("minimal");
    // 70 − 10 reserved − 2 migration = 58 → 14 pods of 4 for 3 × (6 + 1) asked.
    mc.spec.postgres.max_connections = 70;
    run(&fake, &mc).await;
    let calls = fake.take_calls();
    let capped = calls
        .iter()
        .filter(|c| c.is_event())
        .filter_map(|c| c.body.clone())
        .find(|b| b["reason"] == "ConnectionBudgetCapped")
        .expect("capping announced in an event");
    assert_eq!(capped["type"], "Warning");
    assert!(capped["note"].as_str().unwrap().contains("smtp maxReplicas 6→4"), "{capped}");

    let mc = running(&fake, &stored(&fake, &mc)).await;
    let d = condition(&mc, "Degraded");
    assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "ConnectionBudgetCapped"));
    assert!(d.message.contains("smtp maxReplicas 6→4"), "{}", d.message);
    let max = |name: &str| {
        let h: k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler =
            serde_json::from_value(fake.get(HPAS, name).unwrap()).unwrap();
        h.spec.unwrap().max_replicas
    };
    assert_eq!([max("mail-smtp"), max("mail-submission"), max("mail-imap")], [4, 4, 3]);
    assert_eq!(mc.status.as_ref().unwrap().imap.as_ref().unwrap().max_replicas, Some(3));
}

#[tokio::test]
async fn paused_changes_no_children() {
    let fake = fake_with_secrets();
    let mc = running(&fake, &fixture("minimal")).await;
    let mut paused = mc.clone();
    paused.spec.paused = true;
    paused.spec.submission.enabled = false;
    let action = run(&fake, &paused).await;
    assert_eq!(action, Action::await_change());
    let calls = fake.take_calls();
    assert!(applies(&calls).is_empty());
    assert!(!calls.iter().any(|c| c.method == "DELETE"));
    assert!(fake.names(DEPLOYS).contains(&"mail-submission".to_string()));
    let now = stored(&fake, &paused);
    let p = condition(&now, "Progressing");
    assert_eq!((p.status.as_str(), p.reason.as_str()), ("False", "Paused"));
    assert_eq!(condition(&now, "Ready").status, "True", "readiness as last observed");
    assert_eq!(now.status.as_ref().unwrap().phase, Some(mailcluster_api::Phase::Paused));
}

#[tokio::test]
async fn missing_secret_blocks_and_retries() {
    let fake = FakeApi::new();
    fake.put(&format!("{NS}/secrets"), secret("mail-db", "wrong-key"));
    let mc = fixture("minimal");
    let action = run(&fake, &mc).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    let calls = fake.take_calls();
    assert!(applies(&calls).is_empty());
    let now = stored(&fake, &mc);
    let d = condition(&now, "Degraded");
    assert_eq!(d.reason, "SecretMissing");
    assert!(d.message.contains("Secret mail-db has no key url"), "{}", d.message);
    assert!(d.message.contains("Secret mail-redis not found"), "{}", d.message);
}

#[tokio::test]
async fn slo_condition_follows_last_stress() {
    let fake = fake_with_secrets();
    let mc = running(&fake, &fixture("minimal")).await;
    // The stress Job reports a failed run.
    let mut obj = fake.get(MC, "mail").unwrap();
    obj["status"]["lastStress"] = json!({"verdict": "Fail", "job": "mail-stress-1",
                                         "startedAt": "2026-11-30T03:00:00Z", "finishedAt": "2026-11-30T03:10:00Z",
                                         "successRate": 99.99, "p95Ms": {"smtp.deliver": 180.0}});
    fake.put(MC, obj.clone());
    let mc2: MailCluster = serde_json::from_value(obj).unwrap();
    run(&fake, &mc2).await;
    let now = stored(&fake, &mc);
    let slo = condition(&now, "SLOMet");
    assert_eq!((slo.status.as_str(), slo.reason.as_str()), ("False", "StressFailed"));
    assert!(slo.message.contains("smtp.deliver p95 180ms"), "{}", slo.message);
    assert_eq!(
        now.status.as_ref().unwrap().last_stress.as_ref().unwrap().job.as_deref(),
        Some("mail-stress-1")
    );
}
