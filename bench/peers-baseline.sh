#!/usr/bin/env bash
# Reference figures: the default scenarios against Postfix + Dovecot
# (/work/shared/peers, started with setup-postfix-dovecot.sh as root).
# Seeds the mailboxes through Postfix first (search/fetch/pop3 need messages).
# Usage: bench/peers-baseline.sh [OUT_DIR]      (release build expected)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/mailcluster-stress}
OUT=${1:-bench/results/peers}
USERS=${USERS:-1000}
PER_USER=${PER_USER:-10}
DUR=${DUR:-30s}
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)"
[ -x "$BIN" ] || nice cargo build --release -p mailcluster-stress
COMMON=(--users-count "$USERS" -k --no-progress)
run() { local name=$1; shift; echo "## $name: $*"; "$BIN" "$@" "${COMMON[@]}" --json "$OUT/$name.json" | tee "$OUT/$name.txt"; echo "exit $?"; }

echo "## machine: $(nproc) cores; $(free -g | awk '/Mem:/{print $2" GiB RAM"}'); $(date -u +%FT%TZ)" | tee "$OUT/machine.txt"
[ "${SKIP_SEED:-0}" = 1 ] || run seed --smtp 127.0.0.1:2526 -s seed --messages-per-user "$PER_USER" -c 20
sleep 5   # let Postfix hand the tail of the queue to Dovecot over LMTP
run deliver --smtp 127.0.0.1:2526 -s deliver --rate "${RATE:-200}" -c 50 -d "$DUR"
run deliver-submission --smtp 127.0.0.1:2587 --smtp-tls starttls --auth plain -s deliver --rate "${RATE:-200}" -c 50 -d "$DUR"
run auth --smtp 127.0.0.1:2587 --smtp-tls starttls --imap 127.0.0.1:1144 -s auth -c 20 -d "$DUR"
run search --imap 127.0.0.1:1144 -s search -c 20 -d "$DUR"
run fetch --imap 127.0.0.1:1144 -s fetch -c 20 -d "$DUR"
run fetch-imaps --imap 127.0.0.1:1993 --imap-tls implicit -s fetch -c 20 -d "$DUR"
run pop3 --pop3 127.0.0.1:1111 -s pop3 -c 10 -d "$DUR"
run connect-flood-imaps --imap 127.0.0.1:1993 --imap-tls implicit -s connect-flood --protocol imap -c "${FLOOD:-500}" --ramp-up 5s -d 10s
run connect-flood-smtp --smtp 127.0.0.1:2526 -s connect-flood --protocol smtp -c "${FLOOD:-500}" --ramp-up 5s -d 10s
