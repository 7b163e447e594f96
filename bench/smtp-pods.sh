#!/usr/bin/env bash
# One pod against two at the same offered load: the shipped `mailcluster serve`
# (release build) over one PostgreSQL database and one Redis key prefix, once as
# pod A alone, once as pods A and B (two processes, same configuration, own
# ports) with the sessions spread over both in turn — what a Service does with
# connections, without a balancer's own cost in the figure. Open loop at each
# RATE for DUR seconds, 4 KB messages over RCPTS recipients (default 1,000;
# fewer make each mailbox hotter, so that the two pods' batches share more
# mailbox rows), S sessions; latency from each message's intended send time
# (smtp_bench_client). One pod and two pods alternate, ROUNDS times at each rate.
#
# SPLIT=1 holds the machine's capacity equal between the two cases, as a cluster
# that splits the same CPU over more pods would: the one pod runs on every core,
# and each of the two pods is pinned to a core of its own (taskset; its runtime
# then starts one worker thread, as it does in a pod with a one-CPU limit).
# PostgreSQL and the client run unpinned in both cases. Without SPLIT, both pods
# share every core, so the second pod's own threads compete with the first's.
#
# SERVICES_CORE=N gives PostgreSQL and Redis core N of their own, as in a
# cluster where the database does not share the pods' nodes: every process of
# both is pinned to core N (new backends inherit the postmaster's affinity), and
# the pods and the client to the other cores. The one pod and the two pods then
# share those same cores (equal capacity, one worker thread each when there is
# one core). Both services get every core back when the script ends.
#
# FORWARD=0 (the default) lets each pod batch its own share, as the operator
# configures a Deployment's pods by default; FORWARD=1 makes the second of the
# two pods hand its deliveries to the first (smtp.group_commit_leader /
# group_commit_port: batches formed across pods, spec.groupCommit.acrossPods).
#
# POD_ENV="NAME=value ..." sets configuration of the two pods only (the one pod
# keeps mc_start's), to see what two pods need to match one.
#
# A MAILCLUSTER_* variable in the environment configures every pod, the one pod
# included: e.g. MAILCLUSTER_WORKER_THREADS=1, the runtime the operator gives a
# pod that requests up to one CPU (the default request is 100m).
#
# Usage: bench/smtp-pods.sh   (env: RATES="1000 2000" DUR=20 S=50 SIZE=4096 ROUNDS=2 RCPTS=1000 SPLIT=0 SERVICES_CORE= FORWARD=0 POD_ENV=)
set -uo pipefail
cd "$(dirname "$0")/.."
RATES=${RATES:-1000 2000}
DUR=${DUR:-20}
S=${S:-50}
SIZE=${SIZE:-4096}
ROUNDS=${ROUNDS:-2}
RCPTS=${RCPTS:-1000}
FORWARD=${FORWARD:-0}
CLI=target/release/examples/smtp_bench_client
source bench/lib.sh

nice cargo build -q --release -p mailcluster-server --example smtp_bench_client || exit 1
if [ "$FORWARD" = 1 ] && [ "${SPLIT:-0}" != 1 ] && [ -z "${SERVICES_CORE:-}" ]; then
  # Pod A is both the one pod and the leader of the two: it listens for the
  # other pod's deliveries in every round (no cost while nobody forwards).
  export MAILCLUSTER_SMTP__GROUP_COMMIT_PORT=13600
  # Both pods prove this key to each other (the operator's Secret in a cluster).
  export MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET=bench-group-commit-key
  LEADER=a FOLLOWER=b
fi
mc_start 1000 smtp
machine_line
echo "## mailcluster at $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'); configuration (everything else default):"
echo "##   $(env | grep '^MAILCLUSTER_' | grep -v -e _PORT= -e DATABASE_URL -e REDIS_URL -e DATA_DIR | sort | tr '\n' ' ')"

