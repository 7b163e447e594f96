#!/usr/bin/env bash
# PostgreSQL's CPU per delivery statement: the DELIVER statement of
# server/src/store/postgres/mod.rs (read from the source, so it is the shipped
# one), alone under pgbench, at a fixed RATE of statements per second, for
# batches of 1, 2, 4 and 8 messages to as many mailboxes. Its 23 array
# parameters are written as literal arrays (pgbench cannot bind arrays): bodies
# of SIZE bytes, random mailbox and body ids. Prints PostgreSQL's CPU (every
# PostgreSQL process, as bench/lib.sh pg_ticks counts it) per statement and per
# message: what a smaller batch (two pods forming batches from half the traffic
# each) costs the database. Plan caching as the server has it (generic plans).
#
# Usage: bench/deliver-statement.sh DATABASE_URL   (a migrated Mailcluster
#        database with mailboxes, e.g. one bench/smtp.sh made; rows are added)
# env: RATE (300), SECS (15), CLIENTS (8), SIZE (4096), BATCHES ("1 2 4 8")
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
URL=${1:?usage: bench/deliver-statement.sh DATABASE_URL}
RATE=${RATE:-300}
SECS=${SECS:-15}
CLIENTS=${CLIENTS:-8}
SIZE=${SIZE:-4096}
BATCHES=${BATCHES:-1 2 4 8}
command -v pgbench >/dev/null 2>&1 || { echo "pgbench missing (apt-get install postgresql-contrib)" >&2; exit 1; }
read -r lo hi < <(psql "$URL" -Atc "SELECT min(id), max(id) FROM mailboxes" | tr '|' ' ')
[ -n "$lo" ] || { echo "no mailboxes in $URL" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

script() { # batch
  python3 - "$1" "$lo" "$hi" "$SIZE" <<'PY'
import re, sys
batch, lo, hi, size = (int(a) for a in sys.argv[1:5])
src = open("server/src/store/postgres/mod.rs").read()
start = src.index('const DELIVER: &str = "') + len('const DELIVER: &str = "')
stmt = src[start:src.index('";', start)].replace("\\\n", " ").replace("\\", "")
step = (hi - lo + 1) // batch
head = []
for i in range(batch):
    head.append(f"\\set m{i} random({lo + i * step}, {lo + (i + 1) * step - 1})")
    head.append(f"\\set i{i} random(1000000000000, 9000000000000000000)")
def arr(item, kind):
    return "(ARRAY[" + ",".join(item(i) for i in range(batch)) + f"]::{kind}[])"
body = f"convert_to(repeat(md5(random()::text), {max(1, size // 32)}), 'UTF8')"
params = {
    1: arr(lambda i: f":m{i}", "bigint"), 2: arr(lambda i: "1", "bigint"),
    3: arr(lambda i: "1", "bigint"), 4: arr(lambda i: str(size), "bigint"),
    5: arr(lambda i: f":i{i}", "bigint"), 6: arr(lambda i: body, "bytea"),
    7: arr(lambda i: "false", "bool"), 8: arr(lambda i: str(size), "bigint"),
    9: arr(lambda i: "'{}'", "text"), 10: arr(lambda i: "'bench'", "text"),
    11: arr(lambda i: "'a@example.test'", "text"), 12: arr(lambda i: "'b@example.test'", "text"),
    13: arr(lambda i: "''", "text"), 14: arr(lambda i: "'<x@example.test>'", "text"),
    15: arr(lambda i: "now()", "timestamptz"), 16: arr(lambda i: "300", "bigint"),
    17: arr(lambda i: f":m{i}", "bigint"), 18: arr(lambda i: "0", "bigint"),
    19: arr(lambda i: f":i{i}", "bigint"), 20: arr(lambda i: "0", "int"),
    21: arr(lambda i: "''", "text"), 22: arr(lambda i: "now()", "timestamptz"),
    23: arr(lambda i: str(size), "bigint"),
}
stmt = re.sub(r"\$(\d+)(::[a-z]+\[\])?", lambda m: params[int(m.group(1))], stmt)
print("\n".join(head))
print(" ".join(stmt.split()) + ";")
PY
}

for b in $BATCHES; do
  script "$b" >"$dir/deliver-$b.sql"
  t0=$(pg_ticks)
  out=$(PGOPTIONS="-c plan_cache_mode=force_generic_plan" pgbench -n -M prepared -c "$CLIENTS" -j 1 -R "$RATE" -T "$SECS" \
    -f "$dir/deliver-$b.sql" "$URL" 2>&1)
  t1=$(pg_ticks)
  n=$(awk '/number of transactions actually processed/ {split($6, a, "/"); print a[1]}' <<<"$out")
  [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "$out" >&2; exit 1; }
  awk -v b="$b" -v n="$n" -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v lat="$(awk '/latency average/ {print $4}' <<<"$out")" \
    'BEGIN { ms = t * 1000 / hz; printf "batch %d: %d statements, PostgreSQL CPU %.3f ms per statement, %.3f ms per message (mean latency %s ms)\n", b, n, ms / n, ms / n / b, lat }'
done
