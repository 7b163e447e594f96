//! Concurrent sessions per account (`max_connections_per_user`), across pods.
//!
//! Each logged-in session holds a lease in the cache's lease set for its account
//! ([`lease_key`]); a login that finds the set full is refused with `[LIMIT]`. The
//! cost on the login path is one cache round trip (one Lua script), and one more
//! when the session ends.
//!
//! Leases expire (`connection_lease_secs`), so a pod that dies without logging its
//! sessions out stops counting against its users after that long. A live pod keeps
//! its leases alive with one background task that renews all of them in one call
//! every third of the lease time — not one timer per session, and no traffic from
//! idle sessions.
//!
//! Each pod also keeps its own count, checked first: it spares the round trip when
//! this pod alone is at the limit, and it is what still holds when the cache is
//! unreachable. Then the login is let through (fail open): refusing every login
//! because Redis is away would turn a cache outage into a mail outage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::cache::Cache;

/// The cache lease set that counts an account's IMAP sessions on every pod.
pub fn lease_key(account_id: i64) -> String {
    format!("imap:conn:{account_id}")
}

/// This pod's leases and per-account counts.
pub struct Leases {
    /// Unique per process (random), so members from different pods never collide.
    instance: String,
    next: AtomicU64,
    /// Sessions per account on this pod.
    local: Mutex<HashMap<i64, usize>>,
    /// member → account, for the renewal task.
    held: Mutex<HashMap<String, i64>>,
    renewer_started: AtomicBool,
}

impl Default for Leases {
    fn default() -> Self {
        let mut id = [0u8; 8];
        rand::fill(&mut id);
        Leases {
            instance: crate::cache::hex(&id),
            next: AtomicU64::new(0),
            local: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            renewer_started: AtomicBool::new(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a single map operation: a panic cannot leave the
    // map half-updated, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A session's place in the per-account limit; released when dropped.
pub(crate) struct UserSlot {
    leases: Arc<Leases>,
    cache: Arc<dyn Cache>,
    account_id: i64,
    /// The cache lease, when one was taken.
    member: Option<String>,
}

/// Takes a slot for `account_id`, or `None` when the account is at `max` (0 =
/// unlimited: no slot bookkeeping beyond the local count).
pub(crate) async fn acquire(
    leases: &Arc<Leases>,
    cache: &Arc<dyn Cache>,
    account_id: i64,
    max: usize,
    lease: Duration,
) -> Option<UserSlot> {
    {
        let mut local = lock(&leases.local);
        let n = local.entry(account_id).or_insert(0);
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
    }
    // From here on the slot is counted locally; dropping it undoes that.
    let mut slot = UserSlot { leases: leases.clone(), cache: cache.clone(), account_id, member: None };
    if max == 0 {
        return Some(slot);
    }
    let member = format!("{}:{}", leases.instance, leases.next.fetch_add(1, Ordering::Relaxed));
    match cache.lease_acquire(&lease_key(account_id), &member, max as u64, lease).await {
        Ok(true) => {
            lock(&leases.held).insert(member.clone(), account_id);
            slot.member = Some(member);
            if !leases.renewer_started.swap(true, Ordering::AcqRel) {
                tokio::spawn(renew(Arc::downgrade(leases), cache.clone(), lease));
            }
            Some(slot)
        }
        Ok(false) => None,
        Err(e) => {
            tracing::debug!(error = %e, "imap: connection limit checked on this pod only");
            Some(slot)
        }
    }
}

/// Renews every lease this pod holds, every third of the lease time, until the
/// pod's IMAP state is gone.
async fn renew(leases: Weak<Leases>, cache: Arc<dyn Cache>, lease: Duration) {
    let every = (lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        let Some(leases) = leases.upgrade() else { return };
        let held: Vec<(String, String)> =
            lock(&leases.held).iter().map(|(m, a)| (lease_key(*a), m.clone())).collect();
        drop(leases);
        if held.is_empty() {
            continue;
        }
        if let Err(e) = cache.lease_renew(&held, lease).await {
            // The next round retries; until then the leases may lapse, which only
            // lets a few more sessions in, never fewer.
            tracing::debug!(error = %e, "imap: connection lease renewal failed");
        }
    }
}

impl UserSlot {
    /// Gives the lease back and waits for the cache to confirm, so that a client
    /// that saw its LOGOUT completed can log in again at once, even at the limit.
    pub(crate) async fn release(mut self) {
        let Some(member) = self.member.take() else { return };
        lock(&self.leases.held).remove(&member);
        if let Err(e) = self.cache.lease_release(&lease_key(self.account_id), &member).await {
            tracing::debug!(error = %e, "imap: connection lease release failed; it expires");
        }
    }
}

/// The local count always; the lease too when [`UserSlot::release`] was not
/// awaited (a session task cancelled at shutdown), in a task of its own.
impl Drop for UserSlot {
    fn drop(&mut self) {
        let leases = &self.leases;
        {
            let mut local = lock(&leases.local);
            if let Some(n) = local.get_mut(&self.account_id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    local.remove(&self.account_id);
                }
            }
        }
        let Some(member) = self.member.take() else { return };
        lock(&leases.held).remove(&member);
        // Outside a runtime (process exit) the lease simply expires.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let cache = self.cache.clone();
        let key = lease_key(self.account_id);
        rt.spawn(async move {
            if let Err(e) = cache.lease_release(&key, &member).await {
                tracing::debug!(error = %e, "imap: connection lease release failed; it expires");
            }
        });
    }
}
