#!/usr/bin/env bash
# What scanning by rspamd adds to a delivery, in one run on one machine: two
# pods of the shipped binary (release build, over one PostgreSQL database and
# Redis, bench/lib.sh) take the same SMTP load on the MX port, one without a
# filter, one with `filter.rspamd.url` pointing at an rspamd started here
# (Debian's /usr/bin/rspamd, its packaged rules, a normal worker of WORKERS
# processes on 127.0.0.1, no name server: rules that look names up give up at
# once, as they would not on a real MX). Each is offered RATE msg/s for SECS
# seconds (4 KB messages, 1,000 recipients, S sessions), then LOW msg/s for
# LOW_SECS: the first asks what the machine does at the target rate, the second
# what a scan costs when rspamd keeps up. Reports the client's latency
# percentiles (250 = committed), and the rspamd pod's filter metrics: verdicts,
# failures (fail-open deliveries) and the scan time histogram.
#
# Usage: bench/rspamd.sh   (env: RATE=2000 SECS=60 LOW=200 LOW_SECS=30 S=50
#                           SIZE=4096 WORKERS=nproc TIMEOUT_MS=3000
#                           PROFILE=packaged or lean: bench/lib.sh rs_start)
set -uo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-2000}
SECS=${SECS:-60}
LOW=${LOW:-200}
LOW_SECS=${LOW_SECS:-30}
S=${S:-50}
SIZE=${SIZE:-4096}
WORKERS=${WORKERS:-$(nproc)}
TIMEOUT_MS=${TIMEOUT_MS:-3000}
CLI=target/release/examples/smtp_bench_client
PROFILE=${PROFILE:-packaged}
source bench/lib.sh

nice cargo build -q --release -p mailcluster-server --example smtp_bench_client || exit 1
machine_line

rs_start "$PROFILE" "$WORKERS" || exit 1
trap rs_stop EXIT

mc_start 1000 smtp
trap 'mc_cleanup; rs_stop' EXIT
PLAIN=$(mc_port smtp)
SCANNED=13025
mc_pod rspamd 19091 MAILCLUSTER_SMTP_PORT=$SCANNED MAILCLUSTER_FILTER__RSPAMD__URL="$RS_URL" \
  MAILCLUSTER_FILTER__RSPAMD__TIMEOUT_MS="$TIMEOUT_MS"
echo "## mailcluster $("$MC" version 2>/dev/null | head -n 1) at $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'), two pods over one PostgreSQL database and Redis"
echo "## $RS_DESC; filter.rspamd.timeout_ms=$TIMEOUT_MS, fail_mode=open"
echo "## load: $S sessions, $SIZE-byte messages to 1,000 recipients on the MX port, open loop"

run() { # label port rate secs
  printf '%-8s %5s msg/s %3ss  ' "$1" "$3" "$4"
  "$CLI" "127.0.0.1:$2" --sessions "$S" --messages $(($3 * $4)) --rate "$3" --size "$SIZE" --rcpt-count 1000 --rcpt-first 1
}
for pass in "$RATE $SECS" "$LOW $LOW_SECS"; do
  set -- $pass
  run plain "$PLAIN" "$1" "$2"
  run rspamd "$SCANNED" "$1" "$2"
done
echo "## the rspamd pod's filter metrics"
curl -s "http://127.0.0.1:19091/metrics" | grep -E '^mail_filter_rspamd_(checks_total|failures_total|unscanned_total|seconds_(sum|count)|seconds_bucket\{le="(0.01|0.025|0.05|0.1|0.25|1|2.5)"\})'
