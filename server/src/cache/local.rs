//! The in-process cache: the embedded single-pod default when no Redis is
//! configured. Same semantics as [`super::redis::RedisCache`] (TTLs, fixed-window
//! counters, lock expiry, secret rotation) so that sessions cannot tell them apart;
//! both pass `tests/cache_conformance.rs`.
//!
//! One `std::sync::Mutex` guards all maps. Every critical section is a few hash
//! operations with no `.await` inside, so a blocking mutex is cheaper than an async
//! one and contention stays negligible at single-pod scale. Expired entries are
//! removed lazily when touched and by a sweep every [`SWEEP_EVERY`] writes, which
//! keeps memory bounded by the live entries without a background task.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::broadcast;

use super::{Cache, CacheError, CacheResult, LockToken, MailboxEvent, RotatingSecret};
use mailcluster_model::PoolStats;

/// Writes between two sweeps of expired entries.
const SWEEP_EVERY: u64 = 1024;
/// Events buffered per account for slow subscribers. A subscriber that falls this
/// far behind loses its stream (see `subscribe`).
const EVENTS_PER_ACCOUNT: usize = 256;

#[derive(Debug)]
struct Expiring<T> {
    value: T,
    expires: Instant,
}

impl<T> Expiring<T> {
    fn live(&self, now: Instant) -> bool {
        self.expires > now
    }
}

#[derive(Debug)]
struct SecretEntry {
    secret: RotatingSecret,
    rotated_at: Instant,
}

#[derive(Default)]
struct State {
    credentials: HashMap<[u8; 32], Expiring<i64>>,
    /// Account id → its cached credential keys, so a purge finds them all.
    credential_index: HashMap<i64, HashSet<[u8; 32]>>,
    counters: HashMap<String, Expiring<u64>>,
    values: HashMap<String, Expiring<Vec<u8>>>,
    locks: HashMap<String, Expiring<String>>,
    /// Lease set → member → expiry.
    leases: HashMap<String, HashMap<String, Instant>>,
    secrets: HashMap<String, SecretEntry>,
    channels: HashMap<i64, broadcast::Sender<MailboxEvent>>,
    writes: u64,
}

impl State {
    /// Counts a write and, every `SWEEP_EVERY` writes, drops what has expired.
    fn note_write(&mut self, now: Instant) {
        self.writes = self.writes.wrapping_add(1);
        if !self.writes.is_multiple_of(SWEEP_EVERY) {
            return;
        }
        self.credentials.retain(|_, e| e.live(now));
        let credentials = &self.credentials;
        self.credential_index.retain(|_, keys| {
            keys.retain(|k| credentials.contains_key(k));
            !keys.is_empty()
        });
        self.counters.retain(|_, e| e.live(now));
        self.values.retain(|_, e| e.live(now));
        self.locks.retain(|_, e| e.live(now));
        self.leases.retain(|_, set| {
            set.retain(|_, expires| *expires > now);
            !set.is_empty()
        });
        self.channels.retain(|_, tx| tx.receiver_count() > 0);
    }
}

/// In-process [`Cache`]. Share it as `Arc<dyn Cache>`; every clone of the `Arc`
/// sees the same state, which is how tests simulate "another pod" for it.
#[derive(Default)]
pub struct LocalCache {
    state: Mutex<State>,
}

impl LocalCache {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> CacheResult<std::sync::MutexGuard<'_, State>> {
        // A poisoned mutex means a panic while holding it; the maps may be half
        // updated, so report the cache as broken rather than serving them.
        self.state.lock().map_err(|_| CacheError::Internal("local cache state poisoned".into()))
    }
}

fn random_token() -> String {
    let mut bytes = [0u8; 16];
    rand::fill(&mut bytes);
    super::hex(&bytes)
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::fill(&mut bytes[..]);
    bytes
}

