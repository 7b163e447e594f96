//! Reconcile against a mock API server (`tower_test::mock`), for what a real API
//! server does not show or cannot be made to do: the exact request stream of one
//! reconcile (apply order, no status write when nothing changed), and faults —
//! server errors, conflicts, refusals, answers that never come. Everything the API
//! server decides is tested against a real one (controller_real.rs).
//!
//! The mock is a small in-memory apiserver: it stores what is applied, serves gets and
//! label-filtered lists, deletes, records every call, and fails the calls a test asks
//! it to fail.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use mailcluster_api::MailCluster;
use mailcluster_operator::image::ImageAllowlist;
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
    /// (method, path suffix) → the fault to answer with instead of serving.
    faults: Vec<(String, String, Fault)>,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// An error Status with this code.
    Code(u16),
    /// No answer at all (a hung connection or an overloaded apiserver).
    Hang,
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

    fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.0.lock().unwrap().calls)
    }

    fn fail(&self, method: &str, path_suffix: &str, fault: Fault) {
        self.0.lock().unwrap().faults.push((method.into(), path_suffix.into(), fault));
    }

    fn fault_for(&self, method: &str, path: &str) -> Option<Fault> {
        let st = self.0.lock().unwrap();
        st.faults.iter().find(|(m, p, _)| m == method && path.ends_with(p.as_str())).map(|f| f.2)
    }

    fn handle(&self, method: &str, path: &str, query: &str, body: Option<Value>) -> (u16, Value) {
        let mut st = self.0.lock().unwrap();
        st.calls.push(Call {
            method: method.into(),
            path: path.into(),
            query: query.into(),
            body: body.clone(),
        });
        if let Some((_, _, Fault::Code(code))) =
            st.faults.iter().find(|(m, p, _)| m == method && path.ends_with(p.as_str()))
        {
            let code = *code;
            if code == 404 {
                return not_found(path.rsplit('/').next().unwrap_or_default());
            }
            return (
                code,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": format!("injected {code}"), "reason": "Injected", "code": code}),
            );
        }
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
            // Creation: stored, unless the name is taken (events are only recorded).
            ("POST", None) if !path.contains("/events") => {
                let body = body.unwrap_or(Value::Null);
                let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let key = (collection, name.clone());
                if st.objects.contains_key(&key) {
                    return (
                        409,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": format!("\"{name}\" already exists"), "reason": "AlreadyExists", "code": 409}),
                    );
                }
                st.objects.insert(key, body.clone());
                (201, body)
            }
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
                if let Some(Fault::Hang) = me.fault_for(&method, &path) {
                    // Never answered: the response sender is kept, not dropped (a
                    // dropped one would read as a closed connection).
                    me.handle(&method, &path, &query, body);
                    std::mem::forget(send);
                    continue;
                }
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
    // The cluster's keys: looked for, then made.
    assert!(calls[2].is("GET", "/secrets/mail-keys"));
    assert!(calls[3].is("POST", "/secrets"));
    assert!(calls[4].is("GET", &format!("/jobs/{job}")));
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
            // Before there is any pod to guard.
            "networkpolicies/mail".into(),
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

