#!/usr/bin/env bash
# Runs the cargo-fuzz (libFuzzer) targets in fuzz/ for a bounded time each:
#   scripts/fuzz.sh [seconds-per-target] [target...]     (default: 60 s, all targets)
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 0 thread            (a number of inputs instead)
#   FUZZ_SANITIZER=none ...                                (no AddressSanitizer: see below)
# One target at a time. Crashes land in fuzz/artifacts/<target>/, the growing
# corpus in fuzz/corpus/<target>/ (only its seed-* files are committed).
#
# The stable toolchain is enough: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass the
# nightly-only sanitizer flags. Not part of scripts/test.sh: instrumenting the whole
# dependency tree takes far longer than CI should spend; CI runs the same
# properties (fuzz/checks.rs) through server/tests/proto_fuzz.rs instead.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${1:-60}
shift || true
export RUSTC_BOOTSTRAP=1
# AddressSanitizer by default. The fuzzed code forbids `unsafe` (server/src/lib.rs
# denies it; the one exception is a socket option outside every target), so ASan
# watches only dependencies' unsafe code, at about half the speed: long runs may
# choose `none`, which keeps coverage guidance and every property checked.
sanitizer=${FUZZ_SANITIZER:-address}
# Separate from the workspace's target dir: different flags, nothing to share.
target_dir=${FUZZ_TARGET_DIR:-$PWD/target}
if [ "$sanitizer" != address ]; then target_dir=${FUZZ_TARGET_DIR:-$PWD/target-$sanitizer}; fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> cargo install cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build --sanitizer "$sanitizer" --target-dir "$target_dir"
for target in "${targets[@]}"; do
    limit=(-max_total_time="$secs")
    if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS"); fi
    echo "==> fuzzing $target: ${limit[*]}" >&2
    mkdir -p "corpus/$target"
    cargo fuzz run --sanitizer "$sanitizer" --target-dir "$target_dir" "$target" "corpus/$target" -- \
        "${limit[@]}" -max_len=65536 -rss_limit_mb=2048 -timeout=10
done
