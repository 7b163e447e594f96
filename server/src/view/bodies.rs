//! Message bodies for FETCH, shared by the sessions of a process.
//!
//! `UID FETCH n BODY.PEEK[]` is what clients run most. Served one by one, each
//! is a PostgreSQL round trip that also reads and decompresses the body (44 % of
//! the machine went to PostgreSQL in the profile of bench/imap.sh). Here:
//! - the links (which message a UID is, its flags, and the mailbox's modseq for
//!   the session's sync) of many sessions' commands come from one query
//!   ([`batch`](super::batch));
//! - bodies come from a per-process cache: a body never changes once stored
//!   (messages are stored once and linked into mailboxes), so a cached body can
//!   never be stale, whichever pod changed the mailbox;
//! - bodies not in the cache are read for many sessions in one query too, which
//!   also reads a body that many sessions want at once only once.
//!
//! The cache is bounded in bytes (`imap.body_cache_bytes`); the least recently
//! used bodies go first, and a body larger than a sixteenth of the budget is not
//! kept, so one huge attachment cannot flush everything else.
//!
//! Entries are keyed by message id and checked against the INTERNALDATE of the
//! link that asks: every link of a message carries its delivery's INTERNALDATE
//! (COPY and MOVE keep it). Ids are never reused by the store, but a database
//! restored to an earlier point, or an asynchronous replica promoted after losing
//! its primary's last commits, hands out ids again; a cached body must then never
//! be served for the new message that got its id (another user's mail).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use hashlink::LinkedHashMap;

use super::batch::{BatchQuery, Batcher};
use crate::store::{Store, StoreResult};
use mailcluster_model::{MessageLink, StoredBody};

/// Most FETCH commands whose links one query reads (each asks for at most a
/// FETCH batch of UIDs).
const MAX_LINK_BATCH: usize = 256;
/// Most FETCH commands whose missing bodies one query reads: bodies are large.
const MAX_BODY_BATCH: usize = 32;

/// The links of one FETCH batch.
#[derive(Debug, Default)]
pub struct Links {
    /// The mailbox's highest modseq in the snapshot the links were read in;
    /// `None` when the mailbox is gone.
    pub highest_modseq: Option<u64>,
    /// The asked UIDs that exist, ascending.
    pub links: Vec<MessageLink>,
}

pub struct BodyReader {
    links: Batcher<LinkQuery>,
    bodies: Batcher<BodyQuery>,
    cache: Arc<BodyCache>,
    hits: prometheus::IntCounter,
    misses: prometheus::IntCounter,
}

/// The counters of a [`BodyReader`] (see `mail_imap_body_cache_total` and
/// `mail_imap_fetch_reads_total`).
pub struct BodyMetrics {
    pub hits: prometheus::IntCounter,
    pub misses: prometheus::IntCounter,
    pub cached_bytes: prometheus::IntGauge,
    pub link_questions: prometheus::IntCounter,
    pub link_queries: prometheus::IntCounter,
    pub body_questions: prometheus::IntCounter,
    pub body_queries: prometheus::IntCounter,
}

impl BodyReader {
    pub fn new(store: Arc<dyn Store>, cache_bytes: usize, m: BodyMetrics) -> Self {
        let cache = Arc::new(BodyCache::new(cache_bytes, m.cached_bytes));
        BodyReader {
            links: Batcher::new(LinkQuery(store.clone()), MAX_LINK_BATCH, m.link_questions, m.link_queries),
            bodies: Batcher::new(
                BodyQuery { store, cache: cache.clone() },
                MAX_BODY_BATCH,
                m.body_questions,
                m.body_queries,
            ),
            cache,
            hits: m.hits,
            misses: m.misses,
        }
    }

    /// Forgets every cached body (see [`BodyCache::clear`]).
    pub fn clear_cache(&self) {
        self.cache.clear();
    }

    /// Where the given UIDs of a mailbox are, as of now (a query that started
    /// after this call).
    pub async fn links(&self, mailbox_id: i64, uids: &[u32]) -> StoreResult<Links> {
        self.links.ask((mailbox_id, uids.to_vec())).await
    }