#[async_trait]
impl Cache for LocalCache {
    fn backend(&self) -> &'static str {
        "local"
    }

    fn shared_across_processes(&self) -> bool {
        false
    }

    async fn ping(&self) -> CacheResult<()> {
        self.state().map(|_| ())
    }

    /// No connections: zeros, and `max` 0 so saturation ignores this pool.
    fn pool_stats(&self) -> PoolStats {
        PoolStats { max: 0, idle: 0, in_use: 0 }
    }

    async fn credential_put(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        let now = Instant::now();
        let mut st = self.state()?;
        if let Some(old) = st.credentials.insert(*key, Expiring { value: account_id, expires: now + ttl })
            && old.value != account_id
            && let Some(keys) = st.credential_index.get_mut(&old.value)
        {
            keys.remove(key);
        }
        st.credential_index.entry(account_id).or_default().insert(*key);
        st.note_write(now);
        Ok(())
    }

    async fn credential_get(&self, key: &[u8; 32]) -> CacheResult<Option<i64>> {
        let now = Instant::now();
        let st = self.state()?;
        Ok(st.credentials.get(key).filter(|e| e.live(now)).map(|e| e.value))
    }

    async fn credential_touch(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        let now = Instant::now();
        let mut st = self.state()?;
        if let Some(e) = st.credentials.get_mut(key).filter(|e| e.live(now) && e.value == account_id) {
            e.expires = now + ttl;
        }
        Ok(())
    }

    async fn credential_purge_account(&self, account_id: i64) -> CacheResult<()> {
        let mut st = self.state()?;
        if let Some(keys) = st.credential_index.remove(&account_id) {
            for key in keys {
                st.credentials.remove(&key);
            }
        }
        Ok(())
    }

    async fn counter_incr(&self, key: &str, window: Duration) -> CacheResult<u64> {
        let now = Instant::now();
        let mut st = self.state()?;
        let entry = st.counters.entry(key.to_owned()).or_insert(Expiring { value: 0, expires: now + window });
        if !entry.live(now) {
            // The previous window is over: this increment opens a new one.
            *entry = Expiring { value: 0, expires: now + window };
        }
        entry.value = entry.value.saturating_add(1);
        let value = entry.value;
        st.note_write(now);
        Ok(value)
    }

    async fn counter_get(&self, key: &str) -> CacheResult<u64> {
        let now = Instant::now();
        let st = self.state()?;
        Ok(st.counters.get(key).filter(|e| e.live(now)).map_or(0, |e| e.value))
    }

    async fn counter_decr(&self, key: &str) -> CacheResult<()> {
        let now = Instant::now();
        let mut st = self.state()?;
        if let Some(entry) = st.counters.get_mut(key).filter(|e| e.live(now)) {
            entry.value = entry.value.saturating_sub(1);
        }
        Ok(())
    }

    async fn value_put(&self, key: &str, value: &[u8], ttl: Duration) -> CacheResult<()> {
        let now = Instant::now();
        let mut st = self.state()?;
        st.values.insert(key.to_owned(), Expiring { value: value.to_vec(), expires: now + ttl });
        st.note_write(now);
        Ok(())
    }

    async fn value_get(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        let now = Instant::now();
        let st = self.state()?;
        Ok(st.values.get(key).filter(|e| e.live(now)).map(|e| e.value.clone()))
    }

    async fn value_del(&self, key: &str) -> CacheResult<()> {
        self.state()?.values.remove(key);
        Ok(())
    }

    async fn publish(&self, event: MailboxEvent) -> CacheResult<()> {
        let mut st = self.state()?;
        if let Some(tx) = st.channels.get(&event.account_id) {
            // `send` fails only when nobody listens any more: forget the channel.
            if tx.send(event).is_err() {
                st.channels.remove(&event.account_id);
            }
        }
        Ok(())
    }

    async fn subscribe(&self, account_id: i64) -> CacheResult<BoxStream<'static, MailboxEvent>> {
        let rx = {
            let mut st = self.state()?;
            match st.channels.get(&account_id) {
                Some(tx) => tx.subscribe(),
                None => {
                    let (tx, rx) = broadcast::channel(EVENTS_PER_ACCOUNT);
                    st.channels.insert(account_id, tx);
                    rx
                }
            }
        };
        Ok(broadcast_stream(rx))
    }

    async fn lock_try(&self, key: &str, ttl: Duration) -> CacheResult<Option<LockToken>> {
        let now = Instant::now();
        let mut st = self.state()?;
        if st.locks.get(key).is_some_and(|e| e.live(now)) {
            return Ok(None);
        }
        let token = random_token();
        st.locks.insert(key.to_owned(), Expiring { value: token.clone(), expires: now + ttl });
        st.note_write(now);
        Ok(Some(LockToken { key: key.to_owned(), token }))
    }

    async fn lock_refresh(&self, lock: &LockToken, ttl: Duration) -> CacheResult<bool> {
        let now = Instant::now();
        let mut st = self.state()?;
        match st.locks.get_mut(&lock.key) {
            Some(e) if e.live(now) && e.value == lock.token => {
                e.expires = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn lock_release(&self, lock: &LockToken) -> CacheResult<()> {
        let mut st = self.state()?;
        if st.locks.get(&lock.key).is_some_and(|e| e.value == lock.token) {
            st.locks.remove(&lock.key);
        }
        Ok(())
    }

    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> CacheResult<bool> {
        let now = Instant::now();
        let mut st = self.state()?;
        let set = st.leases.entry(key.to_owned()).or_default();
        set.retain(|_, expires| *expires > now);
        if !set.contains_key(member) && set.len() as u64 >= limit {
            return Ok(false);
        }
        set.insert(member.to_owned(), now + ttl);
        st.note_write(now);
        Ok(true)
    }

    async fn lease_renew(&self, leases: &[(String, String)], ttl: Duration) -> CacheResult<()> {
        let now = Instant::now();
        let mut st = self.state()?;
        for (key, member) in leases {
            st.leases.entry(key.clone()).or_default().insert(member.clone(), now + ttl);
        }
        st.note_write(now);
        Ok(())
    }

    async fn lease_release(&self, key: &str, member: &str) -> CacheResult<()> {
        let mut st = self.state()?;
        if let Some(set) = st.leases.get_mut(key) {
            set.remove(member);
            if set.is_empty() {
                st.leases.remove(key);
            }
        }
        Ok(())
    }

    async fn lease_count(&self, key: &str) -> CacheResult<u64> {
        let now = Instant::now();
        let st = self.state()?;
        Ok(st.leases.get(key).map_or(0, |set| set.values().filter(|e| **e > now).count() as u64))
    }

    async fn secret_get(
        &self,
        name: &str,
        len: usize,
        rotate_every: Duration,
    ) -> CacheResult<RotatingSecret> {
        let now = Instant::now();
        let mut st = self.state()?;
        let entry = st.secrets.entry(name.to_owned()).or_insert_with(|| SecretEntry {
            secret: RotatingSecret { current: random_bytes(len), previous: None, generation: 1 },
            rotated_at: now,
        });
        if now.duration_since(entry.rotated_at) >= rotate_every {
            let fresh = random_bytes(len);
            let old = std::mem::replace(&mut entry.secret.current, fresh);
            entry.secret.previous = Some(old);
            entry.secret.generation += 1;
            entry.rotated_at = now;
        }
        Ok(entry.secret.clone())
    }
}

/// Turns a broadcast receiver into the event stream `subscribe` promises.
///
/// A receiver that lagged has lost events it can no longer name, so the stream
/// ends: the caller then falls back to polling the store, which is always correct,
/// instead of sleeping through a change it was never told about.
pub(crate) fn broadcast_stream(rx: broadcast::Receiver<MailboxEvent>) -> BoxStream<'static, MailboxEvent> {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(event) => Some((event, rx)),
            Err(broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed) => None,
        }
    })
    .boxed()
}
