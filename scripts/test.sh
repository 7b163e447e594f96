#!/usr/bin/env bash
# Runs every check of the project on a fresh Debian machine that has only Rust:
#   1. installs what the tests need and is missing (apt-get): PostgreSQL, Redis,
#      python3, swaks, curl, isync (mbsync), fetchmail, sieve-connect, postfix (for
#      smtp-sink), rspamd (server/tests/filter_rspamd.rs starts its own), and as root
#      iproute2, iptables, prometheus, containerd, runc,
#      buildah, containernetworking-plugins, binutils; (pip)
#      kubernetes-validate, helm-python-sdk, lupa;
#   2. starts PostgreSQL and Redis unless they already answer on 127.0.0.1:5432 /
#      127.0.0.1:6379 (running ones are reused, never restarted);
#   3. exports DATABASE_URL / REDIS_URL (kept if already set) for the tests;
#   4. builds (once, cached in ~/.cache/mailcluster/kube) and starts a real Kubernetes
#      control plane on 127.0.0.1 (scripts/kube-up.sh; without a Go >= 1.26 the
#      toolchain comes from the Go module proxy) and, as root, its node: kubelet
#      and containerd running the image scripts/image-build.sh builds (release
#      build, its target directory cached in ~/.cache/mailcluster/image), or
#      reuses a running one; exports MAILCLUSTER_TEST_KUBECONFIG; stops it at the end
#      if it started it (MAILCLUSTER_KEEP_KUBE=1 keeps it);
#   5. cargo fmt --check, cargo clippy -D warnings, the whole test suite
#      (cargo-nextest when installed, else cargo test). The suite includes a
#      bounded fuzz run of the protocol parsers (server/tests/proto_fuzz.rs,
#      MAILCLUSTER_FUZZ_SECS per target, run in parallel) and of whole IMAP
#      sessions (server/tests/session_fuzz.rs, as long per protocol); the libFuzzer targets
#      in fuzz/ are run by scripts/fuzz.sh, outside CI (see there why).
# CI (.ci/run) calls exactly this script.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*" >&2; }

# apt installs, PostgreSQL and Redis: one implementation for tests and benchmarks.
# shellcheck source=scripts/services.sh
source scripts/services.sh
apt_install() { svc_apt_install "$@"; }

# ---- client tools used by the end-to-end tests ----
missing=()
for tool in python3 swaks curl openssl; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
# Mail clients run by the IMAP and POP3 client tests (package names differ).
command -v mbsync >/dev/null 2>&1 || missing+=(isync)
command -v fetchmail >/dev/null 2>&1 || missing+=(fetchmail)
# The ManageSieve client of server/tests/managesieve.rs, which fails instead of
# skipping without it once this is set.
command -v sieve-connect >/dev/null 2>&1 || missing+=(sieve-connect)
export MAILCLUSTER_REQUIRE_SIEVE_CONNECT=1
# swaks speaks TLS through Net::SSLeay, which Debian only recommends (and
# --no-install-recommends skips).
perl -MNet::SSLeay -e1 >/dev/null 2>&1 || missing+=(libnet-ssleay-perl)
# Postfix's smtp-sink is the remote that defers and rejects in the relay tests
# (server/tests/relay.rs). "No configuration": the package installs, no mail
# system is set up or started.
if [ ! -x /usr/sbin/smtp-sink ]; then
    echo "postfix postfix/main_mailer_type select No configuration" | _svc_sudo debconf-set-selections
    missing+=(postfix)
