//! Recently selected mailboxes' message lists, kept per process so that a
//! SELECT does not read a large mailbox's every row again.
//!
//! A cached [`MailboxIndex`] may be older than the mailbox: SELECT brings it up
//! to date with `changes_since(its modseq)` — the same query every command's sync
//! uses — so what the client is told is exactly what a fresh read would give.
//! (When the tombstones no longer reach back to the cached modseq — they are
//! pruned after `imap.tombstone_retention_days` — `changes_since` says so and
//! hands over the full UID list, from which the expunged ones follow.)
//!
//! Bounded by the number of messages held over all entries; the least recently
//! used entries go first. Keyed by mailbox id and UIDVALIDITY, so a renamed or
//! recreated mailbox never reuses an entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Snapshot;
use super::shared_snapshot::{Fields, SharedEncoding};
use mailcluster_model::{Flags, MailboxIndex};

impl Snapshot for MailboxIndex {
    fn modseq(&self) -> u64 {
        self.highest_modseq
    }
    fn messages(&self) -> usize {
        self.uids.len()
    }
}

/// Version of the shared encoding below; a value of another version is a miss.
const SHARED_INDEX_VERSION: u8 = 1;
/// UID, system flags, modseq.
const SHARED_INDEX_ENTRY: usize = 4 + 4 + 8;
/// A keyword entry's UID and count, before its keywords.
const SHARED_KEYWORDS_ENTRY: usize = 4 + 2;

/// A large mailbox's SELECT index in the shared cache: 16 bytes a message, then
/// the keywords of the messages that have any.
impl SharedEncoding for MailboxIndex {
    const NAMESPACE: &'static str = "imap:index";

    fn encode(&self, uid_validity: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 4 + 8 + 4 + 4 + self.uids.len() * SHARED_INDEX_ENTRY + 4);
        out.push(SHARED_INDEX_VERSION);
        out.extend_from_slice(&uid_validity.to_le_bytes());
        out.extend_from_slice(&self.highest_modseq.to_le_bytes());
        out.extend_from_slice(&self.uid_next.to_le_bytes());
        out.extend_from_slice(&u32::try_from(self.uids.len()).unwrap_or(u32::MAX).to_le_bytes());
        for ((uid, flags), modseq) in self.uids.iter().zip(&self.flags).zip(&self.modseqs) {
            out.extend_from_slice(&uid.to_le_bytes());
            out.extend_from_slice(&flags.0.to_le_bytes());
            out.extend_from_slice(&modseq.to_le_bytes());
        }
        out.extend_from_slice(&u32::try_from(self.keywords.len()).unwrap_or(u32::MAX).to_le_bytes());
        for (uid, words) in &self.keywords {
            out.extend_from_slice(&uid.to_le_bytes());
            out.extend_from_slice(&u16::try_from(words.len()).unwrap_or(u16::MAX).to_le_bytes());
            for word in words.iter().take(usize::from(u16::MAX)) {
                // Keywords are IMAP atoms, far shorter than this.
                let word = &word.as_bytes()[..word.len().min(usize::from(u16::MAX))];
                out.extend_from_slice(&(word.len() as u16).to_le_bytes());
                out.extend_from_slice(word);
            }
        }
        out
    }

    /// Also a miss: UIDs (of messages, or of keyword entries) out of ascending
    /// order, a keyword that is not UTF-8, bytes after the end.
    fn decode(value: &[u8], uid_validity: u32) -> Option<MailboxIndex> {
        let mut f = Fields::new(value);
        if f.u8()? != SHARED_INDEX_VERSION || f.u32()? != uid_validity {
            return None;
        }
        let (highest_modseq, uid_next) = (f.u64()?, f.u32()?);
        let count = f.count(SHARED_INDEX_ENTRY)?;
        let mut index = MailboxIndex {
            highest_modseq,
            uid_next,
            uids: Vec::with_capacity(count),
            flags: Vec::with_capacity(count),
            modseqs: Vec::with_capacity(count),
            keywords: Vec::new(),
        };
        for _ in 0..count {
            let (uid, flags, modseq) = (f.u32()?, f.u32()?, f.u64()?);
            if index.uids.last().is_some_and(|&last| last >= uid) {
                return None;
            }
            index.uids.push(uid);
            index.flags.push(Flags(flags));
            index.modseqs.push(modseq);
        }
        let with_keywords = f.count(SHARED_KEYWORDS_ENTRY)?;
        index.keywords.reserve(with_keywords);
        for _ in 0..with_keywords {
            let uid = f.u32()?;
            if index.keywords.last().is_some_and(|(last, _)| *last >= uid) {
                return None;
            }
            let n = f.u16()?;
            let mut words = Vec::with_capacity(usize::from(n).min(64));
            for _ in 0..n {
                let len = usize::from(f.u16()?);
                words.push(std::str::from_utf8(f.bytes(len)?).ok()?.to_owned());
            }
            index.keywords.push((uid, words));
        }
        f.is_empty().then_some(index)
    }
}

