#!/usr/bin/env bash
# Mailcluster alone (no peer): the FETCH part of bench/imap.sh on a smaller clone,
# for comparing server settings one against another (e.g. the body cache on and
# off) — not a side-by-side figure. 200 sessions over USERS users' INBOXes, each a
# clone of one 10,000-message INBOX seeded through SMTP; a 10 s warm-up, then a
# 20 s closed-loop `fetch` run; prints the server CPU, the latencies and the FETCH
# read counters from /metrics. Settings come from the environment, e.g.
#   MAILCLUSTER_IMAP__BODY_CACHE_BYTES=0 bench/imap-fetch-solo.sh
# PERF=1 also records a whole-machine profile of the run into $OUT/perf.data.
#
# Usage: bench/imap-fetch-solo.sh [OUT_DIR]   (env: USERS, MSGS, DUR, PERF)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/imap-fetch-solo}
USERS=${USERS:-50}
MSGS=${MSGS:-10000}
DUR=${DUR:-20s}
mkdir -p "$OUT"
export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true MAILCLUSTER_IMAP__MAX_COMMANDS_PER_SECOND=100000
mc_start "$USERS" smtp,imap
machine_line | tee "$OUT/machine.txt"
Q=(--no-progress -k)
"$STRESS" --smtp "127.0.0.1:$(mc_port smtp)" -s seed --users-count 1 --messages-per-user "$MSGS" -c 20 "${Q[@]}" >"$OUT/seed.txt" || exit 1
mc_clone_inbox "$USERS" || exit 1
"$STRESS" --imap "127.0.0.1:$(mc_port imap)" -s fetch -c 200 --users-count "$USERS" -d 10s "${Q[@]}" >"$OUT/warmup.txt"
c0=$(cpu_secs "$MC_PID")
perf_pid=
if [ -n "${PERF:-}" ]; then
  perf record -F 499 -g -a -o "$OUT/perf.data" -- sleep 15 >/dev/null 2>&1 &
  perf_pid=$!
fi
"$STRESS" --imap "127.0.0.1:$(mc_port imap)" -s fetch -c 200 --users-count "$USERS" -d "$DUR" "${Q[@]}" \
  --json "$OUT/fetch.json" >"$OUT/fetch.txt"
echo "server CPU $(echo "$(cpu_secs "$MC_PID") - $c0" | bc) s" | tee "$OUT/server-cpu.txt"
bench_table "$OUT/fetch.json" | grep fetch- | tee "$OUT/summary.txt"
curl -s "127.0.0.1:$(mc_port admin)/metrics" | grep -E "^mail_imap_(body_cache|fetch_reads|change_checks)" | tee "$OUT/counters.txt"
[ -n "$perf_pid" ] && wait "$perf_pid"
exit 0
