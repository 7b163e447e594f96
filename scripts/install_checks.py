#!/usr/bin/env python3
"""Checks and generators for the install paths: the Helm chart, manifests/ and the
Argo CD health check. Run by operator/tests/install.rs (one test per command) and by
scripts/render-install.sh.

    install_checks.py render-install      print manifests/install.yaml
    install_checks.py render-install-cluster-wide
                                          print manifests/install-cluster-wide.yaml
    install_checks.py render-argocd-cm    print manifests/argocd/argocd-cm.yaml
    install_checks.py lint                helm lint --strict over several value sets
    install_checks.py template            render those value sets and validate every
                                          object against the oldest and newest
                                          supported Kubernetes schemas
    install_checks.py samples             every MailCluster under manifests/ against
                                          the CRD's openAPIV3Schema; other objects
                                          against the Kubernetes schemas
    install_checks.py health              Argo CD health_test.yaml fixtures under Lua 5.1
    install_checks.py dashboard           the Grafana dashboard queries only metrics the
                                          server registers, histograms as histograms

Against the live cluster of $KUBECONFIG (cli/tests/kube_real.rs):

    install_checks.py helm-install RELEASE NAMESPACE [VALUES_JSON]
    install_checks.py helm-uninstall RELEASE NAMESPACE
    install_checks.py health-of           Argo CD's health of the MailCluster JSON on
                                          stdin, as {"status", "message"}

Helm runs as a library (PyPI helm-python-sdk: Helm 4's Go SDK behind a C ABI,
shipped inside the wheel), so nothing is downloaded at run time and no cluster is
needed. Lua 5.1 comes from PyPI lupa (which bundles the Lua 5.1 runtime), the
dialect of Argo CD's embedded interpreter. Each check prints one line per case and
exits non-zero when a check fails.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "mailcluster"
CRD = ROOT / "crds" / "mailclusters.mailcluster.dev.yaml"
# The kinds kept in a cluster's store, installed after the MailCluster's CRD.
STORE_CRDS = [ROOT / "crds" / "maildomains.mailcluster.dev.yaml", ROOT / "crds" / "mailaccounts.mailcluster.dev.yaml"]
MANIFESTS = ROOT / "manifests"
HEALTH_DIR = MANIFESTS / "argocd" / "resource_customizations" / "mailcluster.dev" / "MailCluster"
# The store kinds' health: their Ready condition (no Suspended state).
STORE_HEALTH_DIRS = [HEALTH_DIR.parent / "MailDomain", HEALTH_DIR.parent / "MailAccount"]

RELEASE = "mailcluster"
NAMESPACE = "mailcluster-system"
# The operator's image repository by default, which is also what MailClusters may run.
DEFAULT_IMAGE = "ghcr.io/mailcluster/mailcluster"

# Oldest and newest Kubernetes the chart supports (Chart.yaml kubeVersion; the mail
# pods use preStop.sleep, on by default from 1.30) and the newest schema bundled by
# kubernetes-validate.
KUBE_OLDEST = "1.30.0"
KUBE_NEWEST = "1.37.0"

# Value sets every chart check runs over: defaults, namespaced mode, and every
# optional object switched on.
VALUE_SETS: dict[str, dict] = {
    "defaults": {},
    "namespaced": {
        "watchNamespace": "mail",
        "replicaCount": 1,
        "leaderElection": {"enabled": False},
    },
    "clusterWide": {"clusterWide": True, "networkPolicy": {"enabled": False}},
    "everything": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "networkPolicy": {"enabled": True, "metricsNamespaces": ["monitoring", "observability"]},
        "image": {
            "repository": "registry.example.com/mailcluster",
            "tag": "0.1.0",
            "digest": "sha256:" + "0" * 64,
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "registry"}],
        "allowedImages": ["registry.example.com/mailcluster", "registry.example.com:5000/mail/"],
        "podAnnotations": {"example.com/team": "mail"},
        "priorityClassName": "system-cluster-critical",
    },
}

# Kinds whose schemas are not Kubernetes built-ins (no bundled schema to check against).
FOREIGN_API_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/", "keda.sh/", "argoproj.io/")

# Helm's install order for the kinds in this chart (pkg/release/util/kind_sorter.go),
# so install.yaml applies cleanly top to bottom.
KIND_ORDER = [
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
]


class CheckFailed(Exception):
    pass


def helm():
    import helm_python

    return helm_python


def load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def render_chart(values: dict) -> list[dict]:
    chart = helm().Chart.load(str(CHART))
    chart.validate_schema(values)
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict] = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(load_docs(rendered[path]))
    return docs


def kind_rank(doc: dict) -> tuple[int, str]:
    kind = doc.get("kind", "")
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return rank, doc.get("metadata", {}).get("name", "")


# ---------------------------------------------------------------------------- render


def render_install(values: dict | None = None, what: str = "default values") -> str:
    """The plain-YAML install: Namespace, CRD, then the chart with `values`."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": NAMESPACE,
            "labels": {
                "app.kubernetes.io/part-of": "mailcluster",
                # The operator pod passes the restricted Pod Security Standard.
                "pod-security.kubernetes.io/enforce": "restricted",
            },
        },
    }
    objects = sorted(render_chart(values or {}), key=kind_rank)
    out = [
        f"# Generated from charts/mailcluster ({what}, release "
        f"{RELEASE!r}, namespace {NAMESPACE!r})\n"
        "# by scripts/render-install.sh; do not edit. Apply with\n"
        "#   kubectl apply --server-side -f install.yaml\n"
    ]
    out.append("---\n" + yaml.safe_dump(namespace, sort_keys=False))
    # The CRD file is used as is (it carries its own header comment).
    for path in [CRD, *STORE_CRDS]:
        crd_text = path.read_text()
        out.append(crd_text if crd_text.startswith("---") else crd_text.split("\n", 1)[1])
    for obj in objects:
        out.append("---\n" + yaml.safe_dump(obj, sort_keys=False, width=120))
    return "".join(out)


