//! Backend-independent rules shared by the PostgreSQL and SQLite stores: name and
//! address normalisation, flag arithmetic, body compression, batch aggregation and
//! the mapping of database errors onto [`StoreError`]. Keeping them here is what
//! makes the two backends answer identically in the conformance suite.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{FlagOp, FlagSet, Flags, MailboxIndex, NewDelivery, StoreError, StoreResult, UidSet};

/// The acquire-time callback of a store, settable once after construction.
#[derive(Default)]
pub(crate) struct AcquireTimer(std::sync::OnceLock<super::AcquireObserver>);

impl AcquireTimer {
    pub fn set(&self, observer: super::AcquireObserver) {
        let _ = self.0.set(observer);
    }

    /// Awaits `acquire`, reporting how long it took.
    pub async fn time<T>(&self, acquire: impl std::future::Future<Output = T>) -> T {
        let Some(observer) = self.0.get() else { return acquire.await };
        let started = std::time::Instant::now();
        let out = acquire.await;
        observer(started.elapsed());
        out
    }
}

/// Bodies smaller than this are stored as they are: zstd cannot win 10% on a few
/// hundred bytes often enough to pay for the attempt.
const COMPRESS_MIN: usize = 512;
/// zstd level 3 (the library default): ~300 MB/s per core, most of the gain of
/// higher levels on text-heavy mail.
const COMPRESS_LEVEL: i32 = 3;
/// Largest body the store accepts (and therefore the largest it will inflate);
/// the protocol layers enforce much smaller message size limits.
pub(crate) const MAX_BODY: usize = 256 * 1024 * 1024;
const MAX_MAILBOX_NAME: usize = 1024;
const MAX_KEYWORD: usize = 128;

/// The stored form of a body: compressed when that saves more than 10%.
pub(crate) struct StoredBody {
    pub bytes: Option<Vec<u8>>,
    pub compressed: bool,
}

impl StoredBody {
    pub fn as_slice<'a>(&'a self, raw: &'a [u8]) -> &'a [u8] {
        self.bytes.as_deref().unwrap_or(raw)
    }
}

// One zstd context per thread, reused: creating one per message (what the
// `zstd::bulk` functions do) was the largest single cost of FETCH BODY[] in the
// server (3 % of all CPU, profile of bench/imap.sh).
thread_local! {
    static ZSTD_COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        std::cell::RefCell::new(zstd::bulk::Compressor::new(COMPRESS_LEVEL).ok());
    static ZSTD_DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        std::cell::RefCell::new(zstd::bulk::Decompressor::new().ok());
}

pub(crate) fn compress_body(raw: &[u8]) -> StoredBody {
    if raw.len() >= COMPRESS_MIN
        && let Ok(z) = ZSTD_COMPRESSOR.with_borrow_mut(|c| match c {
            Some(c) => c.compress(raw),
            None => zstd::bulk::compress(raw, COMPRESS_LEVEL),
        })
        && z.len() * 10 < raw.len() * 9
    {
        return StoredBody { bytes: Some(z), compressed: true };
    }
    StoredBody { bytes: None, compressed: false }
}

pub(crate) fn decompress_body(stored: Vec<u8>, compressed: bool, size: i64) -> StoreResult<Bytes> {
    if !compressed {
        return Ok(Bytes::from(stored));
    }
    let capacity = usize::try_from(size).unwrap_or(0).min(MAX_BODY);
    ZSTD_DECOMPRESSOR
        .with_borrow_mut(|d| match d {
            Some(d) => d.decompress(&stored, capacity),
            None => zstd::bulk::decompress(&stored, capacity),
        })
        .map(Bytes::from)
        .map_err(|e| StoreError::Internal(format!("corrupt compressed body: {e}")))
}

