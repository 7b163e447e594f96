#!/usr/bin/env bash
# QRESYNC side by side, in one run: Mailcluster (release build, PostgreSQL + Redis)
# against Dovecot from /work/shared/peers. user0001's INBOX gets MSGS messages on
# both sides (see same_mailboxes in lib.sh); bench/qresync_client.py then takes a
# client's first look, changes CHANGES messages' flags and expunges EXPUNGES others
# from a second connection, and measures a full resynchronisation (EXAMINE + UID
# FETCH 1:* (UID FLAGS)) against a QRESYNC one (EXAMINE … (QRESYNC …)): bytes the
# server sent and time, median of RUNS. Run as root (the peer's Maildirs).
#
# Usage: bench/qresync.sh [OUT_DIR]   (env: MSGS=100000 CHANGES=1000 EXPUNGES=100 RUNS=5)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/qresync}
MSGS=${MSGS:-100000}
CHANGES=${CHANGES:-1000}
EXPUNGES=${EXPUNGES:-100}
RUNS=${RUNS:-5}
mkdir -p "$OUT"
port_open 1144 || { echo "Dovecot IMAP is not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }

export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true MAILCLUSTER_IMAP__MAX_COMMANDS_PER_SECOND=100000
mc_start 1 smtp,imap
machine_line | tee "$OUT/machine.txt"
echo "mailcluster: $MC serve over PostgreSQL + Redis; MAILCLUSTER_* as set by bench/lib.sh mc_start, plus tls.allow_plaintext_auth=true and imap.max_commands_per_second=100000 (the $CHANGES flag changes are pipelined)" | tee -a "$OUT/machine.txt"
same_mailboxes 1 "$MSGS" "$OUT"
for side in dovecot mailcluster; do
  port=1144
  [ "$side" = mailcluster ] && port=$(mc_port imap)
  python3 bench/qresync_client.py "$port" "$OUT/$side.json" "$side" "$CHANGES" "$EXPUNGES" "$RUNS" | tee "$OUT/$side.txt" || exit 1
done
