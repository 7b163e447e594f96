//! Sort keys of recently sorted mailboxes, kept per process: what SORT and THREAD
//! compare, computed once per message (base subject, first address, dates) instead
//! of being read and recomputed for every message on every command. A message's
//! keys never change once it is stored, so an entry only grows; a SORT reads from
//! the store just the UIDs it has not seen (bench/imap-sort.sh measured 10,000-message
//! sorts at 0.16x Dovecot's rate before this cache).
//!
//! Beside the keys, each mailbox keeps the last few orders SORT computed (one per
//! list of sort keys, at most [`ORDERS_PER_MAILBOX`]): profiled at 50 sessions
//! sorting 10,000 messages, comparing keys was about 70 % of the server's CPU, and a
//! mailbox's order only changes when messages arrive or leave. An order is reused
//! whole when the search matched the same messages, and otherwise brought up to
//! date by dropping the ones gone and merging in the new ones.
//!
//! Bounded by the number of messages held over all mailboxes (an order adds two
//! words per message it holds); the least recently used mailbox goes first. Keyed
//! by mailbox id and UIDVALIDITY. Cleared with the other read caches when the
//! database's epoch changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::proto::imap::parse::SortKey;
use mailcluster_model::SortRow;
use mailcluster_model::sort_keys::{base_subject_of, first_display, first_mailbox};

/// Orders kept per mailbox: a client sorts a mailbox by one or two key lists (the
/// column the user clicked, and maybe its reverse).
pub const ORDERS_PER_MAILBOX: usize = 4;

/// Messages of a mailbox in the order of one list of sort keys.
#[derive(Debug)]
pub struct Order {
    /// The UIDs ordered, ascending.
    pub members: Vec<u32>,
    /// Their keys, in sort order.
    pub sorted: Vec<Arc<SortKeys>>,
    /// Where each of `sorted` is in `members`: answering from these alone never
    /// touches the keys, which lie scattered over the heap (following the pointers
    /// was two thirds of a cached SORT's CPU when 50 mailboxes were sorted at once).
    pub ranks: Vec<u32>,
}

impl Order {
    /// `sorted` (keys of `members`, in sort order) with their ranks.
    pub fn new(members: Vec<u32>, sorted: Vec<Arc<SortKeys>>) -> Order {
        let ranks =
            sorted.iter().map(|k| members.binary_search(&k.uid).map_or(u32::MAX, |i| i as u32)).collect();
        Order { members, sorted, ranks }
    }
}

/// What SORT and THREAD need of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKeys {
    pub uid: u32,
    /// The stored message's id (THREAD reads its headers).
    pub message_id: i64,
    /// INTERNALDATE, microseconds.
    pub arrival: i64,
    /// The Date: header in UTC, else the arrival time (RFC 5256 §3), microseconds.
    pub sent: i64,
    pub size: u32,
    /// The base subject (RFC 5256 §2.1), ASCII upper-cased (i;ascii-casemap).
    pub subject: Box<str>,
    /// The subject carried a reply or forward marker.
    pub reply: bool,
    /// addr-mailbox of the first From / To / Cc address, upper-cased.
    pub from: Box<str>,
    pub to: Box<str>,
    pub cc: Box<str>,
    /// The display name of the first From / To address, else its addr-spec,
    /// upper-cased (SORT=DISPLAY, RFC 5957).
    pub display_from: Box<str>,
    pub display_to: Box<str>,
    /// The Message-ID header without its angle brackets.
    pub message_id_header: Box<str>,
}

impl SortKeys {
    pub fn of(row: &SortRow) -> SortKeys {
        let upper = |s: &str| s.to_ascii_uppercase().into_boxed_str();
        let (subject, reply) = base_subject_of(&row.subject);
        SortKeys {
            uid: row.uid,
            message_id: row.message_id,
            arrival: row.internal_date.timestamp_micros(),
            sent: row.sent_date.unwrap_or(row.internal_date).timestamp_micros(),
            size: row.size,
            subject: upper(&subject),
            reply,
            from: upper(first_mailbox(&row.from)),
            to: upper(first_mailbox(&row.to)),
            cc: upper(first_mailbox(&row.cc)),
            display_from: first_display(&row.from).to_uppercase().into_boxed_str(),
            display_to: first_display(&row.to).to_uppercase().into_boxed_str(),
            message_id_header: row.message_id_header.trim().trim_matches(['<', '>']).into(),
        }
    }
}

pub struct SortCache {
    max_messages: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    mailboxes: HashMap<(i64, u32), Entry>,
    messages: usize,
    clock: u64,
}

#[derive(Default)]
struct Entry {
    keys: HashMap<u32, Arc<SortKeys>>,
    /// Most recently computed first.
    orders: Vec<(Vec<SortKey>, Arc<Order>)>,
    used: u64,
}

impl SortCache {
    /// `max_messages` 0 disables the cache.
    pub fn new(max_messages: usize) -> Self {
        SortCache { max_messages, inner: Mutex::new(Inner::default()) }
    }

