//! ManageSieve sessions (RFC 5804): an account's Sieve scripts, listed,
//! stored, checked, renamed, activated and deleted from a mail client, on the
//! IMAP pods (port 4190, STARTTLS, SASL PLAIN).
//!
//! Scripts go through the process's [`crate::scripts::SieveChecker`] before
//! they are stored; the store's [`crate::store::Scripts`] role keeps them.
//! The grammar lives in [`crate::proto::managesieve`].

mod session;

use crate::app::App;
use crate::net::{Protocol, SessionCtx, SessionStream};

/// The ManageSieve protocol on its listener.
pub struct ManageSieveProtocol {
    app: App,
}

impl ManageSieveProtocol {
    pub fn new(app: App) -> Self {
        ManageSieveProtocol { app }
    }
}

#[async_trait::async_trait]
impl Protocol for ManageSieveProtocol {
    fn busy_reply(&self) -> &'static [u8] {
        b"BYE (TRYLATER) \"Too many connections, try again later\"\r\n"
    }

    async fn handle(&self, stream: SessionStream, ctx: SessionCtx) {
        let tls = stream.is_tls();
        session::Session::new(self.app.clone(), stream, ctx, tls).run().await;
    }
}
