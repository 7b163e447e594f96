#!/usr/bin/env bash
# The physical limit of SMTP delivery on this machine: PostgreSQL alone running the
# statements of Mailcluster's delivery transaction (server/src/store/postgres,
# deliver_batch: lock the mailbox, allocate the UID and modseq, insert the body row,
# insert the link row, COMMIT), driven by pgbench with the same 50 clients as the
# SMTP benchmark and no mail server in between. Two shapes:
#   - one message per transaction (one COMMIT, one WAL flush, per message);
#   - BATCH messages per transaction, as group commit forms them under load.
# The mail server can approach, never pass, these figures.
#
# Usage: bench/pg-ceiling.sh DATABASE_URL   (a migrated Mailcluster database with
#        mailboxes, e.g. the one bench/smtp.sh made; rows are added, not removed)
# env: CLIENTS (50), SECS (15), SIZE (4096), BATCH (16)
set -euo pipefail
URL=${1:?usage: bench/pg-ceiling.sh DATABASE_URL}
CLIENTS=${CLIENTS:-50}
SECS=${SECS:-15}
SIZE=${SIZE:-4096}
BATCH=${BATCH:-16}
command -v pgbench >/dev/null 2>&1 || { echo "pgbench missing (apt-get install postgresql-contrib)" >&2; exit 1; }

read -r lo hi < <(psql "$URL" -Atc "SELECT min(id), max(id) FROM mailboxes WHERE name = 'INBOX'" | tr '|' ' ')
[ -n "$lo" ] || { echo "no INBOX in $URL" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# One delivery. The body is SIZE bytes of text, like the benchmark's messages.
cat >"$dir/one.sql" <<EOF
\set mb random($lo, $hi)
BEGIN;
SELECT id FROM mailboxes WHERE id = :mb FOR UPDATE;
UPDATE mailboxes SET uid_next = uid_next + 1, highest_modseq = highest_modseq + 1,
  messages = messages + 1, unseen = unseen + 1, bytes = bytes + $SIZE WHERE id = :mb
  RETURNING uid_next - 1 AS uid, highest_modseq AS modseq \gset
INSERT INTO messages (body, compressed, size, meta, subject, from_addr, to_addr, message_id, header_size)
  VALUES (convert_to(repeat(md5(random()::text), $SIZE / 32), 'UTF8'), false, $SIZE, '{}',
          'bench', 'a@example.test', 'b@example.test', '<x@example.test>', 300)
  RETURNING id \gset
INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, size)
  VALUES (:mb, :uid, :id, 0, '', :modseq, now(), $SIZE);
COMMIT;
EOF

# BATCH deliveries to BATCH mailboxes in one transaction, set-based as
# deliver_batch does it (UNNEST arrays, mailboxes locked in id order).
cat >"$dir/batch.sql" <<EOF
\set first random($lo, $hi - $BATCH)
BEGIN;
SELECT id FROM mailboxes WHERE id BETWEEN :first AND :first + $BATCH - 1 ORDER BY id FOR UPDATE;
WITH m AS (
  UPDATE mailboxes SET uid_next = uid_next + 1, highest_modseq = highest_modseq + 1,
    messages = messages + 1, unseen = unseen + 1, bytes = bytes + $SIZE
  WHERE id BETWEEN :first AND :first + $BATCH - 1
  RETURNING id, uid_next - 1 AS uid, highest_modseq AS modseq
), b AS (
  INSERT INTO messages (body, compressed, size, meta, subject, from_addr, to_addr, message_id, header_size)
  SELECT convert_to(repeat(md5(random()::text || g::text), $SIZE / 32), 'UTF8'), false, $SIZE, '{}',
         'bench', 'a@example.test', 'b@example.test', '<x@example.test>', 300
  FROM generate_series(1, $BATCH) AS g
  RETURNING id
), bn AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM b),
   mn AS (SELECT id, uid, modseq, row_number() OVER (ORDER BY id) AS n FROM m)
INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, size)
  SELECT mn.id, mn.uid, bn.id, 0, '', mn.modseq, now(), $SIZE FROM mn JOIN bn USING (n);
COMMIT;
EOF

run() { # label script messages-per-transaction
  local out tps
  out=$(pgbench -n -c "$CLIENTS" -j "$(nproc)" -T "$SECS" -f "$2" "$URL" 2>&1)
  tps=$(awk '/^tps = / {print $3; exit}' <<<"$out")
  [ -n "$tps" ] || { echo "$out" >&2; return 1; }
  awk -v l="$1" -v t="$tps" -v k="$3" -v c="$CLIENTS" -v s="$SECS" -v lat="$(awk '/latency average/ {print $4}' <<<"$out")" \
    'BEGIN { printf "postgresql  %-22s %.0f transactions/s x %d = %.0f msg/s (%d clients, %d s, mean latency %s ms)\n", l, t, k, t*k, c, s, lat }'
}
run one-per-commit "$dir/one.sql" 1
run "$BATCH-per-commit" "$dir/batch.sql" "$BATCH"
