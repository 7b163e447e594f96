//! The maildrop of one POP3 session: the INBOX snapshot taken at login, the
//! deletion marks, and the lock that makes the session exclusive across pods.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::app::App;
use crate::cache::{Cache, LockToken, MailboxEvent};
use crate::imap::index_cache::Snapshot;
use crate::imap::shared_snapshot::{Fields, SharedEncoding, SharedSnapshots};
use crate::store::StoreError;
use mailcluster_model::{Account, FlagOp, FlagSet, Flags, Mailbox, MailboxChanges, MaildropEntry, UidSet};

/// The cache key of an account's maildrop lock (the cache adds its prefix).
pub fn lock_key(account_id: i64) -> String {
    format!("pop3:maildrop:{account_id}")
}

/// Why a maildrop could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// Another session, on any pod, holds the maildrop (`[IN-USE]`).
    InUse,
    /// The account has no INBOX: nothing a retry would change (`[SYS/PERM]`).
    NoMaildrop,
    /// Cache or store trouble (`[SYS/TEMP]`).
    Unavailable(String),
}

/// Why QUIT could not apply the deletions.
#[derive(Debug)]
pub enum CommitError {
    /// The lock expired while the session held the snapshot (the cache was
    /// unreachable for longer than the lock's lifetime); another session may own
    /// the maildrop now, so nothing is changed.
    LockLost,
    Store(StoreError),
}

/// One message of the snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub uid: u32,
    pub message_id: i64,
    pub size: u32,
    /// Checked with the message id by the shared body cache.
    pub internal_date: chrono::DateTime<chrono::Utc>,
    pub deleted: bool,
    pub retrieved: bool,
}

pub struct Maildrop {
    pub account_id: i64,
    pub mailbox_id: i64,
    pub uid_validity: u32,
    entries: Vec<Entry>,
    lock: MaildropLock,
}

impl Maildrop {
    /// Locks the account's maildrop, then snapshots its INBOX (in that order, so
    /// no other POP3 session can change it between the two).
    pub async fn open(app: &App, account: &Account, lock_ttl: Duration) -> Result<Maildrop, OpenError> {
        let lock = match MaildropLock::acquire(app.cache.clone(), account.id, lock_ttl).await {
            Ok(Some(lock)) => lock,
            Ok(None) => return Err(OpenError::InUse),
            Err(e) => return Err(OpenError::Unavailable(e)),
        };
        let snapshot = async {
            let inbox = app
                .store
                .mailbox_get(account.id, "INBOX")
                .await?
                .ok_or_else(|| StoreError::NotFound("INBOX".into()))?;
            let entries = listing(app, &inbox).await?;
            Ok::<_, StoreError>((inbox, entries))
        };
        match snapshot.await {
            Ok((inbox, entries)) => Ok(Maildrop {
                account_id: account.id,
                mailbox_id: inbox.id,
                uid_validity: inbox.uid_validity,
                entries: entries
                    .entries
                    .iter()
                    .map(|e| Entry {
                        uid: e.uid,
                        message_id: e.message_id,
                        size: e.size,
                        internal_date: e.internal_date,
                        deleted: false,
                        retrieved: false,
                    })
                    .collect(),
                lock,
            }),
            Err(e) => {
                lock.release().await;
                Err(match e {
                    StoreError::NotFound(_) => OpenError::NoMaildrop,
                    e => OpenError::Unavailable(e.to_string()),
                })
            }
        }
    }

    /// Messages not marked deleted and their total size (STAT, RSET, greeting).
    pub fn stat(&self) -> (usize, u64) {
        self.live().fold((0, 0), |(n, octets), (_, e)| (n + 1, octets + u64::from(e.size)))
    }

    /// `(message number, entry)` of every message not marked deleted.
    pub fn live(&self) -> impl Iterator<Item = (usize, &Entry)> {
        self.entries.iter().enumerate().filter(|(_, e)| !e.deleted).map(|(i, e)| (i + 1, e))
    }

    /// Message `n` unless it does not exist or is marked deleted.
    pub fn get(&self, n: u32) -> Option<&Entry> {
        self.entry_index(n).map(|i| &self.entries[i]).filter(|e| !e.deleted)
    }

