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

# Clients first, storage last.
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$c"; done

if [ "$keep" -eq 0 ] && [ -d "$DIR" ]; then
    rm -rf "$DIR"
fi
echo "control plane stopped" >&2