/// Compresses every body of a batch. Large batches run on the blocking pool so a
/// burst of big attachments does not stall the async workers.
pub(crate) async fn compress_batch(batch: &[NewDelivery]) -> StoreResult<Vec<StoredBody>> {
    for d in batch {
        if d.raw.len() > MAX_BODY {
            return Err(StoreError::Invalid(format!("message of {} bytes is too large", d.raw.len())));
        }
    }
    let total: usize = batch.iter().map(|d| d.raw.len()).sum();
    if total < 64 * 1024 {
        return Ok(batch.iter().map(|d| compress_body(&d.raw)).collect());
    }
    let raws: Vec<Bytes> = batch.iter().map(|d| d.raw.clone()).collect();
    tokio::task::spawn_blocking(move || raws.iter().map(|r| compress_body(r)).collect())
        .await
        .map_err(|e| StoreError::Internal(format!("compression task failed: {e}")))
}

/// How a batch lands in one mailbox: the deliveries (indexes into the batch) in
/// batch order, how many of them arrive unseen, and their octets (the mailbox's
/// `bytes` counter, which quotas and STATUS SIZE read).
pub(crate) struct MailboxShare {
    pub deliveries: Vec<usize>,
    pub unseen: i64,
    pub bytes: i64,
}

/// Whether `n` new UIDs from `first` on leave UIDNEXT a 32-bit number: SELECT and
/// STATUS report UIDNEXT as one (RFC 9051 `nz-number`), so the last UID a
/// mailbox hands out is 4294967294.
pub(crate) fn uids_fit(first: i64, n: i64) -> bool {
    first + n <= i64::from(u32::MAX)
}

/// Groups a batch by target mailbox, ascending by id (the lock order), with each
/// delivery's targets de-duplicated.
pub(crate) fn group_by_mailbox(batch: &[NewDelivery]) -> BTreeMap<i64, MailboxShare> {
    let mut out: BTreeMap<i64, MailboxShare> = BTreeMap::new();
    for (i, d) in batch.iter().enumerate() {
        for (pos, &mb) in d.targets.iter().enumerate() {
            if d.targets[..pos].contains(&mb) {
                continue;
            }
            let share =
                out.entry(mb).or_insert_with(|| MailboxShare { deliveries: Vec::new(), unseen: 0, bytes: 0 });
            share.deliveries.push(i);
            share.bytes += d.raw.len() as i64;
            if !d.flags.system.contains(Flags::SEEN) {
                share.unseen += 1;
            }
        }
    }
    out
}

/// Per delivery, in the order of its (de-duplicated) targets; `changes` holds
/// each mailbox's modseq after the batch and the messages the batch added to it.
pub(crate) fn delivered(
    batch: &[NewDelivery],
    assigned: &std::collections::HashMap<(usize, i64), u32>,
    changes: &BTreeMap<i64, (u64, u32)>,
) -> Vec<Vec<super::DeliveredTo>> {
    batch
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut seen = Vec::with_capacity(d.targets.len());
            let mut out = Vec::with_capacity(d.targets.len());
            for &mb in &d.targets {
                if seen.contains(&mb) {
                    continue;
                }
                seen.push(mb);
                if let (Some(&uid), Some(&(modseq, added))) = (assigned.get(&(i, mb)), changes.get(&mb)) {
                    out.push(super::DeliveredTo { mailbox_id: mb, uid, modseq, added });
                }
            }
            out
        })
        .collect()
}

/// `Example.COM` → `example.com`; rejects what cannot be a domain name.
pub(crate) fn normalize_domain(domain: &str) -> StoreResult<String> {
    let d = domain.trim().trim_end_matches('.').to_ascii_lowercase();
    if d.is_empty() || d.len() > 253 || d.chars().any(|c| c.is_whitespace() || c == '@' || c.is_control()) {
        return Err(StoreError::Invalid(format!("bad domain name {domain:?}")));
    }
    Ok(d)
}

/// Lower-cases an address and splits off its domain.
pub(crate) fn normalize_email(email: &str) -> StoreResult<(String, String)> {
    let e = email.trim().to_lowercase();
    let Some((local, domain)) = e.rsplit_once('@') else {
        return Err(StoreError::Invalid(format!("bad address {email:?}")));
    };
    if local.is_empty() || e.len() > 320 || local.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(StoreError::Invalid(format!("bad address {email:?}")));
    }
    let domain = normalize_domain(domain)?;
    Ok((format!("{local}@{domain}"), domain))
}

