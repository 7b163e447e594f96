# Shared by the side-by-side benchmarks: a Mailcluster pod (release build) over a
# fresh PostgreSQL database and a Redis key prefix of its own, with the same users
# as the Postfix + Dovecot peers (user0001… at example.test, password "pass").
#
#   source bench/lib.sh; mc_start USERS PROTOCOLS   → MC_PID, MC_DB_URL, mc_port NAME
#   EMBEDDED=1 mc_start …: the embedded default instead (SQLite in the pod's data
#   directory, MC_SQLITE; in-process cache; no PostgreSQL or Redis; MC_DB_URL empty)
#   bench_table FILE.json…                           → one line per operation
# Cleanup (server, database, Redis keys) runs on exit.

# PostgreSQL and Redis: reused when they answer, else installed and started (the
# same code as the test command's).
# shellcheck source=scripts/services.sh
source scripts/services.sh
ensure_postgres || exit 1
ensure_redis || exit 1
PG=$DATABASE_URL
REDIS=$REDIS_URL
MC=${MC:-target/release/mailcluster}
STRESS=${STRESS:-target/release/mailcluster-stress}
PEERS=${PEERS_DIR:-/var/tmp/mailcluster-peers}
ulimit -n "$(ulimit -Hn)"

port_open() { svc_port_open "$1"; }
machine_line() {
  echo "## machine: $(nproc) cores; $(free -g | awk '/Mem:/{print $2" GiB RAM"}'); load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
}

# Ports of the benchmark pod (fixed, away from the peers' and the defaults).
declare -A MC_PORTS=([smtp]=12025 [submission]=12587 [submissions]=12465 [imap]=12143 [imaps]=12993 [pop3]=12110 [pop3s]=12995 [admin]=19090)
mc_port() { echo "${MC_PORTS[$1]}"; }

