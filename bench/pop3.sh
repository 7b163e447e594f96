#!/usr/bin/env bash
# POP3 sessions per second, side by side in one run: Mailcluster (release build,
# PostgreSQL + Redis) against Dovecot's POP3 from /work/shared/peers.
#
# A session is what a mail client does on every poll: connect + TLS handshake
# (POP3S, implicit TLS), USER/PASS, STAT, LIST, RETR of one message, QUIT — the
# stress runner's `pop3` scenario, closed loop, C concurrent clients cycling over
# USERS users, each maildrop seeded with PER_USER messages through each side's
# own SMTP. The two servers are measured alternately, ROUNDS times.
#
# SIZE (bytes) sets the seeded messages' size (the runner's --message-size; its
# default when unset): e.g. SIZE=1048576 measures RETR of large messages, which
# the server writes from the shared body cache without copying them.
#
# Usage: bench/pop3.sh [OUT_DIR]   (env: USERS, PER_USER, C, DUR, ROUNDS, SIZE)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/pop3}
USERS=${USERS:-200}
PER_USER=${PER_USER:-5}
C=${C:-10}
DUR=${DUR:-20s}
ROUNDS=${ROUNDS:-2}
SEED_SIZE=()
[ -n "${SIZE:-}" ] && SEED_SIZE=(--message-size "$SIZE")
mkdir -p "$OUT"
port_open 1995 || { echo "Dovecot POP3S is not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }

mc_start "$USERS" smtp,pop3,pop3s
machine_line | tee "$OUT/machine.txt"
COMMON=(--users-count "$USERS" -k --no-progress)
# The peer starts from empty maildirs, as Mailcluster does from a fresh database:
# mail another benchmark left there (bench/imap.sh leaves 10,000-message INBOXes)
# would be listed by every Dovecot POP3 session.
for n in $(seq 1 "$USERS"); do
  rm -rf "$PEERS/mail/example.test/$(printf user%04d "$n")/Maildir"
done
"$STRESS" --smtp "127.0.0.1:$(mc_port smtp)" -s seed --messages-per-user "$PER_USER" -c 20 "${SEED_SIZE[@]}" "${COMMON[@]}" >"$OUT/seed-mailcluster.txt" || exit 1
"$STRESS" --smtp 127.0.0.1:2526 -s seed --messages-per-user "$PER_USER" -c 20 "${SEED_SIZE[@]}" "${COMMON[@]}" >"$OUT/seed-dovecot.txt" || exit 1
sleep 5   # Postfix hands the tail of its queue to Dovecot over LMTP

for round in $(seq 1 "$ROUNDS"); do
  for side in dovecot mailcluster; do
    if [ "$side" = dovecot ]; then port=1995; else port=$(mc_port pop3s); fi
    c0=$( [ "$side" = mailcluster ] && cpu_secs "$MC_PID" || echo 0)
    "$STRESS" --pop3 "127.0.0.1:$port" --pop3-tls implicit -s pop3 -c "$C" -d "$DUR" "${COMMON[@]}" \
      --json "$OUT/$side-$round.json" >"$OUT/$side-$round.txt"
    if [ "$side" = mailcluster ]; then
      echo "mailcluster round $round: server CPU $(echo "$(cpu_secs "$MC_PID") - $c0" | bc) s, peak RSS $(rss_mb "$MC_PID") MB"
    fi
  done
done
bench_table "$OUT"/dovecot-*.json "$OUT"/mailcluster-*.json | grep -E "pop3-(session|login|retr)"
