//! A store wrapper for fault injection around the real store: make deliveries fail
//! or slow, count recipient lookups, record group-commit batch sizes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use mailcluster_model::*;
use mailcluster_server::store::*;

pub struct FaultyStore {
    pub inner: Arc<dyn Store>,
    pub fail: AtomicBool,
    /// Fails deliveries into mailboxes only (the outbound queue keeps working).
    pub fail_deliveries: AtomicBool,
    pub commit_delay_ms: AtomicU64,
    pub lookups: AtomicU64,
    pub batches: Mutex<Vec<usize>>,
    /// Sizes of the `highest_modseqs` calls, and how long each holds its answer
    /// after reading it (so that requests pile up behind it).
    pub probe_batches: Mutex<Vec<usize>>,
    pub probe_delay_ms: AtomicU64,
    /// Sizes of the `message_links` calls, held like the probe's for `links_delay_ms`.
    pub link_batches: Mutex<Vec<usize>>,
    pub links_delay_ms: AtomicU64,
    /// The ids asked of each `message_bodies` call.
    pub body_reads: Mutex<Vec<Vec<i64>>>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            fail: AtomicBool::new(false),
            fail_deliveries: AtomicBool::new(false),
            commit_delay_ms: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            batches: Mutex::new(Vec::new()),
            probe_batches: Mutex::new(Vec::new()),
            probe_delay_ms: AtomicU64::new(0),
            link_batches: Mutex::new(Vec::new()),
            links_delay_ms: AtomicU64::new(0),
            body_reads: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl Operations for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn migrate(&self) -> StoreResult<()> {
        self.inner.migrate().await
    }
    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }
    fn pool_stats(&self) -> PoolStats {
        self.inner.pool_stats()
    }
    async fn lease_acquire(
        &self,
        key: &str,
        member: &str,
        limit: u64,
        ttl: std::time::Duration,
    ) -> StoreResult<bool> {
        self.inner.lease_acquire(key, member, limit, ttl).await
    }
    async fn lease_extend(&self, key: &str, member: &str, ttl: std::time::Duration) -> StoreResult<bool> {
        self.inner.lease_extend(key, member, ttl).await
    }
    async fn lease_release(&self, key: &str, member: &str) -> StoreResult<()> {
        self.inner.lease_release(key, member).await
    }
    async fn lease_count(&self, key: &str) -> StoreResult<u64> {
        self.inner.lease_count(key).await
    }
}

