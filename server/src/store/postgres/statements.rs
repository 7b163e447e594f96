//! The SQL text of the statements that carry a whole write in one round trip
//! (a delivery batch, STORE, EXPUNGE) and the per-range read of a mailbox's links
//! that they and the reads share: long enough to be read on their own, apart from
//! the code that binds their parameters.

use mailcluster_model::UidSet;

use crate::store::common::uid_ranges;

/// A delivery batch as one statement, which PostgreSQL runs as its own
/// transaction: one round trip where BEGIN, the lock, the counters, the bodies,
/// the links and COMMIT took six. Besides the round trips themselves, the
/// mailbox rows stay locked for one statement and its WAL flush only, which is
/// what concurrent batches (of this pod or another) wait on.
///
/// Order of effects: the count in the UPDATE's WHERE names no column of the
/// rows, so PostgreSQL makes it a one-time filter, evaluated before the UPDATE
/// reads a row. It runs `locked`, which locks the target mailboxes in ascending
/// id order (the order every multi-mailbox writer uses, so batches cannot
/// deadlock), and checks that every one exists and has UIDs left for its share.
/// Only then are the counters raised, and the bodies and links are written only
/// when every mailbox's were (`whole`): a batch is stored entirely or not at
/// all, as a transaction would have it. Nothing stored returns no rows;
/// `why_not_delivered` says why.
///
/// Parameters: $1–$4 per mailbox (id ascending, messages, unseen, octets);
/// $5–$16 per body; $17–$23 per link (mailbox, position in the mailbox's share,
/// body id, flags, keywords, internal date, size).
pub(super) const DELIVER: &str = "WITH locked AS ( \
        SELECT id, uid_next FROM mailboxes WHERE id = ANY($1::bigint[]) ORDER BY id FOR NO KEY UPDATE \
    ), mb AS ( \
        UPDATE mailboxes m SET uid_next = m.uid_next + t.n, highest_modseq = m.highest_modseq + 1, \
            messages = m.messages + t.n, unseen = m.unseen + t.u, bytes = m.bytes + t.b \
        FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[]) AS t(id, n, u, b) \
        WHERE m.id = t.id AND (SELECT count(*) FROM locked l JOIN UNNEST($1::bigint[], $2::bigint[]) \
            AS g(id, n) ON g.id = l.id WHERE l.uid_next + g.n <= 4294967295) = cardinality($1::bigint[]) \
        RETURNING m.id, m.uid_next - t.n AS first_uid, m.highest_modseq \
    ), whole AS ( \
        SELECT count(*) = cardinality($1::bigint[]) AS ok FROM mb \
    ), msg AS ( \
        INSERT INTO messages (id, body, compressed, size, meta, subject, from_addr, to_addr, cc_addr, \
            message_id, sent_date, header_size) \
        SELECT b.* FROM UNNEST($5::bigint[], $6::bytea[], $7::bool[], $8::bigint[], $9::text[], $10::text[], \
            $11::text[], $12::text[], $13::text[], $14::text[], $15::timestamptz[], $16::bigint[]) \
            AS b(id, body, compressed, size, meta, subject, from_addr, to_addr, cc_addr, message_id, \
                 sent_date, header_size), whole \
        WHERE whole.ok \
    ), link AS ( \
        INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, size) \
        SELECT l.mb, mb.first_uid + l.k, l.msg, l.flags, l.kw, mb.highest_modseq, l.date, l.size \
        FROM UNNEST($17::bigint[], $18::bigint[], $19::bigint[], $20::int[], $21::text[], \
            $22::timestamptz[], $23::bigint[]) AS l(mb, k, msg, flags, kw, date, size) \
        JOIN mb ON mb.id = l.mb, whole \
        WHERE whole.ok \
    ) \
    SELECT mb.id, mb.first_uid, mb.highest_modseq FROM mb, whole WHERE whole.ok";

