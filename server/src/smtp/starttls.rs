//! STARTTLS (RFC 3207).

use super::session::{Session, Step};
use crate::proto::smtp::Reply;

impl Session {
    pub(super) fn cmd_starttls(&mut self, line: &[u8]) -> Step {
        // RFC 3207 §4: STARTTLS takes no parameters.
        if line.trim_ascii().len() != b"STARTTLS".len() {
            self.reply(Reply::new(501, "5.5.4", "Syntax error (no parameters allowed)"));
            return Step::Continue;
        }
        if self.is_tls {
            self.reply(Reply::new(503, "5.5.1", "TLS already active"));
            return Step::Continue;
        }
        if !self.starttls_available() {
            self.reply(Reply::new(454, "4.7.0", "TLS not available"));
            return Step::Continue;
        }
        // Anything the client pipelined after STARTTLS was sent in clear and could
        // have been injected by a man in the middle (CVE-2011-0411): it must not be
        // executed inside the TLS session.
        self.rbuf.clear();
        self.lines.reset();
        self.reply(Reply::new(220, "2.0.0", "Ready to start TLS"));
        Step::StartTls
    }
}
