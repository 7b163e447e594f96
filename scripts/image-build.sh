#!/usr/bin/env bash
# Builds the OCI image ghcr.io/mailcluster/mailcluster:<version> on a machine that
# reaches no container registry: the release binary on a root made of Debian's own
# packages of what the distroless "cc" base carries (libc6, libgcc-s1,
# ca-certificates, tzdata), unpacked with dpkg-deb into a `FROM scratch` image by
# buildah. The Dockerfile stays the build for machines that reach the public
# registries; cli/tests/image.rs checks that both give the same user, entrypoint,
# command, ports, environment and data directory.
#
#   scripts/image-build.sh                 build; prints the archive, digest and size
#   scripts/image-build.sh --print-config  the image configuration only (JSON), no build
#
# Output: target/image/mailcluster-<version>.oci.tar (an OCI archive; `ctr images
# import`, `skopeo copy oci-archive:...`, `podman load` read it). Last line on stdout:
# the archive's path. Environment:
#   MAILCLUSTER_IMAGE_BINARY  a mailcluster binary to package instead of building one
#   MAILCLUSTER_IMAGE_TAG     the tag (default: the workspace version)
#   MAILCLUSTER_IMAGE_TARGET_DIR  cargo's target directory for that build (default
#                             ~/.cache/mailcluster/image/target: outside the clone, so
#                             a new clone of the same sources rebuilds only the
#                             project's own crates)
#
# Reproducible: every file, the layer and the configuration carry time 0, files are
# root-owned but for the data directory, and the packages are the versions apt has
# (their names and versions are recorded as image labels), so the same binary and
# the same packages give the same digest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

REPOSITORY=ghcr.io/mailcluster/mailcluster
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)
TAG="${MAILCLUSTER_IMAGE_TAG:-$VERSION}"
# The configuration the Dockerfile gives its image (cli/tests/image.rs compares them).
USER_ID=65532
DATA_DIR=/var/lib/mailcluster
ENTRYPOINT=/usr/local/bin/mailcluster
CMD=serve
PORTS=(10025 10587 10465 10143 10993 14190 10110 10995 9090 8080 7025)
PATH_ENV=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
PACKAGES=(libc6 libgcc-s1 ca-certificates tzdata)

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

print_config() {
    python3 - "$USER_ID" "$ENTRYPOINT" "$CMD" "$DATA_DIR" "$PATH_ENV" "${PORTS[@]}" <<'PY'
import json, sys
user, entrypoint, cmd, data, path, *ports = sys.argv[1:]
print(json.dumps({
    "User": f"{user}:{user}",
    "Entrypoint": [entrypoint],
    "Cmd": [cmd],
    "ExposedPorts": sorted(f"{p}/tcp" for p in ports),
    "Env": [f"PATH={path}", f"MAILCLUSTER_DATA_DIR={data}"],
    "DataDir": data,
}, indent=2))
PY
}
if [ "${1:-}" = --print-config ]; then
    print_config
    exit 0
fi

[ "$(id -u)" = 0 ] || die "buildah builds images as root here (run as root)"
for tool in buildah dpkg-deb apt-get strip tar python3; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (apt-get install buildah binutils)"
done

OUT="$ROOT/target/image"
WORK="$OUT/work"
CACHE="${MAILCLUSTER_IMAGE_CACHE:-$HOME/.cache/mailcluster/image}"
ARCHIVE="$OUT/mailcluster-$TAG.oci.tar"
mkdir -p "$OUT" "$CACHE/debs"
rm -rf "$WORK"
mkdir -p "$WORK/rootfs"
started=$SECONDS

# ---- the binary ----
binary="${MAILCLUSTER_IMAGE_BINARY:-}"
if [ -z "$binary" ]; then
    target_dir="${MAILCLUSTER_IMAGE_TARGET_DIR:-$HOME/.cache/mailcluster/image/target}"
    log "cargo build --release -p mailcluster (target directory $target_dir)"
    (cd "$ROOT" && CARGO_TARGET_DIR="$target_dir" cargo build --release --locked -p mailcluster >&2)
    binary="$target_dir/release/mailcluster"
fi
[ -x "$binary" ] || die "no executable at $binary"

# ---- Debian's packages, downloaded once per version ----
cd "$CACHE/debs"
versions=()
for pkg in "${PACKAGES[@]}"; do
    v=$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')
    if [ -z "$v" ] || [ "$v" = "(none)" ]; then
        log "apt-get update (no candidate for $pkg)"
        apt-get update -qq >&2
        v=$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')
    fi
    [ -n "$v" ] && [ "$v" != "(none)" ] || die "apt has no package $pkg"
    versions+=("$pkg=$v")
    # Debian's file names encode an epoch's colon as %3a.
    deb=$(ls "${pkg}_${v//:/%3a}_"*.deb 2>/dev/null | head -n 1 || true)
    if [ -z "$deb" ]; then
        log "apt-get download $pkg=$v"
        apt-get download -qq "$pkg=$v" >&2 2>/dev/null || { apt-get update -qq >&2; apt-get download -qq "$pkg=$v" >&2; }
        deb=$(ls "${pkg}_${v//:/%3a}_"*.deb | head -n 1)
    fi
    dpkg-deb -x "$deb" "$WORK/rootfs"