/// Per-mailbox snapshots, least recently used first out. The SELECT cache holds
/// [`MailboxIndex`]es; POP3 keeps its maildrop listings in another instance.
pub struct IndexCache<T = MailboxIndex> {
    max_messages: usize,
    inner: Mutex<Inner<T>>,
}

struct Inner<T> {
    entries: HashMap<(i64, u32), Entry<T>>,
    messages: usize,
    clock: u64,
}

struct Entry<T> {
    snapshot: Arc<T>,
    used: u64,
}

impl<T: Snapshot> IndexCache<T> {
    /// `max_messages` 0 disables the cache.
    pub fn new(max_messages: usize) -> Self {
        IndexCache {
            max_messages,
            inner: Mutex::new(Inner { entries: HashMap::new(), messages: 0, clock: 0 }),
        }
    }

    pub fn get(&self, mailbox_id: i64, uid_validity: u32) -> Option<Arc<T>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.entries.get_mut(&(mailbox_id, uid_validity))?;
        entry.used = now;
        Some(entry.snapshot.clone())
    }

    /// Forgets every list: the database went back in time (a restore, a failover
    /// to a replica that lost the primary's last commits), and a cached list newer
    /// than the database would show messages that no longer exist.
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.clear();
        inner.messages = 0;
    }

    /// Keeps `snapshot` unless a newer one is already held. An `Arc` the caller
    /// also answers from is shared, not copied (a listing is a row per message).
    pub fn put(&self, mailbox_id: i64, uid_validity: u32, snapshot: impl Into<Arc<T>>) {
        let snapshot = snapshot.into();
        let size = snapshot.messages();
        if self.max_messages == 0 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if size > self.max_messages {
            // An older list of the mailbox would be served and brought up to date
            // from an ever older modseq: let the next read start afresh instead.
            if let Some(gone) = inner.entries.remove(&(mailbox_id, uid_validity)) {
                inner.messages -= gone.snapshot.messages();
            }
            return;
        }
        inner.clock += 1;
        let now = inner.clock;
        let key = (mailbox_id, uid_validity);
        if let Some(old) = inner.entries.get(&key) {
            if old.snapshot.modseq() >= snapshot.modseq() {
                return;
            }
            let old_size = old.snapshot.messages();
            inner.messages -= old_size;
        }
        inner.messages += size;
        inner.entries.insert(key, Entry { snapshot, used: now });
        while inner.messages > self.max_messages {
            // Rare (only when over budget), so a scan for the oldest is fine.
            let Some((&oldest, _)) =
                inner.entries.iter().filter(|(k, _)| **k != key).min_by_key(|(_, e)| e.used)
            else {
                break;
            };
            if let Some(gone) = inner.entries.remove(&oldest) {
                inner.messages -= gone.snapshot.messages();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(modseq: u64, n: u32) -> MailboxIndex {
        MailboxIndex {
            highest_modseq: modseq,
            uid_next: n + 1,
            uids: (1..=n).collect(),
            flags: vec![Flags::NONE; n as usize],
            modseqs: vec![modseq; n as usize],
            keywords: Vec::new(),
        }
    }

    #[test]
    fn keeps_the_newest_and_stays_within_budget() {
        let cache: IndexCache = IndexCache::new(100);
        cache.put(1, 7, index(5, 40));
        cache.put(1, 7, index(4, 10));
        assert_eq!(cache.get(1, 7).map(|i| i.highest_modseq), Some(5), "an older snapshot does not replace");
        assert!(cache.get(1, 8).is_none(), "another UIDVALIDITY is another mailbox");
        cache.put(2, 7, index(1, 40));
        assert!(cache.get(1, 7).is_some());
        // 40 + 40 + 40 > 100: the least recently used (mailbox 2) goes.
        cache.put(3, 7, index(1, 40));
        assert!(cache.get(2, 7).is_none());
        assert!(cache.get(1, 7).is_some() && cache.get(3, 7).is_some());
        cache.put(4, 7, index(1, 101));
        assert!(cache.get(4, 7).is_none(), "larger than the whole budget");
        let off: IndexCache = IndexCache::new(0);
        off.put(1, 1, index(1, 1));
        off.put(2, 1, index(1, 0));
        assert!(
            off.get(1, 1).is_none() && off.get(2, 1).is_none(),
            "0 keeps nothing, not even an empty list"
        );
    }

    fn with_keywords(mut index: MailboxIndex) -> MailboxIndex {
        index.flags[0] = Flags::SEEN.union(Flags::FLAGGED);
        index.modseqs[1] = index.highest_modseq + 3;
        index.keywords = vec![(1, vec!["$Work".into(), "Junk".into()]), (3, vec!["\u{e9}t\u{e9}".into()])];
        index
    }

    #[test]
    fn a_shared_index_reads_back_as_written() {
        for original in [index(0, 0), index(9, 1), with_keywords(index(12, 4))] {
            let back = MailboxIndex::decode(&original.encode(77), 77).expect("decodes");
            assert_eq!(back, original);
        }
    }

    #[test]
    fn anything_but_a_whole_index_of_this_uidvalidity_is_a_miss() {
        let value = with_keywords(index(12, 4)).encode(77);
        assert!(MailboxIndex::decode(&value, 78).is_none(), "another UIDVALIDITY");
        for cut in [0, 1, 20, value.len() - 1] {
            assert!(MailboxIndex::decode(&value[..cut], 77).is_none(), "cut at {cut}");
        }
        assert!(MailboxIndex::decode(&[value.as_slice(), &[0]].concat(), 77).is_none(), "trailing bytes");
        let mut other_version = value.clone();
        other_version[0] = SHARED_INDEX_VERSION + 1;
        assert!(MailboxIndex::decode(&other_version, 77).is_none(), "another encoding");
        let mut unordered = index(5, 3);
        unordered.uids = vec![1, 3, 2];
        assert!(MailboxIndex::decode(&unordered.encode(77), 77).is_none(), "UIDs out of order");
        let mut keywords_unordered = with_keywords(index(12, 4));
        keywords_unordered.keywords.reverse();
        assert!(
            MailboxIndex::decode(&keywords_unordered.encode(77), 77).is_none(),
            "keyword UIDs out of order"
        );
        let mut huge_count = value.clone();
        huge_count[17..21].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(MailboxIndex::decode(&huge_count, 77).is_none(), "a count the value does not hold");
        let mut not_utf8 = value.clone();
        let at = not_utf8.len() - 1;
        not_utf8[at] = 0xff;
        assert!(MailboxIndex::decode(&not_utf8, 77).is_none(), "a keyword that is not UTF-8");
    }

    #[test]
    fn a_list_grown_past_the_budget_takes_the_older_one_out() {
        let cache: IndexCache = IndexCache::new(100);
        cache.put(1, 7, index(5, 90));
        cache.put(2, 7, index(1, 10));
        cache.put(1, 7, index(6, 101));
        assert!(cache.get(1, 7).is_none(), "the older list is not served any more");
        // Its room is free again: 10 + 90 fit.
        cache.put(3, 7, index(1, 90));
        assert!(cache.get(2, 7).is_some() && cache.get(3, 7).is_some());
    }
}
