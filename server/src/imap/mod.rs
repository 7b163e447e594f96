//! IMAP4rev1 sessions (RFC 3501 with IDLE, UIDPLUS, MOVE, LITERAL+, SASL-IR,
//! MULTIAPPEND, NAMESPACE, ID, ENABLE, UNSELECT, CHILDREN, SPECIAL-USE).
//!
//! A session is its connection: everything durable lives in the store, so any pod
//! can serve any user. What a session keeps is what RFC 3501 makes per-connection —
//! the selected mailbox and its sequence-number ↔ UID map (see [`selected`]).
//!
//! One file per command family: [`auth`] (CAPABILITY, LOGIN, AUTHENTICATE,
//! STARTTLS, LOGOUT, ID, ENABLE), [`mailbox`] (SELECT … STATUS), [`fetch`],
//! [`flags`] (STORE, COPY, MOVE, EXPUNGE), [`search`], [`append`], [`idle`],
//! [`quota`] (GETQUOTA, GETQUOTAROOT, SETQUOTA).
//! The grammar lives in [`crate::proto::imap`].

pub mod append;
pub mod auth;
pub mod batch;
pub mod bodies;
pub mod fetch;
pub mod flags;
pub mod idle;
pub mod index_cache;
pub(crate) mod input;
pub mod limit;
pub mod mailbox;
pub mod meta_cache;
pub mod probe;
pub mod quota;
pub mod search;
pub mod selected;
mod session;
pub mod shared_snapshot;
pub mod sort;
pub mod sort_cache;
pub mod thread;
pub mod uid_marks;

use std::sync::{Arc, Weak};

pub use session::Session;

use crate::app::App;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::net::{Protocol, SessionCtx, SessionStream};

pub use mailcluster_api::config::ImapConfig;

/// The IMAP protocol on one listener: `imap` (STARTTLS) or `imaps` (implicit TLS).
pub struct ImapProtocol {
    app: App,
    implicit_tls: bool,
    shared: Arc<Shared>,
}

/// What the read path of a process's sessions shares: the batched change probe,
/// the cache of selected mailboxes' message lists, and the batched, cached body
/// reads of FETCH.
pub(crate) struct Reads {
    pub(crate) probe: probe::ModseqProbe,
    pub(crate) bodies: bodies::BodyReader,
    pub(crate) index_cache: index_cache::IndexCache,
    /// POP3's maildrop listings, brought up to date the same way.
    pub(crate) maildrops: index_cache::IndexCache<crate::pop3::maildrop::Listing>,
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

/// State shared by the sessions of one process.
pub(crate) struct Shared {
    /// Connection leases and per-account counts, for `max_connections_per_user`.
    pub(crate) leases: limit::Leases,
    /// `mail_imap_idle_sessions`.
    pub idle_gauge: prometheus::IntGauge,
    pub(crate) reads: Reads,
}

/// The IMAP state of one process, built once (`serve`, or a test's `App`) and
/// shared by its `imap` and `imaps` listeners and all their sessions: connection
/// leases, the change probe, the SELECT cache and the body cache.
#[derive(Clone)]
pub struct ImapState(Arc<Shared>);

impl ImapState {
    /// The process's batched, cached body reads: POP3 RETR uses them too, so a
    /// message read over either protocol is in memory for the other.
    pub(crate) fn bodies(&self) -> &bodies::BodyReader {
        &self.0.reads.bodies
    }

    /// The process's cached POP3 maildrop listings.
    pub(crate) fn maildrops(&self) -> &index_cache::IndexCache<crate::pop3::maildrop::Listing> {
        &self.0.reads.maildrops
    }

    /// The database's epoch as last seen (`Some("")` for a store without one),
    /// asking the database when it was never seen; `None` when it cannot say.
    pub(crate) async fn epoch(&self, store: &dyn crate::store::Store) -> Option<Arc<str>> {
        let known = self.0.reads.epoch.read().unwrap_or_else(|p| p.into_inner()).clone();
        if known.is_some() {
            return known;
        }
        let epoch: Arc<str> = store.epoch().await.ok()?.unwrap_or_default().into();
        self.0.reads.remember_epoch(&epoch);
        Some(epoch)
    }

