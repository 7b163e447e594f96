#!/usr/bin/env bash
# SORT side by side, in one run: Mailcluster (release build, PostgreSQL + Redis)
# against Dovecot from /work/shared/peers. USERS sessions at once, each its own
# user with MSGS messages in INBOX (the same mailboxes on both sides, see
# same_mailboxes in lib.sh), alternating `UID SORT (DATE) UTF-8 ALL` and
# `UID SORT (SUBJECT) UTF-8 ALL` for DUR seconds after one warm-up sort of each
# key per session. The client is bench/imap_sort_client.py (one asyncio process on
# the same machine, for both sides alike). Run as root (the peer's Maildirs).
# RATES lists the runs: 0 is closed loop (each session sorts again as soon as it
# has its answer); r > 0 has each session sort r times a second on a schedule,
# latency counted from the scheduled time (see the client).
#
# Usage: bench/imap-sort.sh [OUT_DIR]   (env: USERS=50, MSGS=10000, DUR=30,
#        RATES="0")
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/imap-sort}
USERS=${USERS:-50}
MSGS=${MSGS:-10000}
DUR=${DUR:-30}
RATES=${RATES:-0}
shopt -s nullglob
mkdir -p "$OUT"
port_open 1144 || { echo "Dovecot IMAP is not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }

export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true MAILCLUSTER_IMAP__MAX_COMMANDS_PER_SECOND=100000
# Every user's sort keys held at once (50 x 10,000; the default is 200,000).
export MAILCLUSTER_IMAP__SORT_CACHE_MESSAGES=${SORT_CACHE:-600000}
mc_start "$USERS" smtp,imap
machine_line | tee "$OUT/machine.txt"
echo "mailcluster: $MC serve over PostgreSQL + Redis; MAILCLUSTER_* as set by bench/lib.sh mc_start, plus imap.sort_cache_messages=$MAILCLUSTER_IMAP__SORT_CACHE_MESSAGES" | tee -a "$OUT/machine.txt"
same_mailboxes "$USERS" "$MSGS" "$OUT"
for rate in $RATES; do
  suffix=""
  [ "$rate" != 0 ] && suffix="-r$rate"
  for side in dovecot mailcluster; do
    port=1144
    [ "$side" = mailcluster ] && port=$(mc_port imap)
    c0=$(cpu_secs "$MC_PID")
    python3 bench/imap_sort_client.py "$port" "$USERS" "$DUR" "$OUT/sort-$side$suffix.json" "$side" "$rate" |
      tee "$OUT/sort-$side$suffix.txt"
    [ "$side" = mailcluster ] && echo "mailcluster server CPU during the run (warm-up included): $(echo "$(cpu_secs "$MC_PID") - $c0" | bc) s" | tee -a "$OUT/sort-$side$suffix.txt"
  done
done
