//! A cache in front of another whose operations a [`Gate`] can fail or hold up:
//! the faults of a Redis that a real one cannot be made to show on cue.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use mailcluster_model::PoolStats;
use mailcluster_server::cache::{Cache, CacheResult, LockToken, MailboxEvent, RotatingSecret};

/// What a [`Gated`] cache asks before each operation.
#[async_trait]
pub trait Gate: Send + Sync + 'static {
    /// `Ok` lets operation `op` (the `Cache` method's name) through to the inner
    /// cache; an error is its answer instead. It may also never return (a hung Redis).
    async fn pass(&self, op: &'static str) -> CacheResult<()>;
}

pub struct Gated<G> {
    /// What `backend()` says: the cache this one stands for.
    pub backend: &'static str,
    pub inner: Arc<dyn Cache>,
    pub gate: G,
}

#[async_trait]
impl<G: Gate> Cache for Gated<G> {
    fn backend(&self) -> &'static str {
        self.backend
    }
    fn shared_across_processes(&self) -> bool {
        self.inner.shared_across_processes()
    }
    async fn ping(&self) -> CacheResult<()> {
        self.gate.pass("ping").await?;
        self.inner.ping().await
    }
    fn pool_stats(&self) -> PoolStats {
        self.inner.pool_stats()
    }
    async fn credential_put(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        self.gate.pass("credential_put").await?;
        self.inner.credential_put(key, account_id, ttl).await
    }
    async fn credential_get(&self, key: &[u8; 32]) -> CacheResult<Option<i64>> {
        self.gate.pass("credential_get").await?;
        self.inner.credential_get(key).await
    }
    async fn credential_touch(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        self.gate.pass("credential_touch").await?;
        self.inner.credential_touch(key, account_id, ttl).await
    }
    async fn credential_purge_account(&self, account_id: i64) -> CacheResult<()> {
        self.gate.pass("credential_purge_account").await?;
        self.inner.credential_purge_account(account_id).await
    }
    async fn counter_incr(&self, key: &str, window: Duration) -> CacheResult<u64> {
        self.gate.pass("counter_incr").await?;
        self.inner.counter_incr(key, window).await
    }
    async fn counter_get(&self, key: &str) -> CacheResult<u64> {
        self.gate.pass("counter_get").await?;
        self.inner.counter_get(key).await
    }
    async fn counter_decr(&self, key: &str) -> CacheResult<()> {
        self.gate.pass("counter_decr").await?;
        self.inner.counter_decr(key).await
    }
    async fn value_put(&self, key: &str, value: &[u8], ttl: Duration) -> CacheResult<()> {
        self.gate.pass("value_put").await?;
        self.inner.value_put(key, value, ttl).await
    }
    async fn value_get(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        self.gate.pass("value_get").await?;
        self.inner.value_get(key).await
    }
    async fn value_del(&self, key: &str) -> CacheResult<()> {
        self.gate.pass("value_del").await?;
        self.inner.value_del(key).await
    }
    async fn publish(&self, event: MailboxEvent) -> CacheResult<()> {
        self.gate.pass("publish").await?;
        self.inner.publish(event).await
    }
    async fn subscribe(&self, account_id: i64) -> CacheResult<BoxStream<'static, MailboxEvent>> {
        self.gate.pass("subscribe").await?;
        self.inner.subscribe(account_id).await
    }
    async fn lock_try(&self, key: &str, ttl: Duration) -> CacheResult<Option<LockToken>> {
        self.gate.pass("lock_try").await?;
        self.inner.lock_try(key, ttl).await
    }
    async fn lock_refresh(&self, lock: &LockToken, ttl: Duration) -> CacheResult<bool> {
        self.gate.pass("lock_refresh").await?;
        self.inner.lock_refresh(lock, ttl).await
    }
    async fn lock_release(&self, lock: &LockToken) -> CacheResult<()> {
        self.gate.pass("lock_release").await?;
        self.inner.lock_release(lock).await
    }
    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> CacheResult<bool> {
        self.gate.pass("lease_acquire").await?;
        self.inner.lease_acquire(key, member, limit, ttl).await
    }
    async fn lease_renew(&self, leases: &[(String, String)], ttl: Duration) -> CacheResult<()> {
        self.gate.pass("lease_renew").await?;
        self.inner.lease_renew(leases, ttl).await
    }
    async fn lease_release(&self, key: &str, member: &str) -> CacheResult<()> {
        self.gate.pass("lease_release").await?;
        self.inner.lease_release(key, member).await
    }
    async fn lease_count(&self, key: &str) -> CacheResult<u64> {
        self.gate.pass("lease_count").await?;
        self.inner.lease_count(key).await
    }
    async fn secret_get(&self, name: &str, len: usize, every: Duration) -> CacheResult<RotatingSecret> {
        self.gate.pass("secret_get").await?;
        self.inner.secret_get(name, len, every).await
    }
}