fi
# The node of the Kubernetes tests (root only): containerd, runc and the CNI
# plugins run the Pods, buildah builds the image they run (scripts/image-build.sh),
# iproute2 makes the node's bridge, kube-proxy's iptables rules carry Service
# traffic. Prometheus (Debian's package) scrapes the mail Pods for the HPA test.
if [ "$(id -u)" = 0 ]; then
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    command -v iptables-restore >/dev/null 2>&1 || missing+=(iptables)
    command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
    command -v containerd >/dev/null 2>&1 || missing+=(containerd)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    command -v buildah >/dev/null 2>&1 || missing+=(buildah)
    [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
    command -v strip >/dev/null 2>&1 || missing+=(binutils)
fi
# rspamd, which the content-filter tests start with a configuration of their
# own (the package's service is not used).
[ -x /usr/bin/rspamd ] || missing+=(rspamd)
if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
# Here rspamd is installed: its tests must run, not skip.
export MAILCLUSTER_REQUIRE_RSPAMD=1

# pip into the interpreter the tests run. Debian's own python3 refuses plain
# `pip install` (PEP 668, externally managed): a throwaway CI machine may override
# that, so the second attempt does. pip's wheel cache makes reruns cheap.
pip_install() {
    if ! python3 -m pip --version >/dev/null 2>&1; then apt_install python3-pip; fi
    log "pip install $*"
    python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}

# ---- offline checks of objects, chart and manifests (operator/tests/schema.rs, install.rs) ----
# kubernetes-validate: Kubernetes JSON schemas 1.25-1.37; helm-python-sdk: Helm 4 as a
# library (its shared object ships in the wheel: no helm binary, nothing downloaded
# at run time); lupa: a Lua 5.1 runtime for the Argo CD health script. Installed once,
# then reused.
if ! command -v kubernetes-validate >/dev/null 2>&1 \
    || ! python3 -c 'import kubernetes_validate, helm_python, lupa.lua51, jsonschema, yaml' >/dev/null 2>&1; then
    pip_install kubernetes-validate helm-python-sdk lupa
fi

# ---- a real Kubernetes control plane (cli/tests/kube_real.rs) ----
# Go builds it from the release's modules; without a Go new enough,
# scripts/kube-build.sh fetches the toolchain from the Go module proxy (curl, python3).
[ -f /etc/ssl/certs/ca-certificates.crt ] || apt_install ca-certificates
kube_dir="${MAILCLUSTER_KUBE_DIR:-/tmp/mailcluster-kube}"
kube_was_running=0
if [ -f "$kube_dir/pids/kube-apiserver" ] && kill -0 "$(cat "$kube_dir/pids/kube-apiserver")" 2>/dev/null; then
    kube_was_running=1
fi
log "Kubernetes control plane (scripts/kube-up.sh)"
kube_started=$SECONDS
kube_env=$(./scripts/kube-up.sh)
eval "$kube_env"
export MAILCLUSTER_TEST_KUBECONFIG="$KUBECONFIG"
unset KUBECONFIG
# kubectl for the tests: the machine's, else the one built with the control plane.
if ! command -v kubectl >/dev/null 2>&1; then
    PATH="$(./scripts/kube-build.sh | tail -n 1):$PATH"
fi
log "control plane up in $((SECONDS - kube_started)) s"
# The image the node runs (built by kube-up.sh as root): cli/tests/image.rs reads its
# configuration.
image_archive="target/image/mailcluster-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1).oci.tar"
if [ "$(id -u)" = 0 ] && [ -f "$image_archive" ]; then export MAILCLUSTER_TEST_IMAGE="$PWD/$image_archive"; fi
# prometheus-adapter for the HPA test (cli/tests/e2e_cluster.rs), built once from its
# Go module like the control plane.
if [ "$(id -u)" = 0 ]; then
    adapter_started=$SECONDS
    ./scripts/monitoring-build.sh >/dev/null
    log "prometheus-adapter ready in $((SECONDS - adapter_started)) s"
fi
if [ "$kube_was_running" -eq 0 ] && [ "${MAILCLUSTER_KEEP_KUBE:-0}" != 1 ]; then
    trap './scripts/kube-down.sh >/dev/null 2>&1 || true' EXIT
fi

# ---- PostgreSQL and Redis (reuse, else install and start) ----
ensure_postgres
ensure_redis

# Seconds of random and mutated input per parser in server/tests/proto_fuzz.rs,
# and of mutated commands in server/tests/session_fuzz.rs.
export MAILCLUSTER_FUZZ_SECS="${MAILCLUSTER_FUZZ_SECS:-10}"

log "DATABASE_URL=$(sed -E 's#(//[^:/@]*):[^@]*@#\1:<redacted>@#' <<<"$DATABASE_URL") REDIS_URL=$REDIS_URL"

# ---- Rust checks ----
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

# ---- dependencies: advisories, licenses, bans, sources (deny.toml) ----
# Offline: the RustSec advisory database comes from the snapshot next to the
# repository, laid out once per snapshot as the git repository cargo-deny reads.
log "cargo deny"
# MAILCLUSTER_ADVISORY_DB names it when the clone sits elsewhere.
advisory_snapshot=""
for candidate in "${MAILCLUSTER_ADVISORY_DB:-}" "$(cd .. && pwd)/shared/advisory-db" /work/shared/advisory-db; do
    if [ -n "$candidate" ] && [ -f "$candidate/SNAPSHOT" ]; then advisory_snapshot=$candidate; break; fi
done
# The directory deny.toml's db-path and db-urls lead cargo-deny to.
advisory_db="$HOME/.cache/mailcluster/advisory-db/advisory-db-3157b0e258782691"
if [ -z "$advisory_snapshot" ] && [ ! -f "$advisory_db/SNAPSHOT" ]; then
    echo "cargo deny needs the RustSec advisory database snapshot: ../shared/advisory-db" \
        "or MAILCLUSTER_ADVISORY_DB (a copy of github.com/rustsec/advisory-db with a SNAPSHOT" \
        "file naming its commit)" >&2
    exit 1
fi
if [ -n "$advisory_snapshot" ] && ! cmp -s "$advisory_snapshot/SNAPSHOT" "$advisory_db/SNAPSHOT"; then
    rm -rf "$advisory_db"
    mkdir -p "$advisory_db"
    cp -R "$advisory_snapshot/." "$advisory_db/"
    git -C "$advisory_db" init -q
    git -C "$advisory_db" add -A
    git -C "$advisory_db" -c user.name=snapshot -c user.email=snapshot@localhost commit -q -m "$(head -n 1 "$advisory_db/SNAPSHOT")"
fi
# 0.20.2 builds with the project's Rust (1.95); installed once into ~/.cargo/bin.
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny 0.20.2" ]; then
    cargo install cargo-deny --version 0.20.2 --locked
fi
# Crates of every platform in the lock files (cargo-deny reads their manifests offline).
cargo fetch --locked
(cd fuzz && cargo fetch --locked)
cargo deny --offline check advisories bans licenses sources
cargo deny --offline --manifest-path fuzz/Cargo.toml check advisories bans licenses sources

if cargo nextest --version >/dev/null 2>&1; then
    log "cargo nextest run"
    cargo nextest run --workspace --no-fail-fast
    log "doc tests"
    cargo test --workspace --doc
else
    log "cargo test"
    cargo test --workspace --no-fail-fast
fi

log "all checks passed"
