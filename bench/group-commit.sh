#!/usr/bin/env bash
# The group commit's two settings side by side on the shipped binary: for each
# SETTING "CONCURRENT:WAIT_MS" (smtp.group_commit_max_concurrent and
# smtp.group_commit_max_wait_ms), a fresh `mailcluster serve` as bench/lib.sh
# mc_start configures it (own database, own Redis key prefix, 1,000 users), then
#   - open loop at RATE msg/s for DUR seconds over 1,000 recipients
#     (smtp_bench_client, latency from each message's intended send time), and
#   - closed loop: Postfix's smtp-source, N x SIZE B over S sessions, one recipient.
# Reported per case: msg/s, latency, server and PostgreSQL CPU per message, and the
# mean batch (deliveries per transaction, from mail_group_commit_batch_size).
# Settings alternate for ROUNDS rounds so that the machine's drift shows in all.
# A check of the defaults on this machine, not a headline figure: no peer side.
#
# Usage: bench/group-commit.sh   (env: SETTINGS="4:1 2:1 2:3" ROUNDS=2 RATE=2000
#        DUR=20 N=20000 S=50 SIZE=4096)
set -uo pipefail
cd "$(dirname "$0")/.."
SETTINGS=${SETTINGS:-"4:1 2:1 2:3"}
ROUNDS=${ROUNDS:-2}
RATE=${RATE:-2000}
DUR=${DUR:-20}
N=${N:-20000}
S=${S:-50}
SIZE=${SIZE:-4096}
CLI=target/release/examples/smtp_bench_client
TICKS=$(getconf CLK_TCK)
nice cargo build -q --release -p mailcluster-server --example smtp_bench_client || exit 1
batches() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^mail_group_commit_batch_size_sum/ {s=$2} /^mail_group_commit_batch_size_count/ {c=$2} END {print s+0, c+0}'; }

for round in $(seq 1 "$ROUNDS"); do
  for setting in $SETTINGS; do
    (
      source bench/lib.sh >/dev/null
      [ "$round" = 1 ] && [ "$setting" = "${SETTINGS%% *}" ] && machine_line
      export MAILCLUSTER_SMTP__GROUP_COMMIT_MAX_CONCURRENT=${setting%%:*} MAILCLUSTER_SMTP__GROUP_COMMIT_MAX_WAIT_MS=${setting##*:}
      mc_start 1000 smtp >/dev/null 2>&1
      [ "$round" = 1 ] && [ "$setting" = "${SETTINGS%% *}" ] && echo "## configuration (everything else default): $(env | grep '^MAILCLUSTER_' | grep -v -e _PORT= -e DATABASE_URL -e REDIS_URL -e DATA_DIR -e KEY_PREFIX -e GROUP_COMMIT | sort | tr '\n' ' ')"
      PORT=$(mc_port smtp)
      ADMIN=$(mc_port admin)
      "$CLI" "127.0.0.1:$PORT" --sessions "$S" --messages 2000 --size "$SIZE" --rcpt-count 1000 --rcpt-first 1 >/dev/null
      measure() { # label, command...
        local label=$1 c0 p0 b0 t0 out t1 c1 p1 b1 n
        shift
        c0=$(awk '{print $14+$15}' "/proc/$MC_PID/stat"); p0=$(pg_ticks); b0=$(batches "$ADMIN"); t0=$(date +%s.%N)
        out=$("$@" 2>&1)
        t1=$(date +%s.%N); c1=$(awk '{print $14+$15}' "/proc/$MC_PID/stat"); p1=$(pg_ticks); b1=$(batches "$ADMIN")
        awk -v s="$setting" -v r="$round" -v l="$label" -v t0="$t0" -v t1="$t1" -v c=$((c1 - c0)) -v p=$((p1 - p0)) -v tk="$TICKS" \
          -v b0="$b0" -v b1="$b1" -v o="$out" 'BEGIN {
            split(b0, x, " "); split(b1, y, " "); n = y[1] - x[1]; tx = y[2] - x[2]
            printf "concurrent:wait %s round %d %-11s %6.0f msg/s, %5.1f per transaction; CPU per message: server %3.0f us, PostgreSQL %3.0f us | %s\n",
              s, r, l, n/(t1-t0), (tx ? n/tx : 0), c/tk*1e6/(n ? n : 1), p/tk*1e6/(n ? n : 1), o }'
      }
      measure "rate-$RATE" "$CLI" "127.0.0.1:$PORT" --sessions "$S" --messages $((RATE * DUR)) --rate "$RATE" --size "$SIZE" --rcpt-count 1000 --rcpt-first 1
      measure smtp-source /usr/sbin/smtp-source -d -s "$S" -m "$N" -l "$SIZE" -f user0001@example.test -t user0911@example.test "127.0.0.1:$PORT"
    )
  done
done