# Another pod: the same binary and configuration on ports of its own, pinned to
# the cores given if any.
start_pod() { # name smtp_port admin_port [cpu list]
  local pin=() role=()
  [ -n "${4:-}" ] && pin=(-- taskset -c "$4")
  if [ "$FORWARD" = 1 ]; then
    # The first of the two pods leads, the second forwards to it.
    case "$1" in
      "$LEADER") role=(MAILCLUSTER_SMTP__GROUP_COMMIT_PORT=13600) ;;
      "$FOLLOWER") role=(MAILCLUSTER_SMTP__GROUP_COMMIT_PORT=0 MAILCLUSTER_SMTP__GROUP_COMMIT_LEADER=127.0.0.1:13600) ;;
    esac
    role+=(MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET=bench-group-commit-key)
  fi
  # shellcheck disable=SC2086 # POD_ENV is a list of NAME=value words
  mc_pod "$1" "$3" ${POD_ENV:-} "${role[@]}" MAILCLUSTER_SMTP_PORT="$2" "${pin[@]}"
}
ONE="127.0.0.1:$(mc_port smtp)"
CLIENT_PIN=()
[ -n "${POD_ENV:-}" ] && echo "## the two pods also: $POD_ENV"
if [ -n "${SERVICES_CORE:-}" ]; then
  services() { pgrep -u postgres; pgrep -x redis-server; }
  all_cores="0-$(($(nproc) - 1))"
  pod_cores=$(seq 0 $(($(nproc) - 1)) | grep -vx "$SERVICES_CORE" | paste -sd,)
  [ -n "$pod_cores" ] || { echo "SERVICES_CORE needs a machine of two cores or more" >&2; exit 1; }
  # shellcheck disable=SC2046 # one pid per word
  pin_services() { for p in $(services); do taskset -a -p -c "$1" "$p" >/dev/null; done; }
  trap 'pin_services "$all_cores"; mc_cleanup' EXIT
  pin_services "$SERVICES_CORE"
  # The one pod (B) and the two pods (C and D), all on the pods' cores; A, from
  # mc_start, only warms up and then idles.
  LEADER=c FOLLOWER=d
  start_pod b 13025 19091 "$pod_cores"
  start_pod c 14025 19092 "$pod_cores"
  start_pod d 15025 19093 "$pod_cores"
  ONE="127.0.0.1:13025"
  TWO="127.0.0.1:14025,127.0.0.1:15025"
  CLIENT_PIN=(taskset -c "$pod_cores")
  echo "## SERVICES_CORE=$SERVICES_CORE: PostgreSQL and Redis pinned to core $SERVICES_CORE; the one pod, the two pods and the client share cores $pod_cores"
elif [ "${SPLIT:-0}" = 1 ]; then
  # The one pod (A, from mc_start) keeps every core; B and C get one each.
  LEADER=b FOLLOWER=c
  start_pod b 13025 19091 0
  start_pod c 14025 19092 1
  TWO="127.0.0.1:13025,127.0.0.1:14025"
  echo "## SPLIT=1: one pod on cores 0-$(($(nproc) - 1)); two pods pinned to core 0 and core 1"
else
  start_pod b 13025 19091
  TWO="$ONE,127.0.0.1:13025"
fi
[ "$FORWARD" = 1 ] && echo "## FORWARD=1: pod $FOLLOWER hands its deliveries to pod $LEADER (group commit across pods)"
# Transactions committed in the pods' database so far: how many messages went
# into each group commit.
commits() { psql "$MC_DB_URL" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"; }
# Checkpoints PostgreSQL has started so far (timed or requested): a round that
# overlaps one pays for its full-page writes, which tells such an outlier from
# a difference between one pod and two.
checkpoints() { psql "$MC_DB_URL" -Atc "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"; }
# Server CPU seconds of every pod, summed.
pods_cpu() { local s=0 p; for p in "$MC_PID" "${MC_POD_PIDS[@]}"; do s=$(echo "$s + $(cpu_secs "$p")" | bc); done; echo "$s"; }
run() { # label rate targets
  local c0 x0 k0 p0 out
  c0=$(pods_cpu) x0=$(commits) k0=$(checkpoints) p0=$(pg_ticks)
  out=$("${CLIENT_PIN[@]}" "$CLI" "$3" --sessions "$S" --messages $(($2 * DUR)) --rate "$2" --size "$SIZE" --rcpt-count "$RCPTS" --rcpt-first 1)
  printf '%-9s rate=%-5s %s server_cpu=%s pg_cpu=%s commits=%s checkpoints=%s\n' "$1" "$2" "$out" "$(echo "$(pods_cpu) - $c0" | bc)" "$(echo "scale=1; ($(pg_ticks) - $p0) / $(getconf CLK_TCK)" | bc)" "$(($(commits) - x0))" "$(($(checkpoints) - k0))"
}
ROUNDS_LOG="$MC_DIR/rounds.txt"
# Warm-up: every pod's pools and caches, not measured.
"$CLI" "$ONE,$TWO" --sessions "$S" --messages 4000 --rate 1000 --size "$SIZE" --rcpt-count 1000 --rcpt-first 1 >/dev/null
for rate in $RATES; do
  for _ in $(seq 1 "$ROUNDS"); do
    run one-pod "$rate" "$ONE" | tee -a "$ROUNDS_LOG"
    run two-pods "$rate" "$TWO" | tee -a "$ROUNDS_LOG"
  done
done
# Per case and rate: the median round's P95 and the spread over rounds, so that
# one outlying round neither hides nor makes a difference.
grep -E '^(one-pod|two-pods) ' "$ROUNDS_LOG" | python3 -c '
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in sys.stdin:
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    rows[(line.split()[0], f["rate"])].append((float(f["p95_ms"]), float(f["p99_ms"]), int(f["checkpoints"])))
for (case, rate), v in sorted(rows.items(), key=lambda kv: (int(kv[0][1]), kv[0][0])):
    p95 = sorted(x[0] for x in v)
    print(f"## {case:<8} rate={rate:<5} rounds={len(v)} p95 median={statistics.median(p95):.2f} min={p95[0]:.2f} max={p95[-1]:.2f} ms"
          f"  p99 median={statistics.median(x[1] for x in v):.2f} ms  rounds with a checkpoint={sum(1 for x in v if x[2])}")
'
