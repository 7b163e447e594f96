//! NOOP, HELP, VRFY, EXPN, QUIT. VRFY and EXPN never reveal whether a user exists
//! (RFC 5321 §3.5.3 allows 252; address harvesting is the only use they get).

use super::session::{Session, Step};
use crate::proto::smtp::Reply;

impl Session {
    /// Commands that do not advance a transaction are cheap to send in a loop; past a
    /// limit each one counts as an error so that such a client is eventually dropped.
    pub(super) fn junk_command(&mut self) {
        self.junk += 1;
        if self.junk > self.config().max_junk_commands {
            self.errors += 1;
        }
    }

    pub(super) fn cmd_noop(&mut self) -> Step {
        self.junk_command();
        self.reply(Reply::new(250, "2.0.0", "OK"));
        Step::Continue
    }

    pub(super) fn cmd_help(&mut self) -> Step {
        self.junk_command();
        self.reply(Reply::new(
            214,
            "2.0.0",
            "Commands: EHLO HELO MAIL RCPT DATA BDAT RSET NOOP QUIT HELP VRFY STARTTLS AUTH\nSee RFC 5321",
        ));
        Step::Continue
    }

    pub(super) fn cmd_vrfy(&mut self) -> Step {
        self.junk_command();
        self.reply(Reply::new(
            252,
            "2.5.0",
            "Cannot VRFY user, but will accept message and attempt delivery",
        ));
        Step::Continue
    }

    pub(super) fn cmd_expn(&mut self) -> Step {
        self.junk_command();
        self.reply(Reply::new(502, "5.5.1", "EXPN not available"));
        Step::Continue
    }

    pub(super) fn cmd_quit(&mut self) -> Step {
        let text = format!("{} Bye", self.hostname());
        self.reply(Reply::new(221, "2.0.0", text));
        Step::Close
    }
}
