#!/usr/bin/env bash
# Is the load generator the bottleneck? Drives the built-in SMTP sink (a separate
# process on the same machine) and reports what one runner process sustains:
#   1. SMTP NOOP round trips/s on persistent sessions (closed loop);
#   2. open-loop deliveries/s (4 KiB MIME messages, pipelined MAIL/RCPT/DATA);
#   3. 10,000 idle implicit-TLS connections held (connect-flood).
# Usage: bench/stress-generator.sh [OUT_DIR]     (release build expected)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/mailcluster-stress}
OUT=${1:-bench/results/generator}
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)"
[ -x "$BIN" ] || nice cargo build --release -p mailcluster-stress

PLAIN=127.0.0.1:${SINK_PORT:-26025}
TLS=127.0.0.1:${SINK_TLS_PORT:-26465}
"$BIN" --sink "$PLAIN" --sink-for 10m & SINK=$!
"$BIN" --sink "$TLS" --sink-tls --sink-for 10m & SINK_TLS=$!
trap 'kill $SINK $SINK_TLS 2>/dev/null || true' EXIT
sleep 1

echo "## machine: $(nproc) cores; $(free -g | awk '/Mem:/{print $2" GiB RAM"}'); $(date -u +%FT%TZ)" | tee "$OUT/machine.txt"

echo "## 1. NOOP round trips, closed loop, 64 sessions, 20 s"
"$BIN" --smtp "$PLAIN" -s smtp-noop -c 64 -d 20s --no-progress --json "$OUT/noop.json" | tee "$OUT/noop.txt"

echo "## 2. deliveries, open loop ${RATE:-10000}/s, 64 sessions, 20 s, 4 KiB MIME"
"$BIN" --smtp "$PLAIN" -s deliver -c 64 --rate "${RATE:-10000}" -d 20s --message-size 4k \
    --no-progress --json "$OUT/deliver.json" --slo 'deliver.throughput >= 0' | tee "$OUT/deliver.txt" || true

echo "## 3. ${CONNS:-10000} idle TLS connections: ramp 10 s, hold 20 s"
"$BIN" --smtp "$TLS" --smtp-tls implicit -k -s connect-flood --protocol smtp -c "${CONNS:-10000}" \
    --ramp-up 10s -d 20s --timeout 20s --no-progress --json "$OUT/tls-flood.json" | tee "$OUT/tls-flood.txt"
