//! Message metadata (ENVELOPE, BODYSTRUCTURE, sizes, part offsets) by mailbox,
//! UIDVALIDITY and UID, kept by the process for FETCH.
//!
//! A mail client's header list (`UID FETCH a:b (FLAGS ENVELOPE …)`) is the command
//! it sends most after FLAGS, and asks again for the same messages at every
//! resynchronisation. Within a UIDVALIDITY a UID names one message for ever, and a
//! message's metadata never changes once stored, so any pod may keep what it read
//! without asking the database whether it still holds. Flags are not kept here:
//! they come from the session's view, brought up to date before the FETCH.
//!
//! Bounded in bytes (`imap.meta_cache_bytes`), least recently used out; cleared
//! with the other read caches when the database's epoch changes.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use hashlink::LinkedHashMap;

use mailcluster_model::MessageMeta;

/// What FETCH needs of a message besides its flags and body.
#[derive(Debug)]
pub struct CachedMeta {
    pub message_id: i64,
    pub internal_date: DateTime<Utc>,
    pub meta: MessageMeta,
}

impl CachedMeta {
    /// Heap and inline bytes, roughly: what the cache's bound counts.
    fn weight(&self) -> usize {
        let m = &self.meta;
        std::mem::size_of::<Self>()
            + [&m.envelope, &m.body_structure, &m.body, &m.subject, &m.from, &m.to, &m.cc, &m.bcc, &m.message_id]
                .iter()
                .map(|s| s.capacity())
                .sum::<usize>()
            + m.parts.iter().map(|p| std::mem::size_of_val(p) + p.path.capacity() * 4).sum::<usize>()
            // The key and the map's links.
            + 48
    }
}

/// (mailbox id, UIDVALIDITY, UID).
type Key = (i64, u32, u32);

pub struct MetaCache {
    max_bytes: usize,
    gauge: prometheus::IntGauge,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: LinkedHashMap<Key, Arc<CachedMeta>>,
    bytes: usize,
}

impl MetaCache {
    /// `max_bytes` 0 disables the cache.
    pub fn new(max_bytes: usize, gauge: prometheus::IntGauge) -> Self {
        MetaCache { max_bytes, gauge, inner: Mutex::new(Inner::default()) }
    }

    /// The cached metadata of each of `uids`, in the same order.
    pub fn get_many(&self, mailbox_id: i64, uid_validity: u32, uids: &[u32]) -> Vec<Option<Arc<CachedMeta>>> {
        if self.max_bytes == 0 {
            return vec![None; uids.len()];
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        uids.iter().map(|&uid| inner.entries.to_back(&(mailbox_id, uid_validity, uid)).cloned()).collect()
    }

    /// Keeps the metadata of `(uid, meta)` pairs read from one mailbox, under one
    /// lock (a `1:*` header list of a large mailbox brings thousands).
    pub fn put_many(&self, mailbox_id: i64, uid_validity: u32, metas: &[(u32, Arc<CachedMeta>)]) {
        if self.max_bytes == 0 || metas.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (uid, meta) in metas {
            let weight = meta.weight();
            if weight > self.max_bytes / 64 {
                continue;
            }
            if let Some(old) = inner.entries.insert((mailbox_id, uid_validity, *uid), meta.clone()) {
                inner.bytes -= old.weight();
            }
            inner.bytes += weight;
        }
        while inner.bytes > self.max_bytes {
            let Some((_, gone)) = inner.entries.pop_front() else { break };
            inner.bytes -= gone.weight();
        }
        self.gauge.set(inner.bytes as i64);
    }

    /// Forgets everything: after the database went back in time, a UID may name
    /// another message under the same UIDVALIDITY.
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.clear();
        inner.bytes = 0;
        self.gauge.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: i64, envelope_len: usize) -> Arc<CachedMeta> {
        Arc::new(CachedMeta {
            message_id: id,
            internal_date: Utc::now(),
            meta: MessageMeta { envelope: "e".repeat(envelope_len), ..MessageMeta::default() },
        })
    }

    fn ids(found: &[Option<Arc<CachedMeta>>]) -> Vec<Option<i64>> {
        found.iter().map(|m| m.as_ref().map(|m| m.message_id)).collect()
    }

    #[test]
    fn keyed_by_uidvalidity_and_bounded_least_recently_used_out() {
        let gauge = prometheus::IntGauge::new("t", "t").expect("gauge");
        let one = meta(0, 1000).weight();
        let cache = MetaCache::new(64 * one + one / 2, gauge.clone());
        let first: Vec<_> = (1..=64).map(|uid| (uid, meta(uid as i64, 1000))).collect();
        cache.put_many(7, 100, &first);
        assert_eq!(ids(&cache.get_many(7, 100, &[1, 2, 64])), [Some(1), Some(2), Some(64)]);
        assert_eq!(ids(&cache.get_many(7, 101, &[1])), [None], "another UIDVALIDITY, another message");
        assert_eq!(ids(&cache.get_many(8, 100, &[1])), [None], "another mailbox");
        // Full: the next one pushes out the least recently used (3, as 1 and 2 were
        // just read).
        cache.put_many(7, 100, &[(65, meta(65, 1000))]);
        assert_eq!(
            ids(&cache.get_many(7, 100, &[1, 2, 3, 4, 65])),
            [Some(1), Some(2), None, Some(4), Some(65)]
        );
        assert!(gauge.get() as usize <= 64 * one + one / 2);
        cache.clear();
        assert_eq!(ids(&cache.get_many(7, 100, &[1])), [None]);
        assert_eq!(gauge.get(), 0);
        let off = MetaCache::new(0, prometheus::IntGauge::new("u", "u").expect("gauge"));
        off.put_many(7, 100, &[(1, meta(1, 10))]);
        assert_eq!(ids(&off.get_many(7, 100, &[1])), [None]);
    }
}
