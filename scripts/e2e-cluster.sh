#!/usr/bin/env bash
# The whole loop on one machine, against a cluster from scripts/kube-up.sh with its
# test node (as root): the operator installed from the chart runs as a Pod, a
# MailCluster whose PostgreSQL and Redis are this machine's (Services without
# selector + EndpointSlices to the node's address), the migration Job, SMTP, IMAP
# and POP3 Pods Ready, a message sent with swaks through the SMTP Service and read
# with curl through the IMAP Service, an on-demand stress run whose verdict lands in
# status.lastStress and SLOMet, `kubectl wait --for=condition=Ready` as
# docs/quickstart.md uses it, and a delete that cascades.
#
#   eval "$(scripts/kube-up.sh)" && scripts/e2e-cluster.sh
#
# Every step is logged with its time; the last line is the SLOMet condition. On a
# failure the script prints the namespace's Pods, events and the logs of every
# container (the node keeps them in $MAILCLUSTER_KUBE_DIR/node/pods/). Bounded:
# each wait has its own timeout (E2E_TIMEOUT, default 180 s).
# Needs: kubectl, swaks, curl, psql, python3 with helm-python-sdk (scripts/test.sh
# installs them), DATABASE_URL / REDIS_URL of the machine's services (defaults below).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KUBE_DIR="${MAILCLUSTER_KUBE_DIR:-/tmp/mailcluster-kube}"
export KUBECONFIG="${KUBECONFIG:-$KUBE_DIR/admin.kubeconfig}"
TIMEOUT="${E2E_TIMEOUT:-180}"
DATABASE_URL="${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres}"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
NS="${E2E_NAMESPACE:-mc-e2e-$(date +%s)-$$}"
DB="e2e_${NS//-/_}"
NODE_IP=$(kubectl get nodes -l mailcluster.dev/test-node=true -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
MC=mail
PASSWORD=e2e-secret-$$

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

on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "---- pods ----" >&2
        kubectl get pods -n "$NS" -o wide >&2 || true
        echo "---- events ----" >&2
        kubectl get events -n "$NS" --sort-by=.lastTimestamp 2>/dev/null | tail -n 40 >&2 || true
        echo "---- mailcluster ----" >&2
        kubectl get mailcluster -n "$NS" -o yaml 2>/dev/null | sed -n '/^status:/,$p' >&2 || true
        for f in "$KUBE_DIR"/node/pods/"${NS}"_*/logs/*.log; do
            [ -f "$f" ] || continue
            echo "---- $(basename "$(dirname "$(dirname "$f")")") $(basename "$f") ----" >&2
            tail -n 40 "$f" >&2
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

step "namespace $NS; its Pods tolerate the test node's taint (PodTolerationRestriction)"
kubectl create namespace "$NS" >/dev/null
kubectl annotate namespace "$NS" >/dev/null \
    'scheduler.alpha.kubernetes.io/defaultTolerations=[{"key":"mailcluster.dev/test-node","operator":"Exists"}]'

step "operator from charts/mailcluster (helm install), watching $NS"
python3 "$ROOT/scripts/install_checks.py" helm-install mc-e2e "$NS" \
    "{\"replicaCount\": 1, \"leaderElection\": {\"enabled\": false}, \"watchNamespace\": \"$NS\", \"image\": {\"tag\": \"e2e\"}}" >/dev/null
kubectl -n "$NS" rollout status deployment/mc-e2e-mailcluster --timeout="${TIMEOUT}s"

step "backends: PostgreSQL database $DB and Redis of this machine, as Services pg and redis -> $NODE_IP"
psql_admin -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
# A Service without selector and its EndpointSlice: the way to give Pods a
# database that lives outside the cluster.
host_service() { # name port
    kubectl apply -n "$NS" -f - >/dev/null <<EOF
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
EOF
}
host_service pg 5432
host_service redis 6379
kubectl create secret generic mail-db -n "$NS" --from-literal=url="$(db_url_for "pg.$NS.svc" "$DB")" >/dev/null
kubectl create secret generic mail-redis -n "$NS" --from-literal=url="redis://redis.$NS.svc:6379" >/dev/null

step "MailCluster $MC: SMTP, submission, IMAP, POP3; one replica each; a small stress plan"
kubectl apply -n "$NS" -f - >/dev/null <<EOF
apiVersion: mailcluster.dev/v1alpha1
kind: MailCluster
metadata: {name: $MC}
spec:
  image: {tag: e2e}
  domains: [e2e.test]
  postgres: {urlSecretRef: {name: mail-db}, poolSize: 8, maxConnections: 100}
  redis: {urlSecretRef: {name: mail-redis}, keyPrefix: "$NS:"}
  pop3: {enabled: true}
  autoscaling: {minReplicas: 1, maxReplicas: 2}
  stress:
    deadlineSeconds: 300
    users: {count: 5}
    scenarios:
      - {name: seed, kind: seed, messagesPerUser: 5}
      - {name: deliver, kind: deliver, rate: 20, duration: 10s}
      - {name: fetch, kind: fetch, concurrency: 4, duration: 10s}
      - {name: pop3, kind: pop3, concurrency: 2, duration: 5s}
    slo: {successRate: 99.0, smtpP95Ms: 2000, imapFetchP95Ms: 2000}
EOF

step "schema migration Job completes"
until_true "the migration Job" sh -c "kubectl get jobs -n $NS -o name | grep -q migrate"
kubectl wait -n "$NS" --for=condition=Complete job -l app.kubernetes.io/component=migrate --timeout="${TIMEOUT}s"

step "SMTP, submission, IMAP and POP3 Pods Ready"
for p in smtp submission imap pop3; do
    until_true "Deployment $MC-$p" kubectl get deployment -n "$NS" "$MC-$p"
    kubectl -n "$NS" rollout status "deployment/$MC-$p" --timeout="${TIMEOUT}s"
done
kubectl get pods -n "$NS" -o wide

step "an account (mailcluster user add, on the same database)"
# A clean environment: MAILCLUSTER_* variables of the caller (the test suite's own
# settings) would be read as configuration.
echo "$PASSWORD" | env -i PATH="$PATH" MAILCLUSTER_DATABASE_URL="$(db_url_for 127.0.0.1 "$DB")" \
    "$ROOT/target/${MAILCLUSTER_KUBE_PROFILE:-debug}/mailcluster" user add alice@e2e.test

svc_ip() { kubectl get service -n "$NS" "$1" -o jsonpath='{.spec.clusterIP}'; }
SMTP_IP=$(svc_ip "$MC-smtp")
IMAP_IP=$(svc_ip "$MC-imap")
step "swaks -> Service $MC-smtp ($SMTP_IP:25)"
swaks --server "$SMTP_IP:25" --from bob@example.net --to alice@e2e.test \
    --header "Subject: e2e $NS" --body "through the Service" --timeout 30 --silent 1
step "curl <- Service $MC-imap ($IMAP_IP:143)"
got=$(curl -sS --max-time 30 -k --ssl-reqd "imap://$IMAP_IP:143/INBOX;UID=1" -u "alice@e2e.test:$PASSWORD")
grep -q "Subject: e2e $NS" <<<"$got" || die "the message read through IMAP is not the one sent: $got"
echo "read back: $(grep '^Subject:' <<<"$got")"

step "stress run on demand (annotation mailcluster.dev/run-stress)"
kubectl annotate -n "$NS" "mailcluster/$MC" "mailcluster.dev/run-stress=e2e-$(date +%s)" --overwrite >/dev/null
slo_condition() {
    kubectl get mailcluster -n "$NS" "$MC" -o jsonpath='{.status.conditions[?(@.type=="SLOMet")].status}'
}
until_true "status.lastStress" sh -c "kubectl get mailcluster -n $NS $MC -o jsonpath='{.status.lastStress.verdict}' | grep -q ."
kubectl get mailcluster -n "$NS" "$MC" -o jsonpath='{.status.lastStress}'; echo
# The operator turns the verdict into SLOMet on its next reconcile.
until_true "SLOMet decided" sh -c "kubectl get mailcluster -n $NS $MC -o jsonpath='{.status.conditions[?(@.type==\"SLOMet\")].status}' | grep -qv Unknown"
[ "$(slo_condition)" = True ] || die "SLOMet is $(slo_condition)"

step "kubectl wait --for=condition=Ready mc/$MC (docs/quickstart.md)"
kubectl -n "$NS" wait --for=condition=Ready "mc/$MC" --timeout="${TIMEOUT}s"
kubectl -n "$NS" get mailclusters

step "delete the MailCluster: its children go with it"
kubectl delete -n "$NS" "mailcluster/$MC" --timeout="${TIMEOUT}s"
gone() {
    [ -z "$(kubectl get deployments,services,jobs,cronjobs,configmaps,pods -n "$NS" \
        -l app.kubernetes.io/instance="$MC" -o name 2>/dev/null)" ]
}
until_true "cascading delete" gone

step "SLOMet=True (stress verdict recorded before the delete)"
echo "SLOMet=True"
