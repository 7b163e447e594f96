//! POP3's maildrop listings as the read layer keeps them: the INBOX as of a
//! modseq, in the process's cache and, for large maildrops, in the shared cache,
//! brought up to date from what changed since.

use std::sync::Arc;

use mailcluster_model::{Mailbox, MailboxChanges, MaildropEntry};

use super::Snapshot;
use super::View;
use super::shared_snapshot::{Fields, SharedEncoding, SharedSnapshots};
use crate::store::{Store, StoreError};

/// An INBOX listing as of one modseq: what the process's maildrop cache keeps, so
/// that a login to a large maildrop reads only what changed since the last one
/// (a full listing is a row per message, every login).
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub highest_modseq: u64,
    /// Ascending by UID.
    pub entries: Vec<MaildropEntry>,
}

impl Snapshot for Listing {
    fn modseq(&self) -> u64 {
        self.highest_modseq
    }
    fn messages(&self) -> usize {
        self.entries.len()
    }
}

impl View {
    /// The INBOX listing now: a cached one (the process's, else the shared cache's)
    /// brought up to date, or a full read.
    /// `inbox` was read before anything here, so its modseq is no newer than what
    /// follows: a change made meanwhile is both in the listing and reported again by
    /// the next `changes_since`, and applying it twice changes nothing. The same holds
    /// for a shared listing another pod wrote, whatever its age: it is the maildrop as
    /// of its modseq, and what changed since is read here.
    pub(crate) async fn pop3_listing(&self, inbox: &Mailbox) -> Result<Arc<Listing>, StoreError> {
        let cache = &self.maildrops;
        let sources = &self.pop3_listings;
        let cfg = &self.pop3;
        let shared =
            SharedSnapshots::of(self, cfg.shared_listing_min_messages, cfg.shared_listing_ttl_secs).await;
        let (cached, from_shared) = match cache.get(inbox.id, inbox.uid_validity) {
            Some(local) => (Some(local), false),
            None => match shared.get::<Listing>(inbox.id, inbox.uid_validity).await {
                Some(listing) => (Some(Arc::new(listing)), true),
                None => (None, false),
            },
        };
        let Some(cached) = cached else {
            sources.with_label_values(&["store"]).inc();
            let entries = self.store.maildrop(inbox.id, 0).await?;
            let listing = Arc::new(Listing { highest_modseq: inbox.highest_modseq, entries });
            cache.put(inbox.id, inbox.uid_validity, listing.clone());
            shared.put(inbox.id, inbox.uid_validity, &listing);
            return Ok(listing);
        };
        sources.with_label_values(&[if from_shared { "shared" } else { "local" }]).inc();
        if cached.highest_modseq == inbox.highest_modseq {
            if from_shared {
                cache.put(inbox.id, inbox.uid_validity, cached.clone());
            }
            return Ok(cached);
        }
        let changes = self.store.changes_since(inbox.id, cached.highest_modseq).await?;
        let listing = Arc::new(brought_up_to_date(self.store.as_ref(), inbox.id, &cached, &changes).await?);
        cache.put(inbox.id, inbox.uid_validity, listing.clone());
        // Written back at every change: a shared copy left to lag costs every pod that
        // reads it the rows changed since, and PostgreSQL more than Redis pays for the
        // write (bench/RESULTS.md, POP3).
        shared.put(inbox.id, inbox.uid_validity, &listing);
        Ok(listing)
    }
}

/// Version of the shared encoding below; a value of another version is a miss.
const SHARED_LISTING_VERSION: u8 = 1;
/// Version, UIDVALIDITY, highest modseq, count.
#[cfg(test)]
const SHARED_LISTING_HEADER: usize = 1 + 4 + 8 + 4;
/// UID, size, body id, INTERNALDATE in microseconds.
const SHARED_LISTING_ENTRY: usize = 4 + 4 + 8 + 8;

impl SharedEncoding for Listing {
    const NAMESPACE: &'static str = "pop3:listing";

