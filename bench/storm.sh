#!/usr/bin/env bash
# The white paper's login storm alone, cold then warm, and where its logins wait.
# The shipped binary (release, over PostgreSQL + Redis, bench/lib.sh mc_start with
# USERS accounts) takes the runner's auth scenario (LOGIN and AUTHENTICATE PLAIN
# over implicit TLS on IMAPS, C workers, 10 s ramp, each login a new connection)
# for DUR, twice back to back: the first run meets every credential cold (each
# user's first login pays argon2 once), the second warm (the credential cache
# answers). Around each run the server's own figures are read from /metrics:
# logins by result, the argon2 runs, the queue for an argon2 permit and the wait
# in it (mail_auth_hash_waiting, mail_auth_hash_wait_seconds), TLS handshakes,
# and the server's CPU seconds. The runner's console report, JSON and HTML go to
# OUT_DIR.
#
# Usage: bench/storm.sh [OUT_DIR]   (env: DUR=1m C=1000 USERS=1000)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/storm}
DUR=${DUR:-1m}
C=${C:-1000}
USERS=${USERS:-1000}
mkdir -p "$OUT"
mc_start "$USERS" imaps
machine_line | tee "$OUT/machine.txt"
echo "mailcluster: $MC serve over PostgreSQL + Redis; MAILCLUSTER_* as set by bench/lib.sh mc_start" \
  | tee -a "$OUT/machine.txt"
admin="http://127.0.0.1:$(mc_port admin)/metrics"

# The auth and TLS lines of /metrics, one sample per line.
metrics() { curl -sf "$admin" | grep -E '^mail_(auth|tls)_' ; }
# Difference of one sample between two metrics dumps ("" when absent).
delta() { # before after name
  awk -v name="$3" 'FNR == NR { if ($1 == name) b = $2; next } $1 == name { printf "%.3f", $2 - b }' "$1" "$2"
}

for run in cold warm; do
  metrics >"$OUT/$run.before.txt"
  c0=$(cpu_secs "$MC_PID")
  "$STRESS" --scenarios auth --imap "127.0.0.1:$(mc_port imaps)" --imap-tls implicit -k \
    --users-template 'user{:04}@example.test' --users-count "$USERS" --password pass \
    --auth both -c "$C" --ramp-up 10s -d "$DUR" --no-progress \
    --json "$OUT/$run.json" --html "$OUT/$run.html" >"$OUT/$run.txt" 2>&1
  c1=$(cpu_secs "$MC_PID")
  metrics >"$OUT/$run.after.txt"
  b=$OUT/$run.before.txt a=$OUT/$run.after.txt
  waits=$(delta "$b" "$a" mail_auth_hash_wait_seconds_count)
  waited=$(delta "$b" "$a" mail_auth_hash_wait_seconds_sum)
  {
    echo "== $run: server CPU $(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.1f", b - a }') s"
    echo "logins ok $(delta "$b" "$a" 'mail_auth_total{result="ok"}'), failed $(delta "$b" "$a" 'mail_auth_total{result="failed"}'), unavailable $(delta "$b" "$a" 'mail_auth_total{result="unavailable"}'), rate-limited $(delta "$b" "$a" 'mail_auth_total{result="rate_limited"}')"
    echo "argon2 permits waited for: $waits, total wait ${waited} s, mean $(awk -v n="$waits" -v s="$waited" 'BEGIN { if (n > 0) printf "%.1f ms", 1000 * s / n; else print "-" }')"
    echo "wait histogram (cumulative, this run):"
    grep '^mail_auth_hash_wait_seconds_bucket' "$a" | while read -r name _; do
      echo "  $name $(delta "$b" "$a" "$name")"
    done
    grep -A12 -E '^(auth|imap-authenticate|imap-login)' "$OUT/$run.txt" | head -30
  } | tee "$OUT/$run.summary.txt"
done
