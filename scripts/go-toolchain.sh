# Sourced by the build scripts: `use_go MIN` makes $GO a Go toolchain of at least
# version MIN. A machine without one — Debian 12 ships Go 1.19, too old even to
# switch toolchains by itself — gets the official toolchain the way the go command
# itself fetches one: the module golang.org/toolchain from the Go module proxy,
# unpacked once into ${MAILCLUSTER_KUBE_CACHE:-~/.cache/mailcluster/kube}/go (one
# download for every script). Exports GOROOT and PATH when it does.
GO_TOOLCHAIN_VERSION="${GO_TOOLCHAIN_VERSION:-1.26.8}"

go_is_new_enough() { # go-binary min-version
    local v
    v=$("$1" env GOVERSION 2>/dev/null) || return 1
    v=${v#go}
    [ "$(printf '%s\n%s\n' "$2" "$v" | sort -V | head -n 1)" = "$2" ]
}

use_go() { # min-version
    local min=$1 goarch gomod goroot proxy zip
    local cache="${MAILCLUSTER_KUBE_CACHE:-$HOME/.cache/mailcluster/kube}/go"
    GO=go
    if [ -z "${MAILCLUSTER_FORCE_GO_BOOTSTRAP:-}" ] && command -v go >/dev/null 2>&1 && go_is_new_enough go "$min"; then
        return 0
    fi
    case "$(uname -m)" in
        x86_64) goarch=amd64 ;;
        aarch64 | arm64) goarch=arm64 ;;
        *) echo "error: no Go toolchain for $(uname -m); install Go >= $min" >&2; exit 1 ;;
    esac
    gomod="golang.org/toolchain@v0.0.1-go$GO_TOOLCHAIN_VERSION.linux-$goarch"
    goroot="$cache/$gomod"
    if [ ! -x "$goroot/bin/go" ]; then
        printf '==> %s\n' "fetching Go $GO_TOOLCHAIN_VERSION ($gomod) from the Go module proxy" >&2
        proxy="${GOPROXY:-https://proxy.golang.org}"
        proxy="${proxy%%,*}"
        mkdir -p "$cache"
        zip="$cache/toolchain.zip.tmp"
        curl -fsSL --retry 3 -o "$zip" "$proxy/golang.org/toolchain/@v/v0.0.1-go$GO_TOOLCHAIN_VERSION.linux-$goarch.zip"
        # A module zip holds <module>@<version>/… and keeps no file modes: the
        # executables under bin/ and pkg/tool/ get theirs back.
        python3 - "$zip" "$cache" <<'PY'
import os, sys, zipfile
zip_path, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(zip_path) as z:
    for info in z.infolist():
        path = z.extract(info, dest)
        # golang.org/toolchain@<version>/<path inside GOROOT>
        inside = info.filename.split("/")[2:]
        if not info.is_dir() and (inside[:1] == ["bin"] or inside[:2] == ["pkg", "tool"]):
            os.chmod(path, 0o755)
PY
        rm -f "$zip"
    fi
    GO="$goroot/bin/go"
    export GOROOT="$goroot"
    export PATH="$goroot/bin:$PATH"
    go_is_new_enough "$GO" "$min" || { echo "error: $GO is not a usable Go >= $min" >&2; exit 1; }
}