    fn encode(&self, uid_validity: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 4 + 8 + 4 + self.entries.len() * SHARED_LISTING_ENTRY);
        out.push(SHARED_LISTING_VERSION);
        out.extend_from_slice(&uid_validity.to_le_bytes());
        out.extend_from_slice(&self.highest_modseq.to_le_bytes());
        out.extend_from_slice(&u32::try_from(self.entries.len()).unwrap_or(u32::MAX).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.uid.to_le_bytes());
            out.extend_from_slice(&e.size.to_le_bytes());
            out.extend_from_slice(&e.message_id.to_le_bytes());
            out.extend_from_slice(&e.internal_date.timestamp_micros().to_le_bytes());
        }
        out
    }

    /// Also a miss: UIDs out of ascending order.
    fn decode(value: &[u8], uid_validity: u32) -> Option<Listing> {
        let mut f = Fields::new(value);
        if f.u8()? != SHARED_LISTING_VERSION || f.u32()? != uid_validity {
            return None;
        }
        let highest_modseq = f.u64()?;
        let count = f.count(SHARED_LISTING_ENTRY)?;
        let mut entries: Vec<MaildropEntry> = Vec::with_capacity(count);
        for _ in 0..count {
            let (uid, size, message_id, date) = (f.u32()?, f.u32()?, f.i64()?, f.i64()?);
            if entries.last().is_some_and(|last| last.uid >= uid) {
                return None;
            }
            let internal_date = chrono::DateTime::from_timestamp_micros(date)?;
            entries.push(MaildropEntry { uid, size, message_id, internal_date });
        }
        f.is_empty().then_some(Listing { highest_modseq, entries })
    }
}

/// `cached` with `changes` applied: expunged messages out, and the new ones (UIDs
/// only grow, so they are those above the cached highest) read from the store.
/// Flag changes do not matter to a listing.
async fn brought_up_to_date(
    store: &dyn Store,
    mailbox_id: i64,
    cached: &Listing,
    changes: &MailboxChanges,
) -> Result<Listing, StoreError> {
    let mut entries = cached.entries.clone();
    match &changes.present {
        // Tombstones pruned past the cached modseq: the full UID list decides.
        Some(present) => entries.retain(|e| present.binary_search(&e.uid).is_ok()),
        None if !changes.expunged.is_empty() => {
            entries.retain(|e| changes.expunged.binary_search(&e.uid).is_err())
        }
        None => {}
    }
    let highest = cached.entries.last().map_or(0, |e| e.uid);
    if changes.changed.iter().any(|r| r.uid > highest) {
        entries.extend(store.maildrop(mailbox_id, highest).await?);
    }
    Ok(Listing { highest_modseq: changes.highest_modseq, entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(uids: &[u32]) -> Listing {
        let date = chrono::DateTime::from_timestamp_micros(1_764_000_000_123_456).expect("date");
        Listing {
            highest_modseq: 77,
            entries: uids
                .iter()
                .map(|&uid| MaildropEntry {
                    uid,
                    message_id: i64::from(uid) * 1_000 + 5,
                    size: uid % 1_000 * 10 + 3,
                    internal_date: date + chrono::Duration::microseconds(i64::from(uid)),
                })
                .collect(),
        }
    }

    #[test]
    fn a_shared_listing_reads_back_as_written() {
        for uids in [&[][..], &[1], &[1, 2, 5, 4_000_000_000]] {
            let original = listing(uids);
            let back = Listing::decode(&original.encode(9), 9).expect("decodes");
            assert_eq!(back.highest_modseq, original.highest_modseq);
            assert_eq!(back.entries, original.entries);
        }
    }

    #[test]
    fn anything_but_a_whole_listing_of_this_uidvalidity_is_a_miss() {
        let value = listing(&[1, 2, 3]).encode(9);
        assert!(Listing::decode(&value, 10).is_none(), "another UIDVALIDITY");
        assert!(Listing::decode(&value[..value.len() - 1], 9).is_none(), "truncated");
        assert!(Listing::decode(&[value.as_slice(), &[0]].concat(), 9).is_none(), "trailing bytes");
        assert!(Listing::decode(&value[..SHARED_LISTING_HEADER - 1], 9).is_none(), "short header");
        assert!(Listing::decode(b"", 9).is_none(), "empty");
        let mut other_version = value.clone();
        other_version[0] = SHARED_LISTING_VERSION + 1;
        assert!(Listing::decode(&other_version, 9).is_none(), "another encoding");
        let unordered = listing(&[1, 3, 2]).encode(9);
        assert!(Listing::decode(&unordered, 9).is_none(), "UIDs out of order");
        let mut huge_count = value.clone();
        huge_count[13..17].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Listing::decode(&huge_count, 9).is_none(), "a count the value does not hold");
    }
}