pub(crate) fn is_inbox(name: &str) -> bool {
    name.eq_ignore_ascii_case("INBOX")
}

/// Validates a mailbox name and spells its INBOX segment canonically
/// (`inbox/Sub` → `INBOX/Sub`), so that lookups and uniqueness agree with the
/// case-insensitivity RFC 3501 gives INBOX.
pub(crate) fn normalize_mailbox_name(name: &str) -> StoreResult<String> {
    if name.is_empty()
        || name.len() > MAX_MAILBOX_NAME
        || name.starts_with('/')
        || name.ends_with('/')
        || name.contains("//")
        || name.chars().any(|c| c.is_control())
    {
        return Err(StoreError::Invalid(format!("bad mailbox name {name:?}")));
    }
    let (first, rest) = match name.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (name, None),
    };
    if is_inbox(first) {
        return Ok(match rest {
            Some(r) => format!("INBOX/{r}"),
            None => "INBOX".to_string(),
        });
    }
    Ok(name.to_string())
}

/// The superior names of a hierarchical name: `a/b/c` → `a`, `a/b`. RFC 3501 says
/// CREATE and RENAME SHOULD create them when missing.
pub(crate) fn parent_names(name: &str) -> Vec<String> {
    name.match_indices('/').map(|(i, _)| name[..i].to_string()).collect()
}

pub(crate) fn encode_keywords(keywords: &[String]) -> String {
    keywords.join(" ")
}

pub(crate) fn decode_keywords(s: &str) -> Vec<String> {
    s.split(' ').filter(|k| !k.is_empty()).map(str::to_string).collect()
}

pub(crate) fn flagset_from_row(flags: i64, keywords: &str) -> FlagSet {
    FlagSet { system: Flags(u32::try_from(flags).unwrap_or(0)), keywords: decode_keywords(keywords) }
}

/// Keywords sorted and unique; rejects ones that could not round-trip through the
/// space-separated column or an IMAP atom.
pub(crate) fn normalize_flagset(flags: &FlagSet) -> StoreResult<FlagSet> {
    let mut keywords = Vec::with_capacity(flags.keywords.len());
    for k in &flags.keywords {
        if k.is_empty()
            || k.len() > MAX_KEYWORD
            || k.starts_with('\\')
            || k.chars().any(|c| c.is_whitespace() || c.is_control() || "(){%*\"]".contains(c))
        {
            return Err(StoreError::Invalid(format!("bad keyword {k:?}")));
        }
        keywords.push(k.clone());
    }
    keywords.sort();
    keywords.dedup();
    Ok(FlagSet { system: Flags(flags.system.0 & 31), keywords })
}

/// The flag set after applying `op` (both inputs normalised).
pub(crate) fn apply_flags(old: &FlagSet, op: FlagOp, flags: &FlagSet) -> FlagSet {
    match op {
        FlagOp::Replace => flags.clone(),
        FlagOp::Add => {
            let mut keywords = old.keywords.clone();
            keywords.extend(flags.keywords.iter().cloned());
            keywords.sort();
            keywords.dedup();
            FlagSet { system: old.system.union(flags.system), keywords }
        }
        FlagOp::Remove => FlagSet {
            system: old.system.difference(flags.system),
            keywords: old.keywords.iter().filter(|k| !flags.keywords.contains(k)).cloned().collect(),
        },
    }
}

