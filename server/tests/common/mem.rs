//! A test-only in-memory `Store` and `Cache`, just enough for IMAP session tests
//! before (and independently of) the real embedded store. Not used by the server.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use mailcluster_server::cache::{Cache, CacheResult, LockToken, MailboxEvent, RotatingSecret};
use mailcluster_server::store::*;

#[derive(Clone)]
struct Msg {
    message_id: i64,
    flags: FlagSet,
    modseq: u64,
    internal_date: chrono::DateTime<chrono::Utc>,
}

#[derive(Default)]
struct Inner {
    accounts: Vec<Account>,
    mailboxes: BTreeMap<i64, Mailbox>,
    msgs: HashMap<i64, BTreeMap<u32, Msg>>,
    tombstones: HashMap<i64, Vec<(u32, u64)>>,
    bodies: HashMap<i64, (bytes::Bytes, MessageMeta)>,
    subs: HashMap<i64, Vec<String>>,
    next_id: i64,
}

#[derive(Default)]
pub struct MemStore {
    inner: Mutex<Inner>,
}

impl Inner {
    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }
    fn bump(&mut self, mailbox: i64) -> u64 {
        let mb = self.mailboxes.get_mut(&mailbox).expect("mailbox");
        mb.highest_modseq += 1;
        mb.highest_modseq
    }
    fn create(&mut self, account: i64, name: &str, su: Option<SpecialUse>) -> StoreResult<Mailbox> {
        if self.mailboxes.values().any(|m| m.account_id == account && m.name == name) {
            return Err(StoreError::AlreadyExists(name.into()));
        }
        let id = self.id();
        let mb = Mailbox {
            id,
            account_id: account,
            name: name.into(),
            uid_validity: id as u32 + 1000,
            uid_next: 1,
            highest_modseq: 1,
            special_use: su,
            recent_floor: 0,
        };
        self.mailboxes.insert(id, mb.clone());
        self.msgs.insert(id, BTreeMap::new());
        Ok(mb)
    }
    fn find(&self, account: i64, name: &str) -> Option<Mailbox> {
        self.mailboxes
            .values()
            .find(|m| {
                m.account_id == account
                    && (m.name == name || (name.eq_ignore_ascii_case("INBOX") && m.name == "INBOX"))
            })
            .cloned()
    }
    fn link(
        &mut self,
        dest: i64,
        message_id: i64,
        flags: FlagSet,
        date: chrono::DateTime<chrono::Utc>,
    ) -> u32 {
        let modseq = self.bump(dest);
        let mb = self.mailboxes.get_mut(&dest).expect("mailbox");
        let uid = mb.uid_next;
        mb.uid_next += 1;
        self.msgs
            .get_mut(&dest)
            .expect("msgs")
            .insert(uid, Msg { message_id, flags, modseq, internal_date: date });
        uid
    }
}