    /// The bodies of the given messages — `(message id, INTERNALDATE of the link)`
    /// pairs — in their order (`None`: no such message).
    pub async fn bodies(&self, messages: &[(i64, DateTime<Utc>)]) -> StoreResult<Vec<Option<StoredBody>>> {
        let mut out: Vec<Option<StoredBody>> =
            messages.iter().map(|&(id, date)| self.cache.get(id, date)).collect();
        let missing: Vec<(i64, DateTime<Utc>)> =
            messages.iter().zip(&out).filter(|(_, b)| b.is_none()).map(|(&m, _)| m).collect();
        self.hits.inc_by((messages.len() - missing.len()) as u64);
        if missing.is_empty() {
            return Ok(out);
        }
        self.misses.inc_by(missing.len() as u64);
        let read: HashMap<i64, StoredBody> =
            self.bodies.ask(missing).await?.into_iter().map(|b| (b.message_id, b)).collect();
        for (slot, (id, _)) in out.iter_mut().zip(messages) {
            if slot.is_none() {
                *slot = read.get(id).cloned();
            }
        }
        Ok(out)
    }
}

struct LinkQuery(Arc<dyn Store>);

impl BatchQuery for LinkQuery {
    type Question = (i64, Vec<u32>);
    type Answer = Links;

    async fn answer(&self, questions: &[(i64, Vec<u32>)]) -> StoreResult<Vec<Links>> {
        let mut keys: Vec<(i64, u32)> =
            questions.iter().flat_map(|(m, uids)| uids.iter().map(move |&u| (*m, u))).collect();
        keys.sort_unstable();
        keys.dedup();
        let found = self.0.message_links(&keys).await?;
        let modseqs: HashMap<i64, u64> = found.mailboxes.into_iter().collect();
        let by_key: HashMap<(i64, u32), MessageLink> =
            found.links.into_iter().map(|l| ((l.mailbox_id, l.uid), l)).collect();
        Ok(questions
            .iter()
            .map(|(mailbox_id, uids)| {
                let mut sorted = uids.clone();
                sorted.sort_unstable();
                sorted.dedup();
                Links {
                    highest_modseq: modseqs.get(mailbox_id).copied(),
                    // Cloned, not taken: two sessions may ask for the same message.
                    links: sorted.iter().filter_map(|&u| by_key.get(&(*mailbox_id, u)).cloned()).collect(),
                }
            })
            .collect())
    }
}

struct BodyQuery {
    store: Arc<dyn Store>,
    cache: Arc<BodyCache>,
}

impl BatchQuery for BodyQuery {
    type Question = Vec<(i64, DateTime<Utc>)>;
    type Answer = Vec<StoredBody>;

    async fn answer(&self, questions: &[Self::Question]) -> StoreResult<Vec<Vec<StoredBody>>> {
        // Looked up again here: when many sessions miss the same body at once, the
        // batch read before this one (batches run one after another) has just
        // cached it, and it is read once, not once per batch.
        let mut found: HashMap<i64, StoredBody> = HashMap::new();
        let mut ids: Vec<(i64, DateTime<Utc>)> = Vec::new();
        for &(id, date) in questions.iter().flatten() {
            if found.contains_key(&id) || ids.iter().any(|&(i, _)| i == id) {
                continue;
            }
            match self.cache.get(id, date) {
                Some(b) => {
                    found.insert(id, b);
                }
                None => ids.push((id, date)),
            }
        }
        if !ids.is_empty() {
            let wanted: Vec<i64> = ids.iter().map(|&(id, _)| id).collect();
            for b in self.store.message_bodies(&wanted).await? {
                if let Some(&(_, date)) = ids.iter().find(|&&(id, _)| id == b.message_id) {
                    self.cache.put(date, b.clone());
                }
                found.insert(b.message_id, b);
            }
        }
        // Clones share the bytes (`Bytes` is reference counted).
        Ok(questions
            .iter()
            .map(|q| q.iter().filter_map(|(id, _)| found.get(id).cloned()).collect())
            .collect())
    }
}

