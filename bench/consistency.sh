#!/usr/bin/env bash
# Many sessions on one mailbox, checked against each other, on the shipped
# binary and on the reference side by side: server/tests/clients/imap_consistency.py
# (IMAP sessions doing APPEND, UID STORE, EXPUNGE, UID MOVE, FETCH, UID SEARCH,
# IDLE and QRESYNC resyncs, while SMTP senders deliver and POP3 clients read and
# delete) for DUR seconds, against
#   - two `mailcluster serve` pods (release build) over one PostgreSQL database
#     and one Redis prefix, the sessions and senders spread over both;
#   - Dovecot with Postfix in front (../shared/peers), when PEER=1.
# Not a speed figure: the clients are Python threads. What it shows is a long
# run's worth of the checks the test suite runs for seconds.
#
#   DUR=300 CLIENTS=12 SEED=1 PEER=1 bench/consistency.sh
#
# The pods run the default configuration but for plaintext logins (the
# checker's clients speak plain IMAP on loopback): MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-120}
CLIENTS=${CLIENTS:-12}
SEED=${SEED:-$RANDOM}
PEER=${PEER:-1}
CHECKER=server/tests/clients/imap_consistency.py
source bench/lib.sh
machine_line
echo "## commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (uncommitted changes)'); DUR=$DUR CLIENTS=$CLIENTS SEED=$SEED"

export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true
mc_start 2 smtp,imap,pop3
mc_pod b 19091 MAILCLUSTER_SMTP_PORT=13025 MAILCLUSTER_IMAP_PORT=13143 MAILCLUSTER_POP3_PORT=13110
echo "== mailcluster: two pods (imap $(mc_port imap), 13143; smtp $(mc_port smtp), 13025; pop3 $(mc_port pop3), 13110)"
MAILCLUSTER_CONSISTENCY_CLIENTS=$CLIENTS timeout $((DUR + 120)) python3 "$CHECKER" "$DUR" "$SEED" \
  user0001@example.test pass "$(mc_port imap)" 13143 \
  "smtp=$(mc_port smtp)" smtp=13025 "pop3=$(mc_port pop3)" pop3=13110
for pid in "$MC_PID" "${MC_POD_PIDS[@]}"; do
  echo "   pod pid $pid: CPU $(cpu_secs "$pid") s, peak RSS $(rss_mb "$pid") MB"
done
if grep -qi panic "$MC_DIR"/serve*.log; then
  echo "a pod panicked:"; grep -i -m5 panic "$MC_DIR"/serve*.log; exit 1
fi

if [ "$PEER" = 1 ]; then
  port_open 1144 || bash ../shared/peers/setup-postfix-dovecot.sh >/dev/null
  echo "== dovecot (imap 1144, pop3 1111) with postfix (smtp 2526)"
  # Postfix answers 250 when it has queued, before LMTP stores: the checker waits.
  MAILCLUSTER_CONSISTENCY_CLIENTS=$CLIENTS MAILCLUSTER_CONSISTENCY_SETTLE_SECS=5 timeout $((DUR + 120)) \
    python3 "$CHECKER" "$DUR" "$SEED" "user$(printf %04d $((RANDOM % 900 + 100)))@example.test" pass 1144 \
    smtp=2526 pop3=1111
fi