    fn entry_index(&self, n: u32) -> Option<usize> {
        let i = usize::try_from(n).ok()?.checked_sub(1)?;
        (i < self.entries.len()).then_some(i)
    }

    /// RFC 1939 §7 unique-id: stable across sessions and consistent with IMAP,
    /// because (UIDVALIDITY, UID) names one message for ever. 16 hex digits are
    /// within the allowed 0x21..0x7E and 70 octets.
    pub fn unique_id(&self, entry: &Entry) -> String {
        self.unique_id_display(entry).to_string()
    }

    /// [`Maildrop::unique_id`] without allocating, for a whole UIDL listing.
    pub fn unique_id_display(&self, entry: &Entry) -> impl std::fmt::Display + use<> {
        UniqueId { uid_validity: self.uid_validity, uid: entry.uid }
    }

    /// Marks message `n` deleted. `Err(true)` if it already was, `Err(false)` if
    /// there is no such message.
    pub fn delete(&mut self, n: u32) -> Result<(), bool> {
        let i = self.entry_index(n).ok_or(false)?;
        if self.entries[i].deleted {
            return Err(true);
        }
        self.entries[i].deleted = true;
        Ok(())
    }

    pub fn mark_retrieved(&mut self, n: u32) {
        if let Some(i) = self.entry_index(n) {
            self.entries[i].retrieved = true;
        }
    }

    /// RSET: no message is marked deleted any more.
    pub fn undelete_all(&mut self) {
        for e in &mut self.entries {
            e.deleted = false;
        }
    }

    /// The UPDATE state (RFC 1939 §6): removes the marked messages in one store
    /// transaction, marks retrieved ones \Seen, tells IMAP sessions, releases the
    /// lock. Returns how many messages are left in the snapshot.
    pub async fn commit(self, app: &App, mark_seen: bool) -> Result<usize, CommitError> {
        if !self.lock.is_held() {
            self.lock.release().await;
            return Err(CommitError::LockLost);
        }
        let deleted: Vec<u32> = self.entries.iter().filter(|e| e.deleted).map(|e| e.uid).collect();
        let seen: Vec<u32> =
            self.entries.iter().filter(|e| e.retrieved && !e.deleted).map(|e| e.uid).collect();
        let remaining = self.entries.len() - deleted.len();
        let mut changed = false;
        let mut modseq = 0;
        if !deleted.is_empty() {
            // Messages an IMAP session expunged meanwhile are simply not there.
            match app.store.expunge(self.mailbox_id, Some(&UidSet::from_uids(&deleted))).await {
                Ok(removed) => {
                    changed |= !removed.uids.is_empty();
                    modseq = removed.modseq;
                }
                Err(e) => {
                    self.lock.release().await;
                    return Err(CommitError::Store(e));
                }
            }
        }
        if mark_seen && !seen.is_empty() {
            let flags = FlagSet { system: Flags::SEEN, keywords: Vec::new() };
            // \Seen is a convenience for IMAP clients: failing to set it must not
            // turn a completed QUIT into an error.
            match app.store.store_flags(self.mailbox_id, &UidSet::from_uids(&seen), FlagOp::Add, &flags).await
            {
                Ok(rows) => {
                    changed |= !rows.is_empty();
                    modseq = rows.iter().map(|r| r.modseq).fold(modseq, u64::max);
                }
                Err(e) => tracing::warn!(error = %e, "pop3: could not mark retrieved messages \\Seen"),
            }
        }
        if changed {
            let event = MailboxEvent { account_id: self.account_id, mailbox_id: self.mailbox_id, modseq };
            if let Err(e) = app.cache.publish(event).await {
                // IMAP sessions on other pods fall back to polling; nothing is lost.
                tracing::debug!(error = %e, "pop3: change notification failed");
            }
        }
        self.lock.release().await;
        Ok(remaining)
    }

    /// Ends the session without the UPDATE state (connection lost, autologout,
    /// shutdown): nothing is deleted.
    pub async fn release(self) {
        self.lock.release().await;
    }
}

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

