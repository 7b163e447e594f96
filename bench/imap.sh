#!/usr/bin/env bash
# IMAP side by side, in one run: Mailcluster (release build, PostgreSQL + Redis)
# against Dovecot from /work/shared/peers (Maildir). Run as root (it lays out the
# peer's Maildirs as the vmail user).
#
#   1. SEARCH: USERS users at once, each in its own session, `UID SEARCH UNSEEN` in
#      an INBOX of MSGS messages (10 % unseen), closed loop;
#   2. FETCH: the same sessions, `UID FETCH n BODY.PEEK[]` over the mailbox;
#      SEARCH and FETCH again open loop at RATE commands/s over the same sessions
#      (closed loop, P95 is set by Little's law — sessions ÷ throughput — so the
#      open-loop runs show the latency at a load both sides sustain);
#   3. logins: connect + LOGIN / AUTHENTICATE PLAIN + LOGOUT cycling over 1,000
#      users (the credential cache warmed by a first pass), plain IMAP;
#   4. idle TLS connections: FLOOD IMAPS connections held by one Mailcluster
#      process; server RSS growth per connection.
#
# Both stores get the same mailboxes: MSGS messages delivered through each side's
# own SMTP into user0001 (Mailcluster's MX; Postfix → LMTP → Maildir), 90 % then
# marked \Seen, and that INBOX cloned into user0002…: Mailcluster links the stored
# bodies into each INBOX with SQL (bodies are stored once by design), Dovecot gets
# hard-linked Maildir files; each side then indexes on a warm-up pass.
#
# Usage: bench/imap.sh [OUT_DIR]   (env: USERS, MSGS, DUR, FLOOD, ROUNDS, RATE,
#        PARTS — any of "mailboxes login idle", default all three)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/imap}
USERS=${USERS:-200}
MSGS=${MSGS:-10000}
DUR=${DUR:-20s}
FLOOD=${FLOOD:-10000}
ROUNDS=${ROUNDS:-2}
RATE=${RATE:-2000}
PARTS=${PARTS:-mailboxes login idle}
part() { [[ " $PARTS " == *" $1 "* ]]; }
shopt -s nullglob
mkdir -p "$OUT"
port_open 1144 || { echo "Dovecot IMAP is not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }

export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true MAILCLUSTER_NET__MAX_CONNECTIONS=$((FLOOD + 1000))
export MAILCLUSTER_IMAP__MAX_COMMANDS_PER_SECOND=100000
mc_start 1000 smtp,imap,imaps
machine_line | tee "$OUT/machine.txt"
Q=(--no-progress -k)

# ---- 1. the same mailboxes on both sides
if part mailboxes; then
same_mailboxes "$USERS" "$MSGS" "$OUT"

# ---- warm-up: every user's INBOX opened once on each side (Dovecot builds its index)
for port in 1144 "$(mc_port imap)"; do
  "$STRESS" --imap "127.0.0.1:$port" -s search -c "$USERS" --users-count "$USERS" -d 15s "${Q[@]}" >"$OUT/warmup-$port.txt"
done
fi

side_port() { if [ "$1" = dovecot ]; then echo 1144; else mc_port imap; fi; }
run() { # scenario label side round, extra args...
  local scen=$1 label=$2 side=$3 round=$4; shift 4
  local c0; c0=$(cpu_secs "$MC_PID")
  "$STRESS" --imap "127.0.0.1:$(side_port "$side")" -s "$scen" -d "$DUR" "${Q[@]}" "$@" \
    --json "$OUT/$label-$side-$round.json" >"$OUT/$label-$side-$round.txt"
  [ "$side" = mailcluster ] && echo "mailcluster $label round $round: server CPU $(echo "$(cpu_secs "$MC_PID") - $c0" | bc) s"
}
# The credential cache: one pass over the 1,000 users, right before each login
# run (entries live `auth.credential_cache_secs`, 300 s by default — less than a
# round takes).
warm_credentials() {
  "$STRESS" --imap "127.0.0.1:$(mc_port imap)" -s auth -c 20 --users-count 1000 --max-ops 1000 -d 60s "${Q[@]}" >/dev/null
}
for round in $(seq 1 "$ROUNDS"); do
  for side in dovecot mailcluster; do
    if part mailboxes; then
      run search search "$side" "$round" -c "$USERS" --users-count "$USERS"
      run fetch fetch "$side" "$round" -c "$USERS" --users-count "$USERS"
      run search search-open "$side" "$round" -c "$USERS" --users-count "$USERS" --rate "$RATE"
      run fetch fetch-open "$side" "$round" -c "$USERS" --users-count "$USERS" --rate "$RATE"
    fi
    if part login; then
      [ "$side" = mailcluster ] && warm_credentials
      run auth login "$side" "$round" -c 50 --users-count 1000
    fi
  done
done
bench_table "$OUT"/search-[dm]*.json "$OUT"/fetch-[dm]*.json "$OUT"/login-*.json "$OUT"/*-open-*.json | grep -E " (search|fetch-body|fetch-header|imap-login|imap-authenticate-plain) "

# ---- 4. idle TLS connections held by one process
part idle || exit 0
rss_now() { awk '/VmRSS/{print $2}' "/proc/$MC_PID/status"; }
before=$(rss_now)
"$STRESS" --imap "127.0.0.1:$(mc_port imaps)" --imap-tls implicit -s connect-flood --protocol imap \
  -c "$FLOOD" --ramp-up 30s -d 20s --timeout 30s "${Q[@]}" --json "$OUT/idle-tls.json" >"$OUT/idle-tls.txt" &
FP=$!
sleep 40
held=$(rss_now)
conns=$(ss -Htn state established "( sport = :$(mc_port imaps) )" | wc -l)
wait "$FP"
awk -v b="$before" -v h="$held" -v n="$conns" 'BEGIN { printf "idle TLS: %d connections established; RSS %.0f MB -> %.0f MB = %.1f KB per connection\n", n, b/1024, h/1024, (h-b)/n }' | tee "$OUT/idle-tls-rss.txt"
tail -n 20 "$OUT/idle-tls.txt"
