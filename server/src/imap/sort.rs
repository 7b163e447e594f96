//! SORT (RFC 5256 §3): the messages a search matches, ordered by keys of their
//! headers and metadata, ties in mailbox order.

use std::cmp::Ordering;

use imap_codec::imap_types::core::Charset;
use imap_codec::imap_types::search::SearchKey;

use super::search::{esearch_line, numbers_line};
use super::session::{Outcome, Session, store_error};
use crate::proto::imap::parse::{ReturnOption, SortKey, SortKind};
use std::sync::Arc;

use crate::view::sort_cache::{Order, SortKeys};
use mailcluster_model::UidSet;

impl Session {
    /// `esort`: the tag and RETURN options of an ESORT (RFC 5267): the answer is
    /// an ESEARCH line, MIN and MAX the first and last in the sorted order.
    pub(crate) async fn cmd_sort(
        &mut self,
        esort: Option<(&str, &[ReturnOption])>,
        charset: Option<&Charset<'_>>,
        criteria: &SearchKey<'_>,
        keys: &[SortKey],
        uid: bool,
    ) -> Outcome {
        let hits = match self.search_hits(charset, criteria, uid).await {
            Ok(hits) => hits,
            Err(o) => return o,
        };
        let Some(mailbox) = self.selected.as_ref().map(|s| (s.mailbox.id, s.mailbox.uid_validity)) else {
            return Outcome::bad("No mailbox selected");
        };
        let previous = self.shared.reads.sort_cache.order(mailbox, keys);
        let order = match previous {
            Some(order) if order.members == hits => order,
            previous => {
                let rows = match self.keys_of(mailbox, &hits).await {
                    Ok(rows) => rows,
                    Err(o) => return o,
                };
                let order = Arc::new(order_of(keys, rows, previous.as_deref()));
                self.shared.reads.sort_cache.put_order(mailbox, keys, order.clone());
                order
            }
        };
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        // The sequence number of each member (both lists ascend: one walk), None
        // for one expunged here meanwhile — not in this session's view any more.
        let mut view = sel.uids.iter().enumerate().peekable();
        let seqs: Vec<Option<u32>> = order
            .members
            .iter()
            .map(|&u| {
                while view.next_if(|(_, v)| **v < u).is_some() {}
                view.next_if(|(_, v)| **v == u).map(|(i, _)| i as u32 + 1)
            })
            .collect();
        let numbers: Vec<u32> = order
            .ranks
            .iter()
            .filter_map(|&r| {
                let seq = (*seqs.get(r as usize)?)?;
                Some(if uid { order.members[r as usize] } else { seq })
            })
            .collect();
        let line = match esort {
            Some((tag, options)) => esearch_line(tag, options, uid, &numbers),
            None => numbers_line("* SORT", &numbers),
        };
        self.push(&line);
        Outcome::ok(if uid { "UID SORT completed" } else { "SORT completed" })
    }

    /// The sort keys of the messages `criteria` matches, ascending by UID.
    pub(crate) async fn matching_rows(
        &mut self,
        charset: Option<&Charset<'_>>,
        criteria: &SearchKey<'_>,
        uid: bool,
    ) -> Result<Vec<Arc<SortKeys>>, Outcome> {
        let hits = self.search_hits(charset, criteria, uid).await?;
        let Some(mailbox) = self.selected.as_ref().map(|s| (s.mailbox.id, s.mailbox.uid_validity)) else {
            return Err(Outcome::bad("No mailbox selected"));
        };
        self.keys_of(mailbox, &hits).await
    }

    /// The sort keys of `uids` (ascending), in their order: from the process's sort
    /// cache, the missing ones read from the store and added to it.
    pub(crate) async fn keys_of(
        &self,
        mailbox: (i64, u32),
        uids: &[u32],
    ) -> Result<Vec<Arc<SortKeys>>, Outcome> {
        let cache = &self.shared.reads.sort_cache;
        let mut keys = cache.get(mailbox, uids);
        let missing: Vec<u32> =
            uids.iter().zip(&keys).filter(|(_, k)| k.is_none()).map(|(u, _)| *u).collect();
        if !missing.is_empty() {
            let rows = self
                .app
                .store
                .sort_rows(mailbox.0, &UidSet::from_uids(&missing))
                .await
                .map_err(store_error)?;
            let read: Vec<Arc<SortKeys>> = rows.iter().map(|r| Arc::new(SortKeys::of(r))).collect();
            cache.put(mailbox, &read);
            let by_uid: std::collections::HashMap<u32, Arc<SortKeys>> =
                read.into_iter().map(|k| (k.uid, k)).collect();
            for (u, k) in uids.iter().zip(keys.iter_mut()) {
                if k.is_none() {
                    *k = by_uid.get(u).cloned();
                }
            }
        }
        // A message expunged between the search and the read has no keys: left out.
        Ok(keys.into_iter().flatten().collect())
    }
}

