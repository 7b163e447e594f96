# Shared steps of the end-to-end scripts (scripts/e2e-*.sh), sourced after `set -euo
# pipefail`: a namespace whose Pods tolerate the test node, the image under the tags
# the scripts roll between, the operator from the
# chart, this machine's PostgreSQL and Redis as Services, a MailCluster's migration
# and rollouts, and a cleanup that prints every Pod's log on a failure.
# Needs: kubectl, psql, python3 with helm-python-sdk; DATABASE_URL / REDIS_URL of the
# machine's services (defaults below).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KUBE_DIR="${MAILCLUSTER_KUBE_DIR:-/tmp/mailcluster-kube}"
export KUBECONFIG="${KUBECONFIG:-$KUBE_DIR/admin.kubeconfig}"
TIMEOUT="${E2E_TIMEOUT:-180}"
DATABASE_URL="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres}"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
NS="${E2E_NAMESPACE:-mc-e2e-$(date +%s)-$$}"
DB="e2e_${NS//-/_}"
MC=mail
# The CLI on this machine, for accounts on the test database.
MAILCLUSTER_BIN="${MAILCLUSTER_BIN:-$ROOT/target/debug/mailcluster}"
# The node's containerd (scripts/kube-node.sh), which holds the imported image.
CTD_SOCK="$KUBE_DIR/containerd/containerd.sock"
IMAGE_REPO=ghcr.io/mailcluster/mailcluster
IMAGE_VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)
NODE_IP=$(kubectl get nodes -l mailcluster.dev/test-node=true -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')

t0=$SECONDS
step() { printf '==> [%4ds] %s\n' "$((SECONDS - t0))" "$*"; }
die() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }
[ -n "$NODE_IP" ] || die "no test node in this cluster (scripts/kube-up.sh as root starts one)"

# psql against the machine's server, with the credentials of DATABASE_URL.
psql_admin() { psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -qAt "$@"; }
# The same credentials, the host part replaced: what the Pods use.
db_url_for() { # host database
    python3 - "$DATABASE_URL" "$1" "$2" <<'PY'
import sys, urllib.parse as u
url, host, db = sys.argv[1:]
p = u.urlsplit(url)
cred = p.netloc.rsplit("@", 1)[0] + "@" if "@" in p.netloc else ""
port = p.port or 5432
print(u.urlunsplit((p.scheme, f"{cred}{host}:{port}", "/" + db, p.query, "")))
PY
}
# The test database from this machine.
psql_db() { psql "$(db_url_for 127.0.0.1 "$DB")" -v ON_ERROR_STOP=1 -qAt "$@"; }
# The mailcluster CLI of this machine, on the test database. A clean environment:
# MAILCLUSTER_* variables of the caller (the test suite's own settings) would be read
# as configuration.
mailcluster_host() {
    env -i PATH="$PATH" MAILCLUSTER_DATABASE_URL="$(db_url_for 127.0.0.1 "$DB")" "$MAILCLUSTER_BIN" "$@"
}

# Run at exit with the exit status, before the cleanup below.
E2E_CLEANUP_HOOKS=()
on_exit() {
    local rc=$?
    local hook
    for hook in "${E2E_CLEANUP_HOOKS[@]}"; do "$hook" "$rc" || true; done
    if [ "$rc" -ne 0 ]; then
        echo "---- pods ----" >&2
        kubectl get pods -n "$NS" -o wide >&2 || true
        echo "---- events ----" >&2
        kubectl get events -n "$NS" --sort-by=.lastTimestamp 2>/dev/null | tail -n 40 >&2 || true
        echo "---- mailcluster ----" >&2
        kubectl get mailcluster -n "$NS" -o yaml 2>/dev/null | sed -n '/^status:/,$p' >&2 || true
        local pod
        for pod in $(kubectl get pods -n "$NS" -o name 2>/dev/null); do
            echo "---- ${pod#pod/} ----" >&2
            kubectl logs -n "$NS" "$pod" --all-containers --prefix --tail=40 >&2 2>&1 || true
            kubectl logs -n "$NS" "$pod" --all-containers --prefix --tail=20 --previous >&2 2>/dev/null || true
        done
    fi
    if [ "${E2E_KEEP:-0}" != 1 ]; then
        python3 "$ROOT/scripts/install_checks.py" helm-uninstall mc-e2e "$NS" >/dev/null 2>&1 || true
        kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
        psql_admin -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    exit "$rc"
}
trap on_exit EXIT

