//! SMTP sessions: inbound MX, submission (STARTTLS) and submissions (implicit TLS).
//!
//! One [`SmtpProtocol`] per listener; each connection runs a [`session::Session`].
//! The session is split by command family: `hello.rs` (EHLO/HELO), `envelope.rs`
//! (MAIL/RCPT/RSET and recipient checks), `data.rs` (DATA/BDAT and delivery),
//! `auth.rs` (AUTH PLAIN/LOGIN), `sender.rs` (whom a user may send as, and how
//! much), `starttls.rs`, `misc.rs` (NOOP/HELP/VRFY/EXPN/QUIT).
//! Grammar and replies live in [`crate::proto::smtp`]; durable storage goes through
//! the group-committing [`crate::delivery::Deliverer`].

mod auth;
mod data;
mod envelope;
mod hello;
mod metrics;
mod misc;
mod sender;
mod session;
mod starttls;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::app::App;
use crate::delivery::DeliveryOptions;
use crate::net::{Protocol, SessionCtx, SessionStream};

pub use metrics::SmtpMetrics;

pub use mailcluster_api::config::SmtpConfig;

/// The group-commit settings of `[smtp]`, for building the [`crate::delivery::Deliverer`].
pub fn delivery_options(config: &SmtpConfig) -> DeliveryOptions {
    DeliveryOptions {
        max_batch: config.group_commit_max_batch,
        max_wait: Duration::from_millis(config.group_commit_max_wait_ms),
        max_concurrent: config.group_commit_max_concurrent,
    }
}

/// Which SMTP service a listener offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpKind {
    /// Inbound MX (port 25 → 10025): mail for local domains only, no AUTH.
    Mx,
    /// Submission (587 → 10587): STARTTLS, AUTH required.
    Submission,
    /// Submissions (465 → 10465): implicit TLS, AUTH required.
    Submissions,
}

impl SmtpKind {
    pub fn listener_name(self) -> &'static str {
        match self {
            SmtpKind::Mx => "smtp",
            SmtpKind::Submission => "submission",
            SmtpKind::Submissions => "submissions",
        }
    }

    pub fn is_submission(self) -> bool {
        !matches!(self, SmtpKind::Mx)
    }
}

/// The SMTP protocol of one listener.
pub struct SmtpProtocol {
    app: App,
    kind: SmtpKind,
    metrics: Arc<SmtpMetrics>,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl SmtpProtocol {
    pub fn new(app: App, kind: SmtpKind) -> Self {
        let metrics = Arc::new(SmtpMetrics::for_listener(&app, kind));
        SmtpProtocol { app, kind, metrics, per_ip: Arc::default() }
    }

    pub fn kind(&self) -> SmtpKind {
        self.kind
    }
}

/// Holds one connection slot of a client IP; frees it on drop (also on panic or
/// early return), so the count cannot leak.
struct IpSlot {
    map: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl IpSlot {
    fn take(map: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, limit: usize) -> Option<IpSlot> {
        let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if limit != 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(IpSlot { map: map.clone(), ip })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[async_trait::async_trait]
impl Protocol for SmtpProtocol {
    fn busy_reply(&self) -> &'static [u8] {
        b"421 4.7.0 Too many connections, try again later\r\n"
    }

    async fn handle(&self, mut stream: SessionStream, ctx: SessionCtx) {
        use tokio::io::AsyncWriteExt;
        let limit = self.app.config.smtp.max_connections_per_ip;
        let Some(_slot) = IpSlot::take(&self.per_ip, ctx.conn.remote.ip(), limit) else {
            let _ = stream.write_all(b"421 4.7.0 Too many connections from your address\r\n").await;
            stream.close().await;
            return;
        };
        // Implicit TLS: the listener normally hands over a TLS stream already; if it
        // hands a plain one, the handshake happens here before any SMTP byte.
        if self.kind == SmtpKind::Submissions && !stream.is_tls() {
            let Some(tls) = ctx.tls.clone() else {
                tracing::warn!("submissions listener without TLS configuration");
                return;
            };
            stream = match stream.upgrade(&tls).await {
                Ok(s) => s,
                Err(err) => {
                    tracing::debug!(error = %err, "implicit TLS handshake failed");
                    return;
                }
            };
        }
        session::Session::new(self.app.clone(), self.kind, self.metrics.clone(), ctx, stream.is_tls())
            .serve(stream)
            .await;
    }
}
