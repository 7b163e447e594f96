//! The maildrop of one POP3 session: the INBOX snapshot taken at login, the
//! deletion marks, and the lock that makes the session exclusive across pods.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::app::App;
use crate::cache::{Cache, LockToken, MailboxEvent};
use crate::store::StoreError;
use mailcluster_model::{Account, FlagOp, FlagSet, Flags, UidSet};

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
            let entries = app.view.pop3_listing(&inbox).await?;
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
