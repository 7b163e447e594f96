//! SMTP sessions: inbound MX, submission (STARTTLS) and submissions (implicit TLS).
//!
//! One [`SmtpProtocol`] per listener; each connection runs a [`session::Session`].
//! The session is split by command family: `hello.rs` (EHLO/HELO), `envelope.rs`
//! (MAIL/RCPT/RSET and recipient checks), `data.rs` (DATA/BDAT and delivery),
//! `auth.rs` (AUTH PLAIN/LOGIN), `starttls.rs`, `misc.rs` (NOOP/HELP/VRFY/EXPN/QUIT).
//! Grammar and replies live in [`crate::proto::smtp`]; durable storage goes through
//! the group-committing [`crate::delivery::Deliverer`].

mod auth;
mod data;
mod envelope;
mod hello;
mod metrics;
mod misc;
mod session;
mod starttls;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::delivery::DeliveryOptions;
use crate::net::{Protocol, SessionCtx, SessionStream};

pub use metrics::SmtpMetrics;

/// `[smtp]` section of the server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpConfig {
    /// Longest command line accepted (octets including CRLF); RFC 5321 §4.5.3.1.4
    /// asks for at least 512, extensions (AUTH initial responses) need more.
    pub max_line_length: usize,
    /// Largest message accepted (octets as sent by the client), advertised in SIZE.
    pub max_message_size: usize,
    /// After a message went over the limit, how many more octets are read and
    /// thrown away (so the client can get its 552) before the connection is closed.
    pub max_discard_size: usize,
    /// RCPT commands accepted per message; more get 452 4.5.3 (RFC 5321 §4.5.3.1.8).
    pub max_recipients: usize,
    /// Failed commands before the session is closed with 421.
    pub max_errors: u32,
    /// NOOP/RSET/VRFY/EXPN/HELP allowed per session before each counts as an error.
    pub max_junk_commands: u32,
    /// Waiting for a command (RFC 5321 §4.5.3.2.7: at least 5 minutes).
    pub command_timeout_secs: u64,
    /// Waiting for the next piece of DATA/BDAT content (§4.5.3.2.5: 3 minutes).
    pub data_timeout_secs: u64,
    /// Simultaneous sessions per client IP on one listener (0 = unlimited).
    pub max_connections_per_ip: usize,
    /// AUTH only on TLS connections (unless `tls.allow_plaintext_auth` is set).
    pub require_tls_for_auth: bool,
    /// On submission, MAIL FROM must be the authenticated account's address.
    pub sender_must_match_auth: bool,
    /// Group commit: most deliveries per store transaction.
    pub group_commit_max_batch: usize,
    /// Group commit: how long a non-full batch may wait for more while other commits
    /// are in flight (0 = never wait; batches still form under load). A message
    /// arriving at an idle server is committed at once either way.
    pub group_commit_max_wait_ms: u64,
    /// Group commit: store transactions in flight at once.
    pub group_commit_max_concurrent: usize,
    /// How long a recipient lookup (exists / does not exist) is cached.
    pub recipient_cache_ttl_secs: u64,
    /// Outbound queue: give up (and bounce) after this long.
    pub queue_expiry_secs: u64,
    /// Where mail to the bare `<postmaster>` goes, and to `postmaster@` a local
    /// domain that has no such account (RFC 5321 §4.5.1 requires both to work).
    /// Empty: `postmaster@` the server's hostname.
    pub postmaster: String,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        SmtpConfig {
            max_line_length: 4096,
            max_message_size: 25 * 1024 * 1024,
            max_discard_size: 64 * 1024 * 1024,
            max_recipients: 100,
            max_errors: 20,
            max_junk_commands: 100,
            command_timeout_secs: 300,
            data_timeout_secs: 180,
            max_connections_per_ip: 256,
            require_tls_for_auth: true,
            sender_must_match_auth: true,
            group_commit_max_batch: 256,
            group_commit_max_wait_ms: 1,
            group_commit_max_concurrent: 4,
            recipient_cache_ttl_secs: 30,
            queue_expiry_secs: 5 * 24 * 3600,
            postmaster: String::new(),
        }
    }
}

impl SmtpConfig {
    /// The group-commit settings, for building the [`crate::delivery::Deliverer`].
    pub fn delivery_options(&self) -> DeliveryOptions {
        DeliveryOptions {
            max_batch: self.group_commit_max_batch,
            max_wait: Duration::from_millis(self.group_commit_max_wait_ms),
            max_concurrent: self.group_commit_max_concurrent,
        }
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
        let metrics = Arc::new(SmtpMetrics::register(&app, kind));
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
            let _ = stream.shutdown().await;
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
