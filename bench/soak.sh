#!/usr/bin/env bash
# The soak: the shipped `mailcluster serve` (release build, PostgreSQL + Redis)
# under DUR of mixed load — SMTP deliveries at DELIVER msg/s together with IMAP
# FETCH/SEARCH sessions and POP3 sessions — from the stress runner's `mixed`
# scenario, open loop at the sum of the weights, with its default SLO (success
# >= 99.95 %, deliver P95 <= 120 ms, fetch and search P95 <= 350 ms). Every user
# starts with SEED messages so IMAP and POP3 have mail from the first second.
# Every minute the server's RSS and CPU and PostgreSQL's CPU are sampled into
# minutes.csv; report.py then adds each minute's operations and worst per-second
# P95 from the runner's JSON. Output: OUT_DIR (JSON, HTML and CSV reports too).
#
# Usage: bench/soak.sh [OUT_DIR]   (env: DUR=30m DELIVER=2000 FETCH=150 SEARCH=100
#        POP3=50 USERS=1000 SEED=5 C=300; profiling: PG_STATS=N writes PostgreSQL's
#        top statements every N minutes to pg-minute-M.txt (needs pg_stat_statements
#        preloaded), PERF=M records a whole-machine profile of 15 s in minute M)
# Every second, seconds.csv gets the machine's I/O and CPU pressure (stall
# microseconds of that second, /proc/pressure), its dirty and writeback memory,
# and the server's CPU; pg-waits.txt gets what PostgreSQL's active backends wait
# on. With the server's log (serve.log) they tell a stall of the machine from
# one of the server or of PostgreSQL.
# SIEVE=FILE makes FILE every user's active Sieve script before the load
# (bench/typical.sieve is a typical filter), so that delivery runs it.
# RSPAMD=lean|packaged (1: lean) starts rspamd (bench/lib.sh rs_start) with
# RS_WORKERS normal workers (default: one per core) and points the server's
# filter.rspamd.url at it, so that every MX message is scanned; its processes'
# CPU goes beside the server's in minutes.csv and seconds.csv.
# Another build: MC=BINARY with LIB=that commit's bench/lib.sh (the settings it
# knows), e.g. `git show COMMIT:bench/lib.sh > /tmp/lib-A.sh; MC=/tmp/mc-A
# LIB=/tmp/lib-A.sh bench/soak.sh OUT`; the load generator is this checkout's.
set -uo pipefail
cd "$(dirname "$0")/.."
source "${LIB:-bench/lib.sh}"
OUT=${1:-bench/results/soak}
DUR=${DUR:-30m}
DELIVER=${DELIVER:-2000}
FETCH=${FETCH:-150}
SEARCH=${SEARCH:-100}
POP3=${POP3:-50}
USERS=${USERS:-1000}
SEED=${SEED:-5}
C=${C:-300}
mkdir -p "$OUT"

# LOGIN and USER/PASS on the plain ports (the load comes from 127.0.0.1).
export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true
SETTINGS="MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true"
RSPAMD=${RSPAMD:-}
[ "$RSPAMD" = 1 ] && RSPAMD=lean
if [ -n "$RSPAMD" ]; then
  rs_start "$RSPAMD" "${RS_WORKERS:-$(nproc)}" || exit 1
  trap rs_stop EXIT
  export MAILCLUSTER_FILTER__RSPAMD__URL=$RS_URL
  SETTINGS+=" MAILCLUSTER_FILTER__RSPAMD__URL=$RS_URL"
fi
mc_start "$USERS" smtp,imap,pop3
trap 'mc_cleanup; rs_stop' EXIT
machine_line | tee "$OUT/machine.txt"
{
  echo "mailcluster: $MC serve over PostgreSQL + Redis; configuration: bench/lib.sh mc_start plus $SETTINGS"
  [ -n "$RSPAMD" ] && echo "rspamd: $RS_DESC; the filter's other settings at their defaults (timeout_ms 3000, fail_mode open)"
  echo "load: mixed, open loop at $((DELIVER + FETCH + SEARCH + POP3))/s (deliver=$DELIVER fetch=$FETCH search=$SEARCH pop3=$POP3), $C workers, $DUR, 4 KB messages, $USERS users seeded with $SEED each"
} | tee -a "$OUT/machine.txt"
if [ -n "${SIEVE:-}" ]; then
  seq -f "user%04g@example.test" 1 "$USERS" |
    xargs -P "$(nproc)" -I{} sh -c "'$MC' sieve put {} typical '$SIEVE' --activate 2>/dev/null" || exit 1
  echo "sieve: $SIEVE active for all $USERS users" | tee -a "$OUT/machine.txt"
  # Every pod reads which accounts have a script every 5 s.
  sleep 6
