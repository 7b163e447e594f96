#!/usr/bin/env bash
# Two builds of `mailcluster serve` on the SMTP delivery path, back to back and
# alternating, so that the machine's drift shows in both: each round starts a fresh
# pod of build A then of build B (bench/lib.sh mc_start: own database, own Redis
# key prefix, 1,000 users), sends a warm-up of 2,000 messages and then Postfix's
# smtp-source load of N x SIZE B over S sessions to one recipient, and reports the
# rate and the CPU per message of the server, of PostgreSQL and of Redis. A check
# of one change on this machine, not a headline figure: there is no peer side.
#
# Usage: bench/smtp-ab.sh BINARY_A BINARY_B   (env: ROUNDS=3 N=20000 S=50 SIZE=4096;
#        LIB_A: the bench/lib.sh of A's commit, when this one sets settings A does not know)
# Build A from another commit with e.g. `git stash; cargo build --release -p
# mailcluster; cp target/release/mailcluster /tmp/mc-A; git stash pop`.
set -uo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: bench/smtp-ab.sh BINARY_A BINARY_B}
B=${2:?usage: bench/smtp-ab.sh BINARY_A BINARY_B}
ROUNDS=${ROUNDS:-3}
N=${N:-20000}
S=${S:-50}
SIZE=${SIZE:-4096}
TICKS=$(getconf CLK_TCK)
redis_ticks() { for p in $(pgrep -x redis-server); do awk '{print $14+$15}' "/proc/$p/stat"; done | awk '{s+=$1} END {print s+0}'; }
echo "## A: $A ($(md5sum <"$A" | cut -c1-12)); B: $B ($(md5sum <"$B" | cut -c1-12))"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    (
      if [ "$side" = A ]; then MC=$A; else MC=$B; fi
      export MC
      if [ "$side" = A ] && [ -n "${LIB_A:-}" ]; then source "$LIB_A" >/dev/null; else source bench/lib.sh >/dev/null; fi
      [ "$round$side" = 1A ] && machine_line
      mc_start 1000 smtp >/dev/null 2>&1
      [ "$round$side" = 1A ] && echo "## configuration of both (everything else default): $(env | grep '^MAILCLUSTER_' | grep -v -e _PORT= -e DATABASE_URL -e REDIS_URL -e DATA_DIR -e KEY_PREFIX | sort | tr '\n' ' ')"
      PORT=$(mc_port smtp)
      /usr/sbin/smtp-source -d -s "$S" -m 2000 -l "$SIZE" -f user0001@example.test -t user0911@example.test "127.0.0.1:$PORT"
      c0=$(awk '{print $14+$15}' "/proc/$MC_PID/stat"); p0=$(pg_ticks); r0=$(redis_ticks); t0=$(date +%s.%N)
      /usr/sbin/smtp-source -d -s "$S" -m "$N" -l "$SIZE" -f user0001@example.test -t user0911@example.test "127.0.0.1:$PORT"
      t1=$(date +%s.%N); c1=$(awk '{print $14+$15}' "/proc/$MC_PID/stat"); p1=$(pg_ticks); r1=$(redis_ticks)
      awk -v side="$side" -v r="$round" -v n="$N" -v t0="$t0" -v t1="$t1" -v c=$((c1 - c0)) -v p=$((p1 - p0)) -v rd=$((r1 - r0)) -v tk="$TICKS" \
        'BEGIN { printf "%s round %d: %.0f msg/s; CPU per message: server %.0f us, PostgreSQL %.0f us, Redis %.0f us\n", side, r, n/(t1-t0), c/tk*1e6/n, p/tk*1e6/n, rd/tk*1e6/n }'
    )
  done
done