#[async_trait]
impl Directory for FaultyStore {
    async fn account_create(&self, email: &str, password_hash: &str) -> StoreResult<Account> {
        self.inner.account_create(email, password_hash).await
    }
    async fn accounts_import(&self, batch: &[ImportedAccount]) -> StoreResult<ImportOutcome> {
        self.inner.accounts_import(batch).await
    }
    async fn account_record_login(
        &self,
        account_id: i64,
        at: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<()> {
        self.inner.account_record_login(account_id, at).await
    }
    async fn account_last_login(&self, email: &str) -> StoreResult<Option<chrono::DateTime<chrono::Utc>>> {
        self.inner.account_last_login(email).await
    }
    async fn account_delete(&self, email: &str) -> StoreResult<()> {
        self.inner.account_delete(email).await
    }
    async fn account_set_password(&self, email: &str, password_hash: &str) -> StoreResult<()> {
        self.inner.account_set_password(email, password_hash).await
    }
    async fn account_set_enabled(&self, email: &str, enabled: bool) -> StoreResult<()> {
        self.inner.account_set_enabled(email, enabled).await
    }
    async fn account_set_display_name(&self, email: &str, name: Option<&str>) -> StoreResult<()> {
        self.inner.account_set_display_name(email, name).await
    }
    async fn account_set_quota(&self, email: &str, limit: Option<u64>) -> StoreResult<()> {
        self.inner.account_set_quota(email, limit).await
    }
    async fn quota(&self, account_id: i64) -> StoreResult<Quota> {
        self.inner.quota(account_id).await
    }
    async fn account_get(&self, email: &str) -> StoreResult<Option<Account>> {
        self.inner.account_get(email).await
    }
    async fn account_list(&self, domain: Option<&str>) -> StoreResult<Vec<Account>> {
        self.inner.account_list(domain).await
    }
}

#[async_trait]
impl Domains for FaultyStore {
    async fn domain_add(&self, domain: &str) -> StoreResult<()> {
        self.inner.domain_add(domain).await
    }
    async fn domain_del(&self, domain: &str) -> StoreResult<()> {
        self.inner.domain_del(domain).await
    }
    async fn domain_list(&self) -> StoreResult<Vec<String>> {
        self.inner.domain_list().await
    }
    async fn domain_exists(&self, domain: &str) -> StoreResult<bool> {
        self.inner.domain_exists(domain).await
    }
    async fn domain_set_catch_all(&self, domain: &str, target: Option<&str>) -> StoreResult<()> {
        self.inner.domain_set_catch_all(domain, target).await
    }
    async fn domain_catch_all(&self, domain: &str) -> StoreResult<Option<String>> {
        self.inner.domain_catch_all(domain).await
    }
    async fn domain_key_set(&self, domain: &str, key: Option<&DomainKey>) -> StoreResult<()> {
        self.inner.domain_key_set(domain, key).await
    }
    async fn domain_keys(&self) -> StoreResult<Vec<DomainKey>> {
        self.inner.domain_keys().await
    }
    async fn domain_set_quota(&self, domain: &str, limit: Option<u64>) -> StoreResult<()> {
        self.inner.domain_set_quota(domain, limit).await
    }
    async fn domain_quota(&self, domain: &str) -> StoreResult<Option<u64>> {
        self.inner.domain_quota(domain).await
    }
}

#[async_trait]
impl Addresses for FaultyStore {
    async fn alias_add(&self, address: &str, target: &str) -> StoreResult<()> {
        self.inner.alias_add(address, target).await
    }
    async fn alias_del(&self, address: &str, target: Option<&str>) -> StoreResult<()> {
        self.inner.alias_del(address, target).await
    }
    async fn alias_list(&self, domain: Option<&str>) -> StoreResult<Vec<(String, String)>> {
        self.inner.alias_list(domain).await
    }
    async fn alias_targets(&self, address: &str) -> StoreResult<Vec<String>> {
        self.inner.alias_targets(address).await
    }
    async fn account_sender_add(&self, email: &str, address: &str) -> StoreResult<()> {
        self.inner.account_sender_add(email, address).await
    }
    async fn account_sender_del(&self, email: &str, address: &str) -> StoreResult<()> {
        self.inner.account_sender_del(email, address).await
    }
    async fn sender_rights(&self, email: &str) -> StoreResult<SenderRights> {
        self.inner.sender_rights(email).await
    }
    async fn recipient(&self, address: &str, user: Option<&str>) -> StoreResult<Recipient> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.recipient(address, user).await
    }
}

#[async_trait]
impl Mailboxes for FaultyStore {
    async fn mailbox_with_quota(&self, account_id: i64, name: &str) -> StoreResult<Option<(Mailbox, Quota)>> {
        self.inner.mailbox_with_quota(account_id, name).await
    }
    async fn recent_count(&self, mailbox_id: i64) -> StoreResult<u32> {
        self.inner.recent_count(mailbox_id).await
    }
    async fn mailbox_list(&self, account_id: i64) -> StoreResult<Vec<Mailbox>> {
        self.inner.mailbox_list(account_id).await
    }
    async fn mailbox_get(&self, account_id: i64, name: &str) -> StoreResult<Option<Mailbox>> {
        self.inner.mailbox_get(account_id, name).await
    }
    async fn mailbox_get_by_id(&self, mailbox_id: i64) -> StoreResult<Option<Mailbox>> {
        self.inner.mailbox_get_by_id(mailbox_id).await
    }
    async fn mailbox_create(
        &self,
        account_id: i64,
        name: &str,
        special_use: Option<SpecialUse>,
    ) -> StoreResult<Mailbox> {
        self.inner.mailbox_create(account_id, name, special_use).await
    }
    async fn mailbox_delete(&self, account_id: i64, name: &str) -> StoreResult<()> {
        self.inner.mailbox_delete(account_id, name).await
    }
    async fn mailbox_rename(&self, account_id: i64, from: &str, to: &str) -> StoreResult<()> {
        self.inner.mailbox_rename(account_id, from, to).await
    }
    async fn mailbox_subscribe(&self, account_id: i64, name: &str, subscribed: bool) -> StoreResult<()> {
        self.inner.mailbox_subscribe(account_id, name, subscribed).await
    }
    async fn subscriptions(&self, account_id: i64) -> StoreResult<Vec<String>> {
        self.inner.subscriptions(account_id).await
    }
    async fn mailbox_size(&self, mailbox_id: i64) -> StoreResult<u64> {
        self.inner.mailbox_size(mailbox_id).await
    }
    async fn mailbox_deleted(&self, mailbox_id: i64) -> StoreResult<(u32, u64)> {
        self.inner.mailbox_deleted(mailbox_id).await
    }
    async fn mailbox_status(&self, mailbox_id: i64) -> StoreResult<MailboxStatus> {
        self.inner.mailbox_status(mailbox_id).await
    }
    async fn recent_claim(&self, mailbox_id: i64, up_to: u32) -> StoreResult<u32> {
        self.inner.recent_claim(mailbox_id, up_to).await
    }
    async fn mailbox_renew_uid_validity(&self, mailbox_id: i64, old: u32) -> StoreResult<Option<u32>> {
        self.inner.mailbox_renew_uid_validity(mailbox_id, old).await
    }
}

