//! The install paths: Helm chart, `manifests/` (install.yaml, samples, Argo CD,
//! autoscaling) and their agreement with what the operator does.
//!
//! Checks that need Helm, the Kubernetes schemas or Lua run
//! `scripts/install_checks.py` (Helm 4 as a library from PyPI `helm-python-sdk`,
//! `kubernetes-validate`, Lua 5.1 from `lupa`; ./scripts/test.sh installs them). When
//! they are missing these tests are skipped locally and fail when `CI` is set. The
//! rest is plain Rust over the checked-in files. Regenerate the derived files with
//! `scripts/render-install.sh`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use mailcluster_operator::children::ChildKind;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML document"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

const PY_MODULES: &str = "helm_python, kubernetes_validate, lupa, jsonschema, yaml";

fn python_available() -> bool {
    let found = Command::new("python3")
        .args(["-c", &format!("import {PY_MODULES}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with {PY_MODULES} is required in CI: \
             pip install helm-python-sdk kubernetes-validate lupa"
        );
        eprintln!("python3 modules {PY_MODULES} missing; install checks skipped");
    }
    found
}

/// Runs one command of the checker; returns its stdout.
fn checks(command: &str) -> String {
    let out = Command::new("python3")
        .arg(root().join("scripts/install_checks.py"))
        .arg(command)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "install_checks.py {command} failed:\n{stdout}{stderr}");
    stdout
}

fn run_check(command: &str) {
    if !python_available() {
        return;
    }
    let out = checks(command);
    print!("{out}");
    assert!(out.contains(" passed, 0 failed"), "{out}");
}

#[test]
fn chart_lints_clean() {
    run_check("lint");
}

#[test]
fn chart_renders_objects_valid_on_oldest_and_newest_kubernetes() {
    run_check("template");
}

#[test]
fn samples_match_the_crd_schema() {
    run_check("samples");
}

#[test]
fn argocd_health_fixtures_pass() {
    run_check("health");
}

#[test]
fn grafana_dashboard_queries_server_metrics() {
    run_check("dashboard");
}

#[test]
fn install_yaml_has_not_drifted() {
    if !python_available() {
        return;
    }
    for (command, file) in [
        ("render-install", "manifests/install.yaml"),
        ("render-install-cluster-wide", "manifests/install-cluster-wide.yaml"),
        ("render-argocd-cm", "manifests/argocd/argocd-cm.yaml"),
    ] {
        let rendered = checks(command);
        assert!(
            read(file) == rendered,
            "{file} is out of date with its sources; run scripts/render-install.sh"
        );
    }
}

#[test]
fn chart_crds_have_not_drifted() {
    let generated = mailcluster_operator::crd_files();
    for (file, yaml) in &generated {
        let source = read(&format!("crds/{file}"));
        assert_eq!(&source, yaml, "crds/{file} itself is stale: UPDATE_CRDS=1 (see tests/crd.rs)");
        let chart_copy = read(&format!("charts/mailcluster/crds/{file}"));
        assert!(
            chart_copy == source,
            "charts/mailcluster/crds/{file} differs from crds/; run scripts/render-install.sh"
        );
        for install in ["manifests/install.yaml", "manifests/install-cluster-wide.yaml"] {
            assert!(read(install).contains(source.split_once('\n').unwrap().1), "{install}: {file}");
        }
    }
    let files: Vec<_> = std::fs::read_dir(root().join("charts/mailcluster/crds")).unwrap().collect();
    assert_eq!(files.len(), generated.len(), "the chart carries exactly the generated CRDs");
}

/// Every MailCluster sample renders through the operator's own build and validation
/// (CEL rules, connection budget), which a schema check alone does not cover.
fn sample_clusters() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(root().join("manifests/samples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        for doc in docs(&std::fs::read_to_string(&path).unwrap()) {
            if doc["kind"] == "MailCluster" {
                out.push((path.file_name().unwrap().to_string_lossy().into_owned(), doc));
            }
        }
    }
    out
}

