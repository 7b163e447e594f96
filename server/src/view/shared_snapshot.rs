//! Large mailboxes' snapshots in the shared cache (Redis): the SELECT index of
//! IMAP and the maildrop listing of POP3, for pods whose own cache does not hold
//! them. A pod that misses its own cache reads one value and then only what
//! changed since (`changes_since`), instead of a row per message of the mailbox.
//!
//! Best effort both ways: a cache that fails, or a value that is unreadable, of
//! another encoding or of another UIDVALIDITY, is a miss and the store is read.
//! Writes never hold up the session: they go out in the background.
//!
//! That a shared snapshot may be older than the mailbox is fine for the same
//! reason it is for the pod's own cache: it is the mailbox as of its modseq, and
//! what changed after it is read from the store. So is a race between two pods'
//! writes: whichever lands last is some past state of the mailbox. Keys name the database's epoch, so a
//! restore or a failover that lost commits leaves every earlier snapshot unused
//! (it could list messages that no longer exist, under body ids handed out again).

use std::time::Duration;

use super::Snapshot;
use super::View;

/// A snapshot that can travel through the shared cache.
pub trait SharedEncoding: Snapshot + Sized {
    /// The key's first part, e.g. `pop3:listing`.
    const NAMESPACE: &'static str;
    /// The snapshot as one value, with `uid_validity` in it.
    fn encode(&self, uid_validity: u32) -> Vec<u8>;
    /// The snapshot in `value` if it is one of this encoding, of this
    /// UIDVALIDITY and whole; anything else is `None` (a miss).
    fn decode(value: &[u8], uid_validity: u32) -> Option<Self>;
}

/// The shared-cache key of a mailbox's snapshot (the cache adds its prefix).
pub fn shared_key(namespace: &str, epoch: &str, mailbox_id: i64) -> String {
    use sha2::Digest;
    let epoch = sha2::Sha256::digest(epoch.as_bytes());
    format!("{namespace}:{}:{mailbox_id}", crate::cache::hex(&epoch[..8]))
}

/// The shared cache as one session sees it: whether it takes snapshots, from
/// what size, for how long, under which epoch.
pub struct SharedSnapshots<'a> {
    view: &'a View,
    /// 0: no snapshot is read or written.
    min_messages: usize,
    ttl: Duration,
    epoch: std::sync::Arc<str>,
}

impl<'a> SharedSnapshots<'a> {
    /// `min_messages` 0 turns sharing off. The embedded cache lives in this
    /// process, so the pod's own cache already is what it would hold; and
    /// without a known epoch no key is safe to use.
    pub async fn of(view: &'a View, min_messages: usize, ttl_secs: u64) -> SharedSnapshots<'a> {
        let wanted = view.cache.shared_across_processes() && min_messages > 0;
        let epoch = if wanted { view.epoch().await } else { None };
        SharedSnapshots {
            view,
            min_messages: if epoch.is_some() { min_messages } else { 0 },
            ttl: Duration::from_secs(ttl_secs.max(1)),
            epoch: epoch.unwrap_or_default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.min_messages > 0
    }

    fn key<T: SharedEncoding>(&self, mailbox_id: i64) -> String {
        shared_key(T::NAMESPACE, &self.epoch, mailbox_id)
    }

    pub async fn get<T: SharedEncoding>(&self, mailbox_id: i64, uid_validity: u32) -> Option<T> {
        if !self.enabled() {
            return None;
        }
        match self.view.cache.value_get(&self.key::<T>(mailbox_id)).await {
            Ok(Some(value)) => T::decode(&value, uid_validity),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(error = %e, namespace = T::NAMESPACE, "shared snapshot unavailable");
                None
            }
        }
    }

    /// Stores `snapshot` when the mailbox is large enough, without waiting for it:
    /// the encoding (a large mailbox's every message) is done off the session too.
    pub fn put<T: SharedEncoding + Send + Sync + 'static>(
        &self,
        mailbox_id: i64,
        uid_validity: u32,
        snapshot: &std::sync::Arc<T>,
    ) {
        if !self.enabled() || snapshot.messages() < self.min_messages {
            return;
        }
        let (cache, key, ttl) = (self.view.cache.clone(), self.key::<T>(mailbox_id), self.ttl);
        let snapshot = snapshot.clone();
        tokio::spawn(async move {
            let value = snapshot.encode(uid_validity);
            if let Err(e) = cache.value_put(&key, &value, ttl).await {
                tracing::debug!(error = %e, "could not share a snapshot");
            }
        });
    }
}

/// Reads little-endian fields from the front of a value; every read fails
/// (`None`) past its end rather than panicking on a cut value.
pub struct Fields<'v>(&'v [u8]);

impl<'v> Fields<'v> {
    pub fn new(value: &'v [u8]) -> Self {
        Fields(value)
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'v [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }

    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }

    /// A count of items of at least `min_item` bytes each, when the value can
    /// hold that many: a corrupt count never becomes a huge allocation.
    pub fn count(&mut self, min_item: usize) -> Option<usize> {
        let n = usize::try_from(self.u32()?).ok()?;
        (n.checked_mul(min_item.max(1))? <= self.0.len()).then_some(n)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_database_epoch_is_another_key() {
        let key = shared_key("imap:index", "7301/1/2026-12-04 17:00:00+00", 5);
        assert_eq!(key, shared_key("imap:index", "7301/1/2026-12-04 17:00:00+00", 5));
        assert_ne!(key, shared_key("imap:index", "7301/2/2026-12-04 17:00:00+00", 5), "a new timeline");
        assert_ne!(key, shared_key("imap:index", "7301/1/2026-12-04 17:00:00+00", 6), "another mailbox");
        assert_ne!(key, shared_key("pop3:listing", "7301/1/2026-12-04 17:00:00+00", 5), "another kind");
        assert!(key.starts_with("imap:index:") && key.ends_with(":5"), "{key}");
    }

    #[test]
    fn fields_stop_at_the_end_of_the_value() {
        let value = [1u8, 2, 0, 3, 0, 0, 0];
        let mut f = Fields::new(&value);
        assert_eq!(f.u8(), Some(1));
        assert_eq!(f.u16(), Some(2));
        assert_eq!(f.u32(), Some(3));
        assert!(f.is_empty());
        assert_eq!(f.u8(), None);
        let mut short = Fields::new(&value[..3]);
        assert_eq!(short.u32(), None, "a field cut short");
    }

    #[test]
    fn a_count_the_value_cannot_hold_is_refused() {
        let mut value = 3u32.to_le_bytes().to_vec();
        value.extend_from_slice(&[0; 12]);
        assert_eq!(Fields::new(&value).count(4), Some(3));
        assert_eq!(Fields::new(&value).count(5), None);
        let huge = u32::MAX.to_le_bytes();
        assert_eq!(Fields::new(&huge).count(1), None);
    }
}
