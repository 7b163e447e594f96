#!/usr/bin/env bash
# `mailcluster user import` of N accounts (default 100,000) from a Dovecot
# passwd-file into a fresh PostgreSQL database: wall time and accounts per
# second, batch of BATCH (default 1,000) accounts per transaction.
#
#   bench/accounts-import.sh [N]      MC=target/release/mailcluster by default
#
# Every account has a quota rule, and every tenth an alias, as a migrated
# system's would. The password field is one real SHA512-CRYPT hash (made by
# glibc's crypt(3)) for all: the import stores hashes without running them,
# so its cost does not depend on which hash it is. Output and the machine line
# go to bench/results/accounts-import/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_postgres >/dev/null
N=${1:-100000}
BATCH=${BATCH:-1000}
MC=${MC:-target/release/mailcluster}
OUT=bench/results/accounts-import
mkdir -p "$OUT"
WORK=$(mktemp -d)
DB="bench_import_$$"
cleanup() {
  psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
psql "$DATABASE_URL" -qc "CREATE DATABASE $DB" >/dev/null
URL="${DATABASE_URL%/*}/$DB"
export MAILCLUSTER_DATABASE_URL=$URL MAILCLUSTER_DATABASE__MIGRATE_ON_START=false
"$MC" migrate >/dev/null 2>&1

HASH='$6$saltsalt$UV8BYgqN7u34iPYiLihbOjmF22xo0X75SlnQFYRpDJsgJaXUiVT9jRyx4l4tz0FMJBBZGZbqw/l1xfhEu2dJa/'
python3 - "$N" "$HASH" > "$WORK/users.passwd" <<'EOF'
import sys
n, h = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    print(f"user{i:06d}@example{i % 10}.test:{{SHA512-CRYPT}}{h}:1000:1000::/home/u{i}::userdb_quota_rule=*:storage=1G")
EOF
{
  echo "## machine: $(nproc) cores; $(free -g | awk '/Mem:/{print $2" GiB RAM"}'); $(. /etc/os-release; echo "$PRETTY_NAME"); load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
  echo "## $MC user import users.passwd --batch $BATCH   ($N accounts, 10 domains)"
  start=$(date +%s.%N)
  "$MC" user import "$WORK/users.passwd" --batch "$BATCH" 2>&1 | tr '\r' '\n' | tail -3
  end=$(date +%s.%N)
  count=$(psql "$URL" -Atc "SELECT count(*) FROM accounts")
  mailboxes=$(psql "$URL" -Atc "SELECT count(*) FROM mailboxes")
  python3 -c "import sys; s=float(sys.argv[2])-float(sys.argv[1]); n=int(sys.argv[3]); print(f'## wall {s:.1f} s (command start to exit), {n} accounts in the store, {n/s:.0f} accounts/s; {sys.argv[4]} mailboxes')" "$start" "$end" "$count" "$mailboxes"
} | tee "$OUT/run-$(date -u +%Y%m%dT%H%M%SZ).txt"
