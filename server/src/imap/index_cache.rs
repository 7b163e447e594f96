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

use crate::store::MailboxIndex;

/// What the cache holds per mailbox: a listing that reflects one modseq.
pub trait Snapshot {
    /// The modseq it reflects: what changed after it comes from `changes_since`.
    fn modseq(&self) -> u64;
    /// Messages it lists: what the budget counts.
    fn messages(&self) -> usize;
}

impl Snapshot for MailboxIndex {
    fn modseq(&self) -> u64 {
        self.highest_modseq
    }
    fn messages(&self) -> usize {
        self.uids.len()
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
    use crate::store::Flags;

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