def render_argocd_cm() -> str:
    script = (HEALTH_DIR / "health.lua").read_text()
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "argocd-cm",
            "namespace": "argocd",
            "labels": {"app.kubernetes.io/name": "argocd-cm", "app.kubernetes.io/part-of": "argocd"},
        },
        "data": {},
    }

    class Literal(str):
        pass

    def literal(dumper, data):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")

    yaml.add_representer(Literal, literal, Dumper=yaml.SafeDumper)
    cm["data"]["resource.customizations.health.mailcluster.dev_MailCluster"] = Literal(script)
    for health_dir in STORE_HEALTH_DIRS:
        key = f"resource.customizations.health.mailcluster.dev_{health_dir.name}"
        cm["data"][key] = Literal((health_dir / "health.lua").read_text())
    header = (
        "# Generated from resource_customizations/mailcluster.dev/*/health.lua by\n"
        "# scripts/render-install.sh; do not edit. Merge into Argo CD's argocd-cm:\n"
        "#   kubectl -n argocd patch configmap argocd-cm --patch-file argocd-cm.yaml\n"
    )
    return header + yaml.safe_dump(cm, sort_keys=False, width=1000)


# ---------------------------------------------------------------------------- lint


def check_lint() -> int:
    n = 0
    for name, values in VALUE_SETS.items():
        for kube in (KUBE_OLDEST, KUBE_NEWEST):
            report = helm().lint(
                str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube}"
            )
            # Severity 1 is informational ("icon is recommended"); strict fails on 2+.
            problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
            problems += [{"error": e} for e in report.get("errors", []) or []]
            if problems:
                raise CheckFailed(f"helm lint --strict ({name}, Kubernetes {kube}): {problems}")
        print(f"ok  lint {name} (Kubernetes {KUBE_OLDEST} and {KUBE_NEWEST})")
        n += 1
    # Lint must be able to fail: a template that does not render is an error.
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        broken = Path(tmp) / "mailcluster"
        shutil.copytree(CHART, broken)
        with open(broken / "templates" / "service.yaml", "a") as f:
            f.write("\n{{ .Values.missing.deeper }}\n")
        report = helm().lint(str(broken), {}, strict=True, namespace=NAMESPACE)
        if not [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] and not report.get("errors"):
            raise CheckFailed(f"helm lint accepted a template that cannot render: {report}")
        print("ok  lint rejects a broken template")
        n += 1
    # The schema must reject what it does not know: a misspelt key is an error.
    try:
        helm().Chart.load(str(CHART)).validate_schema({"replicaCont": 2})
    except helm().HelmError:
        print("ok  values.schema.json rejects an unknown key")
        n += 1
    else:
        raise CheckFailed("values.schema.json accepted an unknown key")
    return n