/// Sorted, merged, inclusive ranges (reversed ranges such as `5:1` accepted).
pub(crate) fn uid_ranges(uids: &UidSet) -> Vec<(i64, i64)> {
    let mut r: Vec<(i64, i64)> =
        uids.0.iter().map(|&(a, b)| (i64::from(a.min(b)), i64::from(a.max(b)))).collect();
    r.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(r.len());
    for (lo, hi) in r {
        match out.last_mut() {
            Some((_, phi)) if lo <= *phi + 1 => *phi = (*phi).max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// SQL conditions on `flags` for [`Messages::uids_by_flags`](super::Messages::uids_by_flags),
/// one term per bit and with literal constants: a partial index
/// (`WHERE flags & 1 = 0`) is only used when the query repeats its predicate
/// verbatim, which a bound parameter or a combined mask would not.
pub(crate) fn flag_conditions(with: Flags, without: Flags) -> String {
    let mut sql = String::new();
    for bit in 0..5 {
        let b = 1u32 << bit;
        if without.0 & b != 0 {
            sql.push_str(&format!(" AND flags & {b} = 0"));
        } else if with.0 & b != 0 {
            sql.push_str(&format!(" AND flags & {b} <> 0"));
        }
    }
    sql
}

/// Whether the error is a unique-constraint violation.
pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

/// Maps a database error: connectivity and contention become `Unavailable` (the
/// session answers with a temporary failure and the client retries), everything
/// else `Internal`.
/// The moment (milliseconds after [`read_only_clock`]'s start) a PostgreSQL
/// connection last answered that the server only reads — SQLSTATE 25006: the
/// primary was demoted by a failover, or made read-only. 0: never. Connections
/// opened before then still point at that server: the pool discards them at their
/// next acquire (`postgres::PgStore::connect`, before_acquire), so it reconnects —
/// through the Service, to the new primary — without a restart. Process-wide
/// because the error is seen where any query fails, far from the pool.
static READ_ONLY_AT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn read_only_clock() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// How long ago a server last said it only reads, if one ever did.
pub(crate) fn read_only_seen_ago() -> Option<std::time::Duration> {
    let at = READ_ONLY_AT_MS.load(std::sync::atomic::Ordering::Acquire);
    (at != 0).then(|| {
        let now = read_only_clock().elapsed();
        now.saturating_sub(std::time::Duration::from_millis(at))
    })
}

fn note_read_only() {
    let now = u64::try_from(read_only_clock().elapsed().as_millis()).unwrap_or(u64::MAX).max(1);
    READ_ONLY_AT_MS.fetch_max(now, std::sync::atomic::Ordering::AcqRel);
}

pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::PoolTimedOut => {
            StoreError::Unavailable("timed out waiting for a database connection".into())
        }
        sqlx::Error::PoolClosed => StoreError::Unavailable("database pool closed".into()),
        sqlx::Error::Io(e) => StoreError::Unavailable(format!("database connection: {e}")),
        sqlx::Error::Tls(e) => StoreError::Unavailable(format!("database tls: {e}")),
        sqlx::Error::Database(d) => {
            let code = d.code().map(|c| c.into_owned()).unwrap_or_default();
            // PG: serialization failure, deadlock, admin / crash shutdown, a server
            // starting or in recovery, too many connections, a server that only
            // reads (a demoted primary); SQLite: SQLITE_BUSY / SQLITE_LOCKED and
            // extended codes.
            if code == "25006" {
                note_read_only();
            }
            let transient = matches!(
                code.as_str(),
                "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "53300" | "25006" | "5" | "6"
            ) || code.starts_with("08")
                || code.parse::<i32>().is_ok_and(|c| c & 0xff == 5 || c & 0xff == 6);
            if d.is_unique_violation() {
                StoreError::AlreadyExists(d.message().to_string())
            } else if transient {
                StoreError::Unavailable(format!("database busy: {}", d.message()))
            } else {
                StoreError::Internal(format!("database: {}", d.message()))
            }
        }
        other => StoreError::Internal(other.to_string()),
    }
}

/// The stored header length, or — for a row written by a version that did not
/// store it (a rolling upgrade) — the end of the header block found in the body.
pub(crate) fn header_size_of(stored: Option<i64>, body: &[u8]) -> u32 {
    match stored.and_then(|v| u32::try_from(v).ok()) {
        Some(v) => v.min(body.len() as u32),
        None => mailcluster_model::message::find_header_end(body).unwrap_or(body.len()) as u32,
    }
}

pub(crate) fn meta_to_json(meta: &super::MessageMeta) -> StoreResult<String> {
    serde_json::to_string(meta).map_err(|e| StoreError::Internal(format!("encode meta: {e}")))
}

pub(crate) fn meta_from_json(s: &str) -> StoreResult<super::MessageMeta> {
    serde_json::from_str(s).map_err(|e| StoreError::Internal(format!("decode meta: {e}")))
}

/// Builds a [`MailboxIndex`] from parallel `uids`/`flags` columns and the
/// (uid, keywords) pairs of the messages that have keywords.
/// A conditional STORE's test (RFC 7162 §3.1.3): the `(uid, modseq)` rows split
/// into those at most `unchanged_since` (to change) and the others (`MODIFIED`),
/// each ascending and without repeats.
pub(crate) fn split_unchanged_since(
    rows: Vec<(i64, i64)>,
    unchanged_since: u64,
) -> StoreResult<(Vec<u32>, Vec<u32>)> {
    let (mut passed, mut modified) = (Vec::new(), Vec::new());
    for (uid, modseq) in rows {
        let uid = u32_of(uid, "uid")?;
        if u64_of(modseq) > unchanged_since { modified.push(uid) } else { passed.push(uid) }
    }
    for v in [&mut passed, &mut modified] {
        v.sort_unstable();
        v.dedup();
    }
    Ok((passed, modified))
}

pub(crate) fn mailbox_index_from(
    highest_modseq: i64,
    uid_next: i64,
    uids: Vec<i64>,
    flags: Vec<i32>,
    modseqs: Vec<i64>,
    keywords: Vec<(i64, String)>,
) -> StoreResult<MailboxIndex> {
    if uids.len() != flags.len() || uids.len() != modseqs.len() {
        return Err(StoreError::Internal("mailbox index: its columns differ in length".into()));
    }
    let mut pairs: Vec<(u32, Flags, u64)> = Vec::with_capacity(uids.len());
    for ((uid, f), m) in uids.into_iter().zip(flags).zip(modseqs) {
        pairs.push((u32_of(uid, "uid")?, Flags(u32::try_from(f).unwrap_or(0)), u64_of(m)));
    }
    if !pairs.is_sorted_by_key(|p| p.0) {
        pairs.sort_unstable_by_key(|p| p.0);
    }
    let mut keywords: Vec<(u32, Vec<String>)> = keywords
        .into_iter()
        .map(|(uid, k)| Ok((u32_of(uid, "uid")?, decode_keywords(&k))))
        .filter(|r: &StoreResult<(u32, Vec<String>)>| r.as_ref().map_or(true, |(_, k)| !k.is_empty()))
        .collect::<StoreResult<_>>()?;
    keywords.sort_unstable_by_key(|k| k.0);
    Ok(MailboxIndex {
        highest_modseq: u64_of(highest_modseq),
        uid_next: u32_of(uid_next, "uid_next")?,
        uids: pairs.iter().map(|p| p.0).collect(),
        flags: pairs.iter().map(|p| p.1).collect(),
        modseqs: pairs.iter().map(|p| p.2).collect(),
        keywords,
    })
}

pub(crate) fn u32_of(v: i64, what: &str) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| StoreError::Internal(format!("{what} {v} out of range")))
}

