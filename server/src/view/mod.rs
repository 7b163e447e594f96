//! The read layer of a process: what its IMAP and POP3 sessions read through,
//! shared by all of them so that a message read over one protocol is in memory
//! for the other, and so that many sessions' reads become one query.
//!
//! - [`probe`]: has a mailbox changed since a modseq (batched across sessions);
//! - [`batch`]: the batching itself; [`bodies`]: message links and bodies, cached;
//! - [`index_cache`]: selected mailboxes' message lists and POP3 maildrop
//!   listings ([`maildrop`]) as of a modseq, brought up to date from the changes;
//! - [`shared_snapshot`]: the same lists of large mailboxes in the shared cache;
//! - [`meta_cache`]: ENVELOPE, BODYSTRUCTURE and sizes; [`sort_cache`]: sort keys;
//! - [`uid_marks`]: the highest UIDNEXT seen per mailbox, for a database that goes
//!   back in time ([`View::watch_epoch`]).
//!
//! Protocol sessions use it; it uses only the store, the cache and the model.

pub mod batch;
pub mod bodies;
pub mod index_cache;
pub mod maildrop;
pub mod meta_cache;
pub mod probe;
pub mod shared_snapshot;
pub mod sort_cache;
pub mod uid_marks;

use std::sync::{Arc, Weak};

use mailcluster_api::config::Pop3Config;

use crate::cache::Cache;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::Store;

/// What the cache holds per mailbox: a listing that reflects one modseq.
pub trait Snapshot {
    /// The modseq it reflects: what changed after it comes from `changes_since`.
    fn modseq(&self) -> u64;
    /// Messages it lists: what the budget counts.
    fn messages(&self) -> usize;
}

/// The read layer of one process, which its IMAP and POP3 sessions share: the
/// batched change probe, the cached message lists of selected mailboxes and
/// maildrops, the batched, cached body reads, metadata and sort keys.
pub struct View {
    store: Arc<dyn Store>,
    cache: Arc<dyn Cache>,
    /// `mail_imap_pop3_listings_total{source}`.
    pop3_listings: prometheus::IntCounterVec,
    /// POP3's shared-listing thresholds.
    pop3: Pop3Config,
    pub(crate) probe: probe::ModseqProbe,
    pub(crate) bodies: bodies::BodyReader,
    pub(crate) index_cache: index_cache::IndexCache,
    /// POP3's maildrop listings, brought up to date the same way.
    pub(crate) maildrops: index_cache::IndexCache<maildrop::Listing>,
    pub(crate) sort_cache: sort_cache::SortCache,
    pub(crate) metas: meta_cache::MetaCache,
    /// `mail_imap_meta_cache_total{result}`.
    pub(crate) meta_hits: prometheus::IntCounter,
    pub(crate) meta_misses: prometheus::IntCounter,
    /// `mail_imap_select_cache_total{result}`.
    pub(crate) select_hits: prometheus::IntCounter,
    pub(crate) select_misses: prometheus::IntCounter,
    /// Missed the pod's own cache, found in the shared one.
    pub(crate) select_shared: prometheus::IntCounter,
    /// The database's epoch (see `watch_epoch`) once known: shared-cache keys of
    /// what a database going back in time makes wrong carry it.
    pub(crate) epoch: std::sync::RwLock<Option<Arc<str>>>,
    /// The highest UIDNEXT seen per mailbox, checked when the epoch changes.
    pub(crate) uid_marks: uid_marks::UidMarks,
}

impl View {
    pub fn new(
        whole: &Config,
        store: &Arc<dyn Store>,
        cache: Arc<dyn Cache>,
        metrics: &Metrics,
    ) -> Arc<View> {
        let config = &whole.imap;
        let m = &metrics.imap;
        let (select_cache, change_checks, body_cache, fetch_reads) =
            (&m.select_cache, &m.change_checks, &m.body_cache, &m.fetch_reads);
        Arc::new(View {
            store: store.clone(),
            cache,
            pop3_listings: m.pop3_listings.clone(),
            pop3: whole.pop3.clone(),
            probe: probe::ModseqProbe::new(
                store.clone(),
                change_checks.with_label_values(&["question"]),
                change_checks.with_label_values(&["query"]),
            ),
            bodies: bodies::BodyReader::new(
                store.clone(),
                config.body_cache_bytes,
                bodies::BodyMetrics {
                    hits: body_cache.with_label_values(&["hit"]),
                    misses: body_cache.with_label_values(&["miss"]),
                    cached_bytes: m.body_cache_bytes.clone(),
                    link_questions: fetch_reads.with_label_values(&["link", "question"]),
                    link_queries: fetch_reads.with_label_values(&["link", "query"]),
                    body_questions: fetch_reads.with_label_values(&["body", "question"]),
                    body_queries: fetch_reads.with_label_values(&["body", "query"]),
                },
            ),
            index_cache: index_cache::IndexCache::new(config.select_cache_messages),
            maildrops: index_cache::IndexCache::new(whole.pop3.maildrop_cache_messages),
            sort_cache: sort_cache::SortCache::new(config.sort_cache_messages),
            metas: meta_cache::MetaCache::new(config.meta_cache_bytes, m.meta_cache_bytes.clone()),
            meta_hits: m.meta_cache.with_label_values(&["hit"]),
            meta_misses: m.meta_cache.with_label_values(&["miss"]),
            select_hits: select_cache.with_label_values(&["hit"]),
            select_misses: select_cache.with_label_values(&["miss"]),
            select_shared: select_cache.with_label_values(&["shared"]),
            epoch: std::sync::RwLock::new(None),
            uid_marks: uid_marks::UidMarks::default(),
        })
    }