# ---------------------------------------------------------------------------- template


def kube_validate(docs: list[dict], version: str, what: str) -> None:
    from kubernetes_validate import SchemaNotFoundError, ValidationError, validate

    for doc in docs:
        if str(doc.get("apiVersion", "")).startswith(FOREIGN_API_GROUPS):
            continue
        label = f"{what}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            validate(doc, version, strict=True)
        except (ValidationError, SchemaNotFoundError) as e:
            raise CheckFailed(f"{label} against Kubernetes {version}: {e}") from None


def check_template() -> int:
    n = 0
    for name, values in VALUE_SETS.items():
        docs = render_chart(values)
        kinds = sorted({d["kind"] for d in docs})
        for version in (KUBE_OLDEST, KUBE_NEWEST):
            kube_validate(docs, version, f"chart ({name})")
        for d in docs:
            if d["kind"] == "Deployment":
                check_operator_pod(d, values)
        print(f"ok  template {name}: {len(docs)} objects ({', '.join(kinds)}) valid on {KUBE_OLDEST} and {KUBE_NEWEST}")
        n += 1
    # Cluster-wide only when asked for; otherwise the same rules through a Role in
    # the watched namespace (by default the release's) and nothing cluster-scoped.
    cluster_wide = render_chart(VALUE_SETS["clusterWide"])
    cluster_rules = next(d for d in cluster_wide if d["kind"] == "ClusterRole")["rules"]
    bindings = [d for d in cluster_wide if d["kind"] == "ClusterRoleBinding"]
    if len(bindings) != 1 or "--namespace" in " ".join(operator_args(cluster_wide)):
        raise CheckFailed("clusterWide: expected one ClusterRoleBinding and no --namespace")
    for name, values, watched, lease_role in (
        ("defaults", {}, NAMESPACE, True),
        ("namespaced", VALUE_SETS["namespaced"], "mail", False),
    ):
        docs = render_chart(values)
        if any(d["kind"].startswith("Cluster") for d in docs):
            raise CheckFailed(f"{name}: renders cluster-wide RBAC")
        roles = [d for d in docs if d["kind"] == "Role" and not d["metadata"]["name"].endswith("leader-election")]
        if [(r["metadata"]["namespace"], r["rules"]) for r in roles] != [(watched, cluster_rules)]:
            raise CheckFailed(f"{name}: expected one Role in {watched!r} with the operator's rules, got {roles}")
        bound = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == roles[0]["metadata"]["name"]]
        if [b["metadata"]["namespace"] for b in bound] != [watched]:
            raise CheckFailed(f"{name}: the operator's Role is not bound in {watched!r}: {bound}")
        if f"--namespace={watched}" not in operator_args(docs):
            raise CheckFailed(f"{name}: the operator does not watch {watched!r} alone: {operator_args(docs)}")
        leases = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("leader-election")]
        if bool(leases) != lease_role:
            raise CheckFailed(f"{name}: leader-election Role {'missing' if lease_role else 'unexpected'}")
        print(f"ok  {name}: the operator's rules in a Role of namespace {watched}, nothing cluster-scoped")
        n += 1
    try:
        render_chart({"clusterWide": True, "watchNamespace": "mail"})
    except helm().HelmError:
        print("ok  template refuses clusterWide with a watchNamespace")
        n += 1
    else:
        raise CheckFailed("clusterWide with a watchNamespace rendered")
    # Leader election off with two replicas is refused at render time.
    try:
        render_chart({"leaderElection": {"enabled": False}})
    except helm().HelmError:
        print("ok  template refuses two replicas without leader election")
        n += 1
    else:
        raise CheckFailed("two replicas without leader election rendered")
    # The validator itself must be able to fail: an unknown field is rejected.
    bad = copy.deepcopy(render_chart({})[0])
    bad["spec" if "spec" in bad else "metadata"]["bogusField"] = 1
    try:
        kube_validate([bad], KUBE_NEWEST, "negative control")
    except CheckFailed:
        print("ok  strict validation rejects an unknown field")
        n += 1
    else:
        raise CheckFailed("strict validation accepted an unknown field")
    return n