done
cd "$ROOT"

# ---- the root filesystem ----
R="$WORK/rootfs"
# What a process of this image never reads: documentation (the copyright files
# stay, as in the distroless images), manuals, lintian and maintainer data, the
# iconv modules (the binary converts no character sets) and the CA package's update
# script (no shell to run it).
find "$R/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
rm -rf "$R/usr/share/man" "$R/usr/share/lintian" "$R/usr/share/info" "$R/usr/share/locale" \
    "$R/usr/lib/x86_64-linux-gnu/gconv" "$R/usr/sbin" "$R/usr/bin" "$R/etc/ca-certificates" \
    "$R/usr/share/ca-certificates-java" "$R/var/lib/dpkg" "$R/etc/ld.so.conf.d"
# Debian 12 packages install into /usr; the loader's path /lib64 is a link to it
# (the merged /usr that base-files would make).
for d in bin lib lib64 sbin; do
    if [ -d "$R/usr/$d" ] && [ ! -e "$R/$d" ]; then ln -s "usr/$d" "$R/$d"; fi
done
[ -e "$R/lib64/ld-linux-x86-64.so.2" ] || die "libc6 gave no /lib64/ld-linux-x86-64.so.2"
# The bundle update-ca-certificates would make: every certificate of the package,
# concatenated in name order.
mkdir -p "$R/etc/ssl/certs"
find "$R/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat >"$R/etc/ssl/certs/ca-certificates.crt"
[ -s "$R/etc/ssl/certs/ca-certificates.crt" ] || die "no CA certificates in the ca-certificates package"
ln -sf /usr/share/zoneinfo/Etc/UTC "$R/etc/localtime"
# The users of the distroless images: root and nonroot (65532).
cat >"$R/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:$USER_ID:$USER_ID:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$R/etc/group" <<EOF
root:x:0:
nonroot:x:$USER_ID:
EOF
printf 'hosts: files dns\n' >"$R/etc/nsswitch.conf"
mkdir -p "$R/tmp" "$R/root" "$R/home/nonroot" "$R$DATA_DIR" "$R/usr/local/bin"
chmod 1777 "$R/tmp"
chmod 0700 "$R/root"
install -m 0755 "$binary" "$R$ENTRYPOINT"
# Without its symbol table: the image is pulled by every node, the table is read by
# profilers that run on the build (target/release keeps it).
strip --strip-unneeded "$R$ENTRYPOINT"
chown "$USER_ID:$USER_ID" "$R/home/nonroot" "$R$DATA_DIR"
chmod 0700 "$R$DATA_DIR"
# One layer: name-ordered, time 0, numeric owners.
tar --sort=name --mtime=@0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$R" -cf "$WORK/rootfs.tar" .

# ---- the image ----
# buildah's own storage, so a machine's containers are not touched.
B=(buildah --root "$CACHE/buildah/root" --runroot "$CACHE/buildah/run" --storage-driver vfs)
ctr=$("${B[@]}" from --quiet scratch)
cleanup() { "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"${B[@]}" add --quiet "$ctr" "$WORK/rootfs.tar" / >/dev/null
config=(--user "$USER_ID:$USER_ID" --entrypoint "[\"$ENTRYPOINT\"]" --cmd "$CMD"
    --env "PATH=$PATH_ENV" --env "MAILCLUSTER_DATA_DIR=$DATA_DIR" --workingdir /
    --os linux --arch amd64
    --label "org.opencontainers.image.title=mailcluster"
    --label "org.opencontainers.image.version=$TAG"
    --label "org.opencontainers.image.source=https://github.com/mailcluster/mailcluster"
    --label "dev.mailcluster.image.packages=${versions[*]}")
for p in "${PORTS[@]}"; do config+=(--port "$p/tcp"); done
"${B[@]}" config "${config[@]}" "$ctr"
rm -f "$ARCHIVE"
"${B[@]}" commit --quiet --timestamp 0 --format oci --disable-compression=false --rm "$ctr" "oci-archive:$ARCHIVE:$REPOSITORY:$TAG" >/dev/null
trap - EXIT

# ---- what was built ----
python3 - "$ARCHIVE" "$REPOSITORY:$TAG" "$((SECONDS - started))" <<'PY' >&2
import json, os, sys, tarfile
path, ref, secs = sys.argv[1], sys.argv[2], sys.argv[3]
with tarfile.open(path) as t:
    index = json.load(t.extractfile("index.json"))
    desc = index["manifests"][0]
    manifest = json.load(t.extractfile("blobs/sha256/" + desc["digest"].split(":")[1]))
    compressed = sum(l["size"] for l in manifest["layers"])
    uncompressed = 0
    import gzip, io
    for l in manifest["layers"]:
        blob = t.extractfile("blobs/sha256/" + l["digest"].split(":")[1]).read()
        uncompressed += len(gzip.decompress(blob)) if "gzip" in l["mediaType"] else len(blob)
print(f"image     {ref}")
print(f"digest    {desc['digest']}")
print(f"size      {compressed / 1e6:.1f} MB compressed (pulled), {uncompressed / 1e6:.1f} MB unpacked")
print(f"archive   {path} ({os.path.getsize(path) / 1e6:.1f} MB), built in {secs} s")
PY
echo "$ARCHIVE"
