//! Mailcluster on a real Kubernetes control plane (`scripts/kube-up.sh`: etcd,
//! kube-apiserver, kube-controller-manager and kube-scheduler built from the
//! release's Go modules). Everything the API server decides is decided here by the
//! API server itself: CRD structural and CEL validation (and its cost budget),
//! server-side apply, RBAC, owner-reference garbage collection, Leases.
//!
//! The cluster has no node yet: pods are scheduled nowhere and never start. Where a
//! step needs a pod to have run (the schema migration Job), the test plays the
//! kubelet and reports the pod's outcome through the API, as a kubelet would; the real
//! job and deployment controllers take it from there.
//!
//! Clients are `kubectl` and Helm (Helm 4's SDK from PyPI `helm-python-sdk`, via
//! scripts/install_checks.py). The operator is the `mailcluster operator` process,
//! authenticated with a token of the chart's ServiceAccount: no admin credentials.
//!
//! The cluster is found through `MAILCLUSTER_TEST_KUBECONFIG` (scripts/test.sh starts
//! one and sets it). Without it the tests are skipped locally and fail under `CI`.

mod common;

use common::redis::free_port;
use common::wire::http_get;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CRD: &str = "mailclusters.mailcluster.dev";
/// Upper bound of every wait on a controller: generous, since a cold apiserver on a
/// loaded two-core machine answers slowly.
const WAIT: Duration = Duration::from_secs(90);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The admin kubeconfig of the test cluster, or None (skip) outside CI.
fn kubeconfig() -> Option<String> {
    match std::env::var("MAILCLUSTER_TEST_KUBECONFIG") {
        Ok(p) if Path::new(&p).exists() => Some(p),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "MAILCLUSTER_TEST_KUBECONFIG is not set or missing under CI: scripts/test.sh starts the cluster"
            )
        }
        _ => {
            eprintln!("skipped: no MAILCLUSTER_TEST_KUBECONFIG (run scripts/kube-up.sh, or scripts/test.sh)");
            None
        }
    }
}

struct Kube {
    kubeconfig: String,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kube {
    fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut cmd = Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl on PATH");
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    }

    fn kubectl(&self, args: &[&str]) -> Out {
        self.kubectl_in(args, None)
    }

    /// Runs kubectl and requires success.
    fn must(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        assert!(o.ok, "kubectl {args:?} failed:\n{}\n{}", o.stdout, o.stderr);
        o.stdout
    }

    fn must_in(&self, args: &[&str], stdin: &str) -> String {
        let o = self.kubectl_in(args, Some(stdin));
        assert!(o.ok, "kubectl {args:?} failed:\n{}\n{}", o.stdout, o.stderr);
        o.stdout
    }

    /// The object as JSON, or None when it does not exist.
    fn get(&self, ns: &str, what: &str) -> Option<Value> {
        let o = self.kubectl(&["get", "-n", ns, what, "-o", "json"]);
        if !o.ok {
            assert!(o.stderr.contains("NotFound"), "kubectl get {what}: {}", o.stderr);
            return None;
        }
        Some(serde_json::from_str(&o.stdout).expect("kubectl JSON"))
    }

    /// Names of the objects of `kind` in `ns`, sorted.
    fn names(&self, ns: &str, kind: &str) -> Vec<String> {
        let out = self.must(&["get", "-n", ns, kind, "-o", "jsonpath={.items[*].metadata.name}"]);
        let mut v: Vec<String> = out.split_whitespace().map(String::from).collect();
        v.sort();
        v
    }