/// The STORE statement around the part that names the message rows (`mm`).
macro_rules! store_flags_sql {
    ($rows:expr) => {
        concat!(
            r#"WITH mb AS (
                SELECT id, highest_modseq + 1 AS modseq FROM mailboxes WHERE id = $1 FOR NO KEY UPDATE
            ), cur AS (
                SELECT mm.uid, mm.flags AS old_flags, mm.keywords AS old_keywords,
                    CASE $4 WHEN 0 THEN mm.flags | $5 WHEN 1 THEN mm.flags & ~$5 ELSE $5 END AS new_flags,
                    CASE $4
                        WHEN 0 THEN array_to_string(ARRAY(
                            SELECT DISTINCT k COLLATE "C" FROM unnest(string_to_array(mm.keywords, ' ') || $6::text[]) AS k
                            WHERE k <> '' ORDER BY 1), ' ')
                        WHEN 1 THEN array_to_string(ARRAY(
                            SELECT k COLLATE "C" FROM unnest(string_to_array(mm.keywords, ' ')) AS k
                            WHERE k <> '' AND k <> ALL($6::text[]) ORDER BY 1), ' ')
                        ELSE array_to_string($6::text[], ' ')
                    END AS new_keywords
                "#,
            $rows,
            r#"
                FOR UPDATE OF mm
            ), upd AS (
                UPDATE mailbox_messages mm
                SET flags = c.new_flags, keywords = c.new_keywords, modseq = (SELECT modseq FROM mb)
                FROM cur c
                WHERE mm.mailbox_id = $1 AND mm.uid = c.uid
                    AND (c.new_flags <> c.old_flags OR c.new_keywords <> c.old_keywords)
                RETURNING mm.uid, mm.flags, mm.keywords, c.old_flags
            ), bump AS (
                UPDATE mailboxes m SET highest_modseq = mb.modseq,
                    unseen = m.unseen + (SELECT coalesce(sum((u.old_flags & 1) - (u.flags & 1)), 0) FROM upd u)
                FROM mb WHERE m.id = mb.id AND EXISTS (SELECT 1 FROM upd)
            )
            SELECT mb.modseq, u.uid, u.flags, u.keywords FROM mb LEFT JOIN upd u ON true ORDER BY u.uid"#
        )
    };
}

/// The links of mailbox `$mailbox` (`$1` unless given: an SQL expression) in the
/// UID ranges whose bounds are `$2`/`$3`, as `mm`: one primary-key range scan per
/// range. The plain join of UNNEST and
/// `mailbox_messages` has a generic plan that reads every link of the mailbox
/// (and, joined with `messages`, hashes the whole table) and then filters: 38 ms
/// a multi-range FETCH in the IMAP session mix, 6.6 against 0.65 ms for four
/// ranges of a 1,000-message mailbox. A LATERAL subquery with `OFFSET 0`, which
/// the planner does not flatten into that join, keeps the range scans.
macro_rules! links_in_ranges {
    () => {
        links_in_ranges!("$1")
    };
    ($mailbox:literal) => {
        concat!(
            "UNNEST($2::bigint[], $3::bigint[]) AS r(lo, hi) CROSS JOIN LATERAL \
             (SELECT * FROM mailbox_messages x WHERE x.mailbox_id = ",
            $mailbox,
            " AND x.uid BETWEEN r.lo AND r.hi OFFSET 0) mm"
        )
    };
}
pub(super) use links_in_ranges;

/// `(los, his)` arrays of a UID set, for `UNNEST($2, $3) r(lo, hi)`.
pub(super) fn range_arrays(uids: &UidSet) -> (Vec<i64>, Vec<i64>) {
    uid_ranges(uids).into_iter().unzip()
}

/// STORE as one statement (see `store_flags`); `$2`/`$3` the UID ranges' bounds.
/// The rows are read range by range (`links_in_ranges!`: 3.1 against 0.35 ms for
/// four ranges of a 1,000-message mailbox), after the mailbox lock.
pub(super) const STORE_FLAGS_RANGES: &str =
    store_flags_sql!(concat!("FROM ", links_in_ranges!("(SELECT id FROM mb)")));
