#!/usr/bin/env bash
# 10,000 concurrent connections to one mail Pod, without and with the kernel tuning
# of MailCluster spec.tuning (docs/tuning.md), on the one-machine cluster's real node.
#
#   eval "$(sudo scripts/kube-up.sh)" && sudo -E bench/tuning.sh
#
# Two Pods of the image (`serve` with its embedded store and USERS accounts made
# with `kubectl exec … mailcluster user add`); the second with the sysctls
# spec.tuning renders (somaxconn 8192, port range, keepalive, FIN timeout, socket
# buffers). Against each, bench/idle_flood.py opens CONNS (10000) sessions over RAMP
# seconds (10) and holds them HOLD seconds (20): SMTP connect, greeting and NOOP;
# IMAP connect, greeting, LOGIN (cleartext allowed for the run) and IDLE — then
# proves each still answers. A burst (all at once) is `mailcluster stress -s
# connect-flood --ramp-up 0s` against the same Pods (bench/RESULTS.md). The Pod's
# network-namespace counters (nstat: ListenOverflows, ListenDrops, TCPReqQFullDrop,
# SyncookiesSent) are read before and after. Prints one table; bounded by its
# durations; removes its namespace.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KUBE_DIR="${MAILCLUSTER_KUBE_DIR:-/tmp/mailcluster-kube}"
export KUBECONFIG="${KUBECONFIG:-$KUBE_DIR/admin.kubeconfig}"
CONNS="${CONNS:-10000}"
RAMP="${RAMP:-10}"
HOLD="${HOLD:-20}"
USERS="${USERS:-20}"
PASSWORD=bench-secret
NS="mc-tuning-$$"
CTD_SOCK="$KUBE_DIR/containerd/containerd.sock"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)
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
    # Cleartext LOGIN on 143: what is measured is the kernel's and the server's
    # handling of many sessions, not TLS (which would make the load client, not the
    # Pod, the bottleneck on a small machine).
    - {name: MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH, value: "true"}
    # USERS accounts hold CONNS sessions between them (the default is 50 per account).
    - {name: MAILCLUSTER_IMAP__MAX_CONNECTIONS_PER_USER, value: "1000"}
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
for name in untuned tuned; do
    kubectl exec -n "$NS" "$name" -- mailcluster domain add bench.test >/dev/null
    for i in $(seq 1 "$USERS"); do
        printf '%s\n' "$PASSWORD" | kubectl exec -i -n "$NS" "$name" -- mailcluster user add "$(printf 'user%03d@bench.test' "$i")" >/dev/null
    done
done

pid_of() {
    local id
    id=$(kubectl get pod -n "$NS" "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
    ctr --address "$CTD_SOCK" --namespace k8s.io tasks ls | awk -v id="${id#containerd://}" '$1 == id {print $2}'
}
counters() { # pid
    nsenter --target "$1" --net nstat -az TcpExtListenOverflows TcpExtListenDrops TcpExtTCPReqQFullDrop TcpExtSyncookiesSent \
        | awk 'NR > 1 && $1 !~ /^#/ {printf "%s=%s ", $1, $2}'
}

printf '%-8s %-5s %8s %7s %14s %14s %s\n' pod proto opened errors "greeting p50/p99" "login|noop p50/p99" "alive after hold; kernel counters (delta)"
for name in untuned tuned; do
    ip=$(kubectl get pod -n "$NS" "$name" -o jsonpath='{.status.podIP}')
    pid=$(pid_of "$name")
    somax=$(nsenter --target "$pid" --net cat /proc/sys/net/core/somaxconn)
    backlog=$(nsenter --target "$pid" --net ss -ltnH 'sport = :10025' | awk '{print $3}')
    echo "# $name: somaxconn $somax, SMTP listener backlog $backlog, pod $ip" >&2
    for proto in smtp imap; do
        port=10025; [ "$proto" = imap ] && port=10143
        before=$(counters "$pid")
        python3 "$ROOT/bench/idle_flood.py" "$proto" "$ip" "$port" --conns "$CONNS" --ramp "$RAMP" --hold "$HOLD" \
            --users-template 'user{:03}@bench.test' --users-count "$USERS" --password "$PASSWORD" >"$WORK/$name-$proto.json"
        after=$(counters "$pid")
        python3 - "$WORK/$name-$proto.json" "$name" "$before" "$after" <<'PY'
import json, sys
path, name, before, after = sys.argv[1:]
r = json.load(open(path))
b = dict(kv.split("=") for kv in before.split())
a = dict(kv.split("=") for kv in after.split())
delta = " ".join(f"{k[6:]}={int(a[k]) - int(b.get(k, 0))}" for k in sorted(a))
second = r.get("login_ms") or r.get("noop_ms")
errors = sum(r["errors"].values())
kinds = ",".join(f"{k}:{n}" for k, n in r["errors"].items())
print(f"{name:<8} {r['protocol']:<5} {r['opened']:>8} {errors:>7} "
      f"{str(r['greeting_ms']['p50']) + '/' + str(r['greeting_ms']['p99']):>14} "
      f"{str(second['p50']) + '/' + str(second['p99']):>14} {r['alive_after_hold']}; {delta} {kinds}")
PY
    done
done
