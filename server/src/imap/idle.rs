//! IDLE (RFC 2177): push changes while the client waits.
//!
//! Wake-ups come from the cache's per-account notification stream, which every
//! pod publishes to after a change, so a delivery on another pod reaches this
//! session within one notification round trip. When that stream ends (Redis
//! lost), the session polls the store every `idle_poll_secs` instead — slower,
//! never wrong, since the store is the only source of truth either way.

use std::time::Duration;

use futures::StreamExt;

use super::input::LineOutcome;
use super::session::{Outcome, Session, store_error};
use crate::cache::MailboxEvent;

enum Wake {
    Line(std::io::Result<LineOutcome>),
    Event(Option<MailboxEvent>),
    Poll,
    Timeout,
    Shutdown,
}

struct IdleGauge(prometheus::IntGauge);

impl Drop for IdleGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Session {
    pub(crate) async fn cmd_idle(&mut self, _tag: &str) -> std::io::Result<Outcome> {
        let account = self.account().map(|a| a.id).unwrap_or_default();
        let mut events = match self.app.cache.subscribe(account).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!(error = %e, "imap: IDLE without notifications, polling");
                None
            }
        };
        // Changes that happened before the subscription started are not missed:
        // report them now.
        if self.selected.is_some()
            && let Err(e) = self.sync(true).await
        {
            return Ok(store_error(e));
        }
        self.push("+ idling");
        self.flush().await?;
        self.shared.idle_gauge.inc();
        let _gauge = IdleGauge(self.shared.idle_gauge.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(self.cfg.idle_timeout_secs);
        let poll = Duration::from_secs(self.cfg.idle_poll_secs.max(1));
        let mut shutdown = self.ctx.shutdown.clone();
        loop {
            let wake = tokio::select! {
                line = self.input.read_line(&mut self.stream) => Wake::Line(line),
                ev = async { match events.as_mut() { Some(s) => s.next().await, None => std::future::pending().await } } => Wake::Event(ev),
                _ = tokio::time::sleep(poll), if events.is_none() => Wake::Poll,
                _ = tokio::time::sleep_until(deadline) => Wake::Timeout,
                _ = shutdown.signalled() => Wake::Shutdown,
            };
            match wake {
                Wake::Line(line) => {
                    return match line? {
                        LineOutcome::Line(l) if l.trim_ascii().eq_ignore_ascii_case(b"DONE") => {
                            Ok(Outcome::ok("IDLE terminated"))
                        }
                        LineOutcome::Line(_) => Ok(Outcome::bad("Expected DONE")),
                        LineOutcome::TooLong => Ok(Outcome::bad("Expected DONE")),
                        LineOutcome::Eof => Err(std::io::ErrorKind::UnexpectedEof.into()),
                    };
                }
                Wake::Event(None) => {
                    tracing::debug!("imap: notification stream ended, IDLE falls back to polling");
                    events = None;
                }
                Wake::Event(Some(ev)) => {
                    if self.selected.as_ref().is_some_and(|s| s.mailbox.id == ev.mailbox_id) {
                        self.idle_sync().await?;
                    }
                }
                Wake::Poll => self.idle_sync().await?,
                Wake::Timeout => {
                    self.push("* BYE IDLE timed out");
                    self.flush().await?;
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                Wake::Shutdown => {
                    self.push("* BYE Server shutting down");
                    self.flush().await?;
                    return Err(std::io::ErrorKind::ConnectionAborted.into());
                }
            }
        }
    }

    async fn idle_sync(&mut self) -> std::io::Result<()> {
        if self.selected.is_none() {
            return Ok(());
        }
        if self.uidvalidity_renewed() {
            self.push(super::session::UIDVALIDITY_BYE);
            self.flush().await?;
            return Err(std::io::ErrorKind::ConnectionAborted.into());
        }
        if let Err(e) = self.sync(true).await {
            // A store hiccup during IDLE is not fatal; the next wake-up retries.
            tracing::debug!(error = %e, "imap: IDLE sync failed");
        }
        self.flush().await
    }
}
