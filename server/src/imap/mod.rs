//! IMAP4rev1 sessions (RFC 3501 with IDLE, UIDPLUS, MOVE, LITERAL+, SASL-IR,
//! MULTIAPPEND, NAMESPACE, ID, ENABLE, UNSELECT, CHILDREN, SPECIAL-USE).
//!
//! A session is its connection: everything durable lives in the store, so any pod
//! can serve any user. What a session keeps is what RFC 3501 makes per-connection —
//! the selected mailbox and its sequence-number ↔ UID map (see [`selected`]).
//!
//! One file per command family: [`auth`] (CAPABILITY, LOGIN, AUTHENTICATE,
//! STARTTLS, LOGOUT, ID, ENABLE), [`mailbox`] (SELECT … STATUS), [`fetch`],
//! [`flags`] (STORE, COPY, MOVE, EXPUNGE), [`search`], [`append`], [`idle`].
//! The grammar lives in [`crate::proto::imap`].

pub mod append;
pub mod auth;
pub mod batch;
pub mod bodies;
pub mod fetch;
pub mod flags;
pub mod idle;
pub mod index_cache;
pub mod limit;
pub mod mailbox;
pub mod probe;
pub mod search;
pub mod selected;
mod session;

use std::sync::{Arc, Mutex, Weak};

pub use session::Session;

use crate::app::App;
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
    /// `mail_imap_select_cache_total{result}`.
    pub(crate) select_hits: prometheus::IntCounter,
    pub(crate) select_misses: prometheus::IntCounter,
}

/// State shared by the sessions of one process.
pub(crate) struct Shared {
    /// Connection leases and per-account counts, for `max_connections_per_user`.
    pub(crate) leases: limit::Leases,
    /// `mail_imap_idle_sessions`.
    pub idle_gauge: prometheus::IntGauge,
    pub(crate) reads: Reads,
}

/// Per-process IMAP state, one per metrics registry: the `imap` and `imaps`
/// listeners of a pod share it (and must not register the gauge twice). Keyed by
/// a `Weak` so that a dropped `Metrics` (tests build many) can never be confused
/// with a new one at the same address.
static SHARED: Mutex<Vec<(Weak<Metrics>, Arc<Shared>)>> = Mutex::new(Vec::new());

impl Shared {
    /// One per App (store, config, metrics registry): the pod's.
    fn new(app: &App) -> Self {
        let m = &app.metrics.imap;
        let (select_cache, change_checks, body_cache, fetch_reads) =
            (&m.select_cache, &m.change_checks, &m.body_cache, &m.fetch_reads);
        let reads = Reads {
            probe: probe::ModseqProbe::new(
                app.store.clone(),
                change_checks.with_label_values(&["question"]),
                change_checks.with_label_values(&["query"]),
            ),
            bodies: bodies::BodyReader::new(
                app.store.clone(),
                app.config.imap.body_cache_bytes,
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
            index_cache: index_cache::IndexCache::new(app.config.imap.select_cache_messages),
            select_hits: select_cache.with_label_values(&["hit"]),
            select_misses: select_cache.with_label_values(&["miss"]),
        };
        Shared { leases: limit::Leases::new(), idle_gauge: m.idle_sessions.clone(), reads }
    }
}

impl ImapProtocol {
    pub fn new(app: App, implicit_tls: bool) -> Self {
        let mut all = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|(m, _)| m.strong_count() > 0);
        let key = Arc::downgrade(&app.metrics);
        let shared = match all.iter().find(|(m, _)| m.ptr_eq(&key)) {
            Some((_, s)) => s.clone(),
            None => {
                let s = Arc::new(Shared::new(&app));
                all.push((key, s.clone()));
                // Outside a runtime (a test building the protocol) nothing watches.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(watch_epoch(Arc::downgrade(&s), app.store.clone(), EPOCH_CHECK_EVERY));
                }
                s
            }
        };
        drop(all);
        ImapProtocol { app, implicit_tls, shared }
    }
}

/// How often a process asks the database who it is (one small query).
const EPOCH_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Clears the process's read caches when the database's epoch changes (a restore,
/// a failover): both assume the database never goes back in time — the SELECT
/// cache would show messages that no longer exist, the body cache could serve one
/// message's body under a message id handed out again. Runs until the IMAP state
/// is dropped.
pub(crate) async fn watch_epoch(
    shared: Weak<Shared>,
    store: Arc<dyn crate::store::Store>,
    every: std::time::Duration,
) {
    let mut known: Option<String> = None;
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
                    shared.reads.bodies.clear_cache();
                }
                _ => {}
            }
            known = Some(epoch);
        }
        tokio::time::sleep(every).await;
    }
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
