#!/usr/bin/env bash
# SMTP side by side, in one run on one machine: the shipped binary (`mailcluster
# serve`, release build, over PostgreSQL + Redis, default configuration but for the
# per-IP connection caps, lifted because all load comes from 127.0.0.1; the
# effective settings are printed at the start) against Postfix + Dovecot
# (/work/shared/peers, started with setup-postfix-dovecot.sh; Postfix SMTP on 2526,
# delivery over LMTP into Maildir), and beside both the PostgreSQL ceiling of the
# same delivery transaction (bench/pg-ceiling.sh).
#
#   1. throughput: Postfix's smtp-source, 20,000 x 4 KB over 50 sessions, one recipient
#   2. the same load spread over 1,000 recipients (smtp_bench_client)
#   3. latency at a fixed offered rate (default 2,000 msg/s)
#   4. a mailbox holding 100,000 messages against an empty one
#
# Mailcluster answers 250 only once a message is committed, so "accepted" is
# "delivered" there; for Postfix the script also waits until the messages are in
# the Maildir. Reports msg/s, latency, server CPU seconds and peak RSS.
#
# EMBEDDED=1 runs the embedded default instead (what `mailcluster serve` runs with
# nothing configured: SQLite in its data directory, in-process cache), and in
# place of the PostgreSQL ceiling the rate of durable 4 KB appends (one
# fdatasync each) in that directory: the write-ahead log's physical limit, which
# group commit multiplies by the batch size.
#
# Usage: bench/smtp.sh            (env: N, S, SIZE, RATE, BIG, CEILING=0 to skip the ceiling part,
#                                  PEER=0 to run Mailcluster's cases alone, EMBEDDED=1)
set -uo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}
S=${S:-50}
SIZE=${SIZE:-4096}
RATE=${RATE:-2000}
BIG=${BIG:-100000}
CLI=target/release/examples/smtp_bench_client
TICKS=$(getconf CLK_TCK)
source bench/lib.sh

nice cargo build -q --release -p mailcluster-server --example smtp_bench_client || exit 1
machine_line
mc_start 1000 smtp
PORT=$(mc_port smtp)
PID=$MC_PID
URL=$MC_DB_URL
echo "## mailcluster $("$MC" version 2>/dev/null | head -n 1) at $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
echo "## configuration (everything else default): $(env | grep '^MAILCLUSTER_' | grep -v -e _PORT= -e DATABASE_URL -e REDIS_URL -e DATA_DIR | sort | tr '\n' ' ')"
if [ -n "$URL" ]; then
  echo "##   over PostgreSQL ($(psql "$PG" -Atc 'SHOW server_version') , database of its own) and Redis (key prefix of its own)"
else
  echo "##   embedded default: SQLite $(sqlite3 --version | cut -d' ' -f1) in its data directory ($MC_DIR, $(df --output=fstype "$MC_DIR" | tail -n 1)), in-process cache"
fi

cpu_of() { awk '{print $14+$15}' "/proc/$1/stat"; }
# CPU ticks of every Postfix/Dovecot process (they come and go: sampled totals).
peer_cpu() { ps -eo user=,comm=,times= | awk '$1 ~ /postfix|dovecot|vmail/ || $2 ~ /^(master|smtpd|cleanup|qmgr|lmtp|dovecot|trivial-rewrite)$/ {s+=$3} END {print s+0}'; }
peer_rss_mb() { ps -eo user=,comm=,rss= | awk '$1 ~ /postfix|dovecot|vmail/ || $2 ~ /^(master|smtpd|cleanup|qmgr|lmtp|dovecot)$/ {s+=$3} END {printf "%.0f", s/1024}'; }
# Postfix goes on delivering after it answered 250: wait until its queue is empty,
# so that the next case does not share the machine with that backlog.
# Whether the Postfix side runs: PEER=0 leaves it out (a check of Mailcluster's own
# figures, not a side-by-side one).
peer_up() { [ "${PEER:-1}" != 0 ] && port_open 2526; }
postfix_drain() {
  for _ in $(seq 1 600); do postqueue -p 2>/dev/null | grep -q 'Mail queue is empty' && return; sleep 0.5; done
  echo "postfix     (queue not empty after 300 s)"
}
stored() {
  if [ -n "$URL" ]; then psql "$URL" -Atc "SELECT count(*) FROM mailbox_messages"
  else sqlite3 -cmd '.timeout 5000' "file:$MC_SQLITE?mode=ro" "SELECT count(*) FROM mailbox_messages"; fi
}
maildir_count() { find "$PEERS/mail/example.test/$1/Maildir/new" "$PEERS/mail/example.test/$1/Maildir/cur" -type f 2>/dev/null | wc -l; }