    fn python(&self, args: &[&str], stdin: &str) -> String {
        let mut child = Command::new("python3")
            .arg(root().join("scripts/install_checks.py"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "install_checks.py {args:?} failed:\n{o}\n{e}");
        o.into()
    }
}

/// Polls `f` until it returns Some, at most [`WAIT`].
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {WAIT:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A name of this run, as a Kubernetes object name may be spelt (no underscores).
fn unique(prefix: &str) -> String {
    common::unique(prefix).replace('_', "-")
}

/// `manifests/install.yaml` applied server-side (once per test process; idempotent
/// across processes) and the CRD Established.
fn installed() -> Option<Kube> {
    static ONCE: OnceLock<()> = OnceLock::new();
    let kube = Kube { kubeconfig: kubeconfig()? };
    ONCE.get_or_init(|| {
        let file = root().join("manifests/install.yaml");
        // --force-conflicts: on a cluster kept from an earlier run this is an
        // upgrade, and the CRD's version list (an atomic field) is owned by whoever
        // applied the previous one — as it is for a user upgrading (docs/quickstart.md).
        kube.must(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=install-test",
            "-f",
            file.to_str().unwrap(),
        ]);
        kube.must(&["wait", "--for=condition=Established", &format!("crd/{CRD}"), "--timeout=60s"]);
    });
    Some(kube)
}

/// A namespace deleted (without waiting) when the test ends, failed or not.
struct Namespace<'a> {
    kube: &'a Kube,
    name: String,
}