fi
COMMON=(--users-count "$USERS" --no-progress -k --message-size 4k)
"$STRESS" --smtp "127.0.0.1:$(mc_port smtp)" -s seed --messages-per-user "$SEED" -c 20 "${COMMON[@]}" >"$OUT/seed.txt" || exit 1

TK=$(getconf CLK_TCK)
# rspamd's CPU seconds so far (0 without it).
rspamd_secs() { if [ -n "$RSPAMD" ]; then rs_cpu_secs; else echo 0; fi; }
sample() {
  local minute=0 c0 p0 r0 c1 p1 r1
  echo "minute,rss_mb,server_cpu_s,postgres_cpu_s,rspamd_cpu_s" >"$OUT/minutes.csv"
  c0=$(cpu_secs "$MC_PID") p0=$(pg_ticks) r0=$(rspamd_secs)
  while kill -0 "$MC_PID" 2>/dev/null; do
    sleep 60
    minute=$((minute + 1))
    c1=$(cpu_secs "$MC_PID") p1=$(pg_ticks) r1=$(rspamd_secs)
    echo "$minute,$(awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$MC_PID/status"),$(echo "$c1 - $c0" | bc),$(echo "scale=1; ($p1 - $p0) / $TK" | bc),$(echo "$r1 - $r0" | bc)" >>"$OUT/minutes.csv"
    c0=$c1 p0=$p1 r0=$r1
  done
}
sample &
SAMPLER=$!
# Cumulative stall microseconds of "some" and "full" in a /proc/pressure file.
pressure() { awk '{split($5, t, "="); printf "%s ", t[2]}' "/proc/pressure/$1"; }
per_second() {
  local prev now
  echo "epoch,io_some_us,io_full_us,cpu_some_us,dirty_kb,writeback_kb,server_cpu_s,rspamd_cpu_s" >"$OUT/seconds.csv"
  prev=($(pressure io) $(pressure cpu) "$(cpu_secs "$MC_PID")" "$(rspamd_secs)")
  while kill -0 "$MC_PID" 2>/dev/null; do
    sleep 1
    now=($(pressure io) $(pressure cpu) "$(cpu_secs "$MC_PID")" "$(rspamd_secs)")
    echo "$(date +%s),$((now[0] - prev[0])),$((now[1] - prev[1])),$((now[2] - prev[2])),$(awk '/^Dirty:/{d=$2} /^Writeback:/{w=$2} END {print d "," w}' /proc/meminfo),$(echo "${now[4]} - ${prev[4]}" | bc),$(echo "${now[5]} - ${prev[5]}" | bc)" >>"$OUT/seconds.csv"
    prev=("${now[@]}")
  done
}
per_second &
PER_SECOND=$!
printf '%s\n' "SELECT extract(epoch FROM now())::bigint, coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND datname = current_database() GROUP BY 1, 2 ORDER BY 3 DESC \\watch 1" |
  psql "$MC_DB_URL" -At -F, >"$OUT/pg-waits.txt" 2>&1 &