until_true() { # what command...
    local what=$1; shift
    local deadline=$((SECONDS + TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "$what: not within ${TIMEOUT}s"
        sleep 1
    done
}

svc_ip() { kubectl get service -n "$NS" "$1" -o jsonpath='{.spec.clusterIP}'; }

# Namespace, operator and backends: everything before the MailCluster.
e2e_prepare() {
    step "namespace $NS; its Pods tolerate the test node's taint (PodTolerationRestriction)"
    kubectl create namespace "$NS" >/dev/null
    kubectl annotate namespace "$NS" >/dev/null \
        'scheduler.alpha.kubernetes.io/defaultTolerations=[{"key":"mailcluster.dev/test-node","operator":"Exists"}]'

    step "image $IMAGE_REPO:$IMAGE_VERSION on the node, also tagged e2e and e2e-2 (a rollout changes the tag)"
    local tag
    for tag in e2e e2e-2; do
        ctr --address "$CTD_SOCK" --namespace k8s.io images tag --force "$IMAGE_REPO:$IMAGE_VERSION" "$IMAGE_REPO:$tag" >/dev/null \
            || die "the node has no image $IMAGE_REPO:$IMAGE_VERSION (scripts/kube-up.sh imports it)"
    done

    step "operator from charts/mailcluster (helm install), watching $NS"
    python3 "$ROOT/scripts/install_checks.py" helm-install mc-e2e "$NS" \
        "{\"replicaCount\": 1, \"leaderElection\": {\"enabled\": false}, \"watchNamespace\": \"$NS\", \"image\": {\"tag\": \"e2e\"}}" >/dev/null
    kubectl -n "$NS" rollout status deployment/mc-e2e-mailcluster --timeout="${TIMEOUT}s"

    step "backends: PostgreSQL database $DB and Redis of this machine, as Services pg and redis -> $NODE_IP"
    psql_admin -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
    host_service pg 5432
    host_service redis 6379
    kubectl create secret generic mail-db -n "$NS" --from-literal=url="$(db_url_for "pg.$NS.svc" "$DB")" >/dev/null
    kubectl create secret generic mail-redis -n "$NS" --from-literal=url="redis://redis.$NS.svc:6379" >/dev/null
}

# A Service without selector and its EndpointSlice: the way to give Pods a database
# that lives outside the cluster.
host_service() { # name port
    kubectl apply -n "$NS" -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: $1}
spec:
  ports: [{name: tcp, port: $2, targetPort: $2}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $1-host
  labels: {kubernetes.io/service-name: $1}
addressType: IPv4
ports: [{name: tcp, port: $2, protocol: TCP}]
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
YAML
}

# The MailCluster $MC on this machine's backends; the rest of its spec (indented two
# spaces) on stdin. POSTGRES overrides the postgres line's settings after the Secret.
apply_mailcluster() {
    { cat <<YAML
apiVersion: mailcluster.dev/v1alpha1
kind: MailCluster
metadata: {name: $MC}
spec:
  image: {tag: e2e}
  domains: [e2e.test]
  postgres: {urlSecretRef: {name: mail-db}, ${POSTGRES:-poolSize: 8, maxConnections: 100}}
  redis: {urlSecretRef: {name: mail-redis}, keyPrefix: "$NS:"}
YAML
      cat; } | kubectl apply -n "$NS" -f - >/dev/null
}

# After the MailCluster is applied: its migration Job, then each protocol's rollout.
e2e_wait_ready() { # protocol...
    step "schema migration Job completes"
    until_true "the migration Job" sh -c "kubectl get jobs -n $NS -o name | grep -q migrate"
    kubectl wait -n "$NS" --for=condition=Complete job -l app.kubernetes.io/component=migrate --timeout="${TIMEOUT}s"

    step "Pods Ready: $*"
    local p
    for p in "$@"; do
        until_true "Deployment $MC-$p" kubectl get deployment -n "$NS" "$MC-$p"
        kubectl -n "$NS" rollout status "deployment/$MC-$p" --timeout="${TIMEOUT}s"
    done
    # A Ready Pod is in the Service's endpoints at once, but kube-proxy programs
    # the Service's rules on its own sync a moment later (seconds on a busy node):
    # a client that connects in between is refused. Clients here connect once.
    local ip port
    for p in "$@"; do
        ip=$(svc_ip "$MC-$p")
        port=$(kubectl get service -n "$NS" "$MC-$p" -o jsonpath='{.spec.ports[0].port}')
        until_true "Service $MC-$p ($ip:$port) accepts connections" \
            timeout 2 bash -c "exec 3<>/dev/tcp/$ip/$port"
    done
    kubectl get pods -n "$NS" -o wide
}

# The node-side PID of a Pod's first container (containerd's task of it).
container_pid() { # pod
    local id
    id=$(kubectl get pod -n "$NS" "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
    id=${id#containerd://}
    [ -n "$id" ] || die "$1 has no running container"
    ctr --address "$CTD_SOCK" --namespace k8s.io tasks ls | awk -v id="$id" '$1 == id {print $2}'
}

# A Kubernetes quantity of memory ("512Mi", "1G", "1048576") in bytes.
quantity_bytes() {
    python3 - "$1" <<'PY'
import re, sys
n, unit = re.fullmatch(r"(\d+)([A-Za-z]*)", sys.argv[1]).groups()
scale = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[unit]
print(int(n) * scale)
PY
}
