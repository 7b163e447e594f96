#!/usr/bin/env bash
# The shipped image: its size, and a cold start to /readyz in a container.
#
#   sudo bench/image.sh [ARCHIVE]     (default: builds it with scripts/image-build.sh)
#
# Starts a containerd of its own in a temporary directory (Debian's containerd and
# runc), imports the OCI archive, then ROUNDS (default 5) times runs a new container
# of it on the host's network with `serve` and its defaults (embedded SQLite store,
# generated certificate, an empty data directory each time: a cold start), and
# times from `ctr run` to the first 200 of http://127.0.0.1:9090/readyz. Prints the
# image's compressed and unpacked size and each start, then the median. Stops its
# containerd and removes everything at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS="${ROUNDS:-5}"
[ "$(id -u)" = 0 ] || { echo "run as root (containerd)" >&2; exit 1; }
for tool in containerd ctr runc curl python3; do
    command -v "$tool" >/dev/null || { echo "$tool is needed (apt-get install containerd runc curl)" >&2; exit 1; }
done
if curl -s --max-time 1 http://127.0.0.1:9090/ >/dev/null 2>&1; then
    echo "something already listens on 127.0.0.1:9090 (the admin port the container uses)" >&2
    exit 1
fi

ARCHIVE="${1:-}"
if [ -z "$ARCHIVE" ]; then ARCHIVE=$("$ROOT/scripts/image-build.sh" | tail -n 1); fi
REF=$(python3 - "$ARCHIVE" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    index = json.load(t.extractfile("index.json"))
print(index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])
PY
)

WORK=$(mktemp -d /tmp/mailcluster-image-bench.XXXXXX)
SOCK="$WORK/containerd.sock"
cat >"$WORK/config.toml" <<EOF
version = 2
root = "$WORK/root"
state = "$WORK/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
EOF
containerd --config "$WORK/config.toml" >"$WORK/containerd.log" 2>&1 &
CTD_PID=$!
cleanup() {
    for id in $(ctr --address "$SOCK" tasks ls -q 2>/dev/null); do ctr --address "$SOCK" tasks kill -s KILL "$id" 2>/dev/null || true; done
    sleep 0.5
    for id in $(ctr --address "$SOCK" containers ls -q 2>/dev/null); do ctr --address "$SOCK" containers rm "$id" 2>/dev/null || true; done
    kill "$CTD_PID" 2>/dev/null || true
    wait "$CTD_PID" 2>/dev/null || true
    grep -o " $WORK/[^ ]*" /proc/mounts 2>/dev/null | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 100); do ctr --address "$SOCK" version >/dev/null 2>&1 && break; sleep 0.1; done
ctr --address "$SOCK" images import "$ARCHIVE" >/dev/null

python3 - "$ARCHIVE" <<'PY'
import gzip, json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    index = json.load(t.extractfile("index.json"))
    m = json.load(t.extractfile("blobs/sha256/" + index["manifests"][0]["digest"][7:]))
    packed = sum(l["size"] for l in m["layers"])
    unpacked = sum(len(gzip.decompress(t.extractfile("blobs/sha256/" + l["digest"][7:]).read())) for l in m["layers"])
print(f"image {index['manifests'][0]['annotations']['org.opencontainers.image.ref.name']}"
      f" {index['manifests'][0]['digest']}: {packed / 1e6:.1f} MB compressed, {unpacked / 1e6:.1f} MB unpacked")
PY

times=()
for i in $(seq 1 "$ROUNDS"); do
    id="mc-start-$i"
    t0=$(date +%s%N)
    ctr --address "$SOCK" run -d --net-host --log-uri "file://$WORK/$id.log" "$REF" "$id" /usr/local/bin/mailcluster serve >/dev/null
    until curl -sf --max-time 1 http://127.0.0.1:9090/readyz >/dev/null 2>&1; do
        if [ $(( ($(date +%s%N) - t0) / 1000000 )) -gt 30000 ]; then echo "no /readyz within 30 s" >&2; exit 1; fi
        sleep 0.005
    done
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    times+=("$ms")
    echo "start $i: $ms ms to /readyz"
    ctr --address "$SOCK" tasks kill -s TERM "$id" >/dev/null 2>&1 || true
    for _ in $(seq 1 100); do
        ctr --address "$SOCK" tasks ls -q 2>/dev/null | grep -qx "$id" || break
        ctr --address "$SOCK" tasks ls 2>/dev/null | awk -v id="$id" '$1 == id {print $3}' | grep -q STOPPED && break
        sleep 0.1
    done
    ctr --address "$SOCK" tasks rm -f "$id" >/dev/null 2>&1 || true
    ctr --address "$SOCK" containers rm "$id" >/dev/null 2>&1 || true
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print "median cold start to /readyz: " a[int((NR+1)/2)] " ms of " NR " (min " a[1] ", max " a[NR] ")"}'
