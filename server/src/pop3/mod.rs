//! POP3 sessions (RFC 1939 with CAPA, RESP-CODES, AUTH-RESP-CODE, PIPELINING,
//! STLS and SASL PLAIN).
//!
//! The maildrop is the account's INBOX in the shared store, so POP3 and IMAP see
//! the same messages. A session works on a snapshot taken at login (RFC 1939 §5:
//! message numbers do not change during a session); deletions are marks until QUIT
//! applies them in one store transaction. One session per maildrop at a time,
//! across all pods, through a lock in the cache that expires by itself when its
//! holder dies ([`maildrop`]).
//!
//! The grammar lives in [`crate::proto::pop3`].

pub mod maildrop;
mod session;

use crate::app::App;
use crate::net::{Protocol, SessionCtx, SessionStream};

pub use mailcluster_api::config::{MIN_AUTOLOGOUT_SECS, Pop3Config};

/// The POP3 protocol on one listener: `pop3` (STLS) or `pop3s` (implicit TLS).
pub struct Pop3Protocol {
    app: App,
    implicit_tls: bool,
}

impl Pop3Protocol {
    pub fn new(app: App, implicit_tls: bool) -> Self {
        Pop3Protocol { app, implicit_tls }
    }
}

#[async_trait::async_trait]
impl Protocol for Pop3Protocol {
    fn busy_reply(&self) -> &'static [u8] {
        b"-ERR [SYS/TEMP] Too many connections, try again later\r\n"
    }

    async fn handle(&self, stream: SessionStream, ctx: SessionCtx) {
        let tls = self.implicit_tls || stream.is_tls();
        session::Session::new(self.app.clone(), stream, ctx, tls).run().await;
    }
}
