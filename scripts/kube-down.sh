#!/usr/bin/env bash
# Stops the control plane started by scripts/kube-up.sh (by the PIDs it recorded:
# SIGTERM, then SIGKILL after 10 s) and removes its state directory. With --keep the
# state (logs, etcd data, certificates) stays for a look after a failure.
set -euo pipefail
DIR="${MAILCLUSTER_KUBE_DIR:-/tmp/mailcluster-kube}"
keep=0
[ "${1:-}" = "--keep" ] && keep=1

stop() {
    local pidfile="$DIR/pids/$1" pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

# The node first (it ends its Pods' processes), clients next, storage last.
for c in mailcluster-test-node kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$c"; done

# What the test node and kube-proxy leave in the kernel: Pod network namespaces
# (and their processes), kube-proxy's iptables chains, the bridge.
if [ "$(id -u)" = 0 ] && [ -d /run/netns ]; then
    for ns in /run/netns/mcpod-*; do
        [ -e "$ns" ] || continue
        name=$(basename "$ns")
        for pid in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$name" 2>/dev/null || true
    done
fi
if [ -f "$DIR/bin-dir" ] && [ -x "$(cat "$DIR/bin-dir")/kube-proxy" ] && command -v iptables >/dev/null 2>&1; then
    "$(cat "$DIR/bin-dir")/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
bridge="${MAILCLUSTER_KUBE_NODE_BRIDGE:-mcbr0}"
if [ "$(id -u)" = 0 ] && [ -d "/sys/class/net/$bridge" ]; then
    ip link del "$bridge" 2>/dev/null || true
fi

if [ "$keep" -eq 0 ] && [ -d "$DIR" ]; then
    rm -rf "$DIR"
fi
echo "control plane stopped" >&2