    /// The process's batched, cached body reads: POP3 RETR uses them too, so a
    /// message read over either protocol is in memory for the other.
    pub(crate) fn bodies(&self) -> &bodies::BodyReader {
        &self.bodies
    }

    /// The database's epoch as last seen (`Some("")` for a store without one),
    /// asking the database when it was never seen; `None` when it cannot say.
    pub(crate) async fn epoch(&self) -> Option<Arc<str>> {
        let known = self.epoch.read().unwrap_or_else(|p| p.into_inner()).clone();
        if known.is_some() {
            return known;
        }
        let epoch: Arc<str> = self.store.epoch().await.ok()?.unwrap_or_default().into();
        self.remember_epoch(&epoch);
        Some(epoch)
    }

    /// Clears the read caches whenever the database's epoch changes; runs until
    /// every handle to this view is gone. `serve` spawns it.
    pub fn watch_epoch(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        watch_epoch(Arc::downgrade(self), self.store.clone(), EPOCH_CHECK_EVERY)
    }

    fn remember_epoch(&self, epoch: &str) {
        let mut known = self.epoch.write().unwrap_or_else(|p| p.into_inner());
        if known.as_deref() != Some(epoch) {
            *known = Some(epoch.into());
        }
    }
}

/// How often a process asks the database who it is (one small query).
const EPOCH_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Clears the process's read caches when the database's epoch changes (a restore,
/// a failover): both assume the database never goes back in time — the SELECT
/// cache would show messages that no longer exist, the body cache could serve one
/// message's body under a message id handed out again. Then renews the
/// UIDVALIDITY of every mailbox whose UIDNEXT went back ([`uid_marks`]), until
/// every one could be checked. Runs until the view is dropped.
async fn watch_epoch(view: Weak<View>, store: Arc<dyn Store>, every: std::time::Duration) {
    let mut known: Option<String> = None;
    let mut unchecked = false;
    loop {
        if view.strong_count() == 0 {
            return;
        }
        if let Ok(Some(epoch)) = store.epoch().await {
            let Some(view) = view.upgrade() else { return };
            match &known {
                Some(k) if *k != epoch => {
                    tracing::warn!(was = %k, now = %epoch, "the database changed (restore or failover); read caches cleared");
                    view.index_cache.clear();
                    view.maildrops.clear();
                    view.sort_cache.clear();
                    view.metas.clear();
                    view.bodies.clear_cache();
                    unchecked = true;
                }
                _ => {}
            }
            view.remember_epoch(&epoch);
            known = Some(epoch);
            if unchecked {
                unchecked = !renew_rewound(&view.uid_marks, store.as_ref()).await;
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Renews the UIDVALIDITY of the mailboxes whose UIDNEXT in the store is below
/// what this process has seen, and ends the sessions that had them (or any
/// another process renewed) selected. False when some could not be checked.
async fn renew_rewound(marks: &uid_marks::UidMarks, store: &dyn Store) -> bool {
    let mut all_checked = true;
    for (mailbox_id, validity, seen_next) in marks.all() {
        let now = match store.mailbox_get_by_id(mailbox_id).await {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(mailbox_id, error = %e, "imap: mailbox not checked for reused UIDs; retrying");
                all_checked = false;
                continue;
            }
        };
        match now {
            Some(mb) if mb.uid_validity == validity && mb.uid_next >= seen_next => {}
            Some(mb) if mb.uid_validity == validity => {
                match store.mailbox_renew_uid_validity(mailbox_id, validity).await {
                    Ok(renewed) => {
                        tracing::warn!(
                            mailbox_id,
                            uid_next = mb.uid_next,
                            seen = seen_next,
                            old = validity,
                            new = ?renewed,
                            "imap: UIDNEXT went back with the database; UIDVALIDITY renewed"
                        );
                        marks.renewed(mailbox_id, validity);
                    }
                    Err(e) => {
                        tracing::warn!(mailbox_id, error = %e, "imap: UIDVALIDITY not renewed; retrying");
                        all_checked = false;
                    }
                }
            }
            // Renewed by another process, or gone: selections under the old
            // value end all the same.
            _ => marks.renewed(mailbox_id, validity),
        }
    }
    all_checked
}
