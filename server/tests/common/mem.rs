//! A test-only in-memory `Cache` whose notification stream can be made to fail at
//! once (`broken_notifications`): a fault the real caches cannot be made to show on
//! demand. Not used by the server.
#![allow(dead_code)]

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use mailcluster_model::*;
use mailcluster_server::cache::{Cache, CacheResult, LockToken, MailboxEvent, RotatingSecret};

/// Notifications over a tokio broadcast channel; the rest is inert.
pub struct MemCache {
    pub tx: tokio::sync::broadcast::Sender<MailboxEvent>,
    /// Simulates a lost backend: subscriptions end at once.
    pub broken_notifications: bool,
}

impl Default for MemCache {
    fn default() -> Self {
        MemCache { tx: tokio::sync::broadcast::channel(1024).0, broken_notifications: false }
    }
}

#[async_trait]
impl Cache for MemCache {
    fn backend(&self) -> &'static str {
        "memory"
    }
    fn shared_across_processes(&self) -> bool {
        false
    }
    async fn ping(&self) -> CacheResult<()> {
        Ok(())
    }
    fn pool_stats(&self) -> PoolStats {
        PoolStats::default()
    }
    async fn credential_put(&self, _: &[u8; 32], _: i64, _: Duration) -> CacheResult<()> {
        Ok(())
    }
    async fn credential_get(&self, _: &[u8; 32]) -> CacheResult<Option<i64>> {
        Ok(None)
    }
    async fn credential_touch(&self, _: &[u8; 32], _: i64, _: Duration) -> CacheResult<()> {
        Ok(())
    }
    async fn credential_purge_account(&self, _: i64) -> CacheResult<()> {
        Ok(())
    }
    async fn counter_incr(&self, _: &str, _: Duration) -> CacheResult<u64> {
        Ok(1)
    }
    async fn counter_get(&self, _: &str) -> CacheResult<u64> {
        Ok(0)
    }
    async fn counter_decr(&self, _: &str) -> CacheResult<()> {
        Ok(())
    }
    async fn value_put(&self, _: &str, _: &[u8], _: Duration) -> CacheResult<()> {
        Ok(())
    }
    async fn value_get(&self, _: &str) -> CacheResult<Option<Vec<u8>>> {
        Ok(None)
    }
    async fn value_del(&self, _: &str) -> CacheResult<()> {
        Ok(())
    }
    async fn publish(&self, event: MailboxEvent) -> CacheResult<()> {
        let _ = self.tx.send(event);
        Ok(())
    }
    async fn subscribe(&self, account_id: i64) -> CacheResult<BoxStream<'static, MailboxEvent>> {
        if self.broken_notifications {
            return Ok(Box::pin(futures::stream::empty()));
        }
        let rx = self.tx.subscribe();
        let stream = futures::stream::unfold(rx, move |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(ev) if ev.account_id == account_id => return Some((ev, rx)),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return None,
                }
            }
        });
        Ok(Box::pin(stream))
    }
    async fn lock_try(&self, key: &str, _: Duration) -> CacheResult<Option<LockToken>> {
        Ok(Some(LockToken { key: key.into(), token: "t".into() }))
    }
    async fn lock_refresh(&self, _: &LockToken, _: Duration) -> CacheResult<bool> {
        Ok(true)
    }
    async fn lock_release(&self, _: &LockToken) -> CacheResult<()> {
        Ok(())
    }
    async fn lease_acquire(&self, _: &str, _: &str, _: u64, _: Duration) -> CacheResult<bool> {
        Ok(true)
    }
    async fn lease_renew(&self, _: &[(String, String)], _: Duration) -> CacheResult<()> {
        Ok(())
    }
    async fn lease_release(&self, _: &str, _: &str) -> CacheResult<()> {
        Ok(())
    }
    async fn lease_count(&self, _: &str) -> CacheResult<u64> {
        Ok(0)
    }
    async fn secret_get(&self, _: &str, len: usize, _: Duration) -> CacheResult<RotatingSecret> {
        Ok(RotatingSecret { current: vec![7; len], previous: None, generation: 1 })
    }
}
