//! A test-only in-memory Store and Cache with just what SMTP uses (domains,
//! accounts, INBOX, deliver_batch, queue_enqueue, values, publish), plus switches
//! to make deliveries fail or slow so error paths and batching can be observed.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use mailcluster_server::cache::{Cache, CacheResult, LockToken, MailboxEvent, RotatingSecret};
use mailcluster_server::store::*;

#[derive(Default)]
pub struct MemStore {
    pub domains: Mutex<HashSet<String>>,
    pub accounts: Mutex<HashMap<String, Account>>,
    /// (mailbox id, raw) per stored link, in commit order.
    pub delivered: Mutex<Vec<(i64, bytes::Bytes)>>,
    pub queued: Mutex<Vec<NewQueueItem>>,
    pub batches: Mutex<Vec<usize>>,
    pub fail_deliveries: AtomicBool,
    /// Milliseconds each deliver_batch takes (to make batches form).
    pub commit_delay_ms: AtomicU64,
    pub lookups: AtomicU64,
    next_id: AtomicU64,
}

impl MemStore {
    pub fn add_domain(&self, d: &str) {
        self.domains.lock().unwrap().insert(d.to_string());
    }
    pub fn add_account(&self, email: &str, _password: &str) -> Account {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) as i64 + 1;
        let domain = email.rsplit('@').next().unwrap_or_default().to_string();
        let acc = Account {
            id,
            email: email.to_lowercase(),
            domain,
            password_hash: String::new(),
            created_at: chrono::Utc::now(),
        };
        self.accounts.lock().unwrap().insert(email.to_lowercase(), acc.clone());
        acc
    }
    /// INBOX of an account has the account's id * 100.
    pub fn inbox_of(&self, email: &str) -> i64 {
        self.accounts.lock().unwrap()[&email.to_lowercase()].id * 100
    }
    pub fn messages_in(&self, mailbox: i64) -> Vec<bytes::Bytes> {
        self.delivered.lock().unwrap().iter().filter(|(m, _)| *m == mailbox).map(|(_, r)| r.clone()).collect()
    }
}

fn unsupported<T>() -> StoreResult<T> {
    Err(StoreError::Internal("not in the test store".into()))
}