/// A mail pod the kubelet refused for a sysctl of `spec.tuning` turns
/// SysctlsAllowed False with the kubelet's words, and a Warning event says so;
/// an operator that may not list pods says it cannot tell, and carries on.
#[tokio::test]
async fn a_pod_refused_for_a_sysctl_shows_in_sysctls_allowed() {
    let fake = fake_with_secrets();
    let mut mc = fixture("minimal");
    mc.spec.tuning = Some(mailcluster_api::TuningSpec { somaxconn: Some(8192), ..Default::default() });
    run(&fake, &mc).await;
    complete_job(&fake, &mailcluster_operator::build::migration_job_name(&mc));
    let kubelet = "Pod was rejected: forbidden sysctl: \"net.core.somaxconn\" not allowlisted";
    let mut labels = mailcluster_operator::names::all_pods_selector(&mc);
    labels.insert("app.kubernetes.io/component".into(), "smtp".into());
    fake.put(
        &format!("{NS}/pods"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "mail-smtp-5f7d-abcde", "namespace": "mail", "labels": labels,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "mailcluster"}],
                     "securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "8192"}]}},
            "status": {"phase": "Failed", "reason": "SysctlForbidden", "message": kubelet},
        }),
    );
    let now = stored(&fake, &mc);
    fake.take_calls();
    run(&fake, &now).await;
    let calls = fake.take_calls();
    let pods = calls.iter().find(|c| c.is("GET", "/namespaces/mail/pods")).expect("the mail pods are listed");
    let selector = query_param(&pods.query, "labelSelector").unwrap();
    assert!(selector.contains("mailcluster.dev/role=server"), "{selector}");
    let now = stored(&fake, &now);
    let allowed = condition(&now, "SysctlsAllowed");
    assert_eq!((allowed.status.as_str(), allowed.reason.as_str()), ("False", "SysctlForbidden"));
    assert!(allowed.message.starts_with(&format!("pod mail-smtp-5f7d-abcde on node node-1: {kubelet}")));
    assert_eq!(condition(&now, "Degraded").reason, "SysctlForbidden");
    let warned = calls.iter().filter(|c| c.method == "POST" && c.is_event()).any(|e| {
        let body = e.body.as_ref().unwrap();
        body["reason"] == "SysctlForbidden" && body["type"] == "Warning"
    });
    assert!(warned, "a Warning event names the refusal");

    // An older Role without pods: the condition is Unknown and nothing fails.
    fake.fail("GET", "/namespaces/mail/pods", Fault::Code(403));
    run(&fake, &now).await;
    let now = stored(&fake, &now);
    assert_eq!(condition(&now, "SysctlsAllowed").status, "Unknown");
    assert_eq!(condition(&now, "Ready").status, "True");
}

/// One reconcile that is expected to fail: its error and the failures metric.
async fn run_failing(fake: &FakeApi, mc: &MailCluster) -> (mailcluster_operator::reconcile::Error, Metrics) {
    fake.put(MC, serde_json::to_value(mc).unwrap());
    let metrics = Metrics::new();
    let ctx = Arc::new(Context::new(fake.client(), metrics.clone(), Capabilities::default()));
    let err = tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(mc.clone()), ctx))
        .await
        .expect("reconcile finishes")
        .expect_err("reconcile fails");
    (err, metrics)
}

#[tokio::test]
async fn a_server_error_on_apply_fails_the_reconcile_before_any_status() {
    let fake = fake_with_secrets();
    fake.fail("PATCH", "/configmaps/mail-config", Fault::Code(500));
    let (err, metrics) = run_failing(&fake, &fixture("minimal")).await;
    assert_eq!(err.reason(), "api");
    assert!(metrics.render().contains(r#"mailcluster_operator_reconcile_failures_total{reason="api"} 1"#));
    // A status written now would claim progress nothing made: none is.
    let calls = fake.take_calls();
    assert!(!calls.iter().any(|c| c.path.ends_with("/status")), "{:?}", applies(&calls));
}

#[tokio::test]
async fn conflicts_and_refusals_are_told_apart() {
    for (code, reason) in [(409, "conflict"), (403, "forbidden"), (422, "invalid")] {
        let fake = fake_with_secrets();
        fake.fail("PATCH", "/mailclusters/mail/status", Fault::Code(code));
        let (err, metrics) = run_failing(&fake, &fixture("minimal")).await;
        assert_eq!(err.reason(), reason, "{code}");
        let line = format!(r#"mailcluster_operator_reconcile_failures_total{{reason="{reason}"}} 1"#);
        assert!(metrics.render().contains(&line), "{code}: {}", metrics.render());
    }
}

#[tokio::test]
async fn failed_reconciles_back_off_per_object() {
    use mailcluster_operator::reconcile::{backoff, error_policy};
    let fake = fake_with_secrets();
    fake.fail("GET", "/secrets/mail-db", Fault::Code(503));
    let mc = Arc::new(fixture("minimal"));
    fake.put(MC, serde_json::to_value(&*mc).unwrap());
    let ctx = Arc::new(Context::new(fake.client(), Metrics::new(), Capabilities::default()));
    let mut delays = Vec::new();
    for _ in 0..4 {
        let err = reconcile(mc.clone(), ctx.clone()).await.expect_err("the Secret read fails");
        delays.push(error_policy(mc.clone(), &err, ctx.clone()));
    }
    let want: Vec<Action> = (1..=4).map(|n| Action::requeue(backoff(n))).collect();
    assert_eq!(delays, want);
    assert_eq!(backoff(1), Duration::from_secs(5));
    assert_eq!(backoff(30), Duration::from_secs(300), "capped");
}

#[tokio::test]
async fn an_apiserver_that_never_answers_holds_one_reconcile_not_the_process() {
    let fake = fake_with_secrets();
    fake.fail("PATCH", "/configmaps/mail-config", Fault::Hang);
    let mc = fixture("minimal");
    fake.put(MC, serde_json::to_value(&mc).unwrap());
    let ctx = Arc::new(Context::new(fake.client(), Metrics::new(), Capabilities::default()));
    let stuck = tokio::spawn(reconcile(Arc::new(mc.clone()), ctx.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stuck.is_finished(), "waits for the answer");
    // Another MailCluster is served meanwhile (the controller runs reconciles of
    // different objects concurrently; a hung call must not hold shared state).
    let mut other = mc.clone();
    other.metadata.name = Some("other".into());
    fake.put(MC, serde_json::to_value(&other).unwrap());
    // Its own ConfigMap has another name, so it is not hung; it completes.
    let other = tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(other), ctx.clone())).await;
    assert!(other.is_ok(), "a second reconcile completes while the first hangs");
    stuck.abort();
}

const SECRETS: &str = "/api/v1/namespaces/mail/secrets";

async fn run_with(fake: &FakeApi, mc: &MailCluster, ctx: Context) -> Action {
    fake.put(MC, serde_json::to_value(mc).unwrap());
    tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(mc.clone()), Arc::new(ctx)))
        .await
        .expect("reconcile finishes")
        .expect("reconcile succeeds")
}

