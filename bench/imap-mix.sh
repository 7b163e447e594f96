#!/usr/bin/env bash
# The IMAP session mix side by side, in one run: Mailcluster (release `mailcluster
# serve`, PostgreSQL + Redis) against Dovecot from /work/shared/peers (Maildir).
# CLIENTS sessions at once, closed loop, each doing what a mail client does (the
# `imap-mix` scenario, weights in stress/README.md): LOGIN, LIST, STATUS, SELECT,
# `UID FETCH 1:* (FLAGS)`, then 50 commands drawn by weight — header lists
# (ENVELOPE), message bodies, STORE ±\Seen/\Flagged, delete + EXPUNGE, APPEND,
# NOOP and STATUS polls — then LOGOUT, and again. Every command counts once.
#
# Both sides get the same mailboxes (same_mailboxes in lib.sh: MSGS messages
# through each side's SMTP into user0001, 90 % \Seen, cloned into user0002…USERS);
# a warm-up pass opens every INBOX once on each side. The sides then run ROUNDS
# times each, alternately, DUR each. CPU per command: the Mailcluster process; all
# PostgreSQL processes (exited backends through the postmaster's children time);
# all Dovecot processes (its per-connection imap processes through the master's
# children time). Run as root (the peer's Maildirs).
#
# Usage: bench/imap-mix.sh [OUT_DIR]   (env: USERS=200 MSGS=1000 CLIENTS=50 DUR=30s ROUNDS=2,
#        SIDES="dovecot mailcluster", EMBEDDED=1 for the embedded default (bench/lib.sh))
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/imap-mix}
USERS=${USERS:-200}
MSGS=${MSGS:-1000}
CLIENTS=${CLIENTS:-50}
DUR=${DUR:-30s}
ROUNDS=${ROUNDS:-2}
SIDES=${SIDES:-dovecot mailcluster}
mkdir -p "$OUT"
port_open 1144 || { echo "Dovecot IMAP is not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }

# Plain IMAP with LOGIN, as Dovecot's 1144 is; the per-session command rate limit
# (a guard against a runaway client) lifted, since closed-loop sessions exceed
# what any person's client sends.
export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true MAILCLUSTER_IMAP__MAX_COMMANDS_PER_SECOND=100000
mc_start "$USERS" smtp,imap
machine_line | tee "$OUT/machine.txt"
{
  echo "mailcluster: $MC serve over $(if [ -n "$MC_DB_URL" ]; then echo PostgreSQL + Redis; else echo "the embedded default (SQLite, in-process cache)"; fi); configuration: bench/lib.sh mc_start plus"
  echo "  MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true MAILCLUSTER_IMAP__MAX_COMMANDS_PER_SECOND=100000"
  echo "dovecot: $(dovecot --version 2>/dev/null) IMAP on 1144, Maildir (/work/shared/peers)"
  echo "load: $CLIENTS sessions, closed loop, $DUR per run, $ROUNDS runs per side; $USERS users with $MSGS messages each"
} | tee -a "$OUT/machine.txt"
same_mailboxes "$USERS" "$MSGS" "$OUT"

Q=(--no-progress -k)
side_port() { if [ "$1" = dovecot ]; then echo 1144; else mc_port imap; fi; }

# CPU seconds of every process named NAME, children already reaped included.
procs_cpu() {
  local total=0 pid
  for pid in $(pgrep -x "$1"); do
    total=$(awk -v tk="$(getconf CLK_TCK)" -v t="$total" '{printf "%.2f", t + ($14+$15+$16+$17)/tk}' "/proc/$pid/stat" 2>/dev/null || echo "$total")
  done
  echo "$total"
}
side_cpu() { if [ "$1" = dovecot ]; then procs_cpu dovecot; else cpu_secs "$MC_PID"; fi; }

# Warm-up: each side opens every INBOX once (Dovecot builds its index files).
for side in $SIDES; do
  "$STRESS" --imap "127.0.0.1:$(side_port "$side")" -s search -c "$CLIENTS" --users-count "$USERS" -d 15s "${Q[@]}" \
    >"$OUT/warmup-$side.txt"
done

echo "side round commands commands_per_s server_cpu_s pg_cpu_s" >"$OUT/cpu.txt"
for round in $(seq 1 "$ROUNDS"); do
  for side in $SIDES; do
    [ -n "${PG_STATS:-}" ] && psql "$MC_DB_URL" -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()" >/dev/null
    s0=$(side_cpu "$side") p0=$(procs_cpu postgres)
    # PERF=1: a whole-machine profile of 10 s in the middle of the run.
    [ -n "${PERF:-}" ] && (sleep 8; perf record -a -g -o "$OUT/perf-$side-$round.data" -- sleep 10 >/dev/null 2>&1) &
    "$STRESS" --imap "127.0.0.1:$(side_port "$side")" -s imap-mix -c "$CLIENTS" --users-count "$USERS" -d "$DUR" \
      "${Q[@]}" --json "$OUT/mix-$side-$round.json" >"$OUT/mix-$side-$round.txt" 2>&1
    s1=$(side_cpu "$side") p1=$(procs_cpu postgres)
    python3 - "$OUT/mix-$side-$round.json" "$side" "$round" "$s0" "$s1" "$p0" "$p1" >>"$OUT/cpu.txt" <<'PY'
import json, sys
path, side, rnd, s0, s1, p0, p1 = sys.argv[1:]
d = json.load(open(path))
s = d["scenarios"][0]
ok = sum(o["ok"] for o in s["ops"].values() if o.get("primary", True))
secs = s["elapsed_s"]
print(side, rnd, ok, f"{ok / secs:.1f}" if secs else "?", f"{float(s1) - float(s0):.1f}", f"{float(p1) - float(p0):.1f}")
PY
    tail -n 1 "$OUT/cpu.txt"
    # PG_STATS=1 (needs pg_stat_statements preloaded): where PostgreSQL's time went.
    [ -n "${PG_STATS:-}" ] && psql "$MC_DB_URL" -c "SELECT calls, round(total_plan_time) AS plan_ms, round(total_exec_time) AS ms, plans, round((total_exec_time / NULLIF(calls, 0))::numeric, 3) AS ms_per_call, round(max_exec_time::numeric, 1) AS max_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS query FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 25" >"$OUT/pg-$side-$round.txt"
    # The cache's breaker and fallbacks so far: logins that miss the credential
    # cache run argon2, which shows in the LOGIN tail.
    [ "$side" = mailcluster ] && curl -s "http://127.0.0.1:$(mc_port admin)/metrics" |
      grep -E '^mail_(cache_up|cache_fallbacks_total|auth_total)' >"$OUT/metrics-$side-$round.txt"
    # … and which statements ran most often: every one is a round trip.
    [ -n "${PG_STATS:-}" ] && psql "$MC_DB_URL" -c "SELECT calls, left(regexp_replace(query, '\s+', ' ', 'g'), 130) AS query FROM pg_stat_statements WHERE query !~* 'pg_stat_statements' ORDER BY calls DESC LIMIT 25" >>"$OUT/pg-$side-$round.txt"
    [ -n "${PG_STATS:-}" ] && psql "$MC_DB_URL" -Atc "SELECT 'statements ' || sum(calls) || ', executing ' || round(sum(total_exec_time)) || ' ms' FROM pg_stat_statements WHERE query !~* 'pg_stat_statements'" >>"$OUT/pg-$side-$round.txt"
  done
done
bench_table "$OUT"/mix-*.json | tee "$OUT/table.txt"
