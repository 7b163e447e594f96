#!/usr/bin/env bash
# 10,000 concurrent connections to one mail Pod, without and with the kernel tuning
# of MailCluster spec.tuning (docs/tuning.md), on the one-machine cluster's real node.
#
#   eval "$(sudo scripts/kube-up.sh)" && sudo -E bench/tuning.sh
#
# For each of the two Pods (the image's `serve` with its embedded store; the second
# with the sysctls spec.tuning renders: somaxconn 8192, port range, keepalive, FIN
# timeout, socket buffers) and each protocol (SMTP connect-and-hold, IMAP
# connect-and-hold over TLS-less 143), `mailcluster stress -s connect-flood` opens
# CONNS (10000) connections in RAMP (2s), holds them HOLD (20s), and reports errors
# and connect latency percentiles. The Pod's network namespace counters (nstat:
# ListenOverflows, ListenDrops, TCPReqQFullDrop, SyncookiesSent) are read before and
# after. Prints one table; bounded by its durations, removes its namespace.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KUBE_DIR="${MAILCLUSTER_KUBE_DIR:-/tmp/mailcluster-kube}"
export KUBECONFIG="${KUBECONFIG:-$KUBE_DIR/admin.kubeconfig}"
CONNS="${CONNS:-10000}"
RAMP="${RAMP:-2s}"
HOLD="${HOLD:-20s}"
NS="mc-tuning-$$"
CTD_SOCK="$KUBE_DIR/containerd/containerd.sock"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)
BIN="${MAILCLUSTER_BIN:-$ROOT/target/release/mailcluster}"
[ -x "$BIN" ] || BIN=$(command -v mailcluster)
WORK=$(mktemp -d)
trap 'kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
ulimit -n "$(ulimit -Hn)"

kubectl create namespace "$NS" >/dev/null
kubectl annotate namespace "$NS" >/dev/null \
    'scheduler.alpha.kubernetes.io/defaultTolerations=[{"key":"mailcluster.dev/test-node","operator":"Exists"}]'

pod() { # name sysctls-json
    kubectl apply -n "$NS" -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  securityContext: {runAsUser: 65532, runAsNonRoot: true, sysctls: $2}
  containers:
  - name: mail
    image: ghcr.io/mailcluster/mailcluster:$VERSION
    imagePullPolicy: IfNotPresent
    args: [serve]
    env:
    - {name: MAILCLUSTER_NET__MAX_CONNECTIONS, value: "15000"}
    - {name: MAILCLUSTER_NET__MAX_CONNECTIONS_PER_IP, value: "0"}
    - {name: MAILCLUSTER_SMTP__MAX_CONNECTIONS_PER_IP, value: "0"}
    - {name: MAILCLUSTER_IMAP__MAX_CONNECTIONS_PER_IP, value: "0"}
    resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 1Gi}}
    readinessProbe: {httpGet: {path: /readyz, port: 9090}, periodSeconds: 1}
YAML
}
pod untuned '[]'
pod tuned '[{name: net.core.somaxconn, value: "8192"}, {name: net.ipv4.ip_local_port_range, value: "16384 65000"},
  {name: net.ipv4.tcp_keepalive_time, value: "300"}, {name: net.ipv4.tcp_keepalive_intvl, value: "30"},
  {name: net.ipv4.tcp_keepalive_probes, value: "5"}, {name: net.ipv4.tcp_fin_timeout, value: "15"},
  {name: net.ipv4.tcp_rmem, value: "4096 87380 6291456"}, {name: net.ipv4.tcp_wmem, value: "4096 65536 4194304"}]'
kubectl wait -n "$NS" --for=condition=Ready pod/untuned pod/tuned --timeout=120s >/dev/null

pid_of() {
    local id
    id=$(kubectl get pod -n "$NS" "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
    ctr --address "$CTD_SOCK" --namespace k8s.io tasks ls | awk -v id="${id#containerd://}" '$1 == id {print $2}'
}
counters() { # pid
    nsenter --target "$1" --net nstat -az TcpExtListenOverflows TcpExtListenDrops TcpExtTCPReqQFullDrop TcpExtSyncookiesSent \
        | awk 'NR > 1 && $1 !~ /^#/ {printf "%s=%s ", $1, $2}'
}

printf '%-8s %-5s %8s %7s %9s %9s %9s %s\n' pod proto conns errors "p50 ms" "p99 ms" "max ms" "kernel counters (delta)"
for name in untuned tuned; do
    ip=$(kubectl get pod -n "$NS" "$name" -o jsonpath='{.status.podIP}')
    pid=$(pid_of "$name")
    somax=$(nsenter --target "$pid" --net cat /proc/sys/net/core/somaxconn)
    backlog=$(nsenter --target "$pid" --net ss -ltnH 'sport = :10025' | awk '{print $3}')
    echo "# $name: somaxconn $somax, SMTP listener backlog $backlog, pod $ip" >&2
    for proto in smtp imap; do
        port=10025; [ "$proto" = imap ] && port=10143
        before=$(counters "$pid")
        "$BIN" stress -s connect-flood --protocol "$proto" "--$proto" "$ip:$port" --concurrency "$CONNS" \
            --ramp-up "$RAMP" --duration "$HOLD" --timeout 10s --success-rate 0 --no-progress \
            --json "$WORK/$name-$proto.json" >"$WORK/$name-$proto.out" 2>&1 || true
        after=$(counters "$pid")
        python3 - "$WORK/$name-$proto.json" "$name" "$proto" "$before" "$after" <<'PY'
import json, sys
path, name, proto, before, after = sys.argv[1:]
try:
    totals = json.load(open(path))["totals"]
except Exception as e:
    print(f"{name:<8} {proto:<5} run failed: {e}")
    sys.exit(0)
t = next((v for v in totals.values() if v.get("primary")), next(iter(totals.values())))
b = dict(kv.split("=") for kv in before.split())
a = dict(kv.split("=") for kv in after.split())
delta = " ".join(f"{k[6:]}={int(a[k]) - int(b.get(k, 0))}" for k in sorted(a))
kinds = ",".join(f"{k}:{n}" for k, n in t["errors_by_kind"].items())
print(f"{name:<8} {proto:<5} {t['count']:>8} {t['errors']:>7} "
      f"{t['p50_ms']:>9.2f} {t['p99_ms']:>9.2f} {t['max_ms']:>9.2f} {delta} {kinds}")
PY
    done
done