fn render(doc: &Value) -> Vec<Value> {
    let yaml = serde_yaml_ng::to_string(doc).unwrap();
    let rendered = mailcluster_operator::render(&yaml).unwrap_or_else(|e| panic!("render: {e:#}"));
    assert!(!rendered.contains("# warning:"), "sample renders with a warning:\n{rendered}");
    docs(&rendered)
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn samples_render_through_the_operator() {
    let samples = sample_clusters();
    let names: Vec<&str> = samples.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(names, ["full.yaml", "minimal.yaml", "tls-secret.yaml"]);
    for (file, doc) in &samples {
        let objects = render(doc);
        let deployments = of_kind(&objects, "Deployment");
        assert!(deployments.len() >= 3, "{file}: {} Deployments", deployments.len());
        let hpas = of_kind(&objects, "HorizontalPodAutoscaler");
        match file.as_str() {
            "full.yaml" => {
                assert_eq!(hpas.len(), 4, "smtp, submission, imap, pop3 autoscaled");
                assert_eq!(of_kind(&objects, "Certificate").len(), 1, "cert-manager Certificate");
                let cron = of_kind(&objects, "CronJob");
                assert_eq!(cron.len(), 1);
                assert_eq!(cron[0]["spec"]["schedule"], "0 3 * * *", "nightly stress run");
                assert_eq!(of_kind(&objects, "ServiceMonitor").len(), 1);
                assert_eq!(of_kind(&objects, "NetworkPolicy").len(), 1);
            }
            "tls-secret.yaml" => {
                assert!(hpas.is_empty(), "fixed replicas");
                assert!(of_kind(&objects, "Certificate").is_empty());
                let secret = &deployments[0]["spec"]["template"]["spec"]["volumes"];
                assert!(secret.to_string().contains("\"secretName\":\"mail-tls\""), "{secret}");
            }
            _ => assert_eq!(hpas.len(), 3, "{file}: default autoscaling"),
        }
    }
}

/// The Pods metrics the operator's HPAs reference, over every sample.
fn hpa_pod_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, doc) in sample_clusters() {
        for hpa in of_kind(&render(&doc), "HorizontalPodAutoscaler") {
            for m in hpa["spec"]["metrics"].as_array().unwrap() {
                if m["type"] == "Pods" {
                    names.insert(m["pods"]["metric"]["name"].as_str().unwrap().to_string());
                }
            }
        }
    }
    names
}

#[test]
fn prometheus_adapter_and_keda_serve_the_hpa_metrics() {
    let wanted = hpa_pod_metrics();
    assert_eq!(
        wanted.iter().map(String::as_str).collect::<Vec<_>>(),
        ["mail_connections_active", "mail_pool_saturation"]
    );
    let cm = docs(&read("manifests/autoscaling/prometheus-adapter-rules.yaml")).remove(0);
    let config: Value = serde_yaml_ng::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let served: BTreeSet<String> = config["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            // Per-pod metrics: the adapter must map both labels to resources.
            assert_eq!(r["resources"]["overrides"]["pod"]["resource"], "pod", "{r}");
            assert_eq!(r["resources"]["overrides"]["namespace"]["resource"], "namespace", "{r}");
            r["name"]["as"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(served, wanted, "adapter rules vs the operator's HPA metrics");

    let keda = docs(&read("manifests/autoscaling/keda-scaledobject.yaml")).remove(0);
    let queried: BTreeSet<String> = keda["spec"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let q = t["metadata"]["query"].as_str().unwrap();
            wanted.iter().find(|m| q.contains(m.as_str())).unwrap_or_else(|| panic!("{q}")).clone()
        })
        .collect();
    assert_eq!(queried, wanted);
}

/// The operator's own Role in install.yaml: in the namespace it watches, which
/// is its own; and nothing cluster-scoped but the CRD and the Namespace.
fn operator_role(install: &[Value]) -> &Value {
    for d in install {
        let kind = d["kind"].as_str().unwrap();
        assert!(
            !kind.starts_with("Cluster")
                && (d["metadata"].get("namespace").is_some()
                    || kind == "Namespace"
                    || kind == "CustomResourceDefinition"),
            "install.yaml grants or makes something cluster-wide: {kind} {}",
            d["metadata"]["name"]
        );
    }
    let role = install
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "mailcluster")
        .expect("the operator's Role in install.yaml");
    let deployment = install.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let namespace = role["metadata"]["namespace"].as_str().unwrap();
    assert_eq!(deployment["metadata"]["namespace"], namespace);
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains(&format!("\"--namespace={namespace}\"")), "{args}");
    let binding = install
        .iter()
        .find(|d| d["kind"] == "RoleBinding" && d["roleRef"]["name"] == "mailcluster")
        .expect("its RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], namespace);
    role
}