MC_POD_PIDS=()
mc_cleanup() {
  [ ${#MC_POD_PIDS[@]} -gt 0 ] && kill "${MC_POD_PIDS[@]}" 2>/dev/null && wait "${MC_POD_PIDS[@]}" 2>/dev/null
  [ -n "${MC_PID:-}" ] && kill "$MC_PID" 2>/dev/null && wait "$MC_PID" 2>/dev/null
  [ -n "${MC_DB:-}" ] && psql "$PG" -qc "DROP DATABASE IF EXISTS $MC_DB WITH (FORCE)" >/dev/null
  [ -n "${MC_PREFIX:-}" ] && redis-cli -u "$REDIS" --scan --pattern "${MC_PREFIX}*" | xargs -r redis-cli -u "$REDIS" del >/dev/null
  [ -n "${MC_DIR:-}" ] && rm -rf "$MC_DIR"
}

# mc_start USERS PROTOCOLS(comma list)
mc_start() {
  local users=$1 protocols=$2
  # Always through cargo (a no-op when current): a figure must come from this
  # checkout's binary, never from a stale one left in target/.
  nice cargo build -q --release -p mailcluster -p mailcluster-stress || exit 1
  MC_DIR=$(mktemp -d -p /var/tmp)
  trap mc_cleanup EXIT
  if [ "${EMBEDDED:-0}" = 1 ]; then
    # What `mailcluster serve` runs with nothing configured: its data directory
    # holds the SQLite file (on disk, not tmpfs: /var/tmp), the cache is in-process.
    MC_DB_URL= MC_SQLITE=$MC_DIR/mailcluster.db
    unset MAILCLUSTER_DATABASE_URL MAILCLUSTER_REDIS_URL
  else
    MC_DB=mc_bench_$$
    MC_PREFIX="mcbench$$:"
    psql "$PG" -qc "CREATE DATABASE $MC_DB" || exit 1
    # MC_DB_PARAMS: connection parameters for the pod only (e.g. "?options=-c%20…").
    MC_DB_URL="${PG%/*}/$MC_DB"
    export MAILCLUSTER_DATABASE_URL=$MC_DB_URL${MC_DB_PARAMS:-} MAILCLUSTER_REDIS_URL=$REDIS MAILCLUSTER_REDIS__KEY_PREFIX=$MC_PREFIX
  fi
  export MAILCLUSTER_LISTEN_ADDR=127.0.0.1 MAILCLUSTER_PROTOCOLS=$protocols MAILCLUSTER_LOG_FORMAT=json \
    MAILCLUSTER_LOG_LEVEL=warn MAILCLUSTER_DATA_DIR=$MC_DIR MAILCLUSTER_HOSTNAME=bench.test
  local name
  for name in "${!MC_PORTS[@]}"; do
    export "MAILCLUSTER_${name^^}_PORT=${MC_PORTS[$name]}"
  done
  # Loopback load comes from one address: lift the per-IP caps meant for the internet.
  export MAILCLUSTER_NET__MAX_CONNECTIONS_PER_IP=0 MAILCLUSTER_SMTP__MAX_CONNECTIONS_PER_IP=0 \
    MAILCLUSTER_IMAP__MAX_CONNECTIONS_PER_IP=0 MAILCLUSTER_POP3__MAX_CONNECTIONS_PER_IP=0
  # Load users send far more than a person: no per-account sending limits either.
  export MAILCLUSTER_SMTP__SUBMISSION_MESSAGES_PER_HOUR=0 MAILCLUSTER_SMTP__SUBMISSION_RECIPIENTS_PER_HOUR=0
  "$MC" migrate >/dev/null || exit 1
  "$MC" domain add example.test || exit 1
  seq -f "user%04g@example.test" 1 "$users" | xargs -P "$(nproc)" -I{} sh -c "'$MC' user add {} --password pass >/dev/null" || exit 1
  "$MC" serve 2>"$MC_DIR/serve.log" &
  MC_PID=$!
  for _ in $(seq 1 120); do port_open "$(mc_port admin)" && break; sleep 0.5; done
  port_open "$(mc_port admin)" || { echo "mailcluster did not start"; cat "$MC_DIR/serve.log"; exit 1; }
}

# rspamd for the benchmarks that scan (bench/rspamd.sh, bench/rspamd-sizing.sh,
# bench/soak.sh RSPAMD=): Debian's /usr/bin/rspamd from a configuration directory
# of its own under /var/tmp, its normal worker on 127.0.0.1:RS_PORT and controller
# on RS_CONTROLLER, no name server (rules that look names up fail at once).
#   rs_start PROFILE WORKERS → RS_PID, RS_URL, RS_DESC (the configuration, one line)
#     packaged: Debian's rules as installed, http_headers on
#     lean: plus bench/rspamd-lean/local.d (its README.md says what is off and
#           why), Bayes in Redis database 13 of REDIS
#   rs_stop; rs_cpu_secs: CPU seconds of rspamd's processes so far
RSPAMD_BIN=${RSPAMD_BIN:-/usr/bin/rspamd}
RS_PORT=${RS_PORT:-12333}
RS_CONTROLLER=${RS_CONTROLLER:-12334}
rs_start() {
  local profile=$1 workers=$2 hostport
  [ -x "$RSPAMD_BIN" ] || { echo "$RSPAMD_BIN is missing (apt-get install rspamd)"; return 1; }
  RS_DIR=$(mktemp -d -p /var/tmp)
  mkdir -p "$RS_DIR/local.d" /var/tmp/mailcluster-rspamd-hs-cache
  cat >"$RS_DIR/rspamd.conf" <<CONF
.include "\$CONFDIR/common.conf"
options {
  .include "\$CONFDIR/options.inc"
  hs_cache_dir = "/var/tmp/mailcluster-rspamd-hs-cache/";
  dns { nameserver = ["127.0.0.1:9"]; timeout = 0.1s; retransmits = 1; }
}
logging { type = "file"; filename = "$RS_DIR/rspamd.log"; level = "error"; }
worker "normal" { bind_socket = "127.0.0.1:$RS_PORT"; count = $workers; }
worker "controller" { bind_socket = "127.0.0.1:$RS_CONTROLLER"; count = 1; secure_ip = ["127.0.0.1"]; static_dir = "\${WWWDIR}"; }
CONF
  echo "enabled = true;" >"$RS_DIR/local.d/http_headers.conf"
  case $profile in
  packaged) RS_DESC="packaged rules, http_headers on" ;;
  lean)
    cp bench/rspamd-lean/local.d/*.conf "$RS_DIR/local.d/"
    hostport=${REDIS#redis://}
    hostport=${hostport%%/*}
    # A database of its own: rspamd's keys never meet the pods' or the tests'.
    printf 'servers = "%s";\ndb = "13";\n' "$hostport" >"$RS_DIR/local.d/redis.conf"
    RS_DESC="lean (bench/rspamd-lean; off: $(grep -l 'enabled = false' bench/rspamd-lean/local.d/*.conf |
      xargs -n1 basename | sed 's/\.conf$//' | paste -sd, -)), Bayes in Redis db 13"
    ;;
  *) echo "rspamd profile $profile: packaged or lean"; return 1 ;;
  esac
  RS_DESC="rspamd $("$RSPAMD_BIN" --version | awk '{print $NF}') $RS_DESC; normal worker x $workers, no name server"
  "$RSPAMD_BIN" -f -u root -g root -c "$RS_DIR/rspamd.conf" --var=LOCAL_CONFDIR="$RS_DIR" --var=DBDIR="$RS_DIR" \
    --var=RUNDIR="$RS_DIR" >"$RS_DIR/stdout.log" 2>&1 &
  RS_PID=$!
  RS_URL=http://127.0.0.1:$RS_PORT
  for _ in $(seq 1 600); do curl -sf "$RS_URL/ping" >/dev/null && return 0; sleep 0.2; done
  echo "rspamd did not start"
  cat "$RS_DIR"/*.log
  rs_stop
  return 1
}
rs_stop() {
  [ -n "${RS_PID:-}" ] && kill "$RS_PID" 2>/dev/null && wait "$RS_PID" 2>/dev/null
  [ -n "${RS_DIR:-}" ] && rm -rf "$RS_DIR"
  RS_PID= RS_DIR=
}
rs_cpu_secs() {
  local p
  for p in "$RS_PID" $(pgrep -P "$RS_PID"); do cpu_secs "$p" && echo; done | awk '{s += $1} END {printf "%.1f", s}'
}

# mc_pod NAME ADMIN_PORT [NAME=value…] [-- WRAPPER…]: another pod of mc_start's
# database and Redis prefix (the same binary and MAILCLUSTER_* environment, plus
# the settings given: its own listener ports among them), run under WRAPPER (e.g.
# taskset) when given; its pid is appended to MC_POD_PIDS, and mc_cleanup stops it.
mc_pod() {
  local name=$1 admin=$2 settings=() wrapper=()
  shift 2
  while [ $# -gt 0 ]; do
    [ "$1" = -- ] && { shift; wrapper=("$@"); break; }
    settings+=("$1"); shift
  done
  env "${settings[@]}" MAILCLUSTER_ADMIN_PORT="$admin" MAILCLUSTER_DATA_DIR="$MC_DIR/$name" \
    "${wrapper[@]}" "$MC" serve 2>"$MC_DIR/serve-$name.log" &
  MC_POD_PIDS+=($!)
  for _ in $(seq 1 120); do port_open "$admin" && break; sleep 0.5; done
  port_open "$admin" || { echo "pod $name did not start"; cat "$MC_DIR/serve-$name.log"; exit 1; }
}

# mc_clone_inbox USERS: marks 90 % of user0001's INBOX \Seen and links that INBOX
# into user0002…USERS with SQL (bodies are stored once by design, so this is what
# delivering the same mail to every user would store).
mc_clone_inbox() {
  [ -n "$MC_DB_URL" ] || { mc_clone_inbox_sqlite "$1"; return; }
  psql "$MC_DB_URL" -q -v ON_ERROR_STOP=1 <<SQL
SELECT m.id AS src FROM mailboxes m JOIN accounts a ON a.id = m.account_id
  WHERE a.email = 'user0001@example.test' AND m.name = 'INBOX' \gset
UPDATE mailbox_messages SET flags = flags | 1 WHERE mailbox_id = :src AND uid % 10 <> 0;
UPDATE mailboxes SET unseen = (SELECT count(*) FROM mailbox_messages WHERE mailbox_id = :src AND flags & 1 = 0) WHERE id = :src;
CREATE TEMP TABLE targets AS
  SELECT m.id FROM mailboxes m JOIN accounts a ON a.id = m.account_id
  WHERE m.name = 'INBOX' AND a.email > 'user0001@example.test' AND a.email <= 'user$(printf %04d "$1")@example.test';
INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, size)
  SELECT t.id, mm.uid, mm.message_id, mm.flags, mm.keywords, mm.modseq, mm.internal_date, mm.size
  FROM targets t CROSS JOIN mailbox_messages mm WHERE mm.mailbox_id = :src;
UPDATE mailboxes d SET uid_next = s.uid_next, highest_modseq = s.highest_modseq, messages = s.messages, unseen = s.unseen,
  bytes = s.bytes
  FROM mailboxes s WHERE s.id = :src AND d.id IN (SELECT id FROM targets);
ANALYZE;
SQL
}

# The same for the embedded default's SQLite file (EMBEDDED=1).
mc_clone_inbox_sqlite() {
  sqlite3 -bail -cmd '.timeout 30000' "$MC_SQLITE" <<SQL
CREATE TEMP TABLE src AS SELECT m.id AS id FROM mailboxes m JOIN accounts a ON a.id = m.account_id
  WHERE a.email = 'user0001@example.test' AND m.name = 'INBOX';
BEGIN IMMEDIATE;
UPDATE mailbox_messages SET flags = flags | 1 WHERE mailbox_id = (SELECT id FROM src) AND uid % 10 <> 0;
UPDATE mailboxes SET unseen = (SELECT count(*) FROM mailbox_messages WHERE mailbox_id = (SELECT id FROM src) AND flags & 1 = 0)
  WHERE id = (SELECT id FROM src);
CREATE TEMP TABLE targets AS
  SELECT m.id FROM mailboxes m JOIN accounts a ON a.id = m.account_id
  WHERE m.name = 'INBOX' AND a.email > 'user0001@example.test' AND a.email <= 'user$(printf %04d "$1")@example.test';
INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, size)
  SELECT t.id, mm.uid, mm.message_id, mm.flags, mm.keywords, mm.modseq, mm.internal_date, mm.size
  FROM targets t CROSS JOIN mailbox_messages mm WHERE mm.mailbox_id = (SELECT id FROM src);
UPDATE mailboxes SET (uid_next, highest_modseq, messages, unseen, bytes) =
  (SELECT s.uid_next, s.highest_modseq, s.messages, s.unseen, s.bytes FROM mailboxes s WHERE s.id = (SELECT id FROM src))
  WHERE id IN (SELECT id FROM targets);
COMMIT;
ANALYZE;
SQL
}

# CPU seconds used by a process so far.
cpu_secs() { awk -v tk="$(getconf CLK_TCK)" '{printf "%.1f", ($14+$15)/tk}' "/proc/$1/stat"; }
# CPU ticks of PostgreSQL so far: every live process (its backends live as long
# as the pools' connections; ps's whole seconds per process would round each of
# them to 0), and the postmaster's reaped children (backends that already ended).
pg_ticks() { for p in $(pgrep -u postgres); do awk '{print $14+$15+$16+$17}' "/proc/$p/stat" 2>/dev/null; done | awk '{s+=$1} END {print s+0}'; }
rss_mb() { awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$1/status"; }

# One line per operation of each JSON report: throughput and latency percentiles.
bench_table() {
  python3 - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    for s in d["scenarios"]:
        for name, o in sorted(s["ops"].items()):
            print(f"{path.rsplit('/',1)[-1]:<34} {name:<16} ok {o['ok']:>7} err {o['errors']:>5} "
                  f"{o['throughput']:>9.1f}/s  p50 {o['p50_ms']:>8.2f}  p95 {o['p95_ms']:>8.2f}  p99 {o['p99_ms']:>8.2f} ms")
PY
}

# same_mailboxes USERS MSGS OUT: MSGS messages delivered through each side's own
# SMTP into user0001 (Mailcluster's MX; Postfix → LMTP → Maildir), 90 % then marked
# \Seen, and that INBOX cloned into user0002…USERS: Mailcluster links the stored
# bodies into each INBOX with SQL (bodies are stored once by design), Dovecot gets
# hard-linked Maildir files. Needs mc_start first.
same_mailboxes() {
  local users=$1 msgs=$2 out=$3 md src t0 i=0 n d f
  local q=(--no-progress -k)
  md=$PEERS/mail/example.test
  src=$md/user0001/Maildir
  rm -rf "$src"   # a fresh mailbox for the peer too
  "$STRESS" --smtp "127.0.0.1:$(mc_port smtp)" -s seed --users-count 1 --messages-per-user "$msgs" -c 20 "${q[@]}" \
    >"$out/seed-mailcluster.txt" || exit 1
  "$STRESS" --smtp 127.0.0.1:2526 -s seed --users-count 1 --messages-per-user "$msgs" -c 20 "${q[@]}" \
    >"$out/seed-dovecot.txt" || exit 1
  tail -n 3 "$out/seed-mailcluster.txt" "$out/seed-dovecot.txt"
  for _ in $(seq 1 600); do
    [ "$(find "$src/new" "$src/cur" -type f 2>/dev/null | wc -l)" -ge "$msgs" ] && break; sleep 1
  done
  echo "cloning user0001's INBOX into user0002..user$(printf %04d "$users")"
  t0=$(date +%s)
  mc_clone_inbox "$users" || exit 1
  for f in "$src"/new/*; do
    i=$((i + 1))
    if ((i % 10)); then mv "$f" "$src/cur/${f##*/}:2,S"; else mv "$f" "$src/cur/${f##*/}:2,"; fi
  done
  rm -f "$src"/dovecot*
  for n in $(seq 2 "$users"); do
    d=$md/$(printf user%04d "$n")/Maildir
    rm -rf "$d"; mkdir -p "$d/new" "$d/tmp"; cp -al "$src/cur" "$d/cur"
  done
  chown -R vmail:vmail "$md"
  echo "cloned in $(( $(date +%s) - t0 )) s"
}