PG_WAITS=$!
pg_stats() {
  local every=$1 minute=0
  psql "$MC_DB_URL" -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()" >/dev/null || return
  while kill -0 "$MC_PID" 2>/dev/null; do
    sleep $((every * 60))
    minute=$((minute + every))
    psql "$MC_DB_URL" -c "SELECT calls, round(total_plan_time) AS plan_ms, round(total_exec_time) AS ms, round((total_exec_time / NULLIF(calls, 0))::numeric, 3) AS ms_per_call, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 120) AS query FROM pg_stat_statements WHERE query !~* 'pg_stat_statements' ORDER BY total_exec_time + total_plan_time DESC LIMIT 25" \
      -c "SELECT calls, left(regexp_replace(query, '\s+', ' ', 'g'), 120) AS query FROM pg_stat_statements WHERE query !~* 'pg_stat_statements' ORDER BY calls DESC LIMIT 15" \
      -c "SELECT sum(calls) AS statements, round(sum(total_exec_time)) AS exec_ms, round(sum(total_plan_time)) AS plan_ms FROM pg_stat_statements WHERE query !~* 'pg_stat_statements'; SELECT pg_stat_statements_reset()" \
      >"$OUT/pg-minute-$minute.txt" 2>&1
  done
}
STATS=
[ -n "${PG_STATS:-}" ] && { pg_stats "$PG_STATS" & STATS=$!; }
[ -n "${PERF:-}" ] && { (sleep $((PERF * 60 - 60 + 20)); perf record -a -g -o "$OUT/perf-minute-$PERF.data" -- sleep 15 >/dev/null 2>&1) & }
trap 'kill "$SAMPLER" "$PER_SECOND" "$PG_WAITS" $STATS 2>/dev/null; cp "$MC_DIR/serve.log" "$OUT/serve.log"; gzip -f "$OUT/pg-waits.txt"; mc_cleanup; rs_stop' EXIT
echo "stress started at epoch $(date +%s) (second 1 of its series)" | tee -a "$OUT/machine.txt"

"$STRESS" --smtp "127.0.0.1:$(mc_port smtp)" --imap "127.0.0.1:$(mc_port imap)" --pop3 "127.0.0.1:$(mc_port pop3)" \
  -s mixed --weights "deliver=$DELIVER,fetch=$FETCH,search=$SEARCH,pop3=$POP3" -r $((DELIVER + FETCH + SEARCH + POP3)) \
  -c "$C" -d "$DUR" --ramp-up 30s "${COMMON[@]}" \
  --json "$OUT/soak.json" --html "$OUT/soak.html" --csv "$OUT/soak.csv" >"$OUT/soak.txt" 2>&1
echo "stress exit $?" | tee -a "$OUT/soak.txt"
# Scans that got no verdict were delivered unchecked (fail_mode open): a run
# with any is no run with rspamd.
[ -n "$RSPAMD" ] && curl -s "http://127.0.0.1:$(mc_port admin)/metrics" | grep -E '^mail_filter_rspamd_' |
  tee "$OUT/filter-metrics.txt" | grep -E '_(checks|failures|unscanned)_total'
tail -n 30 "$OUT/soak.txt"
python3 - "$OUT/soak.json" "$OUT/minutes.csv" <<'PY' | tee "$OUT/minutes.txt"
import csv, json, sys
d = json.load(open(sys.argv[1]))
s = d["scenarios"][0]
per = {}
for p in s["series"]:
    m = (p["second"] - 1) // 60 + 1
    e = per.setdefault(m, {})
    o = e.setdefault(p["op"], [0, 0, 0.0])
    o[0] += p["ok"]; o[1] += p["errors"]; o[2] = max(o[2], p["p95_ms"])
# The minute's own P95 (from its histogram, in reports that have one) beside the
# worst second's.
minute_p95 = {}
for p in s.get("minutes", []):
    minute_p95[((p["second"] - 1) // 60 + 1, p["op"])] = p["p95_ms"]
rows = {int(r["minute"]): r for r in csv.DictReader(open(sys.argv[2]))}
ops = ["deliver", "fetch-body", "fetch-header", "search", "pop3-session"]
print("minute | RSS MB | server CPU s | PostgreSQL CPU s | rspamd CPU s | " + " | ".join(f"{o} ok/err, P95 ms of the minute / of its worst second" for o in ops))
for m in sorted(per):
    r = rows.get(m, {})
    cells = []
    for o in ops:
        ok, err, p95 = per[m].get(o, [0, 0, 0.0])
        mp = minute_p95.get((m, o))
        cells.append(f"{ok}/{err}, {'-' if mp is None else f'{mp:.1f}'} / {p95:.1f}")
    print(f"{m} | {r.get('rss_mb', '-')} | {r.get('server_cpu_s', '-')} | {r.get('postgres_cpu_s', '-')} | {r.get('rspamd_cpu_s', '-')} | " + " | ".join(cells))
print(f"verdict {d['verdict']}, success {d['success_rate']:.3f} %")
PY
# The raw reports are large and compress tenfold: kept gzipped beside the tables.
gzip -f "$OUT/soak.json" "$OUT/soak.csv"
