//! Values read back from a shared cache are trusted only with a MAC made with a
//! key the cache never holds.
//!
//! Cached recipient lookups decide which account a message goes to, and cached
//! mailbox snapshots (the SELECT index, the POP3 listing) which message bodies a
//! session reads. Whoever can write Redis (a leaked password, an exposed port)
//! could otherwise send mail to another account or read another account's mail
//! by writing one key. [`Sealed`] appends HMAC-SHA256(key, name ‖ 0 ‖ value) to
//! every value it stores and checks it on every read: the name is covered, so a
//! value copied from one key to another does not verify either. A value that
//! does not verify is a miss (the caller reads the store) and is counted in
//! `mail_cache_forged_total`.
//!
//! The key ([`MacKey`]) comes from the pod's configuration (`cache.mac_key`, a
//! Kubernetes Secret), or is derived from the database URL, which carries the
//! database password and which every pod of a cluster shares, so pods keep
//! reading each other's entries.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{Cache, CacheResult, ClientCacheStats, LockToken, MailboxEvent, RotatingSecret};
use mailcluster_model::PoolStats;

const TAG_LEN: usize = 32;

/// The secret that authenticates what the pod reads back from the shared cache.
#[derive(Clone)]
pub struct MacKey([u8; 32]);

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(<redacted>)")
    }
}

/// Where a [`MacKey`] came from, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacKeySource {
    Configured,
    DatabaseUrl,
    /// Nothing shared to derive from (the embedded database): this process only.
    Random,
}

impl MacKey {
    /// `cache.mac_key` when set, else derived from `database_url`, else random.
    pub fn from_settings(configured: Option<&str>, database_url: Option<&str>) -> (MacKey, MacKeySource) {
        match (configured.filter(|k| !k.is_empty()), database_url.filter(|u| !u.is_empty())) {
            (Some(key), _) => (MacKey::derive(b"configured", key.as_bytes()), MacKeySource::Configured),
            (None, Some(url)) => (MacKey::derive(b"database-url", url.as_bytes()), MacKeySource::DatabaseUrl),
            (None, None) => (MacKey::process(), MacKeySource::Random),
        }
    }

    /// The key `config` names (see [`MacKey::from_settings`]).
    pub fn for_config(config: &crate::config::Config) -> (MacKey, MacKeySource) {
        let configured = config.cache.mac_key.as_ref().map(|k| k.expose());
        MacKey::from_settings(configured, config.database.url.as_ref().map(|u| u.expose()))
    }

    /// A random key of this process, the same for every caller in it.
    pub fn process() -> MacKey {
        static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        MacKey(*KEY.get_or_init(|| {
            let mut key = [0u8; 32];
            rand::fill(&mut key);
            key
        }))
    }

    fn derive(label: &[u8], material: &[u8]) -> MacKey {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"mailcluster cache mac key")
            .expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(&[0]);
        mac.update(material);
        MacKey(mac.finalize().into_bytes().into())
    }

    /// A key for one use (`purpose`), derived from this one, so that a MAC made
    /// for one use never verifies for another.
    pub fn subkey(&self, purpose: &str) -> [u8; 32] {
        MacKey::derive(purpose.as_bytes(), &self.0).0
    }

    fn tag(&self, name: &str, value: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = self.mac();
        mac.update(name.as_bytes());
        mac.update(&[0]);
        mac.update(value);
        mac.finalize().into_bytes().into()
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }

    /// `value` with its tag appended.
    pub fn seal(&self, name: &str, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(value.len() + TAG_LEN);
        out.extend_from_slice(value);
        out.extend_from_slice(&self.tag(name, value));
        out
    }

    /// The value in `sealed` when its tag verifies (in constant time).
    pub fn open(&self, name: &str, mut sealed: Vec<u8>) -> Option<Vec<u8>> {
        let at = sealed.len().checked_sub(TAG_LEN)?;
        let mut mac = self.mac();
        mac.update(name.as_bytes());
        mac.update(&[0]);
        mac.update(&sealed[..at]);
        mac.verify_slice(&sealed[at..]).ok()?;
        sealed.truncate(at);
        Some(sealed)
    }
}

/// A cache whose values carry a MAC (see the module documentation).
pub struct Sealed {
    inner: Arc<dyn Cache>,
    key: MacKey,
    forged: prometheus::IntCounter,
}

impl Sealed {
    pub fn new(inner: Arc<dyn Cache>, key: MacKey) -> Sealed {
        let forged = prometheus::IntCounter::new(
            "mail_cache_forged_total",
            "Values read from the shared cache whose MAC did not verify (read from the store instead)",
        )
        .expect("static metric definition is valid");
        Sealed { inner, key, forged }
    }

