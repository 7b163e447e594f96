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

use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::net::{Protocol, SessionCtx, SessionStream};

/// RFC 1939 §3: an inactivity autologout timer, if any, must be at least 10 minutes.
pub const MIN_AUTOLOGOUT_SECS: u64 = 600;

/// `[pop3]` section of the server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Pop3Config {
    /// Longest command line. RFC 2449 allows 255 octets for commands; SASL
    /// responses can be longer.
    pub max_line_bytes: usize,
    /// Inactivity after which the session is closed without entering the UPDATE
    /// state (no deletion applied). At least 600 (RFC 1939 §3).
    pub autologout_secs: u64,
    /// Erroneous commands (unknown, malformed, wrong state, failed logins) before
    /// the connection is closed.
    pub max_errors: u32,
    /// Lifetime of the maildrop lock; the session renews it at a third of this, so
    /// a crashed holder blocks the maildrop for at most this long.
    pub lock_ttl_secs: u64,
    /// Mark messages retrieved with RETR as \Seen (applied at QUIT, with the
    /// deletions), so IMAP clients of the same account see them as read.
    pub mark_seen_on_retr: bool,
}

impl Default for Pop3Config {
    fn default() -> Self {
        Pop3Config {
            max_line_bytes: 4096,
            autologout_secs: MIN_AUTOLOGOUT_SECS,
            max_errors: 10,
            lock_ttl_secs: 60,
            mark_seen_on_retr: true,
        }
    }
}

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