#[async_trait]
impl Store for MemStore {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn migrate(&self) -> StoreResult<()> {
        Ok(())
    }
    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }
    fn pool_stats(&self) -> PoolStats {
        PoolStats::default()
    }
    async fn domain_add(&self, domain: &str) -> StoreResult<()> {
        self.add_domain(domain);
        Ok(())
    }
    async fn domain_del(&self, _: &str) -> StoreResult<()> {
        unsupported()
    }
    async fn domain_list(&self) -> StoreResult<Vec<String>> {
        Ok(self.domains.lock().unwrap().iter().cloned().collect())
    }
    async fn domain_exists(&self, domain: &str) -> StoreResult<bool> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        Ok(self.domains.lock().unwrap().contains(&domain.to_lowercase()))
    }
    async fn account_create(&self, email: &str, _: &str) -> StoreResult<Account> {
        Ok(self.add_account(email, ""))
    }
    async fn account_delete(&self, _: &str) -> StoreResult<()> {
        unsupported()
    }
    async fn account_set_password(&self, _: &str, _: &str) -> StoreResult<()> {
        unsupported()
    }
    async fn account_get(&self, email: &str) -> StoreResult<Option<Account>> {
        Ok(self.accounts.lock().unwrap().get(&email.to_lowercase()).cloned())
    }
    async fn account_list(&self, _: Option<&str>) -> StoreResult<Vec<Account>> {
        unsupported()
    }
    async fn mailbox_list(&self, _: i64) -> StoreResult<Vec<Mailbox>> {
        unsupported()
    }
    async fn mailbox_get(&self, account_id: i64, name: &str) -> StoreResult<Option<Mailbox>> {
        if !name.eq_ignore_ascii_case("INBOX") {
            return Ok(None);
        }
        Ok(Some(Mailbox {
            id: account_id * 100,
            account_id,
            name: "INBOX".into(),
            uid_validity: 1,
            uid_next: 1,
            highest_modseq: 1,
            special_use: None,
        }))
    }
    async fn mailbox_get_by_id(&self, _: i64) -> StoreResult<Option<Mailbox>> {
        unsupported()
    }
    async fn mailbox_create(&self, _: i64, _: &str, _: Option<SpecialUse>) -> StoreResult<Mailbox> {
        unsupported()
    }
    async fn mailbox_delete(&self, _: i64, _: &str) -> StoreResult<()> {
        unsupported()
    }
    async fn mailbox_rename(&self, _: i64, _: &str, _: &str) -> StoreResult<()> {
        unsupported()
    }
    async fn mailbox_subscribe(&self, _: i64, _: &str, _: bool) -> StoreResult<()> {
        unsupported()
    }
    async fn subscriptions(&self, _: i64) -> StoreResult<Vec<String>> {
        unsupported()
    }
    async fn mailbox_status(&self, _: i64) -> StoreResult<MailboxStatus> {
        unsupported()
    }
    async fn deliver_batch(&self, batch: &[NewDelivery]) -> StoreResult<Vec<Vec<DeliveredTo>>> {
        let delay = self.commit_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.fail_deliveries.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("test: store down".into()));
        }
        self.batches.lock().unwrap().push(batch.len());
        let mut delivered = self.delivered.lock().unwrap();
        let mut out = Vec::new();
        for d in batch {
            let mut to = Vec::new();
            for &m in &d.targets {
                delivered.push((m, d.raw.clone()));
                let uid = delivered.iter().filter(|(x, _)| *x == m).count() as u32;
                to.push(DeliveredTo { mailbox_id: m, uid });
            }
            out.push(to);
        }
        Ok(out)
    }
    async fn mailbox_uids(&self, _: i64) -> StoreResult<Vec<u32>> {
        unsupported()
    }
    async fn messages_by_uid(&self, _: i64, _: &UidSet) -> StoreResult<Vec<MessageRow>> {
        unsupported()
    }
    async fn flags_by_uid(&self, _: i64, _: &UidSet) -> StoreResult<Vec<FlagRow>> {
        unsupported()
    }
    async fn message_body(&self, _: i64) -> StoreResult<bytes::Bytes> {
        unsupported()
    }
    async fn uids_by_flags(&self, _: i64, _: Flags, _: Flags) -> StoreResult<Vec<u32>> {
        unsupported()
    }
    async fn store_flags(&self, _: i64, _: &UidSet, _: FlagOp, _: &FlagSet) -> StoreResult<Vec<FlagRow>> {
        unsupported()
    }
    async fn expunge(&self, _: i64, _: Option<&UidSet>) -> StoreResult<Vec<u32>> {
        unsupported()
    }
    async fn copy(&self, _: i64, _: &UidSet, _: i64) -> StoreResult<Vec<(u32, u32)>> {
        unsupported()
    }
    async fn move_messages(&self, _: i64, _: &UidSet, _: i64) -> StoreResult<Vec<(u32, u32)>> {
        unsupported()
    }
    async fn changes_since(&self, _: i64, _: u64) -> StoreResult<MailboxChanges> {
        unsupported()
    }
    async fn queue_enqueue(&self, item: &NewQueueItem) -> StoreResult<i64> {
        if self.fail_deliveries.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("test: store down".into()));
        }
        let mut q = self.queued.lock().unwrap();
        q.push(item.clone());
        Ok(q.len() as i64)
    }
    async fn queue_claim(&self, _: &str, _: u32, _: Duration) -> StoreResult<Vec<QueueItem>> {
        unsupported()
    }
    async fn queue_complete(&self, _: i64) -> StoreResult<()> {
        unsupported()
    }
    async fn queue_fail(&self, _: i64, _: &str, _: Option<chrono::DateTime<chrono::Utc>>) -> StoreResult<()> {
        unsupported()
    }
}

#[derive(Default)]
pub struct MemCache {
    pub values: Mutex<HashMap<String, Vec<u8>>>,
    pub events: Mutex<Vec<MailboxEvent>>,
}

#[async_trait]
impl Cache for MemCache {
    fn backend(&self) -> &'static str {
        "memory"
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
    async fn credential_purge_account(&self, _: i64) -> CacheResult<()> {
        Ok(())
    }
    async fn counter_incr(&self, _: &str, _: Duration) -> CacheResult<u64> {
        Ok(1)
    }
    async fn counter_get(&self, _: &str) -> CacheResult<u64> {
        Ok(0)
    }
    async fn value_put(&self, key: &str, value: &[u8], _: Duration) -> CacheResult<()> {
        self.values.lock().unwrap().insert(key.to_string(), value.to_vec());
        Ok(())
    }
    async fn value_get(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        Ok(self.values.lock().unwrap().get(key).cloned())
    }
    async fn value_del(&self, key: &str) -> CacheResult<()> {
        self.values.lock().unwrap().remove(key);
        Ok(())
    }
    async fn publish(&self, event: MailboxEvent) -> CacheResult<()> {
        self.events.lock().unwrap().push(event);
        Ok(())
    }
    async fn subscribe(&self, _: i64) -> CacheResult<BoxStream<'static, MailboxEvent>> {
        Ok(Box::pin(futures::stream::empty()))
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
    async fn secret_get(&self, _: &str, len: usize, _: Duration) -> CacheResult<RotatingSecret> {
        Ok(RotatingSecret { current: vec![7; len], previous: None, generation: 1 })
    }
}