fn apply(flags: &FlagSet, op: FlagOp, change: &FlagSet) -> FlagSet {
    let mut out = flags.clone();
    match op {
        FlagOp::Add => {
            out.system = out.system.union(change.system);
            out.keywords.extend(change.keywords.iter().cloned());
        }
        FlagOp::Remove => {
            out.system = out.system.difference(change.system);
            out.keywords.retain(|k| !change.keywords.contains(k));
        }
        FlagOp::Replace => out = change.clone(),
    }
    out.keywords.sort();
    out.keywords.dedup();
    out
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
    async fn domain_add(&self, _: &str) -> StoreResult<()> {
        Ok(())
    }
    async fn domain_del(&self, _: &str) -> StoreResult<()> {
        Ok(())
    }
    async fn domain_list(&self) -> StoreResult<Vec<String>> {
        Ok(vec![])
    }
    async fn domain_exists(&self, _: &str) -> StoreResult<bool> {
        Ok(true)
    }
    async fn account_create(&self, email: &str, hash: &str) -> StoreResult<Account> {
        let mut g = self.inner.lock().expect("lock");
        let id = g.id();
        let account = Account {
            id,
            email: email.to_lowercase(),
            domain: email.rsplit('@').next().unwrap_or_default().into(),
            password_hash: hash.into(),
            created_at: chrono::Utc::now(),
        };
        g.accounts.push(account.clone());
        g.create(id, "INBOX", None)?;
        for su in SpecialUse::ALL {
            g.create(id, su.default_name(), Some(su))?;
        }
        Ok(account)
    }
    async fn account_delete(&self, _: &str) -> StoreResult<()> {
        Ok(())
    }
    async fn account_set_password(&self, _: &str, _: &str) -> StoreResult<()> {
        Ok(())
    }
    async fn account_get(&self, email: &str) -> StoreResult<Option<Account>> {
        let g = self.inner.lock().expect("lock");
        Ok(g.accounts.iter().find(|a| a.email.eq_ignore_ascii_case(email)).cloned())
    }
    async fn account_list(&self, _: Option<&str>) -> StoreResult<Vec<Account>> {
        Ok(self.inner.lock().expect("lock").accounts.clone())
    }
    async fn mailbox_list(&self, account: i64) -> StoreResult<Vec<Mailbox>> {
        let g = self.inner.lock().expect("lock");
        Ok(g.mailboxes.values().filter(|m| m.account_id == account).cloned().collect())
    }
    async fn mailbox_get(&self, account: i64, name: &str) -> StoreResult<Option<Mailbox>> {
        Ok(self.inner.lock().expect("lock").find(account, name))
    }
    async fn mailbox_get_by_id(&self, id: i64) -> StoreResult<Option<Mailbox>> {
        Ok(self.inner.lock().expect("lock").mailboxes.get(&id).cloned())
    }
    async fn mailbox_create(&self, account: i64, name: &str, su: Option<SpecialUse>) -> StoreResult<Mailbox> {
        self.inner.lock().expect("lock").create(account, name, su)
    }
    async fn mailbox_delete(&self, account: i64, name: &str) -> StoreResult<()> {
        let mut g = self.inner.lock().expect("lock");
        let mb = g.find(account, name).ok_or_else(|| StoreError::NotFound(name.into()))?;
        if mb.name == "INBOX" {
            return Err(StoreError::Invalid("INBOX".into()));
        }
        g.mailboxes.remove(&mb.id);
        g.msgs.remove(&mb.id);
        Ok(())
    }
    async fn mailbox_rename(&self, account: i64, from: &str, to: &str) -> StoreResult<()> {
        let mut g = self.inner.lock().expect("lock");
        let mb = g.find(account, from).ok_or_else(|| StoreError::NotFound(from.into()))?;
        if g.find(account, to).is_some() {
            return Err(StoreError::AlreadyExists(to.into()));
        }
        if mb.name == "INBOX" {
            let new = g.create(account, to, None)?;
            let moved = std::mem::take(g.msgs.get_mut(&mb.id).expect("msgs"));
            for (_, m) in moved {
                g.link(new.id, m.message_id, m.flags, m.internal_date);
            }
            return Ok(());
        }
        let prefix = format!("{from}/");
        for m in g.mailboxes.values_mut() {
            if m.account_id == account && (m.name == from || m.name.starts_with(&prefix)) {
                m.name = format!("{to}{}", &m.name[from.len()..]);
                m.uid_validity += 1;
            }
        }
        Ok(())
    }
    async fn mailbox_subscribe(&self, account: i64, name: &str, on: bool) -> StoreResult<()> {
        let mut g = self.inner.lock().expect("lock");
        let subs = g.subs.entry(account).or_default();
        subs.retain(|s| s != name);
        if on {
            subs.push(name.into());
        }
        Ok(())
    }
    async fn subscriptions(&self, account: i64) -> StoreResult<Vec<String>> {
        Ok(self.inner.lock().expect("lock").subs.get(&account).cloned().unwrap_or_default())
    }
    async fn mailbox_status(&self, id: i64) -> StoreResult<MailboxStatus> {
        let g = self.inner.lock().expect("lock");
        let mb = g.mailboxes.get(&id).ok_or_else(|| StoreError::NotFound("mailbox".into()))?;
        let msgs = &g.msgs[&id];
        Ok(MailboxStatus {
            messages: msgs.len() as u32,
            unseen: msgs.values().filter(|m| !m.flags.system.contains(Flags::SEEN)).count() as u32,
            uid_next: mb.uid_next,
            uid_validity: mb.uid_validity,
            highest_modseq: mb.highest_modseq,
        })
    }
    async fn recent_claim(&self, id: i64, up_to: u32) -> StoreResult<u32> {
        let mut g = self.inner.lock().expect("lock");
        let mb = g.mailboxes.get_mut(&id).ok_or_else(|| StoreError::NotFound("mailbox".into()))?;
        let before = mb.recent_floor;
        mb.recent_floor = before.max(up_to);
        Ok(before)
    }
    async fn deliver_batch(&self, batch: &[NewDelivery]) -> StoreResult<Vec<Vec<DeliveredTo>>> {
        let mut g = self.inner.lock().expect("lock");
        let mut out = Vec::new();
        for d in batch {
            let id = g.id();
            g.bodies.insert(id, (d.raw.clone(), d.meta.clone()));
            let mut to = Vec::new();
            for &t in &d.targets {
                let uid = g.link(t, id, d.flags.clone(), d.internal_date);
                to.push(DeliveredTo { mailbox_id: t, uid });
            }
            out.push(to);
        }
        Ok(out)
    }
    async fn mailbox_uids(&self, id: i64) -> StoreResult<Vec<u32>> {
        Ok(self
            .inner
            .lock()
            .expect("lock")
            .msgs
            .get(&id)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default())
    }
    async fn mailbox_index(&self, id: i64) -> StoreResult<MailboxIndex> {
        let g = self.inner.lock().expect("lock");
        let mb = g.mailboxes.get(&id).ok_or_else(|| StoreError::NotFound(format!("mailbox {id}")))?;
        let mut index =
            MailboxIndex { highest_modseq: mb.highest_modseq, uid_next: mb.uid_next, ..Default::default() };
        for (&uid, m) in g.msgs.get(&id).into_iter().flatten() {
            index.uids.push(uid);
            index.flags.push(m.flags.system);
            index.modseqs.push(m.modseq);
            if !m.flags.keywords.is_empty() {
                index.keywords.push((uid, m.flags.keywords.clone()));
            }
        }
        Ok(index)
    }
    async fn messages_by_uid(&self, id: i64, uids: &UidSet) -> StoreResult<Vec<MessageRow>> {
        let g = self.inner.lock().expect("lock");
        Ok(g.msgs[&id]
            .iter()
            .filter(|(u, _)| uids.contains(**u))
            .map(|(u, m)| MessageRow {
                uid: *u,
                message_id: m.message_id,
                flags: m.flags.clone(),
                modseq: m.modseq,
                internal_date: m.internal_date,
                meta: g.bodies[&m.message_id].1.clone(),
            })
            .collect())
    }
    async fn message_body(&self, message_id: i64) -> StoreResult<bytes::Bytes> {
        let g = self.inner.lock().expect("lock");
        g.bodies.get(&message_id).map(|b| b.0.clone()).ok_or_else(|| StoreError::NotFound("body".into()))
    }
    async fn uids_by_flags(&self, id: i64, with: Flags, without: Flags) -> StoreResult<Vec<u32>> {
        let g = self.inner.lock().expect("lock");
        Ok(g.msgs[&id]
            .iter()
            .filter(|(_, m)| m.flags.system.contains(with) && !m.flags.system.intersects(without))
            .map(|(u, _)| *u)
            .collect())
    }
    async fn store_flags(
        &self,
        id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
    ) -> StoreResult<Vec<FlagRow>> {
        let mut g = self.inner.lock().expect("lock");
        let modseq = g.bump(id);
        let mut out = Vec::new();
        for (u, m) in g.msgs.get_mut(&id).expect("msgs").iter_mut() {
            if uids.contains(*u) {
                let new = apply(&m.flags, op, flags);
                if new != m.flags {
                    m.flags = new;
                    m.modseq = modseq;
                    out.push(FlagRow { uid: *u, flags: m.flags.clone(), modseq });
                }
            }
        }
        Ok(out)
    }
    async fn store_flags_unchanged_since(
        &self,
        id: i64,
        uids: &UidSet,
        op: FlagOp,
        flags: &FlagSet,
        unchanged_since: u64,
    ) -> StoreResult<ConditionalStore> {
        let (passed, modified): (Vec<u32>, Vec<u32>) = {
            let g = self.inner.lock().expect("lock");
            let msgs = g.msgs.get(&id).ok_or_else(|| StoreError::NotFound(format!("mailbox {id}")))?;
            msgs.iter().filter(|(u, _)| uids.contains(**u)).map(|(u, m)| (*u, m.modseq)).fold(
                (Vec::new(), Vec::new()),
                |(mut p, mut f), (u, m)| {
                    if m > unchanged_since {
                        f.push(u)
                    } else {
                        p.push(u)
                    }
                    (p, f)
                },
            )
        };
        // Test and change are two steps here (a test double, not for races).
        let changed = if passed.is_empty() {
            Vec::new()
        } else {
            self.store_flags(id, &UidSet::from_uids(&passed), op, flags).await?
        };
        Ok(ConditionalStore { changed, modified })
    }
    async fn expunge(&self, id: i64, uids: Option<&UidSet>) -> StoreResult<Vec<u32>> {
        let mut g = self.inner.lock().expect("lock");
        let modseq = g.bump(id);
        let gone: Vec<u32> = g.msgs[&id]
            .iter()
            .filter(|(u, m)| match uids {
                Some(set) => set.contains(**u),
                None => m.flags.system.contains(Flags::DELETED),
            })
            .map(|(u, _)| *u)
            .collect();
        for u in &gone {
            g.msgs.get_mut(&id).expect("msgs").remove(u);
            g.tombstones.entry(id).or_default().push((*u, modseq));
        }
        Ok(gone)
    }
    async fn copy(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>> {
        let mut g = self.inner.lock().expect("lock");
        let items: Vec<(u32, Msg)> =
            g.msgs[&src].iter().filter(|(u, _)| uids.contains(**u)).map(|(u, m)| (*u, m.clone())).collect();
        Ok(items
            .into_iter()
            .map(|(u, m)| (u, g.link(dest, m.message_id, m.flags, m.internal_date)))
            .collect())
    }
    async fn move_messages(&self, src: i64, uids: &UidSet, dest: i64) -> StoreResult<Vec<(u32, u32)>> {
        let pairs = self.copy(src, uids, dest).await?;
        let moved = UidSet::from_uids(&pairs.iter().map(|p| p.0).collect::<Vec<_>>());
        self.expunge(src, Some(&moved)).await?;
        Ok(pairs)
    }
    async fn changes_since(&self, id: i64, modseq: u64) -> StoreResult<MailboxChanges> {
        let g = self.inner.lock().expect("lock");
        let highest = g.mailboxes.get(&id).map(|m| m.highest_modseq).unwrap_or(modseq);
        Ok(MailboxChanges {
            highest_modseq: highest,
            changed: g.msgs[&id]
                .iter()
                .filter(|(_, m)| m.modseq > modseq)
                .map(|(u, m)| FlagRow { uid: *u, flags: m.flags.clone(), modseq: m.modseq })
                .collect(),
            expunged: g
                .tombstones
                .get(&id)
                .map(|t| t.iter().filter(|(_, s)| *s > modseq).map(|(u, _)| *u).collect())
                .unwrap_or_default(),
            present: None,
        })
    }
    async fn queue_enqueue(&self, _: &NewQueueItem) -> StoreResult<i64> {
        Err(StoreError::Invalid("no queue".into()))
    }
    async fn queue_claim(&self, _: &str, _: u32, _: Duration) -> StoreResult<Vec<QueueItem>> {
        Ok(vec![])
    }
    async fn queue_complete(&self, _: i64) -> StoreResult<()> {
        Ok(())
    }
    async fn queue_finish(&self, _: i64, _: &str, _: &QueueAttempt) -> StoreResult<bool> {
        Ok(false)
    }
    async fn queue_release(&self, _: i64, _: &str) -> StoreResult<()> {
        Ok(())
    }
    async fn queue_list(&self, _: u32) -> StoreResult<Vec<QueueEntry>> {
        Ok(vec![])
    }
    async fn queue_get(&self, _: i64) -> StoreResult<Option<(QueueEntry, bytes::Bytes)>> {
        Ok(None)
    }
    async fn queue_retry(&self, _: Option<i64>) -> StoreResult<u64> {
        Ok(0)
    }
    async fn queue_delete(&self, _: i64) -> StoreResult<bool> {
        Ok(false)
    }
    async fn queue_stats(&self) -> StoreResult<QueueStats> {
        Ok(QueueStats::default())
    }
    // Leases back the cache only while Redis is down; the sessions under test here
    // use MemCache, so these are never reached.
    async fn lease_acquire(&self, _: &str, _: &str, _: u64, _: std::time::Duration) -> StoreResult<bool> {
        Err(StoreError::Unavailable("MemStore keeps no leases".into()))
    }
    async fn lease_extend(&self, _: &str, _: &str, _: std::time::Duration) -> StoreResult<bool> {
        Err(StoreError::Unavailable("MemStore keeps no leases".into()))
    }
    async fn lease_release(&self, _: &str, _: &str) -> StoreResult<()> {
        Err(StoreError::Unavailable("MemStore keeps no leases".into()))
    }
    async fn lease_count(&self, _: &str) -> StoreResult<u64> {
        Err(StoreError::Unavailable("MemStore keeps no leases".into()))
    }
}

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