#[async_trait]
impl Messages for FaultyStore {
    async fn deliver_batch(&self, batch: &[NewDelivery]) -> StoreResult<Vec<Vec<DeliveredTo>>> {
        let delay = self.commit_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.fail.load(Ordering::SeqCst) || self.fail_deliveries.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("test: store down".into()));
        }
        let out = self.inner.deliver_batch(batch).await?;
        self.batches.lock().unwrap().push(batch.len());
        Ok(out)
    }
    async fn mailbox_uids(&self, mailbox_id: i64) -> StoreResult<Vec<u32>> {
        self.inner.mailbox_uids(mailbox_id).await
    }
    async fn mailbox_index(&self, mailbox_id: i64) -> StoreResult<MailboxIndex> {
        self.inner.mailbox_index(mailbox_id).await
    }
    async fn messages_by_uid(&self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<MessageRow>> {
        self.inner.messages_by_uid(mailbox_id, uids).await
    }
    async fn message_body(&self, message_id: i64) -> StoreResult<bytes::Bytes> {
        self.inner.message_body(message_id).await
    }
    async fn uids_by_flags(&self, mailbox_id: i64, with: Flags, without: Flags) -> StoreResult<Vec<u32>> {
        self.inner.uids_by_flags(mailbox_id, with, without).await
    }
    async fn store_flags(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
    ) -> StoreResult<Vec<FlagRow>> {
        self.inner.store_flags(mailbox_id, uids, op, flags).await
    }
    async fn store_flags_unchanged_since(
        &self,
        mailbox_id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
        unchanged_since: u64,
    ) -> StoreResult<ConditionalStore> {
        self.inner.store_flags_unchanged_since(mailbox_id, uids, op, flags, unchanged_since).await
    }
    async fn expunge(&self, mailbox_id: i64, uids: Option<&UidSet>) -> StoreResult<Expunged> {
        self.inner.expunge(mailbox_id, uids).await
    }
    async fn copy(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>> {
        self.inner.copy(src, uids, dest).await
    }
    async fn move_messages(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>> {
        self.inner.move_messages(src, uids, dest).await
    }
    async fn highest_modseqs(&self, mailbox_ids: &[i64]) -> StoreResult<Vec<(i64, u64)>> {
        self.probe_batches.lock().expect("lock").push(mailbox_ids.len());
        let answer = self.inner.highest_modseqs(mailbox_ids).await;
        tokio::time::sleep(Duration::from_millis(self.probe_delay_ms.load(Ordering::SeqCst))).await;
        answer
    }
    async fn message_links(&self, keys: &[(i64, u32)]) -> StoreResult<MessageLinks> {
        self.link_batches.lock().expect("lock").push(keys.len());
        let answer = self.inner.message_links(keys).await;
        tokio::time::sleep(Duration::from_millis(self.links_delay_ms.load(Ordering::SeqCst))).await;
        answer
    }
    async fn message_bodies(&self, message_ids: &[i64]) -> StoreResult<Vec<StoredBody>> {
        self.body_reads.lock().expect("lock").push(message_ids.to_vec());
        self.inner.message_bodies(message_ids).await
    }
    async fn changes_since(&self, mailbox_id: i64, modseq: u64) -> StoreResult<MailboxChanges> {
        self.inner.changes_since(mailbox_id, modseq).await
    }
}

#[async_trait]
impl Queue for FaultyStore {
    async fn queue_enqueue(&self, item: &NewQueueItem) -> StoreResult<i64> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("test: store down".into()));
        }
        self.inner.queue_enqueue(item).await
    }
    async fn queue_claim(
        &self,
        worker: &str,
        limit: u32,
        lease: std::time::Duration,
    ) -> StoreResult<Vec<QueueItem>> {
        self.inner.queue_claim(worker, limit, lease).await
    }
    async fn queue_complete(&self, id: i64) -> StoreResult<()> {
        self.inner.queue_complete(id).await
    }
    async fn queue_finish(&self, id: i64, worker: &str, attempt: &QueueAttempt) -> StoreResult<bool> {
        self.inner.queue_finish(id, worker, attempt).await
    }
    async fn queue_release(&self, id: i64, worker: &str) -> StoreResult<()> {
        self.inner.queue_release(id, worker).await
    }
    async fn queue_list(&self, limit: u32) -> StoreResult<Vec<QueueEntry>> {
        self.inner.queue_list(limit).await
    }
    async fn queue_get(&self, id: i64) -> StoreResult<Option<(QueueEntry, bytes::Bytes)>> {
        self.inner.queue_get(id).await
    }
    async fn queue_retry(&self, id: Option<i64>) -> StoreResult<u64> {
        self.inner.queue_retry(id).await
    }
    async fn queue_delete(&self, id: i64) -> StoreResult<bool> {
        self.inner.queue_delete(id).await
    }
    async fn queue_stats(&self) -> StoreResult<QueueStats> {
        self.inner.queue_stats().await
    }
}