/// The INBOX listing now: a cached one (the process's, else the shared cache's)
/// brought up to date, or a full read.
/// `inbox` was read before anything here, so its modseq is no newer than what
/// follows: a change made meanwhile is both in the listing and reported again by
/// the next `changes_since`, and applying it twice changes nothing. The same holds
/// for a shared listing another pod wrote, whatever its age: it is the maildrop as
/// of its modseq, and what changed since is read here.
async fn listing(app: &App, inbox: &Mailbox) -> Result<Arc<Listing>, StoreError> {
    let cache = app.imap.maildrops();
    let sources = &app.metrics.imap.pop3_listings;
    let cfg = &app.config.pop3;
    let shared = SharedSnapshots::of(app, cfg.shared_listing_min_messages, cfg.shared_listing_ttl_secs).await;
    let (cached, from_shared) = match cache.get(inbox.id, inbox.uid_validity) {
        Some(local) => (Some(local), false),
        None => match shared.get::<Listing>(inbox.id, inbox.uid_validity).await {
            Some(listing) => (Some(Arc::new(listing)), true),
            None => (None, false),
        },
    };
    let Some(cached) = cached else {
        sources.with_label_values(&["store"]).inc();
        let entries = app.store.maildrop(inbox.id, 0).await?;
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
    let changes = app.store.changes_since(inbox.id, cached.highest_modseq).await?;
    let listing = Arc::new(brought_up_to_date(app, inbox.id, &cached, &changes).await?);
    cache.put(inbox.id, inbox.uid_validity, listing.clone());
    // Written back at every change: a shared copy left to lag costs every pod that
    // reads it the rows changed since, and PostgreSQL more than Redis pays for the
    // write (bench/RESULTS.md, POP3).
    shared.put(inbox.id, inbox.uid_validity, &listing);
    Ok(listing)
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
    app: &App,
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
        entries.extend(app.store.maildrop(mailbox_id, highest).await?);
    }
    Ok(Listing { highest_modseq: changes.highest_modseq, entries })
}

struct UniqueId {
    uid_validity: u32,
    uid: u32,
}

impl std::fmt::Display for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}{:08x}", self.uid_validity, self.uid)
    }
}

/// A maildrop lock in the cache, renewed in the background while held.
struct MaildropLock {
    cache: Arc<dyn Cache>,
    token: Option<LockToken>,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl MaildropLock {
    async fn acquire(
        cache: Arc<dyn Cache>,
        account_id: i64,
        ttl: Duration,
    ) -> Result<Option<MaildropLock>, String> {
        let Some(token) = cache.lock_try(&lock_key(account_id), ttl).await.map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = tokio::spawn(renew(cache.clone(), token.clone(), ttl, lost.clone()));
        Ok(Some(MaildropLock { cache, token: Some(token), lost, renewer }))
    }

    fn is_held(&self) -> bool {
        !self.lost.load(Ordering::Acquire)
    }

    async fn release(mut self) {
        self.renewer.abort();
        if let Some(token) = self.token.take()
            && let Err(e) = self.cache.lock_release(&token).await
        {
            // It expires by itself after its TTL.
            tracing::debug!(error = %e, "pop3: maildrop lock release failed");
        }
    }
}

impl Drop for MaildropLock {
    /// A session task that is cancelled never reaches `release`: free the lock
    /// from a detached task rather than blocking the maildrop for its TTL.
    fn drop(&mut self) {
        self.renewer.abort();
        if let Some(token) = self.token.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let cache = self.cache.clone();
            runtime.spawn(async move {
                let _ = cache.lock_release(&token).await;
            });
        }
    }
}

async fn renew(cache: Arc<dyn Cache>, token: LockToken, ttl: Duration, lost: Arc<AtomicBool>) {
    let every = (ttl / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        match cache.lock_refresh(&token, ttl).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(key = %token.key, "pop3: maildrop lock lost");
                lost.store(true, Ordering::Release);
                return;
            }
            // A cache hiccup: the lock is still valid until its TTL; try again.
            Err(e) => tracing::debug!(error = %e, "pop3: maildrop lock renewal failed"),
        }
    }
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