/// A quota limit as stored (octets; NULL for none). Limits above `i64::MAX`
/// octets are stored as that: no mailbox gets near it.
pub(crate) fn limit_column(limit: Option<u64>) -> Option<i64> {
    limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX))
}

pub(crate) fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Seconds since the epoch as a UIDVALIDITY candidate.
pub(crate) fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A value as the JSON text the queue columns hold.
pub(crate) fn json_of<T: serde::Serialize + ?Sized>(value: &T) -> StoreResult<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Internal(e.to_string()))
}

/// A migration keeps the release before it working on the schema it leaves
/// (`server/migrations/README.md`), so a release runs on the schema of the next
/// one. Its migrator therefore accepts a database with migrations it does not
/// know: rolling a MailCluster back to the previous image (whose migration Job
/// runs first) or starting the previous binary on an upgraded embedded store
/// must not be refused for it.
pub(crate) fn rollback_tolerant(mut migrator: sqlx::migrate::Migrator) -> sqlx::migrate::Migrator {
    migrator.set_ignore_missing(true);
    migrator
}

/// A queue column's JSON text back as a value.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Internal(format!("bad {what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailbox_index_columns_are_sorted_together() {
        let index = mailbox_index_from(
            9,
            12,
            vec![5, 2, 9],
            vec![1, 0, 8],
            vec![7, 3, 9],
            vec![(9, "$b $a".into()), (2, "$x".into())],
        )
        .expect("index");
        assert_eq!(index.uids, vec![2, 5, 9]);
        assert_eq!(index.flags, vec![Flags::NONE, Flags::SEEN, Flags::DELETED]);
        assert_eq!(index.modseqs, vec![3, 7, 9]);
        assert_eq!(index.keywords, vec![(2, vec!["$x".to_string()]), (9, vec!["$b".into(), "$a".into()])]);
        assert_eq!((index.highest_modseq, index.uid_next), (9, 12));
        assert!(mailbox_index_from(1, 1, vec![1, 2], vec![0], vec![1, 1], vec![]).is_err());
        assert!(mailbox_index_from(1, 1, vec![1, 2], vec![0, 0], vec![1], vec![]).is_err());
    }

    #[test]
    fn mailbox_names() {
        assert_eq!(normalize_mailbox_name("inbox").unwrap(), "INBOX");
        assert_eq!(normalize_mailbox_name("Inbox/Sub").unwrap(), "INBOX/Sub");
        assert_eq!(normalize_mailbox_name("Inboxes").unwrap(), "Inboxes");
        for bad in ["", "/a", "a/", "a//b", "a\nb"] {
            assert!(normalize_mailbox_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parent_names("a/b/c"), vec!["a".to_string(), "a/b".to_string()]);
        assert!(parent_names("a").is_empty());
    }

    #[test]
    fn ranges_merge_and_flip() {
        let set = UidSet(vec![(9, 7), (1, 2), (3, 3), (10, 12), (20, 20)]);
        assert_eq!(uid_ranges(&set), vec![(1, 3), (7, 12), (20, 20)]);
    }

    #[test]
    fn flag_ops() {
        let old = FlagSet { system: Flags::SEEN, keywords: vec!["a".into(), "c".into()] };
        let arg = FlagSet { system: Flags::FLAGGED, keywords: vec!["b".into(), "c".into()] };
        let added = apply_flags(&old, FlagOp::Add, &arg);
        assert_eq!(added.system, Flags(Flags::SEEN.0 | Flags::FLAGGED.0));
        assert_eq!(added.keywords, vec!["a", "b", "c"]);
        let removed = apply_flags(&old, FlagOp::Remove, &arg);
        assert_eq!(removed.system, Flags::SEEN);
        assert_eq!(removed.keywords, vec!["a"]);
        assert!(normalize_flagset(&FlagSet { system: Flags::NONE, keywords: vec!["a b".into()] }).is_err());
    }

    #[test]
    fn compression_only_when_it_pays() {
        let text = b"Subject: hi\r\n\r\n".repeat(200);
        let stored = compress_body(&text);
        assert!(stored.compressed);
        let back = decompress_body(stored.bytes.unwrap(), true, text.len() as i64).unwrap();
        assert_eq!(&back[..], &text[..]);
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert!(!compress_body(&noise).compressed, "incompressible bodies stay as they are");
        assert!(!compress_body(b"short").compressed);
    }

    #[test]
    fn flag_sql_terms() {
        assert_eq!(flag_conditions(Flags::NONE, Flags::SEEN), " AND flags & 1 = 0");
        assert_eq!(flag_conditions(Flags::DELETED, Flags::NONE), " AND flags & 8 <> 0");
    }
}