/// Calls that create, change or delete anything but the MailCluster's status
/// and events.
fn writes(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.method != "GET" && !c.is_event() && !c.path.ends_with("/status"))
        .map(|c| format!("{} {}", c.method, c.path))
        .collect()
}

#[tokio::test]
async fn an_image_outside_the_allowlist_gets_nothing_created_or_changed() {
    let evil = "ghcr.io/mailcluster/mailcluster-evil";
    // A new cluster asking for it: nothing is made, not even its keys.
    let fake = fake_with_secrets();
    let mut mc = fixture("minimal");
    mc.spec.image.repository = evil.into();
    let action = run(&fake, &mc).await;
    assert_eq!(action, Action::await_change(), "retrying cannot help; a spec change or restart will");
    let calls = fake.take_calls();
    assert_eq!(writes(&calls), Vec::<String>::new());
    let now = stored(&fake, &mc);
    for t in ["Ready", "Degraded", "Progressing"] {
        let c = condition(&now, t);
        assert_eq!(c.reason, "ImageNotAllowed", "{t}");
        assert!(c.message.contains(&format!("{evil}:0.1.0")), "{t}: names the image: {}", c.message);
        assert!(
            c.message.contains("ghcr.io/mailcluster/mailcluster"),
            "{t}: names the allowlist: {}",
            c.message
        );
    }
    assert_eq!(condition(&now, "Ready").status, "False");
    assert_eq!(condition(&now, "Degraded").status, "True");
    assert_eq!(now.status.as_ref().unwrap().phase, Some(mailcluster_api::Phase::Degraded));
    assert!(
        calls
            .iter()
            .any(|c| c.is_event() && c.body.as_ref().is_some_and(|b| b["reason"] == "ImageNotAllowed")),
        "announced"
    );

    // A running cluster switched to it: its objects stay as they are.
    let fake = fake_with_secrets();
    let mc = fixture("minimal");
    run(&fake, &mc).await;
    complete_job(&fake, &mailcluster_operator::build::migration_job_name(&mc));
    run(&fake, &stored(&fake, &mc)).await;
    let deployments = "/apis/apps/v1/namespaces/mail/deployments";
    let running = fake.get(deployments, "mail-smtp").expect("deployed")["spec"]["template"].clone();
    fake.take_calls();
    let mut changed = stored(&fake, &mc);
    changed.spec.image.repository = evil.into();
    changed.metadata.generation = Some(2);
    run(&fake, &changed).await;
    assert_eq!(writes(&fake.take_calls()), Vec::<String>::new(), "nothing applied or deleted");
    assert_eq!(
        fake.get(deployments, "mail-smtp").unwrap()["spec"]["template"],
        running,
        "pods keep their image"
    );
    assert_eq!(condition(&stored(&fake, &changed), "Degraded").reason, "ImageNotAllowed");

    // The operator told to trust another registry runs that one, and only it.
    let ctx = || {
        let allowed = ImageAllowlist::parse_list("registry.example.com:5000/mail/").unwrap();
        Context::new(fake.client(), Metrics::new(), Capabilities::default()).with_allowed_images(allowed)
    };
    let mut moved = stored(&fake, &changed);
    moved.spec.image.repository = "registry.example.com:5000/mail/mailcluster".into();
    moved.metadata.generation = Some(3);
    run_with(&fake, &moved, ctx()).await;
    assert!(!writes(&fake.take_calls()).is_empty(), "applied");
    assert_eq!(condition(&stored(&fake, &moved), "Degraded").status, "False");
    let mut back = stored(&fake, &moved);
    back.spec.image.repository = "ghcr.io/mailcluster/mailcluster".into();
    back.metadata.generation = Some(4);
    run_with(&fake, &back, ctx()).await;
    assert_eq!(writes(&fake.take_calls()), Vec::<String>::new());
    assert_eq!(condition(&stored(&fake, &back), "Degraded").reason, "ImageNotAllowed");
}

