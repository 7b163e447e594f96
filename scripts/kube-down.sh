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

# The node first: the kubelet (so it restarts nothing), then every container and
# its shim (containerd leaves them running by design), containerd; clients next,
# storage last.
stop mailcluster-node-services
stop kubelet
if [ "$(id -u)" = 0 ]; then
    # Every process of every Pod: the kubelet's cgroups hold them all.
    for round in 1 2 3; do
        pids=$(cat /sys/fs/cgroup/pids/kubepods/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/cgroup.procs \
            /sys/fs/cgroup/pids/kubepods/*/*/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/*/*/cgroup.procs \
            /sys/fs/cgroup/kubepods/cgroup.procs 2>/dev/null | sort -u || true)
        [ -n "$pids" ] || break
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
    done
    # The shims of this containerd (their command line names its socket's directory).
    for pid in $(pgrep -f "containerd-shim.*-address $DIR/containerd/" 2>/dev/null || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
fi
stop containerd
for c in kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$c"; done

if [ "$(id -u)" = 0 ]; then
    # What containerd and the kubelet leave in the kernel: mounts under the state
    # directory (volumes, the container roots), the Pods' network namespaces, the
    # kubelet's cgroups (deepest first).
    grep -o " $DIR/[^ ]*" /proc/mounts 2>/dev/null | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    for ns in /run/netns/cni-*; do
        [ -e "$ns" ] || continue
        ip netns del "$(basename "$ns")" 2>/dev/null || true
    done
    for controller in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
        [ -d "$controller" ] || continue
        find "$controller" -depth -type d -exec rmdir {} \; 2>/dev/null || true
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