/// The chart's RBAC grants what the reconciler calls, kind by kind (see
/// reconcile.rs/runtime.rs): apply = patch + create, orphan deletion = list + delete,
/// watched kinds (`runtime::WATCHED`) also watch. The cluster-wide install grants
/// the same rules, in every namespace.
#[test]
fn rbac_covers_every_call_of_the_operator() {
    let install = docs(&read("manifests/install.yaml"));
    let cluster_role = operator_role(&install);
    let wide = docs(&read("manifests/install-cluster-wide.yaml"));
    let wide_role =
        wide.iter().find(|d| d["kind"] == "ClusterRole").expect("ClusterRole in install-cluster-wide.yaml");
    assert_eq!(wide_role["rules"], cluster_role["rules"], "one set of rules for both scopes");
    assert!(wide.iter().any(|d| d["kind"] == "ClusterRoleBinding"));
    let verbs = |group: &str, resource: &str| -> BTreeSet<String> {
        let mut v = BTreeSet::new();
        for rule in cluster_role["rules"].as_array().unwrap() {
            let has = |k: &str, x: &str| rule[k].as_array().unwrap().iter().any(|e| e == x);
            if has("apiGroups", group) && has("resources", resource) {
                assert!(rule.get("resourceNames").is_none());
                v.extend(rule["verbs"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()));
            }
        }
        v
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let watched = mailcluster_operator::runtime::WATCHED;
    for kind in ChildKind::ALL {
        let gvk = kind.gvk();
        let mut want = set(&["list", "create", "patch", "delete"]);
        if watched.contains(&kind) {
            want.insert("watch".into());
        }
        if kind == ChildKind::Job || kind == ChildKind::ConfigMap {
            // The migration Job is read by name, and so is a MailAccount's
            // Sieve script ConfigMap.
            want.insert("get".into());
        }
        assert_eq!(verbs(&gvk.group, kind.plural()), want, "{kind:?}");
    }
    assert_eq!(verbs("mailcluster.dev", "mailclusters"), set(&["get", "list", "watch"]));
    assert_eq!(verbs("mailcluster.dev", "mailclusters/status"), set(&["get", "patch"]));
    // The store kinds: watched, the MailAccount finalizer patched in and out,
    // status applied.
    for kind in ["maildomains", "mailaccounts"] {
        assert_eq!(verbs("mailcluster.dev", kind), set(&["get", "list", "watch", "patch"]), "{kind}");
        assert_eq!(verbs("mailcluster.dev", &format!("{kind}/status")), set(&["get", "patch"]), "{kind}");
    }
    // Secrets are read by name (a MailAccount's password too), watched by their
    // metadata (a changed password Secret), and the cluster's keys created once:
    // never changed or deleted.
    assert_eq!(verbs("", "secrets"), set(&["get", "list", "watch", "create"]));
    // Pods are listed for the ones refused for their sysctls, nothing more.
    assert_eq!(verbs("", "pods"), set(&["list"]));
    assert_eq!(verbs("events.k8s.io", "events"), set(&["create", "patch"]));
    // Nothing beyond those: one rule per line above, no wildcards.
    let rules = cluster_role["rules"].to_string();
    assert!(!rules.contains("\"*\""), "no wildcards: {rules}");
    let resources: usize = cluster_role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["resources"].as_array().unwrap().len())
        .sum();
    assert_eq!(resources, ChildKind::ALL.len() + 9, "{rules}");

    // The stress Role the operator creates grants only what the operator holds itself
    // (RBAC forbids creating a Role that escalates).
    let mc = docs(&read("manifests/samples/full.yaml")).remove(0);
    let stress_role = render(&mc).into_iter().find(|o| o["kind"] == "Role").expect("stress Role");
    for rule in stress_role["rules"].as_array().unwrap() {
        let group = rule["apiGroups"][0].as_str().unwrap();
        for res in rule["resources"].as_array().unwrap() {
            let held = verbs(group, res.as_str().unwrap());
            for v in rule["verbs"].as_array().unwrap() {
                assert!(held.contains(v.as_str().unwrap()), "operator lacks {v} on {res}");
            }
        }
    }

    // Leader election: a Lease in the operator's namespace, renewed by name.
    let lease_role = install
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"].as_str().unwrap().ends_with("leader-election"))
        .expect("leader-election Role");
    let rules = lease_role["rules"].to_string();
    let lease = format!("{:?}", mailcluster_operator::OperatorOptions::default().lease_name);
    for needle in ["\"create\"", "\"get\"", "\"update\"", "coordination.k8s.io", lease.as_str()] {
        assert!(rules.contains(needle), "{needle} missing from {rules}");
    }
}