/// The same for one UID, `$2[1]` (`$3` unused).
pub(super) const STORE_FLAGS_ONE: &str = store_flags_sql!(
    "FROM mailbox_messages mm WHERE mm.mailbox_id = (SELECT id FROM mb) AND mm.uid = ($2::bigint[])[1] \
     AND $3::bigint[] IS NOT NULL"
);

/// EXPUNGE as one statement around the part that picks the rows (`mm`): the
/// mailbox's write lock, the links deleted, the counters and modseq, the
/// tombstones, and the bodies no other link holds.
///
/// Every part reads the statement's snapshot, where the links this statement
/// deletes are still there: a body goes when its links there are all among them.
/// They are counted per body, which keeps the body index in use, and only up to
/// one more than this statement's links to it, so a body shared by thousands of
/// mailboxes is not read through (an anti-join against the links left was planned
/// as a scan of every link).
///
/// A link to one of these bodies that a transaction committed while this
/// statement waited for the lock is not in the snapshot: the body's deletion then
/// fails on the foreign key (see `expunge_links`), never leaving a link without
/// its body.
macro_rules! expunge_sql {
    ($using:expr, $rows:expr) => {
        concat!(
            "WITH mb AS (SELECT id FROM mailboxes WHERE id = $1::bigint FOR UPDATE), \
             gone AS (DELETE FROM mailbox_messages mm ",
            $using,
            " WHERE mm.mailbox_id = (SELECT id FROM mb) AND ",
            $rows,
            " RETURNING mm.uid, mm.message_id, mm.flags, mm.size), \
             counts AS (UPDATE mailboxes m SET highest_modseq = m.highest_modseq + 1, \
                 messages = m.messages - (SELECT count(*) FROM gone), \
                 unseen = m.unseen - (SELECT count(*) FROM gone WHERE flags & 1 = 0), \
                 bytes = m.bytes - (SELECT CAST(coalesce(sum(size), 0) AS BIGINT) FROM gone) \
                 WHERE m.id = $1 AND EXISTS (SELECT 1 FROM gone) RETURNING m.highest_modseq), \
             tombstones AS (INSERT INTO expunged (mailbox_id, uid, modseq) \
                 SELECT $1, g.uid, c.highest_modseq FROM gone g CROSS JOIN counts c \
                 ON CONFLICT (mailbox_id, uid) DO UPDATE SET modseq = EXCLUDED.modseq), \
             orphans AS (DELETE FROM messages m \
                 USING (SELECT message_id, count(*) AS n FROM gone GROUP BY message_id) g \
                 WHERE m.id = g.message_id \
                 AND (SELECT count(*) FROM (SELECT 1 FROM mailbox_messages o \
                     WHERE o.message_id = g.message_id LIMIT g.n + 1) o) = g.n) \
             SELECT EXISTS (SELECT 1 FROM mb) AS found, ARRAY(SELECT uid FROM gone ORDER BY uid) AS uids, \
                 coalesce((SELECT highest_modseq FROM counts), 0) AS modseq"
        )
    };
}

/// EXPUNGE of the `\Deleted` links; a literal predicate, served by the partial index.
pub(super) const EXPUNGE_DELETED: &str = expunge_sql!("", "mm.flags & 8 <> 0");
/// EXPUNGE of the links of one UID, `$2`.
pub(super) const EXPUNGE_ONE: &str = expunge_sql!("", "mm.uid = $2");
/// EXPUNGE of the links in UID ranges (`$2`/`$3` their bounds), found range by
/// range as in `links_in_ranges!` (2.2 against 0.49 ms for four ranges of a
/// 1,000-message mailbox).
pub(super) const EXPUNGE_RANGES: &str = expunge_sql!(
    concat!("USING (SELECT mm.uid FROM ", links_in_ranges!("(SELECT id FROM mb)"), ") AS sel"),
    "mm.uid = sel.uid"
);