    pub fn new(config: &Config, store: &Arc<dyn crate::store::Store>, metrics: &Metrics) -> ImapState {
        ImapState(Arc::new(Shared::new(config, store, metrics)))
    }

    /// Clears the read caches whenever the database's epoch changes; runs until
    /// every handle to this state is gone. `serve` spawns it.
    pub fn watch_epoch(
        &self,
        store: Arc<dyn crate::store::Store>,
    ) -> impl Future<Output = ()> + Send + 'static {
        watch_epoch(Arc::downgrade(&self.0), store, EPOCH_CHECK_EVERY)
    }
}

impl Reads {
    fn remember_epoch(&self, epoch: &str) {
        let mut known = self.epoch.write().unwrap_or_else(|p| p.into_inner());
        if known.as_deref() != Some(epoch) {
            *known = Some(epoch.into());
        }
    }
}

impl Shared {
    fn new(whole: &Config, store: &Arc<dyn crate::store::Store>, metrics: &Metrics) -> Self {
        let config = &whole.imap;
        let m = &metrics.imap;
        let (select_cache, change_checks, body_cache, fetch_reads) =
            (&m.select_cache, &m.change_checks, &m.body_cache, &m.fetch_reads);
        let reads = Reads {
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
        };
        Shared { leases: limit::Leases::new(), idle_gauge: m.idle_sessions.clone(), reads }
    }
}

impl ImapProtocol {
    pub fn new(app: App, implicit_tls: bool) -> Self {
        let shared = app.imap.0.clone();
        ImapProtocol { app, implicit_tls, shared }
    }
}

/// How often a process asks the database who it is (one small query).
const EPOCH_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Clears the process's read caches when the database's epoch changes (a restore,
/// a failover): both assume the database never goes back in time — the SELECT
/// cache would show messages that no longer exist, the body cache could serve one
/// message's body under a message id handed out again. Then renews the
/// UIDVALIDITY of every mailbox whose UIDNEXT went back ([`uid_marks`]), until
/// every one could be checked. Runs until the IMAP state is dropped.
pub(crate) async fn watch_epoch(
    shared: Weak<Shared>,
    store: Arc<dyn crate::store::Store>,
    every: std::time::Duration,
) {
    let mut known: Option<String> = None;
    let mut unchecked = false;
    loop {
        if shared.strong_count() == 0 {
            return;
        }
        if let Ok(Some(epoch)) = store.epoch().await {
            let Some(shared) = shared.upgrade() else { return };
            match &known {
                Some(k) if *k != epoch => {
                    tracing::warn!(was = %k, now = %epoch, "imap: the database changed (restore or failover); read caches cleared");
                    shared.reads.index_cache.clear();
                    shared.reads.maildrops.clear();
                    shared.reads.sort_cache.clear();
                    shared.reads.metas.clear();
                    shared.reads.bodies.clear_cache();
                    unchecked = true;
                }
                _ => {}
            }
            shared.reads.remember_epoch(&epoch);
            known = Some(epoch);
            if unchecked {
                unchecked = !renew_rewound(&shared.reads.uid_marks, store.as_ref()).await;
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Renews the UIDVALIDITY of the mailboxes whose UIDNEXT in the store is below
/// what this process has seen, and ends the sessions that had them (or any
/// another process renewed) selected. False when some could not be checked.
async fn renew_rewound(marks: &uid_marks::UidMarks, store: &dyn crate::store::Store) -> bool {
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

#[async_trait::async_trait]
impl Protocol for ImapProtocol {
    fn busy_reply(&self) -> &'static [u8] {
        b"* BYE [UNAVAILABLE] Too many connections, try again later\r\n"
    }

    async fn handle(&self, stream: SessionStream, ctx: SessionCtx) {
        let is_tls = self.implicit_tls || stream.is_tls();
        let session = Session::new(self.app.clone(), self.shared.clone(), stream, ctx, is_tls);
        session.run().await;
    }
}
