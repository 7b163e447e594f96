#!/usr/bin/env bash
# How many of the soak's messages one core of rspamd scans, per configuration.
# The requests are the pod's own: a pod of the shipped binary (bench/lib.sh)
# sends the stress runner's seed mail (4 KB messages, as bench/soak.sh sends)
# with filter.rspamd.url at bench/rspamd_scan_client.py's recorder, which keeps
# MSGS of them (headers and message exactly as the pod sent them). Then, for
# each PROFILE (bench/lib.sh rs_start), rspamd is started with WORKERS normal
# workers and the recorded requests are replayed at it for SECS seconds over C
# kept connections, closed loop (rspamd busy, no queue). Reports scans/s, the
# CPU seconds rspamd's processes used, hence scans per CPU second (per core,
# which does not depend on what else the machine runs as much as scans/s does),
# the latency, and the verdicts of two checks that must stay: GTUBE is refused,
# and a phishing-like message scores on the packaged header and regexp rules.
#
# Usage: bench/rspamd-sizing.sh [OUT_DIR]  (env: PROFILES="packaged lean"
#        WORKERS=1 SECS=30 C=8 MSGS=200)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/rspamd-sizing}
PROFILES=${PROFILES:-packaged lean}
WORKERS=${WORKERS:-1}
SECS=${SECS:-30}
C=${C:-8}
MSGS=${MSGS:-200}
CLIENT=bench/rspamd_scan_client.py
RECORDER_PORT=12339
mkdir -p "$OUT"

mc_start 100 smtp
REQS=$MC_DIR/requests
python3 "$CLIENT" record "$RECORDER_PORT" "$REQS" "$MSGS" &
RECORDER=$!
trap 'kill "$RECORDER" 2>/dev/null; rs_stop; mc_cleanup' EXIT
mc_pod recorded 19092 MAILCLUSTER_SMTP_PORT=13026 MAILCLUSTER_FILTER__RSPAMD__URL="http://127.0.0.1:$RECORDER_PORT"
"$STRESS" --smtp 127.0.0.1:13026 -s seed --users-count 100 --messages-per-user $(((MSGS + 99) / 100)) -c 20 \
  --no-progress -k --message-size 4k >"$MC_DIR/seed.txt" || { cat "$MC_DIR/seed.txt"; exit 1; }
kill "$RECORDER"
[ "$(ls "$REQS"/*.eml | wc -l)" -ge "$MSGS" ] || { echo "recorded only $(ls "$REQS"/*.eml | wc -l) requests"; exit 1; }

# The two checks: GTUBE, and a message the packaged rules score as phishing
# (headers a sender forges, a link whose text names another host, HTML only).
CHECKS=$MC_DIR/checks
mkdir -p "$CHECKS"
printf 'From: a@example.test\r\nTo: b@example.test\r\nSubject: test\r\nMessage-ID: <gtube@example.test>\r\nDate: Mon, 7 Dec 2026 20:00:00 +0000\r\n\r\nXJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X\r\n' >"$CHECKS/gtube.eml"
printf 'From: "Bank" <security@example.test>\r\nTo: undisclosed-recipients:;\r\nSubject: URGENT!!! YOUR ACCOUNT IS SUSPENDED\r\nX-Mailer: PHPMailer 5.2\r\nContent-Type: text/html\r\n\r\n<html><body><a href="http://192.0.2.1/login">https://www.paypal.com/verify</a> Click here to verify your password</body></html>\r\n' >"$CHECKS/phishing.eml"

{
  machine_line
  echo "## requests: $MSGS of the pod's /checkv2 requests for stress seed mail (4 KB), replayed closed loop over $C connections for $SECS s"
} | tee "$OUT/summary.txt"
for profile in $PROFILES; do
  rs_start "$profile" "$WORKERS" || exit 1
  echo "## $RS_DESC" | tee -a "$OUT/summary.txt"
  for check in gtube phishing; do
    echo "$check: $(python3 "$CLIENT" check "127.0.0.1:$RS_PORT" "$CHECKS/$check.eml" IP=192.0.2.7)" | tee -a "$OUT/summary.txt"
  done
  # The first scans of a worker load its maps and compile what hyperscan's cache lacks.
  python3 "$CLIENT" scan "127.0.0.1:$RS_PORT" "$REQS" "$C" 5 >/dev/null
  c0=$(rs_cpu_secs) l0=$(cut -d' ' -f1 /proc/loadavg)
  python3 "$CLIENT" scan "127.0.0.1:$RS_PORT" "$REQS" "$C" "$SECS" >"$OUT/scan-$profile-w$WORKERS.json"
  c1=$(rs_cpu_secs)
  python3 - "$OUT/scan-$profile-w$WORKERS.json" "$(echo "$c1 - $c0" | bc)" "$l0 $(cut -d' ' -f1 /proc/loadavg)" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
cpu = float(sys.argv[2])
print(f"scans {d['scans']} errors {d['errors']} in {d['seconds']} s: {d['scans_per_s']}/s; rspamd CPU {cpu:.1f} s, "
      f"{d['scans'] / cpu:.0f} scans per CPU second; P50 {d['p50_ms']} P95 {d['p95_ms']} P99 {d['p99_ms']} ms; "
      f"actions {d['actions']}; load {sys.argv[3]}")
PY
  rs_stop
done
