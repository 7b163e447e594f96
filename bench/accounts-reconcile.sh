#!/usr/bin/env bash
# N MailAccount objects (default 1,000), each with its password Secret, applied
# to a real control plane (scripts/kube-up.sh), then reconciled into a fresh
# PostgreSQL database by `mailcluster operator` started on this machine: the
# time from the operator's start to every MailAccount Ready=True (the time of
# `kubectl apply` itself is reported beside it).
#
#   eval "$(scripts/kube-up.sh)" && bench/accounts-reconcile.sh [N]
#   PASSWORDS=plain: Secrets hold plain passwords (an argon2id hash per account)
#   instead of one SHA512-CRYPT hash (stored as given, no hashing).
#
# The MailCluster is `paused` (no Deployments: no node is needed) and names the
# database and Redis through Secrets, as any MailCluster does. The operator is
# MC (default target/release/mailcluster) with --namespace and no leader
# election. Output goes to bench/results/accounts-reconcile/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_postgres >/dev/null
ensure_redis >/dev/null
N=${1:-1000}
MC=${MC:-target/release/mailcluster}
PASSWORDS=${PASSWORDS:-hash}
OUT=bench/results/accounts-reconcile
mkdir -p "$OUT"
NS="bench-accounts-$$"
DB="bench_accounts_$$"
WORK=$(mktemp -d)
OP_PID=
cleanup() {
  [ -n "$OP_PID" ] && kill "$OP_PID" 2>/dev/null && wait "$OP_PID" 2>/dev/null
  kubectl get mailaccounts -n "$NS" -o name 2>/dev/null |
    xargs -r -n 200 kubectl patch -n "$NS" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

psql "$DATABASE_URL" -qc "CREATE DATABASE $DB" >/dev/null
URL="${DATABASE_URL%/*}/$DB"
MAILCLUSTER_DATABASE_URL=$URL "$MC" migrate >/dev/null 2>&1
kubectl apply --server-side --force-conflicts -f crds/ >/dev/null
kubectl create namespace "$NS" >/dev/null
kubectl -n "$NS" create secret generic mail-db --from-literal=url="$URL" >/dev/null
kubectl -n "$NS" create secret generic mail-redis --from-literal=url="$REDIS_URL" >/dev/null
kubectl -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: mailcluster.dev/v1alpha1
kind: MailCluster
metadata: {name: mail}
spec:
  image: {tag: 0.1.0}
  domains: [example.com]
  paused: true
  postgres: {urlSecretRef: {name: mail-db}}
  redis: {urlSecretRef: {name: mail-redis}}
---
apiVersion: mailcluster.dev/v1alpha1
kind: MailDomain
metadata: {name: example-com}
spec: {clusterRef: mail, domain: example.com}
EOF

HASH='$6$saltsalt$UV8BYgqN7u34iPYiLihbOjmF22xo0X75SlnQFYRpDJsgJaXUiVT9jRyx4l4tz0FMJBBZGZbqw/l1xfhEu2dJa/'
python3 - "$N" "$HASH" "$PASSWORDS" > "$WORK/accounts.yaml" <<'EOF'
import json, sys
n, h, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
for i in range(n):
    name = f"user{i:05d}"
    password = f"password-{i}" if kind == "plain" else h
    print("---")
    print(json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-password"},
                      "stringData": {"password": password}}))
    print("---")
    print(json.dumps({"apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailAccount", "metadata": {"name": name},
                      "spec": {"clusterRef": "mail", "address": f"{name}@example.com",
                               "aliases": [f"alias-{name}@example.com"],
                               "passwordSecretRef": {"name": f"{name}-password", "key": "password"}}}))
EOF

# The domain is in the store before the operator starts (as its MailDomain
# would have put it there), so no account waits for it.
MAILCLUSTER_DATABASE_URL=$URL MAILCLUSTER_DATABASE__MIGRATE_ON_START=false "$MC" domain add example.com >/dev/null 2>&1

ready_count() {
  kubectl -n "$NS" get mailaccounts -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null |
    grep -c '^True$' || true
}
# Not a pipeline: the operator started inside must be this shell's child, for
# the cleanup to stop it.
RESULT="$OUT/run-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "## machine: $(nproc) cores; $(free -g | awk '/Mem:/{print $2" GiB RAM"}'); $(. /etc/os-release; echo "$PRETTY_NAME"); load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
  echo "## $N MailAccounts + $N Secrets (passwords: $PASSWORDS), kubectl apply --server-side, operator $MC"
  # Everything applied first, then the operator started: the time to all
  # Ready is the operator's, not kubectl's (which sends the objects one by one).
  a0=$(date +%s.%N)
  kubectl -n "$NS" apply --server-side -f "$WORK/accounts.yaml" >/dev/null
  applied=$(date +%s.%N)
  start=$(date +%s.%N)
  "$MC" operator --namespace "$NS" --no-leader-election --metrics-addr 127.0.0.1:0 >"$WORK/operator.log" 2>&1 &
  OP_PID=$!
  while :; do
    n=$(ready_count)
    [ "$n" -ge "$N" ] && break
    now=$(date +%s.%N)
    python3 -c "import sys; sys.exit(float(sys.argv[1])-float(sys.argv[2]) > 900)" "$now" "$start" || { echo "## timed out with $n Ready"; exit 1; }
    sleep 1
  done
  end=$(date +%s.%N)
  stored=$(psql "$URL" -Atc "SELECT count(*) FROM accounts")
  python3 -c "import sys; a0,a,s,e=map(float,sys.argv[1:5]); n=int(sys.argv[5]); print(f'## kubectl apply of the {2*n} objects {a-a0:.1f} s; operator started, all {n} MailAccounts Ready {e-s:.1f} s later ({n/(e-s):.0f} accounts/s); {sys.argv[6]} accounts in the store')" "$a0" "$applied" "$start" "$end" "$N" "$stored"
} > "$RESULT"
cat "$RESULT"