    /// The keys held for `uids` (None where not held), in their order.
    pub fn get(&self, mailbox: (i64, u32), uids: &[u32]) -> Vec<Option<Arc<SortKeys>>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        match inner.mailboxes.get_mut(&mailbox) {
            Some(entry) => {
                entry.used = now;
                uids.iter().map(|u| entry.keys.get(u).cloned()).collect()
            }
            None => vec![None; uids.len()],
        }
    }

    /// Keeps `keys`, making room by dropping the least recently used mailboxes.
    pub fn put(&self, mailbox: (i64, u32), keys: &[Arc<SortKeys>]) {
        if self.max_messages == 0 || keys.len() > self.max_messages {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        while inner.messages + keys.len() > self.max_messages {
            let Some(oldest) = inner
                .mailboxes
                .iter()
                .filter(|(m, _)| **m != mailbox)
                .min_by_key(|(_, e)| e.used)
                .map(|(m, _)| *m)
            else {
                break;
            };
            if let Some(gone) = inner.mailboxes.remove(&oldest) {
                inner.messages -= gone.keys.len();
            }
        }
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.mailboxes.entry(mailbox).or_default();
        entry.used = now;
        let before = entry.keys.len();
        for k in keys {
            entry.keys.insert(k.uid, k.clone());
        }
        let added = entry.keys.len() - before;
        inner.messages += added;
        if inner.messages > self.max_messages {
            // Only this mailbox is left and it grew past the bound: start it over.
            inner.messages -= inner.mailboxes.remove(&mailbox).map_or(0, |e| e.keys.len());
        }
    }

    /// The last order computed for `keys` in `mailbox`: over the messages a search
    /// matched then, which need not be the ones it matches now.
    pub fn order(&self, mailbox: (i64, u32), keys: &[SortKey]) -> Option<Arc<Order>> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let entry = inner.mailboxes.get(&mailbox)?;
        entry.orders.iter().find(|(k, _)| k == keys).map(|(_, o)| o.clone())
    }

    /// Keeps `order` for `keys` in place of the one held before, unless it holds
    /// fewer than half as many messages: a narrow search sorted between two sorts of
    /// the whole mailbox must not leave them only its few messages to start from.
    /// The mailbox's keys must be held (an order lives and goes with them).
    pub fn put_order(&self, mailbox: (i64, u32), keys: &[SortKey], order: Arc<Order>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = inner.mailboxes.get_mut(&mailbox) else { return };
        if let Some((_, held)) = entry.orders.iter().find(|(k, _)| k == keys)
            && order.members.len() < held.members.len() / 2
        {
            return;
        }
        entry.orders.retain(|(k, _)| k != keys);
        entry.orders.insert(0, (keys.to_vec(), order));
        entry.orders.truncate(ORDERS_PER_MAILBOX);
    }

    /// Forgets everything (the database went back in time).
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.mailboxes.clear();
        inner.messages = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(uid: u32) -> Arc<SortKeys> {
        Arc::new(SortKeys {
            uid,
            message_id: i64::from(uid),
            arrival: 0,
            sent: 0,
            size: 0,
            subject: "".into(),
            reply: false,
            from: "".into(),
            to: "".into(),
            cc: "".into(),
            display_from: "".into(),
            display_to: "".into(),
            message_id_header: "".into(),
        })
    }

    #[test]
    fn bounded_by_messages_least_recently_used_mailbox_first() {
        let cache = SortCache::new(10);
        cache.put((1, 1), &(1..=4).map(keys).collect::<Vec<_>>());
        cache.put((2, 1), &(1..=4).map(keys).collect::<Vec<_>>());
        assert!(cache.get((1, 1), &[1])[0].is_some(), "1 is now the most recently used");
        cache.put((3, 1), &(1..=4).map(keys).collect::<Vec<_>>());
        assert!(cache.get((2, 1), &[1])[0].is_none(), "2 went to make room");
        assert!(cache.get((1, 1), &[4])[0].is_some());
        assert_eq!(cache.get((3, 1), &[2, 9]).iter().map(Option::is_some).collect::<Vec<_>>(), [true, false]);
        // Another UIDVALIDITY is another mailbox.
        assert!(cache.get((1, 2), &[1])[0].is_none());
        cache.clear();
        assert!(cache.get((1, 1), &[1])[0].is_none());
        // Off.
        let off = SortCache::new(0);
        off.put((1, 1), &[keys(1)]);
        assert!(off.get((1, 1), &[1])[0].is_none());
    }

    #[test]
    fn orders_per_key_list_a_narrow_one_never_replacing_a_wide_one() {
        use crate::proto::imap::parse::SortKind;
        let cache = SortCache::new(100);
        let order = |uids: std::ops::RangeInclusive<u32>| {
            Arc::new(Order::new(uids.clone().collect(), uids.map(keys).collect()))
        };
        let by = |kind| vec![SortKey { reverse: false, kind }];
        // Nothing to attach to before the mailbox's keys are held.
        cache.put_order((1, 1), &by(SortKind::Date), order(1..=10));
        assert!(cache.order((1, 1), &by(SortKind::Date)).is_none());
        cache.put((1, 1), &(1..=10).map(keys).collect::<Vec<_>>());
        cache.put_order((1, 1), &by(SortKind::Date), order(1..=10));
        cache.put_order((1, 1), &by(SortKind::Date), order(1..=4));
        assert_eq!(cache.order((1, 1), &by(SortKind::Date)).unwrap().members.len(), 10);
        cache.put_order((1, 1), &by(SortKind::Date), order(1..=5));
        assert_eq!(cache.order((1, 1), &by(SortKind::Date)).unwrap().members.len(), 5);
        // Bounded per mailbox, the least recently computed going first.
        for kind in [SortKind::Subject, SortKind::From, SortKind::To, SortKind::Cc] {
            cache.put_order((1, 1), &by(kind), order(1..=10));
        }
        assert!(cache.order((1, 1), &by(SortKind::Date)).is_none());
        assert!(cache.order((1, 1), &by(SortKind::Subject)).is_some());
        assert!(cache.order((2, 1), &by(SortKind::Subject)).is_none());
        cache.clear();
        assert!(cache.order((1, 1), &by(SortKind::Cc)).is_none());
    }
}
