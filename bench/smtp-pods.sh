#!/usr/bin/env bash
# One pod against two at the same offered load: the shipped `mailcluster serve`
# (release build) over one PostgreSQL database and one Redis key prefix, once as
# pod A alone, once as pods A and B (two processes, same configuration, own
# ports) with the sessions spread over both in turn — what a Service does with
# connections, without a balancer's own cost in the figure. Open loop at each
# RATE for DUR seconds, 4 KB messages over 1,000 recipients, S sessions; latency
# from each message's intended send time (smtp_bench_client). One pod and two pods
# alternate, ROUNDS times at each rate.
#
# Usage: bench/smtp-pods.sh   (env: RATES="1000 2000" DUR=20 S=50 SIZE=4096 ROUNDS=2)
set -uo pipefail
cd "$(dirname "$0")/.."
RATES=${RATES:-1000 2000}
DUR=${DUR:-20}
S=${S:-50}
SIZE=${SIZE:-4096}
ROUNDS=${ROUNDS:-2}
CLI=target/release/examples/smtp_bench_client
source bench/lib.sh

nice cargo build -q --release -p mailcluster-server --example smtp_bench_client || exit 1
mc_start 1000 smtp
machine_line
echo "## mailcluster at $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'); configuration (everything else default):"
echo "##   $(env | grep '^MAILCLUSTER_' | grep -v -e _PORT= -e DATABASE_URL -e REDIS_URL -e DATA_DIR | sort | tr '\n' ' ')"

# Pod B: the same binary and configuration on ports of its own.
B_PORT=13025
MAILCLUSTER_SMTP_PORT=$B_PORT MAILCLUSTER_ADMIN_PORT=19091 MAILCLUSTER_DATA_DIR="$MC_DIR/b" "$MC" serve 2>"$MC_DIR/serve-b.log" &
B_PID=$!
trap 'kill "$B_PID" 2>/dev/null; wait "$B_PID" 2>/dev/null; mc_cleanup' EXIT
for _ in $(seq 1 120); do port_open 19091 && break; sleep 0.5; done
port_open 19091 || { echo "pod B did not start"; cat "$MC_DIR/serve-b.log"; exit 1; }

A="127.0.0.1:$(mc_port smtp)"
B="127.0.0.1:$B_PORT"
# Transactions committed in the pods' database so far: how many messages went
# into each group commit.
commits() { psql "$MC_DB_URL" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"; }
run() { # label rate targets
  local a0 b0 x0 out
  a0=$(cpu_secs "$MC_PID") b0=$(cpu_secs "$B_PID") x0=$(commits)
  out=$("$CLI" "$3" --sessions "$S" --messages $(($2 * DUR)) --rate "$2" --size "$SIZE" --rcpt-count 1000 --rcpt-first 1)
  printf '%-9s rate=%-5s %s cpu_a=%s cpu_b=%s commits=%s\n' "$1" "$2" "$out" \
    "$(echo "$(cpu_secs "$MC_PID") - $a0" | bc)" "$(echo "$(cpu_secs "$B_PID") - $b0" | bc)" "$(($(commits) - x0))"
}
# Warm-up: both pods' pools and caches, not measured.
"$CLI" "$A,$B" --sessions "$S" --messages 4000 --rate 1000 --size "$SIZE" --rcpt-count 1000 --rcpt-first 1 >/dev/null
for rate in $RATES; do
  for _ in $(seq 1 "$ROUNDS"); do
    run one-pod "$rate" "$A"
    run two-pods "$rate" "$A,$B"
  done
done