mc_run() { # name, command...
  local name=$1; shift
  local c0 t0 t1 c1 s0 s1 p0 p1 out
  c0=$(cpu_of "$PID"); p0=$(pg_ticks); s0=$(stored); t0=$(date +%s.%N)
  out=$("$@" 2>&1)
  t1=$(date +%s.%N); c1=$(cpu_of "$PID"); p1=$(pg_ticks); s1=$(stored)
  awk -v n="$name" -v d=$((s1 - s0)) -v t0="$t0" -v t1="$t1" -v c=$((c1 - c0)) -v tk="$TICKS" -v o="$out" -v pg=$((p1 - p0)) \
    'BEGIN { e=t1-t0; printf "mailcluster %-22s delivered=%d in %.2fs = %.0f msg/s; server CPU %.1fs (%.0f%% of one core), PostgreSQL CPU %.1fs | %s\n", n, d, e, d/e, c/tk, 100*c/tk/e, pg/tk, o }'
}

echo "## 1. smtp-source: $N x $SIZE B over $S sessions, one recipient"
mc_run smtp-source /usr/sbin/smtp-source -d -s "$S" -m "$N" -l "$SIZE" -f user0001@example.test -t user0911@example.test "127.0.0.1:$PORT"
if peer_up; then
  before=$(maildir_count user0911); c0=$(peer_cpu); t0=$(date +%s.%N); peak=0
  /usr/sbin/smtp-source -d -s "$S" -m "$N" -l "$SIZE" -f user0001@example.test -t user0911@example.test 127.0.0.1:2526 &
  SP=$!
  while kill -0 "$SP" 2>/dev/null; do r=$(peer_rss_mb); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.5; done
  ta=$(date +%s.%N)
  for _ in $(seq 1 600); do [ $(( $(maildir_count user0911) - before )) -ge "$N" ] && break; r=$(peer_rss_mb); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.5; done
  td=$(date +%s.%N); c1=$(peer_cpu); got=$(( $(maildir_count user0911) - before ))
  awk -v t0="$t0" -v ta="$ta" -v td="$td" -v n="$N" -v got="$got" -v c=$((c1 - c0)) -v p="$peak" \
    'BEGIN { printf "postfix     smtp-source            accepted %d in %.2fs = %.0f msg/s; delivered %d in %.2fs = %.0f msg/s; CPU %ds; RSS sum peak %d MB\n", n, ta-t0, n/(ta-t0), got, td-t0, got/(td-t0), c, p }'
else
  echo "postfix     (not running on 2526: start /work/shared/peers/setup-postfix-dovecot.sh)"
fi

echo "## 2. $N x $SIZE B over $S sessions, spread over 1,000 recipients"
mc_run spread-1000 "$CLI" "127.0.0.1:$PORT" --sessions "$S" --messages "$N" --size "$SIZE" --rcpt-count 1000 --rcpt-first 1
peer_up && echo "postfix     spread-1000            $("$CLI" 127.0.0.1:2526 --sessions "$S" --messages "$N" --size "$SIZE" --rcpt-count 1000 --rcpt-first 1) (250 = queued)" && postfix_drain

echo "## 3. latency at $RATE msg/s offered (10 s), 1,000 recipients"
mc_run "rate-$RATE" "$CLI" "127.0.0.1:$PORT" --sessions "$S" --messages $((RATE * 10)) --rate "$RATE" --size "$SIZE" --rcpt-count 1000 --rcpt-first 1
peer_up && echo "postfix     rate-$RATE              $("$CLI" 127.0.0.1:2526 --sessions "$S" --messages $((RATE * 10)) --rate "$RATE" --size "$SIZE" --rcpt-count 1000 --rcpt-first 1) (250 = queued)" && postfix_drain

echo "## 4. a mailbox with $BIG messages against an empty one"
"$CLI" "127.0.0.1:$PORT" --sessions "$S" --messages "$BIG" --size 1024 --rcpt-count 1 --rcpt-first 500 >/dev/null
mc_run "into-${BIG}-mailbox" "$CLI" "127.0.0.1:$PORT" --sessions "$S" --messages "$N" --size "$SIZE" --rcpt-count 1 --rcpt-first 500
mc_run into-empty-mailbox "$CLI" "127.0.0.1:$PORT" --sessions "$S" --messages "$N" --size "$SIZE" --rcpt-count 1 --rcpt-first 912

echo "## mailcluster server peak RSS: $(awk '/VmHWM/{printf "%.0f MB", $2/1024}' "/proc/$PID/status")"
curl -s "http://127.0.0.1:$(mc_port admin)/metrics" |
  grep -E '^mail_group_commit_batch_size_(sum|count)|^mail_smtp_delivery_seconds_(sum|count)|^mail_db_pool_max'

if [ "${CEILING:-1}" != 0 ] && [ -n "$URL" ]; then
  echo "## the same transaction in PostgreSQL alone (bench/pg-ceiling.sh, on this run's schema)"
  bench/pg-ceiling.sh "$URL"
elif [ "${CEILING:-1}" != 0 ]; then
  echo "## durable appends in the data directory: one 4 KB write and fdatasync at a time, 5 s"
  python3 - "$MC_DIR" <<'PY'
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 5:
    os.write(fd, b"x" * 4096)
    os.fdatasync(fd)
    n += 1
elapsed = time.monotonic() - t0
os.close(fd)
os.unlink(path)
print(f"fdatasync ceiling: {n / elapsed:.0f} durable appends/s ({1000 * elapsed / n:.2f} ms each)")
PY
fi
