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
# CLONE=1 measures maildrops that keep their mail (a client that leaves it on the
# server): PER_USER messages are seeded into user0001 only, through each side's SMTP,
# then every other maildrop gets the same messages: Mailcluster's by SQL
# (mc_clone_inbox), Dovecot's as hard links of user0001's message files (its index
# files copied, never linked: Dovecot writes them in place). USERS=200 PER_USER=7000
# is 1.4 million listed messages, past Mailcluster's default listing cache
# (pop3.maildrop_cache_messages), as the 60-minute soak's maildrops are.
#
# Usage: bench/pop3.sh [OUT_DIR]   (env: USERS, PER_USER, C, DUR, ROUNDS, SIZE, CLONE)
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
SEED_USERS=$USERS
[ -n "${CLONE:-}" ] && SEED_USERS=1
# The peer starts from empty maildirs, as Mailcluster does from a fresh database:
# mail another benchmark left there (bench/imap.sh leaves 10,000-message INBOXes)
# would be listed by every Dovecot POP3 session.
for n in $(seq 1 "$USERS"); do
  rm -rf "$PEERS/mail/example.test/$(printf user%04d "$n")/Maildir"
done
SEED=(-s seed --messages-per-user "$PER_USER" -c 20 "${SEED_SIZE[@]}" --users-count "$SEED_USERS" -k --no-progress)
"$STRESS" --smtp "127.0.0.1:$(mc_port smtp)" "${SEED[@]}" >"$OUT/seed-mailcluster.txt" || exit 1
"$STRESS" --smtp 127.0.0.1:2526 "${SEED[@]}" >"$OUT/seed-dovecot.txt" || exit 1
src=$PEERS/mail/example.test/user0001/Maildir
# Postfix hands the tail of its queue to Dovecot over LMTP.
for _ in $(seq 1 600); do
  [ "$(find "$src/new" "$src/cur" -type f 2>/dev/null | wc -l)" -ge "$( [ -n "${CLONE:-}" ] && echo "$PER_USER" || echo 1)" ] && break
  sleep 1
done
sleep 5
if [ -n "${CLONE:-}" ]; then
  mc_clone_inbox "$USERS"
  for n in $(seq 2 "$USERS"); do
    dst=$PEERS/mail/example.test/$(printf user%04d "$n")/Maildir
    mkdir -p "$dst" && cp -al "$src/cur" "$src/new" "$src/tmp" "$dst/" \
      && find "$src" -maxdepth 1 -type f -exec cp -p {} "$dst/" \;
  done
  chown -R --reference="$src" "$PEERS/mail/example.test"
  echo "cloned user0001's $PER_USER messages into $USERS maildrops on both sides"
fi

for round in $(seq 1 "$ROUNDS"); do
  for side in dovecot mailcluster; do
    if [ "$side" = dovecot ]; then port=1995; else port=$(mc_port pop3s); fi
    c0=$( [ "$side" = mailcluster ] && cpu_secs "$MC_PID" || echo 0)
    p0=$(pg_ticks)
    r0=$(cpu_secs "$(pgrep -o redis-server)")
    "$STRESS" --pop3 "127.0.0.1:$port" --pop3-tls implicit -s pop3 -c "$C" -d "$DUR" "${COMMON[@]}" \
      --json "$OUT/$side-$round.json" >"$OUT/$side-$round.txt"
    if [ "$side" = mailcluster ]; then
      echo "mailcluster round $round: server CPU $(echo "$(cpu_secs "$MC_PID") - $c0" | bc) s," \
        "PostgreSQL CPU $(echo "scale=1; ($(pg_ticks) - $p0) / $(getconf CLK_TCK)" | bc) s," \
        "Redis CPU $(echo "$(cpu_secs "$(pgrep -o redis-server)") - $r0" | bc) s, peak RSS $(rss_mb "$MC_PID") MB"
    fi
  done
done
bench_table "$OUT"/dovecot-*.json "$OUT"/mailcluster-*.json | grep -E "pop3-(session|login|retr)"