impl<'a> Namespace<'a> {
    fn create(kube: &'a Kube, prefix: &str) -> Namespace<'a> {
        let name = unique(prefix);
        kube.must(&["create", "namespace", &name]);
        Namespace { kube, name }
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self.kube.kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

#[test]
fn install_yaml_and_every_sample_are_accepted() {
    let Some(kube) = installed() else { return };

    // A second server-side apply under another field manager (Argo CD after
    // kubectl, or a person after CI) shares the fields instead of conflicting: the
    // file states every field of an atomic value the apiserver would complete.
    let file = root().join("manifests/install.yaml");
    kube.must(&["apply", "--server-side", "--field-manager=install-test-2", "-f", file.to_str().unwrap()]);

    // Every object of install.yaml exists as applied.
    let text = std::fs::read_to_string(root().join("manifests/install.yaml")).unwrap();
    for doc in text.split("\n---\n") {
        let v: Value = serde_yaml_ng::from_str(doc).unwrap();
        if v.is_null() {
            continue;
        }
        let kind = v["kind"].as_str().unwrap();
        let name = v["metadata"]["name"].as_str().unwrap();
        let ns = v["metadata"]["namespace"].as_str().unwrap_or("default");
        assert!(kube.get(ns, &format!("{kind}/{name}")).is_some(), "{kind}/{name} of install.yaml");
    }
    let crd = kube.get("default", &format!("crd/{CRD}")).unwrap();
    let conditions = crd["status"]["conditions"].as_array().unwrap();
    let established = conditions.iter().find(|c| c["type"] == "Established").unwrap();
    assert_eq!(established["status"], "True");
    let names_accepted = conditions.iter().find(|c| c["type"] == "NamesAccepted").unwrap();
    assert_eq!(names_accepted["status"], "True");

    // Samples: the apiserver runs admission, structural and CEL validation on each
    // (server dry run: nothing is persisted, so no operator acts on them).
    let ns = Namespace::create(&kube, "samples");
    let mut seen = 0;
    for entry in std::fs::read_dir(root().join("manifests/samples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        // A sample that names its namespace is applied there (created if missing),
        // the others into the test's namespace.
        let text = std::fs::read_to_string(&path).unwrap();
        let named = text.split("\n---\n").find_map(|doc| {
            let v: Value = serde_yaml_ng::from_str(doc).ok()?;
            v["metadata"]["namespace"].as_str().map(String::from)
        });
        let target = match named {
            Some(n) => {
                let _ = kube.kubectl(&["create", "namespace", &n]);
                n
            }
            None => ns.name.clone(),
        };
        let out = kube.must(&[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-n",
            &target,
            "-f",
            path.to_str().unwrap(),
        ]);
        assert!(out.contains("serverside-applied (server dry run)"), "{}: {out}", path.display());
        seen += 1;
    }
    assert!(seen >= 4, "samples found: {seen}");
}

/// A MailCluster valid in every respect, as JSON, to which each case adds one fault.
fn valid_cluster(name: &str) -> Value {
    json!({
        "apiVersion": "mailcluster.dev/v1alpha1",
        "kind": "MailCluster",
        "metadata": {"name": name},
        "spec": {
            "image": {"tag": "0.1.0"},
            "domains": ["example.com", "example.org"],
            "postgres": {"urlSecretRef": {"name": "mail-db"}, "poolSize": 10, "maxConnections": 100},
            "redis": {"urlSecretRef": {"name": "mail-redis"}, "keyPrefix": "mc1"},
            "autoscaling": {"minReplicas": 2, "maxReplicas": 4},
            "smtp": {"service": {"ports": [{"name": "smtp", "port": 25}]}},
            "tls": {"secretName": "mail-tls"},
            "proxyProtocol": {"enabled": true, "trustedCidrs": ["10.0.0.0/8"]},
            "stress": {"slo": {"successRate": 99.9}},
        }
    })
}

/// Merges `patch` into `base` (JSON merge patch semantics, enough for these cases).
fn merged(mut base: Value, patch: &Value) -> Value {
    fn merge(a: &mut Value, b: &Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    if v.is_null() {
                        a.remove(k);
                    } else {
                        merge(a.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
            (a, b) => *a = b.clone(),
        }
    }
    merge(&mut base, patch);
    base
}

#[test]
fn every_cel_rule_rejects_its_violation_with_its_message() {
    let Some(kube) = installed() else { return };
    let ns = Namespace::create(&kube, "cel");

    // The rules as the apiserver serves them: every message must be exercised below.
    let crd = kube.get("default", &format!("crd/{CRD}")).unwrap();
    let mut rules = std::collections::BTreeSet::new();
    fn collect(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(rs)) = m.get("x-kubernetes-validations") {
                    for r in rs {
                        out.insert(r["message"].as_str().unwrap().to_string());
                    }
                }
                m.values().for_each(|x| collect(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
            _ => {}
        }
    }
    collect(&crd["spec"]["versions"], &mut rules);
    assert!(rules.len() >= 8, "rules: {rules:?}");

    let create = |obj: &Value| {
        kube.kubectl_in(&["create", "--dry-run=server", "-n", &ns.name, "-f", "-"], Some(&obj.to_string()))
    };
    let base = valid_cluster("cel");
    let o = create(&base);
    assert!(o.ok, "the valid base is accepted: {}", o.stderr);

    let ports = |a: &str, pa: i32, b: &str, pb: i32| json!({"service": {"ports": [{"name": a, "port": pa}, {"name": b, "port": pb}]}});
    let cases: Vec<(&str, Value)> = vec![
        (
            "domains must be unique",
            json!({"spec": {"domains": ["example.com", "example.org", "example.com"]}}),
        ),
        (
            "one DKIM key per domain",
            json!({"spec": {"dkim": [
                {"domain": "example.com", "selector": "a", "secretName": "k1"},
                {"domain": "example.com", "selector": "b", "secretName": "k2"}
            ]}}),
        ),
        (
            "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            json!({"spec": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}),
        ),
        (
            "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            json!({"spec": {"imap": {"autoscaling": {"minReplicas": 3, "maxReplicas": 1}}}}),
        ),
        ("service ports must be unique", json!({"spec": {"smtp": ports("smtp", 25, "submission", 25)}})),
        ("each listener may be listed once", json!({"spec": {"imap": ports("imap", 143, "imap", 1143)}})),
        (
            "set exactly one of tls.secretName or tls.issuerRef",
            json!({"spec": {"tls": {"secretName": "a", "issuerRef": {"name": "le", "kind": "ClusterIssuer"}}}}),
        ),
        (
            "postgres.poolSize must not exceed postgres.maxConnections",
            json!({"spec": {"postgres": {"poolSize": 200, "maxConnections": 100}}}),
        ),
        (
            "proxyProtocol.trustedCidrs is required when enabled: a PROXY header from anyone lets clients forge their address",
            json!({"spec": {"proxyProtocol": {"enabled": true, "trustedCidrs": null}}}),
        ),
        (
            "stress.slo.successRate is a percentage (0..100)",
            json!({"spec": {"stress": {"slo": {"successRate": 120.0}}}}),
        ),
        (
            "set exactly one of filter.rspamd.url or filter.rspamd.deploy",
            json!({"spec": {"filter": {"rspamd": {"url": "http://rspamd:11334", "deploy": {"image": "rspamd/rspamd:3.12"}}}}}),
        ),
        (
            "set exactly one of filter.rspamd.url or filter.rspamd.deploy",
            json!({"spec": {"filter": {"rspamd": {}}}}),
        ),
        (
            "filter.rspamd.deploy makes its own password: leave passwordSecretRef unset",
            json!({"spec": {"filter": {"rspamd": {
                "deploy": {"image": "rspamd/rspamd:3.12"},
                "passwordSecretRef": {"name": "mine"}
            }}}}),
        ),
    ];
    let mut covered = std::collections::BTreeSet::new();
    for (message, patch) in &cases {
        let o = create(&merged(base.clone(), patch));
        assert!(!o.ok, "{message}: accepted {patch}");
        assert!(o.stderr.contains(message), "{patch}: want {message:?}, got: {}", o.stderr);
        covered.insert(message.to_string());
    }

    // Transition rule: needs a stored object to update.
    let stored = merged(base.clone(), &json!({"metadata": {"name": "immutable"}}));
    kube.must_in(&["create", "-n", &ns.name, "-f", "-"], &stored.to_string());
    let o = kube.kubectl(&[
        "patch",
        "-n",
        &ns.name,
        "mailcluster/immutable",
        "--type=merge",
        "-p",
        r#"{"spec":{"redis":{"keyPrefix":"other"}}}"#,
    ]);
    assert!(!o.ok && o.stderr.contains("redis.keyPrefix is immutable"), "{}", o.stderr);
    covered.insert("redis.keyPrefix is immutable".into());
    // An unrelated change passes the same rule.
    kube.must(&[
        "patch",
        "-n",
        &ns.name,
        "mailcluster/immutable",
        "--type=merge",
        "-p",
        r#"{"spec":{"paused":true}}"#,
    ]);

    let untested: Vec<&String> = rules.difference(&covered).collect();
    assert!(untested.is_empty(), "CEL rules without a violating case: {untested:?}");
}

/// The MailDomain and MailAccount CRDs' rules, read from the served CRDs like the
/// MailCluster's above: each has a violating case, creation or update.
#[test]
fn every_store_kind_cel_rule_rejects_its_violation() {
    let Some(kube) = installed() else { return };
    let ns = Namespace::create(&kube, "cel-store");
    let domain = json!({
        "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailDomain",
        "metadata": {"name": "d"},
        "spec": {"clusterRef": "mail", "domain": "example.com"}
    });
    let account = json!({
        "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailAccount",
        "metadata": {"name": "a"},
        "spec": {"clusterRef": "mail", "address": "a@example.com",
                 "passwordSecretRef": {"name": "a-pw", "key": "password"}}
    });
    for (crd, base, plural, field, bad, created, changed) in [
        (
            "maildomains.mailcluster.dev",
            &domain,
            "maildomain",
            "domain",
            "Example.COM",
            "domain must be a lower-case domain name",
            "domain is immutable: create another MailDomain",
        ),
        (
            "mailaccounts.mailcluster.dev",
            &account,
            "mailaccount",
            "address",
            "not-an-address",
            "address must be user@domain",
            "address is immutable: create another MailAccount",
        ),
    ] {
        let served = kube.get("default", &format!("crd/{crd}")).unwrap();
        let text = served["spec"]["versions"].to_string();
        for message in [created, changed] {
            assert!(text.contains(message), "{crd} serves no rule {message:?}");
        }
        let o = kube.kubectl_in(
            &["create", "--dry-run=server", "-n", &ns.name, "-f", "-"],
            Some(&merged(base.clone(), &json!({"spec": {field: bad}})).to_string()),
        );
        assert!(!o.ok && o.stderr.contains(created), "{crd}: {}", o.stderr);
        kube.must_in(&["create", "-n", &ns.name, "-f", "-"], &base.to_string());
        let name = base["metadata"]["name"].as_str().unwrap();
        let patch = json!({"spec": {field: "other@example.org"}}).to_string();
        let o = kube.kubectl(&[
            "patch",
            "-n",
            &ns.name,
            &format!("{plural}/{name}"),
            "--type=merge",
            "-p",
            &patch,
        ]);
        assert!(!o.ok && o.stderr.contains(changed), "{crd}: {}", o.stderr);
    }
}

// ------------------------------------------------------------------ the operator

/// `mailcluster operator` as its own process, logging to a file kept for failures.
struct OperatorProcess {
    child: Child,
    log: PathBuf,
    metrics: SocketAddr,
    identity: String,
}

impl OperatorProcess {
    fn start(
        dir: &Path,
        kubeconfig: &Path,
        identity: &str,
        lease_ns: &str,
        watch_ns: &str,
    ) -> OperatorProcess {
        let log = dir.join(format!("{identity}.log"));
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new(common::BIN)
            .args(["operator", "--metrics-addr", &metrics.to_string()])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBECONFIG", kubeconfig)
            // What the chart's Deployment passes through the downward API.
            .env("POD_NAME", identity)
            .env("POD_NAMESPACE", lease_ns)
            .env("MAILCLUSTER_OPERATOR_NAMESPACE", watch_ns)
            .env("RUST_LOG", "info,kube=warn")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join(format!("{identity}.stderr"))).unwrap())
            .spawn()
            .expect("spawn mailcluster operator");
        OperatorProcess { child, log, metrics, identity: identity.into() }
    }

    fn log_text(&self) -> String {
        let mut s = std::fs::read_to_string(&self.log).unwrap_or_default();
        s.push_str(&std::fs::read_to_string(self.log.with_extension("stderr")).unwrap_or_default());
        s
    }

    fn metrics_text(&self) -> String {
        http_get(self.metrics, "/metrics").1
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- log of operator {} ----\n{}", self.identity, self.log_text());
        }
        self.kill9();
    }
}

/// A Helm release of charts/mailcluster, uninstalled when the test ends.
struct Release<'a> {
    kube: &'a Kube,
    name: String,
    namespace: String,
}

impl<'a> Release<'a> {
    fn install(kube: &'a Kube, name: &str, namespace: &str, values: &Value) -> Release<'a> {
        let out = kube.python(&["helm-install", name, namespace, &values.to_string()], "");
        assert!(out.contains(&format!("release {name}")), "{out}");
        Release { kube, name: name.into(), namespace: namespace.into() }
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = Command::new("python3")
            .arg(root().join("scripts/install_checks.py"))
            .args(["helm-uninstall", &self.name, &self.namespace])
            .env("KUBECONFIG", &self.kube.kubeconfig)
            .output();
        let _ = self.kube.kubectl(&["delete", "namespace", &self.namespace, "--wait=false"]);
    }
}

/// A kubeconfig that authenticates as `sa` in `ns` with a bound token: what a pod
/// of the chart's Deployment gets mounted.
fn service_account_kubeconfig(kube: &Kube, ns: &str, sa: &str, path: &Path) {
    let token = kube.must(&["create", "token", sa, "-n", ns, "--duration=1h"]);
    let server = kube.must(&["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"]);
    let ca = kube.must(&[
        "config",
        "view",
        "--raw",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.certificate-authority}",
    ]);
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {sa}\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: {sa}}}\ncurrent-context: c\n",
        token.trim()
    );
    std::fs::write(path, config).unwrap();
}

