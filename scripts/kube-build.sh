#!/usr/bin/env bash
# Builds the Kubernetes control plane used by the tests and demos — etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, and as root the node's
# kube-proxy and kubelet — from the release's Go
# modules, once per version, into a cache outside the repository:
#
#   ${MAILCLUSTER_KUBE_CACHE:-~/.cache/mailcluster/kube}/<version>/bin/
#
# Prints that bin directory on its last line. A second call with the same version
# finds the binaries and builds nothing.
#
# Why a wrapper module: k8s.io/kubernetes's go.mod replaces every staging module
# (k8s.io/api, k8s.io/apiserver, ...) with a path inside its own tree, so
# `go install k8s.io/kubernetes/cmd/...@vX` refuses it. A module of our own that
# requires k8s.io/kubernetes and replaces each staging module with its published
# v0.Y.Z builds the same code.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-1.36.3}"
# The etcd release k8s.io/kubernetes itself pins for this Kubernetes release
# (go.etcd.io/etcd/client/v3 in its go.mod): the server the apiserver is tested with.
ETCD_VERSION="${ETCD_VERSION:-3.6.8}"

CACHE_ROOT="${MAILCLUSTER_KUBE_CACHE:-$HOME/.cache/mailcluster/kube}"
DIR="$CACHE_ROOT/$KUBE_VERSION"
BIN="$DIR/bin"
# kube-proxy (iptables mode) carries Service traffic to the node's Pods.
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
# kubelet runs them (on containerd), only where the node can run: as root on Linux.
if [ "$(id -u)" = 0 ] && [ "$(uname -s)" = Linux ]; then COMPONENTS+=(kubelet); fi
# kubectl of the same release when the machine has none.
if ! command -v kubectl >/dev/null 2>&1 || [ -x "$BIN/kubectl" ]; then COMPONENTS+=(kubectl); fi

log() { printf '==> %s\n' "$*" >&2; }

have_all() {
    local c
    for c in etcd "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || return 1; done
}

if have_all; then
    echo "$BIN"
    exit 0
fi

# The Go the release asks for (its go.mod says `go 1.26.0`).
source "$(dirname "$0")/go-toolchain.sh"
use_go 1.26
# The toolchain chosen here builds everything below (no switching behind our back).
export GOTOOLCHAIN=local

mkdir -p "$BIN" "$DIR/src/kubernetes" "$DIR/src/etcd"
# Builds share the module and build caches of the user's Go installation.
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

started=$(date +%s)

# ---- etcd ----
if [ ! -x "$BIN/etcd" ]; then
    log "building etcd v$ETCD_VERSION"
    (
        cd "$DIR/src/etcd"
        cat >go.mod <<EOF
module mailcluster.dev/kube/etcd

go 1.26

require go.etcd.io/etcd/server/v3 v$ETCD_VERSION
EOF
        cat >main.go <<'EOF'
// The etcd server binary: etcd's own entry point, nothing added.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
        "$GO" mod tidy >/dev/null
        "$GO" build -trimpath -ldflags='-s -w' -o "$BIN/etcd.tmp" .
        mv "$BIN/etcd.tmp" "$BIN/etcd"
    )
fi

# ---- kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy ----
missing=()
for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || missing+=("$c"); done
if [ "${#missing[@]}" -gt 0 ]; then
    log "building Kubernetes v$KUBE_VERSION (${COMPONENTS[*]})"
    (
        cd "$DIR/src/kubernetes"
        upstream_mod=$("$GO" mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
        [ -f "$upstream_mod" ] || { echo "error: cannot read k8s.io/kubernetes@v$KUBE_VERSION go.mod" >&2; exit 1; }
        # Staging modules are the ones the release requires at v0.0.0 and replaces
        # with ./staging/src/...; their published versions are v0.<minor>.<patch>.
        staging_version="v0.${KUBE_VERSION#*.}"
        mapfile -t staging < <(awk '/=> \.\/staging\/src\// {print $1}' "$upstream_mod" | sort -u)
        required=$(awk '/^require \(/{r=1; next} r && /^\)/{r=0} r {print $1 " " $2}' "$upstream_mod")
        {
            echo "module mailcluster.dev/kube/kubernetes"
            echo
            echo "go 1.26"
            echo
            echo "require k8s.io/kubernetes v$KUBE_VERSION"
            echo
            for m in "${staging[@]}"; do
                if grep -qx "$m v0.0.0" <<<"$required"; then
                    echo "replace $m => $m $staging_version"
                fi
            done
        } >go.mod
        cat >tools.go <<'EOF'
// Anchors the control-plane commands in this module's build list.
package tools
EOF
        for c in "${COMPONENTS[@]}"; do "$GO" get "k8s.io/kubernetes/cmd/$c@v$KUBE_VERSION" >/dev/null 2>&1 || "$GO" get "k8s.io/kubernetes/cmd/$c@v$KUBE_VERSION"; done
        for c in "${missing[@]}"; do
            log "go build $c"
            "$GO" build -trimpath -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=${KUBE_VERSION%%.*} -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$KUBE_VERSION")" \
                -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c"
            mv "$BIN/$c.tmp" "$BIN/$c"
        done
    )
fi

log "control plane v$KUBE_VERSION built in $(( $(date +%s) - started )) s"
echo "$BIN"
