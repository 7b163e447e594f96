//! Who an authenticated client may send as, and how much: the envelope sender
//! at MAIL, the header's originator fields after the content, and the
//! account's hourly message and recipient limits.
//!
//! Without these checks any user could put a colleague's (or the director's)
//! address in `From:`, and the message would leave DKIM-signed by the domain,
//! passing DMARC for the forgery.

use mail_parser::{HeaderName, HeaderValue, MessageParser};

use super::session::Session;
use crate::proto::smtp::{Reply, replies};

/// The header fields that name a message's author or sender (RFC 5322 §3.6.2,
/// §3.6.6): what a recipient is shown, and what DMARC aligns with.
fn originator_field(name: &HeaderName<'_>) -> Option<&'static str> {
    match name {
        HeaderName::From => Some("From"),
        HeaderName::Sender => Some("Sender"),
        HeaderName::ResentFrom => Some("Resent-From"),
        HeaderName::ResentSender => Some("Resent-Sender"),
        _ => None,
    }
}

impl Session {
    /// Whether the sender checks of submission apply to this session.
    fn checks_senders(&self) -> bool {
        self.account.is_some() && self.config().sender_must_match_auth
    }

    /// MAIL FROM of an authenticated session: `None` when the account may use
    /// `address`, else the refusal. Reads the account's aliases and allowed
    /// senders for the header check after the content.
    pub(super) async fn mail_from_refusal(&mut self, address: &str) -> Option<Reply> {
        if !self.checks_senders() {
            return None;
        }
        let email = self.account.as_ref()?.email.clone();
        if address.is_empty() {
            // Bounces come from mail systems, never from a user's client.
            self.count_refusal("sender");
            return Some(Reply::new(553, "5.7.1", "Authenticated users may not send with the null sender"));
        }
        let rights = match self.app.store.sender_rights(&email).await {
            Ok(rights) => rights,
            Err(err) => {
                tracing::warn!(error = %err, "sender rights lookup failed");
                return Some(replies::temp_failure());
            }
        };
        let permitted = rights.permits(&email, address, &self.config().recipient_delimiter);
        self.sender_rights = Some(rights);
        if permitted {
            return None;
        }
        tracing::info!(account = %email, sender = %address, "MAIL FROM refused: not the account's address");
        self.count_refusal("sender");
        Some(Reply::new(553, "5.7.1", format!("Sender address <{address}> not owned by {email}")))
    }

    /// The header of a submitted message: every address of its `From:`,
    /// `Sender:`, `Resent-From:` and `Resent-Sender:` fields must be one the
    /// account may use. `Ok` carries the domain of the first `From:` address,
    /// the one its DKIM signature may be made for (none when the message has
    /// no `From:`, or when the checks are off and it is not the account's own
    /// domain).
    pub(super) fn header_senders(&self, content: &[u8]) -> Result<Option<String>, Reply> {
        let Some(account) = self.account.as_ref() else { return Ok(None) };
        let default_rights = mailcluster_model::SenderRights::default();
        let rights = self.sender_rights.as_ref().unwrap_or(&default_rights);
        let delimiters = &self.config().recipient_delimiter;
        let check = self.checks_senders();
        let refuse = |text: String| {
            tracing::info!(account = %account.email, "message refused: {text}");
            Err(Reply::new(553, "5.7.1", text))
        };
        let Some(parsed) = MessageParser::new().parse_headers(content) else { return Ok(None) };
        let mut signing_domain = None;
        for header in parsed.headers() {
            let Some(field) = originator_field(&header.name) else { continue };
            let addresses: Vec<&str> = match &header.value {
                HeaderValue::Address(list) => list.iter().filter_map(|a| a.address.as_deref()).collect(),
                _ => Vec::new(),
            };
            let named = match &header.value {
                HeaderValue::Address(list) => list.iter().count(),
                _ => 0,
            };
            if check && (addresses.is_empty() || addresses.len() != named) {
                // What other parsers make of it cannot be known: refused.
                return refuse(format!("{field}: header without a valid address"));
            }
            for address in &addresses {
                let permitted = rights.permits(&account.email, address, delimiters);
                if check && !permitted {
                    return refuse(format!("{field}: address <{address}> not owned by {}", account.email));
                }
                if field == "From" && signing_domain.is_none() {
                    let domain =
                        address.rsplit_once('@').map(|(_, d)| d.trim_end_matches('.').to_lowercase());
                    let own = domain.as_deref().is_some_and(|d| d.eq_ignore_ascii_case(&account.domain));
                    // A sender the account may not use is never signed for,
                    // even with the checks off.
                    signing_domain = Some(domain.filter(|_| permitted || own));
                }
            }
        }
        Ok(signing_domain.flatten())
    }

    /// Counts a message against the account's hourly limit, at MAIL: counted
    /// before it is accepted, so parallel sessions cannot all slip under the
    /// limit. `None` while under it (or when the cache cannot count: the
    /// limit is not a reason to refuse service).
    pub(super) async fn message_rate_refusal(&self) -> Option<Reply> {
        let limit = self.config().submission_messages_per_hour;
        let reply = Reply::new(450, "4.7.1", "Too many messages sent in the last hour, try again later");
        self.rate_refusal("msg", limit, "message_rate", reply).await
    }

    /// Counts a recipient against the account's hourly limit, at RCPT.
    pub(super) async fn recipient_rate_refusal(&self) -> Option<Reply> {
        let limit = self.config().submission_recipients_per_hour;
        let reply = Reply::new(450, "4.7.1", "Too many recipients in the last hour, try again later");
        self.rate_refusal("rcpt", limit, "recipient_rate", reply).await
    }

    async fn rate_refusal(&self, what: &str, limit: u64, reason: &str, reply: Reply) -> Option<Reply> {
        let account = self.account.as_ref()?;
        if limit == 0 {
            return None;
        }
        let key = crate::accept::sent_counter_key(what, account.id);
        match self.app.cache.counter_incr(&key, crate::accept::SENT_WINDOW).await {
            Ok(n) if n > limit => {
                tracing::info!(account = %account.email, limit, "submission refused: hourly {what} limit");
                self.count_refusal(reason);
                Some(reply)
            }
            Ok(_) => None,
            Err(err) => {
                tracing::debug!(error = %err, "sending limit not counted");
                None
            }
        }
    }

    pub(super) fn count_refusal(&self, reason: &str) {
        self.metrics.sender_refusals.with_label_values(&[self.kind.listener_name(), reason]).inc();
    }
}
