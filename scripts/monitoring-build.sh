#!/usr/bin/env bash
# Builds prometheus-adapter (kubernetes-sigs/prometheus-adapter, the custom-metrics
# API server that serves Prometheus series to the HPA) from its Go module, once per
# version, into a cache outside the repository:
#
#   ${MAILCLUSTER_MONITORING_CACHE:-~/.cache/mailcluster/monitoring}/bin/prometheus-adapter
#
# Prints that binary's path on its last line. A second call with the same version
# finds the binary and builds nothing.
#
# Why not `go install sigs.k8s.io/prometheus-adapter/cmd/adapter@vX`: go install
# also looks up the module's deprecation through its @latest version, which needs
# the proxy's version list of sigs.k8s.io/prometheus-adapter, and the proxy answers
# that with 403, so go install stops. The module itself downloads fine by explicit
# version, so this builds the release's own source with its own go.mod and go.sum
# (no replace directives, no dependency changed): the same dependency set as
# upstream's `make prometheus-adapter`.
set -euo pipefail

ADAPTER_VERSION="${PROMETHEUS_ADAPTER_VERSION:-0.12.0}"
ADAPTER_MODULE="sigs.k8s.io/prometheus-adapter"

CACHE_ROOT="${MAILCLUSTER_MONITORING_CACHE:-$HOME/.cache/mailcluster/monitoring}"
BIN="$CACHE_ROOT/bin"
TARGET="$BIN/prometheus-adapter"
# The version the binary in $BIN was built from (the binary itself reports none).
STAMP="$BIN/.prometheus-adapter.version"
SRC="$CACHE_ROOT/src/prometheus-adapter-$ADAPTER_VERSION"

log() { printf '==> %s\n' "$*" >&2; }

if [ -x "$TARGET" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$ADAPTER_VERSION" ]; then
    echo "$TARGET"
    exit 0
fi

# The release's go.mod says `go 1.22.1`; the project's Go is 1.26, which builds it
# unchanged.
source "$(dirname "$0")/go-toolchain.sh"
use_go 1.22.1
# The toolchain chosen here builds everything below (no switching behind our back:
# the release's `toolchain go1.22.2` line would otherwise ask for an older one).
export GOTOOLCHAIN=local

mkdir -p "$BIN" "$CACHE_ROOT/src"
# Builds share the module and build caches of the user's Go installation. The
# release's go.sum is complete: -mod=readonly builds exactly its dependency set.
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
export CGO_ENABLED=0

started=$(date +%s)

log "building prometheus-adapter v$ADAPTER_VERSION"
dir=$("$GO" mod download -json "$ADAPTER_MODULE@v$ADAPTER_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -f "$dir/go.mod" ] || { echo "error: cannot download $ADAPTER_MODULE@v$ADAPTER_VERSION" >&2; exit 1; }
# The module cache is read-only: build in a writable copy of the release's tree.
rm -rf "$SRC"
cp -R "$dir" "$SRC"
chmod -R u+w "$SRC"
(
    cd "$SRC"
    "$GO" build -trimpath -ldflags='-s -w' -o "$TARGET.tmp" ./cmd/adapter
)
mv "$TARGET.tmp" "$TARGET"
echo "$ADAPTER_VERSION" >"$STAMP"
# The source tree is only needed for the build (the module cache keeps the release).
rm -rf "$SRC"

log "prometheus-adapter v$ADAPTER_VERSION built in $(( $(date +%s) - started )) s"
echo "$TARGET"