#[async_trait]
impl Scripts for FaultyStore {
    async fn sieve_put(
        &self,
        account_id: i64,
        name: &str,
        source: &[u8],
        quota: SieveQuota,
    ) -> StoreResult<()> {
        self.inner.sieve_put(account_id, name, source, quota).await
    }
    async fn sieve_list(&self, account_id: i64) -> StoreResult<Vec<SieveEntry>> {
        self.inner.sieve_list(account_id).await
    }
    async fn sieve_get(&self, account_id: i64, name: &str) -> StoreResult<Option<Vec<u8>>> {
        self.inner.sieve_get(account_id, name).await
    }
    async fn sieve_delete(&self, account_id: i64, name: &str) -> StoreResult<()> {
        self.inner.sieve_delete(account_id, name).await
    }
    async fn sieve_rename(&self, account_id: i64, from: &str, to: &str) -> StoreResult<()> {
        self.inner.sieve_rename(account_id, from, to).await
    }
    async fn sieve_activate(&self, account_id: i64, name: Option<&str>) -> StoreResult<()> {
        self.inner.sieve_activate(account_id, name).await
    }
    async fn sieve_active(&self, account_id: i64) -> StoreResult<Option<(String, Vec<u8>)>> {
        self.inner.sieve_active(account_id).await
    }
    async fn sieve_active_digests(&self) -> StoreResult<Vec<mailcluster_server::store::ActiveScript>> {
        self.inner.sieve_active_digests().await
    }
    async fn sieve_vacation_seen(
        &self,
        account_id: i64,
        handle: &str,
        sender: &str,
        period_secs: u64,
    ) -> StoreResult<bool> {
        self.inner.sieve_vacation_seen(account_id, handle, sender, period_secs).await
    }
    async fn sieve_duplicate_seen(&self, account_id: i64, key: &str, period_secs: u64) -> StoreResult<bool> {
        self.inner.sieve_duplicate_seen(account_id, key, period_secs).await
    }
    async fn sieve_seen_prune(&self) -> StoreResult<u64> {
        self.inner.sieve_seen_prune().await
    }
}