/// Bodies by message id, least recently used first out, bounded in bytes.
pub struct BodyCache {
    max_bytes: usize,
    gauge: prometheus::IntGauge,
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    /// By message id: the INTERNALDATE of the link that loaded it, and the body.
    entries: LinkedHashMap<i64, (DateTime<Utc>, StoredBody)>,
    bytes: usize,
}

impl BodyCache {
    /// `max_bytes` 0 disables the cache.
    pub fn new(max_bytes: usize, gauge: prometheus::IntGauge) -> Self {
        BodyCache { max_bytes, gauge, inner: Mutex::new(CacheInner::default()) }
    }

    /// The body of `message_id`, if cached by a link with the same INTERNALDATE.
    pub fn get(&self, message_id: i64, internal_date: DateTime<Utc>) -> Option<StoredBody> {
        if self.max_bytes == 0 {
            return None;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.entries.to_back(&message_id) {
            Some((date, body)) if *date == internal_date => Some(body.clone()),
            Some(_) => {
                // Another message under a reused id: the old body goes.
                if let Some((_, gone)) = inner.entries.remove(&message_id) {
                    inner.bytes -= gone.body.len();
                    self.gauge.set(inner.bytes as i64);
                }
                None
            }
            None => None,
        }
    }

    /// Forgets every body: after the database went back in time, message ids are
    /// handed out again, and the INTERNALDATE check only catches most reuses.
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.clear();
        inner.bytes = 0;
        self.gauge.set(0);
    }

    pub fn put(&self, internal_date: DateTime<Utc>, body: StoredBody) {
        let size = body.body.len();
        if size > self.max_bytes / 16 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, old)) = inner.entries.insert(body.message_id, (internal_date, body)) {
            inner.bytes -= old.body.len();
        }
        inner.bytes += size;
        while inner.bytes > self.max_bytes {
            let Some((_, (_, gone))) = inner.entries.pop_front() else { break };
            inner.bytes -= gone.body.len();
        }
        self.gauge.set(inner.bytes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(id: i64, len: usize) -> StoredBody {
        StoredBody { message_id: id, header_size: 0, body: bytes::Bytes::from(vec![b'x'; len]) }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    #[test]
    fn bounded_in_bytes_least_recently_used_out() {
        let gauge = prometheus::IntGauge::new("t", "t").unwrap();
        let cache = BodyCache::new(1600, gauge.clone());
        let t = at(1);
        cache.put(t, body(1, 100));
        cache.put(t, body(2, 100));
        cache.put(t, body(3, 90));
        assert_eq!(gauge.get(), 290);
        cache.put(t, body(4, 101));
        assert!(cache.get(4, t).is_none(), "over a sixteenth of the budget is not kept");
        assert!(cache.get(1, t).is_some(), "1 is now the most recently used");
        for id in 10..25 {
            cache.put(t, body(id, 100));
        }
        // 1,790 bytes offered: 2 went first, then 3; 1 (used later) stayed.
        assert_eq!(gauge.get(), 1600);
        assert!(cache.get(2, t).is_none() && cache.get(3, t).is_none());
        assert!(cache.get(1, t).is_some() && cache.get(24, t).is_some());
        cache.put(t, body(24, 100));
        assert_eq!(gauge.get(), 1600, "a second put of the same body is not counted twice");
        let off = BodyCache::new(0, prometheus::IntGauge::new("u", "u").unwrap());
        off.put(t, body(1, 0));
        assert!(off.get(1, t).is_none());
    }

    #[test]
    fn a_reused_id_never_serves_the_old_body() {
        let gauge = prometheus::IntGauge::new("t", "t").unwrap();
        let cache = BodyCache::new(1600, gauge.clone());
        cache.put(at(1), body(7, 50));
        assert!(cache.get(7, at(1)).is_some());
        // Asked for by a link of another delivery (id handed out again).
        assert!(cache.get(7, at(2)).is_none());
        assert_eq!(gauge.get(), 0, "the old body is dropped");
        assert!(cache.get(7, at(1)).is_none());
    }
}
