#!/usr/bin/env bash
# SELECT of large mailboxes, side by side in one run: Mailcluster (release build,
# PostgreSQL + Redis) against Dovecot from /work/shared/peers. USERS users, each
# with the same MSGS-message INBOX on both sides (same_mailboxes in lib.sh); C
# sessions at once, closed loop, each one connect, LOGIN, SELECT INBOX, LOGOUT,
# cycling over the users (bench/imap_select_client.py): a mail client opening a
# folder, in a cluster where every session may land on another pod.
#
# Three Mailcluster pods over the same database and Redis, so that one run shows
# where a SELECT's index comes from:
#   local  — mc_start's pod: its own SELECT cache (imap.select_cache_messages,
#            2,000,000 by default) holds every mailbox after the warm-up pass;
#   shared — imap.select_cache_messages=0: a pod whose cache does not hold the
#            mailbox (another pod served the user last, or the mailboxes outgrew
#            the budget, as the 60-minute soak's did): the index comes from Redis
#            (imap.shared_index_min_messages, 1,000 by default) plus what
#            changed since;
#   store  — imap.select_cache_messages=0 and imap.shared_index_min_messages=0:
#            every SELECT reads the whole mailbox from PostgreSQL (what the shared
#            pod did before the shared index existed).
# Each line of output carries the pod's server CPU, PostgreSQL's and Redis's CPU
# over the run.
#
# Usage: bench/imap-select.sh [OUT_DIR]   (env: USERS=200 MSGS=7000 C=8 DUR=20 ROUNDS=2 WARM=30)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-bench/results/imap-select}
USERS=${USERS:-200}
MSGS=${MSGS:-7000}
C=${C:-8}
DUR=${DUR:-20}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
port_open 1144 || { echo "Dovecot IMAP is not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }

export MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH=true
mc_start "$USERS" smtp,imap
machine_line | tee "$OUT/machine.txt"
echo "mailcluster: $MC serve at $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes') over PostgreSQL + Redis; MAILCLUSTER_* as set by bench/lib.sh mc_start, plus tls.allow_plaintext_auth=true; pods shared and store as described in the script" | tee -a "$OUT/machine.txt"

# The other two pods serve IMAP only, on ports of their own.
mc_pod shared 19191 MAILCLUSTER_PROTOCOLS=imap MAILCLUSTER_IMAP_PORT=15143 MAILCLUSTER_IMAP__SELECT_CACHE_MESSAGES=0
SHARED_PID=${MC_POD_PIDS[-1]}
mc_pod store 19192 MAILCLUSTER_PROTOCOLS=imap MAILCLUSTER_IMAP_PORT=16143 MAILCLUSTER_IMAP__SELECT_CACHE_MESSAGES=0 \
  MAILCLUSTER_IMAP__SHARED_INDEX_MIN_MESSAGES=0
STORE_PID=${MC_POD_PIDS[-1]}

same_mailboxes "$USERS" "$MSGS" "$OUT"
# Warm-up, not measured: Dovecot builds its index files; the local pod reads every
# mailbox once (its cache then holds them, and it shares each index in Redis).
python3 bench/imap_select_client.py 1144 "$USERS" "${WARM:-30}" /dev/null warm-dovecot "$C" | sed 's/^/warm-up: /'
python3 bench/imap_select_client.py "$(mc_port imap)" "$USERS" "${WARM:-30}" /dev/null warm-mailcluster "$C" | sed 's/^/warm-up: /'

redis_pid=$(pgrep -o redis-server)
for round in $(seq 1 "$ROUNDS"); do
  for side in dovecot local shared store; do
    case $side in
      dovecot) port=1144 pid= ;;
      local) port=$(mc_port imap) pid=$MC_PID ;;
      shared) port=15143 pid=$SHARED_PID ;;
      store) port=16143 pid=$STORE_PID ;;
    esac
    c0=$([ -n "$pid" ] && cpu_secs "$pid" || echo 0) p0=$(pg_ticks) r0=$(cpu_secs "$redis_pid")
    line=$(python3 bench/imap_select_client.py "$port" "$USERS" "$DUR" "$OUT/$side-$round.json" "$side" "$C")
    extra=""
    [ -n "$pid" ] && extra=" server_cpu=$(echo "$(cpu_secs "$pid") - $c0" | bc)s pg_cpu=$(echo "scale=1; ($(pg_ticks) - $p0) / $(getconf CLK_TCK)" | bc)s redis_cpu=$(echo "$(cpu_secs "$redis_pid") - $r0" | bc)s"
    echo "round $round $line$extra" | tee -a "$OUT/rounds.txt"
  done
done