#[test]
fn operator_deployment_matches_the_binary() {
    let install = docs(&read("manifests/install.yaml"));
    let d = install.iter().find(|d| d["kind"] == "Deployment").expect("operator Deployment");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let port = mailcluster_operator::OperatorOptions::default().metrics_addr.port();
    assert_eq!(c["ports"][0]["containerPort"], port, "metrics port = the operator's default");
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[0], "operator");
    assert!(args.contains(&format!("--metrics-addr=0.0.0.0:{port}").as_str()), "{args:?}");
    // The image is the one the MailCluster pods default to (one image for all).
    let mc: mailcluster_api::MailCluster =
        serde_yaml_ng::from_str(&read("manifests/samples/minimal.yaml")).unwrap();
    let image = c["image"].as_str().unwrap();
    assert!(image.starts_with(&format!("{}:", mc.spec.image.repository)), "{image}");
    assert_eq!(d["spec"]["template"]["spec"]["securityContext"]["runAsUser"], 65532);
}

/// The image cannot be built here (no container engine): check by reading that the
/// Dockerfile builds the workspace's binary with the pinned toolchain and runs it as
/// the user the operator's pod security contexts name.
#[test]
fn dockerfile_matches_the_workspace() {
    let dockerfile = read("Dockerfile");
    let workspace: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    let rust = workspace["workspace"]["package"]["rust-version"].as_str().unwrap();
    assert!(
        dockerfile.contains(&format!("ARG RUST_VERSION={rust}\n")),
        "toolchain pin != rust-version {rust}"
    );
    let cli: toml::Value = toml::from_str(&read("cli/Cargo.toml")).unwrap();
    let bin = cli["bin"][0]["name"].as_str().unwrap();
    let package = cli["package"]["name"].as_str().unwrap();
    assert!(dockerfile.contains(&format!("cargo build --release --locked -p {package}")));
    assert!(dockerfile.contains(&format!("target/release/{bin} ")));
    assert!(dockerfile.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{bin}\"]")));

    let mc = docs(&read("manifests/samples/minimal.yaml")).remove(0);
    let objects = render(&mc);
    let pod = &of_kind(&objects, "Deployment")[0]["spec"]["template"]["spec"];
    let uid = pod["securityContext"]["runAsUser"].as_i64().unwrap();
    assert!(dockerfile.contains(&format!("USER {uid}:{uid}")), "image user != pods' runAsUser {uid}");
    // Every port the pods open is declared.
    let expose = dockerfile.lines().find(|l| l.starts_with("EXPOSE ")).unwrap();
    let full = docs(&read("manifests/samples/full.yaml")).remove(0);
    for d in of_kind(&render(&full), "Deployment") {
        for c in d["spec"]["template"]["spec"]["containers"].as_array().unwrap() {
            for p in c["ports"].as_array().unwrap() {
                let port = p["containerPort"].as_i64().unwrap().to_string();
                assert!(expose.split_whitespace().any(|w| w == port), "port {port} not in {expose}");
            }
        }
    }

    // The build context keeps every workspace member and the lock file.
    let ignored: Vec<String> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let members = workspace["workspace"]["members"].as_array().unwrap();
    for keep in members.iter().map(|m| m.as_str().unwrap()).chain(["Cargo.lock", "Cargo.toml"]) {
        assert!(!ignored.iter().any(|i| i == keep), ".dockerignore drops {keep}");
    }
    assert!(ignored.iter().any(|i| i == "target"), "target/ would bloat the build context");
}

/// `scaler: External` hands a protocol to an outside scaler (the KEDA example): no HPA
/// of ours targets its Deployment and its replica count is never written.
#[test]
fn external_scaler_leaves_replicas_to_keda() {
    let mut mc = docs(&read("manifests/samples/full.yaml")).remove(0);
    mc["spec"]["imap"]["autoscaling"]["scaler"] = "External".into();
    let objects = render(&mc);
    let hpas: Vec<&str> = of_kind(&objects, "HorizontalPodAutoscaler")
        .iter()
        .map(|h| h["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(hpas, ["prod-smtp", "prod-submission", "prod-pop3"]);
    let imap =
        of_kind(&objects, "Deployment").into_iter().find(|d| d["metadata"]["name"] == "prod-imap").unwrap();
    assert!(imap["spec"].get("replicas").is_none(), "replicas belong to the external scaler");

    // The KEDA example scales that Deployment within the bounds the budget reserved.
    let keda = docs(&read("manifests/autoscaling/keda-scaledobject.yaml")).remove(0);
    assert_eq!(keda["spec"]["scaleTargetRef"]["name"], "prod-imap");
    let a = &mc["spec"]["imap"]["autoscaling"];
    assert_eq!(keda["spec"]["minReplicaCount"], a["minReplicas"]);
    assert_eq!(keda["spec"]["maxReplicaCount"], a["maxReplicas"]);
    // And the MailCluster with the field is valid against the regenerated CRD's enum.
    let crd = read("crds/mailclusters.mailcluster.dev.yaml");
    assert!(crd.contains("- External") && crd.contains("- HorizontalPodAutoscaler"));
}
