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
pub mod fetch;
pub mod flags;
pub mod idle;
pub(crate) mod input;
pub mod limit;
pub mod mailbox;
pub mod quota;
pub mod search;
pub mod selected;
mod session;
pub mod sort;
pub mod thread;

use std::sync::Arc;

pub use session::Session;

use crate::app::App;
use crate::net::{Protocol, SessionCtx, SessionStream};
use crate::view::View;

pub use mailcluster_api::config::ImapConfig;

/// The IMAP protocol on one listener: `imap` (STARTTLS) or `imaps` (implicit TLS).
pub struct ImapProtocol {
    app: App,
    implicit_tls: bool,
    shared: Arc<Shared>,
}

/// State shared by the sessions of one process.
pub(crate) struct Shared {
    /// Connection leases and per-account counts, for `max_connections_per_user`.
    pub(crate) leases: Arc<limit::Leases>,
    /// `mail_imap_idle_sessions`.
    pub idle_gauge: prometheus::IntGauge,
    /// The process's read layer, which POP3 shares.
    pub(crate) reads: Arc<View>,
}

impl ImapProtocol {
    pub fn new(app: App, implicit_tls: bool) -> Self {
        let shared = Arc::new(Shared {
            leases: app.imap_leases.clone(),
            idle_gauge: app.metrics.imap.idle_sessions.clone(),
            reads: app.view.clone(),
        });
        ImapProtocol { app, implicit_tls, shared }
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