    /// Registers `mail_cache_forged_total`.
    pub fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.forged.clone()))
    }

    fn open(&self, key: &str, value: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let opened = self.key.open(key, value?);
        if opened.is_none() {
            self.forged.inc();
            tracing::warn!(key, "cache: a value failed its MAC check and was ignored");
        }
        opened
    }
}

#[async_trait]
impl Cache for Sealed {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn shared_across_processes(&self) -> bool {
        self.inner.shared_across_processes()
    }
    async fn ping(&self) -> CacheResult<()> {
        self.inner.ping().await
    }
    fn pool_stats(&self) -> PoolStats {
        self.inner.pool_stats()
    }
    fn client_cache_stats(&self) -> Option<ClientCacheStats> {
        self.inner.client_cache_stats()
    }

    async fn credential_put(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        self.inner.credential_put(key, account_id, ttl).await
    }
    async fn credential_get(&self, key: &[u8; 32]) -> CacheResult<Option<i64>> {
        self.inner.credential_get(key).await
    }
    async fn credential_touch(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        self.inner.credential_touch(key, account_id, ttl).await
    }
    async fn credential_purge_account(&self, account_id: i64) -> CacheResult<()> {
        self.inner.credential_purge_account(account_id).await
    }

    async fn counter_incr(&self, key: &str, window: Duration) -> CacheResult<u64> {
        self.inner.counter_incr(key, window).await
    }
    async fn counter_get(&self, key: &str) -> CacheResult<u64> {
        self.inner.counter_get(key).await
    }
    async fn counter_decr(&self, key: &str) -> CacheResult<()> {
        self.inner.counter_decr(key).await
    }
    fn counters_shared(&self) -> bool {
        self.inner.counters_shared()
    }

    async fn value_put(&self, key: &str, value: &[u8], ttl: Duration) -> CacheResult<()> {
        self.inner.value_put(key, &self.key.seal(key, value), ttl).await
    }
    async fn value_get(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        let value = self.inner.value_get(key).await?;
        Ok(self.open(key, value))
    }
    async fn value_get_hot(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        let value = self.inner.value_get_hot(key).await?;
        Ok(self.open(key, value))
    }
    async fn value_del(&self, key: &str) -> CacheResult<()> {
        self.inner.value_del(key).await
    }

    async fn publish(&self, event: MailboxEvent) -> CacheResult<()> {
        self.inner.publish(event).await
    }
    async fn publish_all(&self, events: &[MailboxEvent]) -> CacheResult<()> {
        self.inner.publish_all(events).await
    }
    async fn subscribe(&self, account_id: i64) -> CacheResult<BoxStream<'static, MailboxEvent>> {
        self.inner.subscribe(account_id).await
    }

    async fn lock_try(&self, key: &str, ttl: Duration) -> CacheResult<Option<LockToken>> {
        self.inner.lock_try(key, ttl).await
    }
    async fn lock_refresh(&self, lock: &LockToken, ttl: Duration) -> CacheResult<bool> {
        self.inner.lock_refresh(lock, ttl).await
    }
    async fn lock_release(&self, lock: &LockToken) -> CacheResult<()> {
        self.inner.lock_release(lock).await
    }

    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> CacheResult<bool> {
        self.inner.lease_acquire(key, member, limit, ttl).await
    }
    async fn lease_renew(&self, leases: &[(String, String)], ttl: Duration) -> CacheResult<()> {
        self.inner.lease_renew(leases, ttl).await
    }
    async fn lease_release(&self, key: &str, member: &str) -> CacheResult<()> {
        self.inner.lease_release(key, member).await
    }
    async fn lease_count(&self, key: &str) -> CacheResult<u64> {
        self.inner.lease_count(key).await
    }

    async fn secret_get(
        &self,
        name: &str,
        len: usize,
        rotate_every: Duration,
    ) -> CacheResult<RotatingSecret> {
        self.inner.secret_get(name, len, rotate_every).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_under_its_own_name_and_key() {
        let (key, _) = MacKey::from_settings(Some("a key of sixteen+"), None);
        let sealed = key.seal("rcpt:bob@example.org", b"42");
        assert_eq!(key.open("rcpt:bob@example.org", sealed.clone()).as_deref(), Some(&b"42"[..]));
        assert_eq!(key.open("rcpt:eve@example.org", sealed.clone()), None, "moved to another name");
        let (other, _) = MacKey::from_settings(None, Some("postgres://u:p@db/mail"));
        assert_eq!(other.open("rcpt:bob@example.org", sealed.clone()), None, "another key");
        let mut flipped = sealed;
        flipped[0] ^= 1;
        assert_eq!(key.open("rcpt:bob@example.org", flipped), None, "changed value");
        assert_eq!(key.open("x", b"short".to_vec()), None, "shorter than a tag");
    }
}