def operator_args(docs: list[dict]) -> list[str]:
    (d,) = [d for d in docs if d["kind"] == "Deployment"]
    return d["spec"]["template"]["spec"]["containers"][0]["args"]


def check_operator_pod(deployment: dict, values: dict) -> None:
    """What the chart promises about the operator pod, beyond schema validity."""
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True, "pod must run as non-root"
    assert sc["readOnlyRootFilesystem"] is True, "read-only root filesystem"
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz", probe
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["args"][0] == "operator"
    env = {e["name"] for e in c["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env, "Lease identity and namespace come from the downward API"
    if values.get("clusterWide"):
        assert not any(a.startswith("--namespace") for a in c["args"]), c["args"]
    else:
        assert f"--namespace={values.get('watchNamespace') or NAMESPACE}" in c["args"], c["args"]
    allowed = ",".join(values.get("allowedImages") or [values.get("image", {}).get("repository") or DEFAULT_IMAGE])
    assert f"--allowed-images={allowed}" in c["args"], c["args"]


# ---------------------------------------------------------------------------- samples


def strict_schema(schema: dict) -> dict:
    """The CRD schema with unknown fields rejected: the API server would silently prune
    them, so a misspelt key in a sample would otherwise pass and do nothing."""
    schema = copy.deepcopy(schema)

    def walk(s: dict) -> None:
        if not isinstance(s, dict):
            return
        if (
            s.get("type") == "object"
            and "properties" in s
            and "additionalProperties" not in s
            and not s.get("x-kubernetes-preserve-unknown-fields")
        ):
            s["additionalProperties"] = False
        for key in ("properties",):
            for sub in s.get(key, {}).values():
                walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(s.get(key), dict):
                walk(s[key])
        for key in ("allOf", "anyOf", "oneOf"):
            for sub in s.get(key, []):
                walk(sub)

    walk(schema)
    # Kubernetes adds apiVersion/kind/metadata to every object.
    schema["properties"]["metadata"] = {"type": "object"}
    schema["properties"]["apiVersion"] = {"type": "string"}
    schema["properties"]["kind"] = {"type": "string"}
    return schema


def crd_validator(path: Path = CRD):
    import jsonschema

    crd = next(d for d in load_docs(path.read_text()) if d.get("kind") == "CustomResourceDefinition")
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    schema = strict_schema(version["schema"]["openAPIV3Schema"])
    api_version = f"{crd['spec']['group']}/{version['name']}"
    return api_version, crd["spec"]["names"]["kind"], jsonschema.Draft7Validator(schema)


def check_samples() -> int:
    api_version, kind, validator = crd_validator()
    # MailDomain and MailAccount samples, each against its own CRD.
    store_validators = {}
    for path in STORE_CRDS:
        store_api_version, store_kind, store_validator = crd_validator(path)
        store_validators[(store_api_version, store_kind)] = store_validator
    n = 0
    files = sorted(glob.glob(str(MANIFESTS / "samples" / "*.yaml"))) + [
        str(MANIFESTS / "autoscaling" / "keda-scaledobject.yaml"),
        str(MANIFESTS / "autoscaling" / "prometheus-adapter-rules.yaml"),
        str(MANIFESTS / "argocd" / "application.yaml"),
        str(MANIFESTS / "argocd" / "argocd-cm.yaml"),
    ]
    clusters = 0
    for path in files:
        docs = load_docs(Path(path).read_text())
        if not docs:
            raise CheckFailed(f"{path}: no objects")
        others = []
        for doc in docs:
            store_validator = store_validators.get((doc.get("apiVersion"), doc.get("kind")))
            if store_validator is not None:
                errors = sorted(store_validator.iter_errors(doc), key=lambda e: list(e.path))
                if errors:
                    lines = [f"  {'.'.join(map(str, e.path))}: {e.message}" for e in errors]
                    raise CheckFailed(f"{path}: {doc['metadata']['name']}:\n" + "\n".join(lines))
            elif doc.get("apiVersion") == api_version and doc.get("kind") == kind:
                errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
                if errors:
                    lines = [f"  {'.'.join(map(str, e.path))}: {e.message}" for e in errors]
                    raise CheckFailed(f"{path}: {doc['metadata']['name']}:\n" + "\n".join(lines))
                clusters += 1
            else:
                others.append(doc)
        for version in (KUBE_OLDEST, KUBE_NEWEST):
            kube_validate(others, version, os.path.relpath(path, ROOT))
        print(f"ok  {os.path.relpath(path, ROOT)}: {len(docs)} objects")
        n += 1
    if clusters < 3:
        raise CheckFailed(f"only {clusters} MailCluster samples found")
    # Negative control: a misspelt field and a wrong type are both caught.
    sample = load_docs((MANIFESTS / "samples" / "minimal.yaml").read_text())[0]
    for mutate, what in (
        (lambda d: d["spec"].__setitem__("domians", ["x"]), "an unknown field"),
        (lambda d: d["spec"]["postgres"].__setitem__("poolSize", "ten"), "a wrong type"),
    ):
        bad = copy.deepcopy(sample)
        mutate(bad)
        if not list(validator.iter_errors(bad)):
            raise CheckFailed(f"CRD schema check accepted a sample with {what}")
        print(f"ok  CRD schema check rejects {what}")
        n += 1
    return n


# ---------------------------------------------------------------------------- health


def argocd_health(obj: dict, health_dir: Path = HEALTH_DIR) -> dict:
    """Runs health.lua of `health_dir` (MailCluster's by default) on one object as
    Argo CD does; returns {"status", "message"}."""
    from lupa.lua51 import LuaRuntime

    script = (health_dir / "health.lua").read_text()
    lua = LuaRuntime(unpack_returned_tuples=True)
    assert lua.eval("_VERSION") == "Lua 5.1", lua.eval("_VERSION")
    # Argo CD hands the object to the script as the global `obj` in a VM with only
    # the base and table libraries: the script runs here in the same confinement
    # (setfenv), so a call into string/os/io fails the check as it would there.
    run = lua.eval(
        """function(source, obj)
             local chunk, err = loadstring(source, "health.lua")
             if chunk == nil then error(err) end
             local env = {obj = obj, ipairs = ipairs, pairs = pairs, type = type,
                          tostring = tostring, tonumber = tonumber, next = next,
                          error = error, pcall = pcall, table = table}
             setfenv(chunk, env)
             return chunk()
           end"""
    )
    try:
        result = run(script, lua.table_from(obj, recursive=True))
    except Exception as e:  # lupa.LuaError: the script failed where Argo CD would too
        raise CheckFailed(f"health.lua raised: {e}") from None
    return {"status": result["status"], "message": result["message"]}


def check_health() -> int:
    n = 0
    wanted = {"Healthy", "Progressing", "Degraded"}
    for health_dir, statuses_wanted in [(HEALTH_DIR, wanted | {"Suspended"})] + [
        (d, wanted) for d in STORE_HEALTH_DIRS
    ]:
        tests = yaml.safe_load((health_dir / "health_test.yaml").read_text())["tests"]
        statuses = set()
        for case in tests:
            what = f"{health_dir.name}/{case['inputPath']}"
            obj = yaml.safe_load((health_dir / case["inputPath"]).read_text())
            try:
                got = argocd_health(obj, health_dir)
            except CheckFailed as e:
                raise CheckFailed(f"{what}: {e}") from None
            want = case["healthStatus"]
            if got != want:
                raise CheckFailed(f"{what}: got {got}, want {want}")
            statuses.add(got["status"])
            print(f"ok  health {what}: {got['status']}")
            n += 1
        missing = statuses_wanted - statuses
        if missing:
            raise CheckFailed(f"{health_dir.name}/health_test.yaml covers no case for {sorted(missing)}")
    return n


# ---------------------------------------------------------------------------- live cluster


def health_of() -> None:
    """Prints Argo CD's health of the MailCluster JSON on stdin as one JSON line."""
    print(json.dumps(argocd_health(json.load(sys.stdin))))


def helm_install(release: str, namespace: str, values_json: str) -> None:
    """A real `helm install` (Helm 4's SDK) of charts/mailcluster into the cluster of
    $KUBECONFIG, creating the namespace; prints the release's status."""
    h = helm()
    cfg = h.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
    try:
        rel = cfg.install(str(CHART), release, json.loads(values_json), namespace=namespace,
                          create_namespace=True, timeout=120)
        print(f"release {release} in {namespace}: {getattr(rel, 'info', rel)}")
    finally:
        cfg.close()


def helm_uninstall(release: str, namespace: str) -> None:
    h = helm()
    cfg = h.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
    try:
        cfg.uninstall(release, timeout=120)
        print(f"release {release} uninstalled")
    finally:
        cfg.close()


# ---------------------------------------------------------------------------- dashboard


def server_metrics() -> dict[str, bool]:
    """Metric name -> is a histogram, read from the server's registration code."""
    import re

    found: dict[str, bool] = {}
    for path in (ROOT / "server" / "src").rglob("*.rs"):
        text = path.read_text()
        for m in re.finditer(r'"(mail_[a-z0-9_]+)"', text):
            before = text[max(0, m.start() - 200) : m.start()]
            found[m.group(1)] = found.get(m.group(1), False) or "HistogramOpts::new(" in before[-60:]
    return found


def check_dashboard() -> int:
    import re

    known = server_metrics()
    path = MANIFESTS / "grafana" / "mailcluster-dashboard.json"
    dash = json.loads(path.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = set()
    for expr in exprs:
        for name in re.findall(r"\b(mail_[a-z0-9_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base not in known:
                raise CheckFailed(f"dashboard queries {name}, which the server does not export")
            if name.endswith("_bucket") and not known[base]:
                raise CheckFailed(f"dashboard takes quantiles of {base}, which is not a histogram")
            used.add(base)
    # The autoscaling signals must be on it.
    for needed in ("mail_pool_saturation", "mail_connections_active"):
        if needed not in used:
            raise CheckFailed(f"dashboard does not show {needed}")
    ids = [p["id"] for p in dash["panels"]]
    if len(ids) != len(set(ids)):
        raise CheckFailed("dashboard panel ids are not unique")
    print(f"ok  dashboard: {len(exprs)} queries over {len(used)} server metrics")
    return 1


# ---------------------------------------------------------------------------- main

COMMANDS = {
    "lint": check_lint,
    "template": check_template,
    "samples": check_samples,
    "health": check_health,
    "dashboard": check_dashboard,
}


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "helm-install" and len(argv) in (4, 5):
        helm_install(argv[2], argv[3], argv[4] if len(argv) == 5 else "{}")
        return 0
    if len(argv) == 4 and argv[1] == "helm-uninstall":
        helm_uninstall(argv[2], argv[3])
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = argv[1]
    if cmd == "health-of":
        try:
            health_of()
        except CheckFailed as e:
            print(f"FAIL health-of: {e}", file=sys.stderr)
            return 1
        return 0
    if cmd == "render-install":
        sys.stdout.write(render_install())
        return 0
    if cmd == "render-install-cluster-wide":
        sys.stdout.write(render_install({"clusterWide": True}, "clusterWide=true"))
        return 0
    if cmd == "render-argocd-cm":
        sys.stdout.write(render_argocd_cm())
        return 0
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        return 2
    try:
        n = COMMANDS[cmd]()
    except (CheckFailed, AssertionError) as e:
        print(f"FAIL {cmd}: {e}", file=sys.stderr)
        return 1
    print(f"{cmd}: {n} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