#[tokio::test]
async fn the_keys_secret_is_created_once_and_never_overwritten() {
    let fake = fake_with_secrets();
    let mc = fixture("minimal");
    run(&fake, &mc).await;
    let calls = fake.take_calls();
    let created: Vec<&Call> = calls.iter().filter(|c| c.is("POST", "/secrets")).collect();
    assert_eq!(created.len(), 1);
    let secret = fake.get(SECRETS, "mail-keys").expect("created");
    let data = secret["data"].as_object().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["cache-mac-key", "group-commit-key"]);
    let owner = &secret["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str()),
        (Some("MailCluster"), mc.metadata.uid.as_deref())
    );
    assert_eq!(owner["controller"], true, "goes with the MailCluster");

    // Every later reconcile finds it and leaves it alone.
    for _ in 0..3 {
        run(&fake, &stored(&fake, &mc)).await;
        let calls = fake.take_calls();
        assert!(calls.iter().any(|c| c.is("GET", "/secrets/mail-keys")));
        let touched: Vec<String> = writes(&calls).into_iter().filter(|w| w.contains("/secrets")).collect();
        assert!(touched.is_empty(), "{touched:?}");
        assert_eq!(fake.get(SECRETS, "mail-keys").unwrap(), secret, "same keys");
    }

    // One made by someone else with those keys is used as it is.
    let fake = fake_with_secrets();
    let theirs = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mail-keys", "namespace": "mail"},
                        "data": {"group-commit-key": "b3Vycw==", "cache-mac-key": "b3Vycw=="}});
    fake.put(SECRETS, theirs.clone());
    run(&fake, &mc).await;
    assert!(writes(&fake.take_calls()).iter().all(|w| !w.contains("/secrets")));
    assert_eq!(fake.get(SECRETS, "mail-keys").unwrap(), theirs);

    // One without a key the pods need: reported, not rewritten, no pods built.
    let fake = fake_with_secrets();
    let partial = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mail-keys", "namespace": "mail"},
                         "data": {"group-commit-key": "b3Vycw=="}});
    fake.put(SECRETS, partial.clone());
    run(&fake, &mc).await;
    assert_eq!(writes(&fake.take_calls()), Vec::<String>::new());
    assert_eq!(fake.get(SECRETS, "mail-keys").unwrap(), partial);
    let now = stored(&fake, &mc);
    assert_eq!(condition(&now, "Degraded").reason, "SecretMissing");
    assert!(condition(&now, "Degraded").message.contains("mail-keys has no key cache-mac-key"));

    // Created by another reconcile between our look and our create: theirs stands.
    let fake = fake_with_secrets();
    fake.fail("GET", "/secrets/mail-keys", Fault::Code(404));
    fake.put(SECRETS, theirs.clone());
    run(&fake, &mc).await;
    assert_eq!(fake.get(SECRETS, "mail-keys").unwrap(), theirs);
}