/// `rows` (ascending by UID) in the order of `keys`. With an earlier order by the
/// same keys, only the messages it does not hold are sorted, then merged into the
/// ones it holds that are still asked for; the result is the same as sorting all.
fn order_of(keys: &[SortKey], rows: Vec<Arc<SortKeys>>, previous: Option<&Order>) -> Order {
    let members: Vec<u32> = rows.iter().map(|r| r.uid).collect();
    let ordering = |a: &SortKeys, b: &SortKeys| ordering(keys, a, b);
    let mut fresh = match previous {
        Some(p) => rows.into_iter().filter(|r| p.members.binary_search(&r.uid).is_err()).collect(),
        None => rows,
    };
    // Compared in place, field by field: no key is copied out of the cache.
    fresh.sort_by(|a, b| ordering(a, b));
    let Some(previous) = previous else { return Order::new(members, fresh) };
    let mut kept = previous.sorted.iter().filter(|k| members.binary_search(&k.uid).is_ok()).peekable();
    let mut fresh = fresh.into_iter().peekable();
    let mut sorted = Vec::with_capacity(members.len());
    loop {
        let next = match (kept.peek(), fresh.peek()) {
            (Some(k), Some(f)) if ordering(k, f).is_le() => kept.next().cloned(),
            (_, Some(_)) => fresh.next(),
            (Some(_), None) => kept.next().cloned(),
            (None, None) => break,
        };
        sorted.extend(next);
    }
    Order::new(members, sorted)
}

/// Two messages in the order of `keys`; equal by every key, in mailbox order (UIDs
/// ascend with it), so no two messages are ever equal.
fn ordering(keys: &[SortKey], a: &SortKeys, b: &SortKeys) -> Ordering {
    keys.iter()
        .map(|k| {
            let o = compare(k.kind, a, b);
            if k.reverse { o.reverse() } else { o }
        })
        .find(|o| o.is_ne())
        .unwrap_or_else(|| a.uid.cmp(&b.uid))
}

/// One sort key of two messages, in ascending order. Times and numbers compare
/// as such; text keys are stored ASCII upper-cased, so byte order is
/// i;ascii-casemap (RFC 5256 §2.2).
fn compare(kind: SortKind, a: &SortKeys, b: &SortKeys) -> Ordering {
    match kind {
        SortKind::Arrival => a.arrival.cmp(&b.arrival),
        SortKind::Date => a.sent.cmp(&b.sent),
        SortKind::Size => a.size.cmp(&b.size),
        SortKind::Subject => a.subject.as_bytes().cmp(b.subject.as_bytes()),
        SortKind::From => a.from.as_bytes().cmp(b.from.as_bytes()),
        SortKind::To => a.to.as_bytes().cmp(b.to.as_bytes()),
        SortKind::Cc => a.cc.as_bytes().cmp(b.cc.as_bytes()),
        SortKind::DisplayFrom => a.display_from.cmp(&b.display_from),
        SortKind::DisplayTo => a.display_to.cmp(&b.display_to),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(uid: u32, seed: u64) -> Arc<SortKeys> {
        // Few distinct values, so ties (broken by UID) are common.
        let h = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(u64::from(uid).wrapping_mul(1442695040888963407));
        Arc::new(SortKeys {
            uid,
            message_id: i64::from(uid),
            arrival: (h >> 20) as i64 % 7,
            sent: (h >> 30) as i64 % 5,
            size: (h >> 40) as u32 % 3,
            subject: ["", "A", "AB", "B"][(h >> 50) as usize % 4].into(),
            reply: false,
            from: ["X", "Y"][(h >> 55) as usize % 2].into(),
            to: "".into(),
            cc: "".into(),
            display_from: ["B", "A"][(h >> 58) as usize % 2].into(),
            display_to: "".into(),
            message_id_header: "".into(),
        })
    }

    #[test]
    fn an_order_brought_up_to_date_is_the_order_sorted_afresh() {
        let key = |kind, reverse| SortKey { kind, reverse };
        let lists = [
            vec![key(SortKind::Subject, false)],
            vec![key(SortKind::Date, true), key(SortKind::From, false)],
            vec![key(SortKind::Size, false), key(SortKind::Arrival, true), key(SortKind::Subject, false)],
            vec![key(SortKind::DisplayFrom, true), key(SortKind::Size, false)],
        ];
        for (round, keys_list) in lists.iter().enumerate() {
            let seed = round as u64 + 1;
            let all = |uids: &mut dyn Iterator<Item = u32>| uids.map(|u| keys(u, seed)).collect::<Vec<_>>();
            let before = order_of(keys_list, all(&mut (1..=300)), None);
            // Some gone (every third, and the first 50), some new (301..=360).
            let now = all(&mut (51..=360).filter(|u| u % 3 != 0));
            let merged = order_of(keys_list, now.clone(), Some(&before));
            let afresh = order_of(keys_list, now.clone(), None);
            let uids = |o: &Order| o.sorted.iter().map(|k| k.uid).collect::<Vec<_>>();
            assert_eq!(uids(&merged), uids(&afresh), "{keys_list:?}");
            assert_eq!(merged.members, now.iter().map(|k| k.uid).collect::<Vec<_>>());
            // And the afresh order is sorted: each neighbour pair in order by the keys.
            for pair in afresh.sorted.windows(2) {
                assert!(
                    ordering(keys_list, &pair[0], &pair[1]).is_lt(),
                    "{keys_list:?}: {} before {}",
                    pair[0].uid,
                    pair[1].uid
                );
            }
        }
    }
}
