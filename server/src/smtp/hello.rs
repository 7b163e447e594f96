//! EHLO and HELO (RFC 5321 §4.1.1.1): greet, reset any transaction, and list the
//! extensions that apply to this listener and connection state.

use super::SmtpKind;
use super::session::{Session, Step};
use crate::proto::smtp::{Reply, sanitize};

impl Session {
    pub(super) fn cmd_hello(&mut self, host: &str, extended: bool) -> Step {
        // A new greeting aborts any transaction in progress (§4.1.4).
        self.envelope = None;
        self.bdat = None;
        let host = sanitize(host, 255);
        let mut text = if extended {
            format!("{} Hello {} [{}]", self.hostname(), host, self.conn.remote.ip())
        } else {
            self.hostname().to_string()
        };
        if extended {
            text.push_str("\nPIPELINING");
            text.push_str(&format!("\nSIZE {}", self.config().max_message_size));
            text.push_str("\n8BITMIME\nSMTPUTF8\nENHANCEDSTATUSCODES\nCHUNKING\nDSN");
            if self.starttls_available() {
                text.push_str("\nSTARTTLS");
            }
            if self.kind.is_submission() && self.auth_allowed() {
                text.push_str("\nAUTH PLAIN LOGIN");
            }
            text.push_str("\nHELP");
        }
        self.helo = Some(host);
        self.esmtp = extended;
        // RFC 2034 §3: the EHLO/HELO reply carries no enhanced status code.
        self.reply(Reply::new(250, "", text));
        Step::Continue
    }

    pub(super) fn starttls_available(&self) -> bool {
        self.tls.is_some() && !self.is_tls && self.kind != SmtpKind::Submissions
    }

    /// AUTH is offered (and accepted) only over TLS unless configured otherwise:
    /// passwords never cross the network in clear by default.
    pub(super) fn auth_allowed(&self) -> bool {
        self.is_tls || !self.config().require_tls_for_auth || self.app.config.tls.allow_plaintext_auth
    }
}