fn condition(mc: &Value, type_: &str) -> Option<(String, String)> {
    let c = mc["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?;
    Some((c["status"].as_str()?.to_string(), c["reason"].as_str()?.to_string()))
}

/// Plays the kubelet for a Job's pod: the pod ran and exited 0. The job controller
/// then marks the Job Complete, as it would for a real run.
fn report_job_pod_succeeded(kube: &Kube, ns: &str, job: &str) {
    let pod = eventually("the Job's pod", || {
        let names = kube.must(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            &format!("job-name={job}"),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ]);
        names.split_whitespace().next().map(String::from)
    });
    let now = "2026-01-01T00:00:00Z";
    let status = json!({"status": {
        "phase": "Succeeded",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
        "containerStatuses": [{
            "name": "migrate", "image": "mailcluster", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}},
        }],
    }});
    kube.must(&[
        "patch",
        "pod",
        &pod,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
}

/// The chart's default: the operator may act in its own namespace only.
#[test]
fn the_charts_default_rbac_reaches_its_release_namespace_only() {
    let Some(kube) = installed() else { return };
    let dir = tempfile::tempdir().unwrap();
    let release_ns = unique("mcns");
    let _release = Release::install(&kube, "mcns", &release_ns, &json!({}));
    let sa_config = dir.path().join("operator.kubeconfig");
    service_account_kubeconfig(&kube, &release_ns, "mcns-mailcluster", &sa_config);
    let as_sa = Kube { kubeconfig: sa_config.to_str().unwrap().into() };
    for allowed in [
        vec!["get", "mailclusters", "-n", release_ns.as_str()],
        vec!["get", "deployments", "-n", release_ns.as_str()],
        vec!["get", "secret", "absent", "-n", release_ns.as_str(), "--ignore-not-found"],
        // Listed and watched (the operator watches password Secrets by their
        // metadata), in the release's namespace only.
        vec!["get", "secrets", "-n", release_ns.as_str()],
    ] {
        let out = as_sa.kubectl(&allowed);
        assert!(out.ok, "{allowed:?}: {}", out.stderr);
    }
    let other = Namespace::create(&kube, "mcother");
    for denied in [
        vec!["get", "mailclusters", "-A"],
        vec!["get", "mailclusters", "-n", other.name.as_str()],
        vec!["get", "secret", "absent", "-n", other.name.as_str()],
        vec!["get", "secrets", "-n", other.name.as_str()],
    ] {
        let out = as_sa.kubectl(&denied);
        assert!(!out.ok && out.stderr.contains("forbidden"), "{denied:?}: {}", out.stderr);
    }
}

#[test]
fn operator_with_the_charts_service_account_runs_a_cluster() {
    let Some(kube) = installed() else { return };
    let dir = tempfile::tempdir().unwrap();

    // The operator as the chart installs it when asked to watch every namespace:
    // its ServiceAccount, ClusterRole and binding, applied by a real `helm install`.
    let release_ns = unique("mcop");
    let release = Release::install(&kube, "mcop", &release_ns, &json!({"clusterWide": true}));
    let sa = "mcop-mailcluster";
    assert!(kube.get(&release_ns, &format!("serviceaccount/{sa}")).is_some(), "chart ServiceAccount");
    let sa_config = dir.path().join("operator.kubeconfig");
    service_account_kubeconfig(&kube, &release_ns, sa, &sa_config);
    // RBAC is enforced on that identity: it may not read Secrets' neighbours it was
    // not granted (nodes), while it may list MailClusters cluster-wide.
    let as_sa = Kube { kubeconfig: sa_config.to_str().unwrap().into() };
    assert!(as_sa.kubectl(&["get", "mailclusters", "-A"]).ok);
    let denied = as_sa.kubectl(&["get", "nodes"]);
    assert!(!denied.ok && denied.stderr.contains("forbidden"), "{}", denied.stderr);

    // Each operator of these tests watches only its own test's namespace (the chart's
    // watchNamespace setting), so tests running side by side do not share one.
    let ns = Namespace::create(&kube, "mail");
    let mut leader = OperatorProcess::start(dir.path(), &sa_config, "operator-a", &release_ns, &ns.name);
    for name in ["mail-db", "mail-redis"] {
        kube.must(&[
            "create",
            "secret",
            "generic",
            name,
            "-n",
            &ns.name,
            "--from-literal=url=postgres://unused",
        ]);
    }
    let cluster = json!({
        "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailCluster",
        "metadata": {"name": "mail"},
        "spec": {
            "image": {"tag": "0.1.0"}, "domains": ["example.com"],
            // Room for every pod's pool: no budget warning (Degraded) in this story.
            "postgres": {"urlSecretRef": {"name": "mail-db"}, "maxConnections": 1000},
            "redis": {"urlSecretRef": {"name": "mail-redis"}},
            "pop3": {"enabled": true},
            "networkPolicy": {"enabled": true},
            "stress": {"schedule": "0 3 * * *"},
        }
    });
    kube.must_in(&["apply", "--server-side", "-n", &ns.name, "-f", "-"], &cluster.to_string());
    let uid =
        kube.get(&ns.name, "mailcluster/mail").unwrap()["metadata"]["uid"].as_str().unwrap().to_string();

    // Before the schema migration: config, Services, the migration Job and the
    // stress CronJob, each owned by the MailCluster; no Deployments yet.
    let job = eventually("the migration Job", || {
        kube.names(&ns.name, "jobs").into_iter().find(|n| n.starts_with("mail-migrate"))
    });
    assert_eq!(
        kube.names(&ns.name, "services"),
        ["mail-imap", "mail-metrics", "mail-pop3", "mail-smtp", "mail-submission"]
    );
    assert!(kube.names(&ns.name, "deployments").is_empty(), "no Deployments before the migration");
    let phase = eventually("status Pending", || {
        kube.get(&ns.name, "mailcluster/mail")?["status"]["phase"].as_str().map(String::from)
    });
    assert_eq!(phase, "Pending");

    // The migration pod cannot run (no node); report it done as its kubelet would.
    report_job_pod_succeeded(&kube, &ns.name, &job);
    let protocols = ["mail-imap", "mail-pop3", "mail-smtp", "mail-submission"];
    eventually("Deployments, HPAs and PDBs", || {
        (kube.names(&ns.name, "deployments") == protocols
            && kube.names(&ns.name, "hpa") == protocols
            && kube.names(&ns.name, "pdb") == protocols)
            .then_some(())
    });

    // Every child the operator applied carries the MailCluster as its controller
    // owner and was written by the operator's one field manager.
    let kinds = "configmaps,services,deployments,hpa,pdb,jobs,cronjobs,networkpolicies,serviceaccounts,roles,rolebindings";
    let children_as = |output: &str| {
        let mut args = vec![
            "get",
            kinds,
            "-n",
            &ns.name,
            "-l",
            "app.kubernetes.io/managed-by=mailcluster-operator",
            "-o",
        ];
        args.push(output);
        if output == "json" {
            args.push("--show-managed-fields");
        }
        kube.must(&args)
    };
    let children: Value = serde_json::from_str(&children_as("json")).unwrap();
    let items = children["items"].as_array().unwrap();
    let mut kinds_seen = std::collections::BTreeSet::new();
    for item in items {
        let what = format!("{}/{}", item["kind"], item["metadata"]["name"]);
        let owner = &item["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], uid.as_str(), "{what} owned by the MailCluster");
        assert_eq!(owner["controller"], true, "{what}");
        let managers: Vec<&str> = item["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["operation"] == "Apply")
            .filter_map(|m| m["manager"].as_str())
            .collect();
        assert_eq!(managers, ["mailcluster-operator"], "{what}: applied by one field manager");
        kinds_seen.insert(item["kind"].as_str().unwrap().to_string());
    }
    for kind in [
        "ConfigMap",
        "Service",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Job",
        "CronJob",
        "NetworkPolicy",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    ] {
        assert!(kinds_seen.contains(kind), "no {kind} among the children: {kinds_seen:?}");
    }

    // Pods cannot start (no node): Ready=False with the reason, Progressing=True.
    let mc = eventually("Ready=False PodsNotReady", || {
        let mc = kube.get(&ns.name, "mailcluster/mail")?;
        (condition(&mc, "Ready")? == ("False".into(), "PodsNotReady".into())).then_some(mc)
    });
    assert_eq!(mc["status"]["observedGeneration"], mc["metadata"]["generation"]);
    assert_eq!(condition(&mc, "Progressing").map(|c| c.0), Some("True".into()));
    // `kubectl wait` sees the same condition the docs tell users to wait on.
    let waited =
        kube.kubectl(&["wait", "-n", &ns.name, "--for=condition=Ready=False", "mc/mail", "--timeout=10s"]);
    assert!(waited.ok, "{}", waited.stderr);
    // Argo CD's health of what the operator really wrote.
    let health: Value = serde_json::from_str(&kube.python(&["health-of"], &mc.to_string())).unwrap();
    assert_eq!(health["status"], "Progressing", "{health}");

    // Spec change: IMAP off (its objects go), SMTP fixed at 3 replicas. Applied by
    // the user's own field manager: no conflict with the operator's.
    let change = merged(
        cluster.clone(),
        &json!({"spec": {"imap": {"enabled": false}, "smtp": {"replicas": 3, "autoscaling": {"enabled": false}}}}),
    );
    kube.must_in(&["apply", "--server-side", "-n", &ns.name, "-f", "-"], &change.to_string());
    eventually("IMAP children deleted, SMTP at 3 fixed replicas", || {
        let smtp = kube.get(&ns.name, "deployment/mail-smtp")?;
        (smtp["spec"]["replicas"] == 3
            && kube.names(&ns.name, "deployments") == ["mail-pop3", "mail-smtp", "mail-submission"]
            && kube.names(&ns.name, "hpa") == ["mail-pop3", "mail-submission"]
            && kube.get(&ns.name, "service/mail-imap").is_none())
        .then_some(())
    });
    // A field the operator owns, changed by someone else, is taken back.
    kube.must(&["scale", "-n", &ns.name, "deployment/mail-smtp", "--replicas=1"]);
    kube.must(&["annotate", "-n", &ns.name, "mc/mail", "test/poke=1", "--overwrite"]);
    eventually("SMTP replicas restored", || {
        (kube.get(&ns.name, "deployment/mail-smtp")?["spec"]["replicas"] == 3).then_some(())
    });
    let metrics = leader.metrics_text();
    assert!(metrics.contains("mailcluster_operator_reconciles_total"), "{metrics}");
    assert!(
        !metrics.contains("mailcluster_operator_reconcile_failures_total{"),
        "no reconcile failed: {metrics}"
    );

    // Leader election: a second replica waits; SIGKILL of the leader (no release)
    // hands it the Lease within 15 s.
    let lease_holder = || -> Option<String> {
        kube.get(&release_ns, "lease/mailcluster-operator")?["spec"]["holderIdentity"]
            .as_str()
            .map(String::from)
    };
    assert_eq!(lease_holder().as_deref(), Some("operator-a"));
    let standby = OperatorProcess::start(dir.path(), &sa_config, "operator-b", &release_ns, &ns.name);
    eventually("operator-b waiting", || standby.log_text().contains("waiting for leadership").then_some(()));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(lease_holder().as_deref(), Some("operator-a"), "the standby does not steal a live Lease");
    leader.kill9();
    let killed = Instant::now();
    eventually("operator-b holds the Lease", || (lease_holder()? == "operator-b").then_some(()));
    let takeover = killed.elapsed();
    assert!(takeover <= Duration::from_secs(15), "takeover took {takeover:?}");
    eprintln!("lease taken over {takeover:?} after SIGKILL of the leader");
    // The new leader reconciles: POP3 off now.
    let change = merged(change, &json!({"spec": {"pop3": {"enabled": false}}}));
    kube.must_in(&["apply", "--server-side", "-n", &ns.name, "-f", "-"], &change.to_string());
    eventually("POP3 children deleted by the new leader", || {
        (kube.names(&ns.name, "deployments") == ["mail-smtp", "mail-submission"]).then_some(())
    });

    // Delete: the garbage collector removes every child through its owner reference.
    kube.must(&["delete", "-n", &ns.name, "mc/mail", "--wait=true", "--timeout=60s"]);
    eventually("children garbage-collected", || children_as("name").trim().is_empty().then_some(()));
    drop(standby);
    drop(release);
}
