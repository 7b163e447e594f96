//! Non-authenticated state and connection-level commands: CAPABILITY, STARTTLS,
//! LOGIN, AUTHENTICATE PLAIN (with SASL-IR), ID, NAMESPACE, ENABLE.

use std::fmt::Write as _;
use std::time::Duration;

use base64::Engine as _;
use imap_codec::imap_types::auth::AuthMechanism;
use imap_codec::imap_types::extensions::enable::CapabilityEnable;

use super::input::LineOutcome;
use super::session::{Outcome, Session, State};
use crate::auth::AuthOutcome;
use crate::net::SessionStream;

impl Session {
    /// Plaintext credentials are accepted only over TLS unless configured otherwise.
    fn auth_allowed(&self) -> bool {
        self.tls || self.app.config.tls.allow_plaintext_auth
    }

    pub(crate) fn capabilities(&self) -> String {
        let mut caps = String::from(
            "IMAP4rev1 IMAP4rev2 LITERAL+ SASL-IR ID ENABLE IDLE NAMESPACE UIDPLUS MOVE UNSELECT CHILDREN SPECIAL-USE CREATE-SPECIAL-USE MULTIAPPEND ESEARCH SEARCHRES SORT SORT=DISPLAY ESORT THREAD=ORDEREDSUBJECT THREAD=REFERENCES LIST-EXTENDED LIST-STATUS STATUS=SIZE BINARY WITHIN CONDSTORE QRESYNC QUOTA QUOTA=RES-STORAGE UTF8=ACCEPT OBJECTID",
        );
        // RFC 7889: one limit for every mailbox, the literal limit APPEND meets.
        let _ = write!(caps, " APPENDLIMIT={}", self.app.config.imap.max_literal_bytes);
        if self.account().is_some() && !self.stream.is_compressed() {
            caps.push_str(" COMPRESS=DEFLATE");
        }
        if self.account().is_none() {
            if !self.tls && self.ctx.tls.is_some() {
                caps.push_str(" STARTTLS");
            }
            if self.auth_allowed() {
                caps.push_str(" AUTH=PLAIN");
            } else {
                caps.push_str(" LOGINDISABLED");
            }
        }
        caps
    }

    pub(crate) fn cmd_capability(&mut self) -> Outcome {
        let caps = self.capabilities();
        self.push(&format!("* CAPABILITY {caps}"));
        Outcome::ok("CAPABILITY completed")
    }

    pub(crate) async fn cmd_starttls(&mut self, tag: &str) -> std::io::Result<Outcome> {
        if self.tls {
            return Ok(Outcome::bad("TLS is already active"));
        }
        if self.account().is_some() {
            return Ok(Outcome::bad("STARTTLS is only valid before login"));
        }
        let Some(tls) = self.ctx.tls.clone() else {
            return Ok(Outcome::no("TLS is not available"));
        };
        self.push(&format!("{tag} OK Begin TLS negotiation now"));
        self.flush().await?;
        // Anything pipelined after STARTTLS arrived in plaintext: drop it.
        self.input.discard_buffered();
        let plain = std::mem::replace(&mut self.stream, SessionStream::Memory(tokio::io::duplex(1).0));
        self.stream = plain.upgrade(&tls).await?;
        self.tls = true;
        Ok(Outcome::Sent)
    }

    /// COMPRESS DEFLATE (RFC 4978): the OK goes out uncompressed, everything after it
    /// is DEFLATE in both directions. Valid once, after login (the ABNF puts it in
    /// `command-auth`).
    pub(crate) async fn cmd_compress(&mut self, tag: &str, mechanism: &str) -> std::io::Result<Outcome> {
        if self.stream.is_compressed() {
            return Ok(Outcome::no("[COMPRESSIONACTIVE] DEFLATE is already active"));
        }
        if !mechanism.eq_ignore_ascii_case("DEFLATE") {
            return Ok(Outcome::no("Unsupported compression mechanism"));
        }
        self.push(&format!("{tag} OK DEFLATE active"));
        self.flush().await?;
        // The client waits for the OK before compressing: anything buffered was
        // sent uncompressed against the protocol, and is not executed.
        self.input.discard_buffered();
        let plain = std::mem::replace(&mut self.stream, SessionStream::Memory(tokio::io::duplex(1).0));
        self.stream = plain.compress();
        Ok(Outcome::Sent)
    }

    pub(crate) async fn cmd_login(&mut self, user: &[u8], password: &[u8]) -> Outcome {
        if self.account().is_some() {
            return Outcome::bad("Already logged in");
        }
        if !self.auth_allowed() {
            return Outcome::no("[PRIVACYREQUIRED] Use STARTTLS before LOGIN");
        }
        let (Ok(user), Ok(password)) = (std::str::from_utf8(user), std::str::from_utf8(password)) else {
            return Outcome::no("[AUTHENTICATIONFAILED] Invalid credentials");
        };
        self.login(user, password).await
    }

    async fn login(&mut self, user: &str, password: &str) -> Outcome {
        match self.app.auth.verify(user, password, self.ctx.conn.remote.ip()).await {
            AuthOutcome::Ok(account) => {
                let max = self.cfg.max_connections_per_user;
                let lease = Duration::from_secs(self.cfg.connection_lease_secs);
                let Some(slot) =
                    super::limit::acquire(&self.shared.leases, &self.app.cache, account.id, max, lease).await
                else {
                    return Outcome::no("[LIMIT] Too many connections for this account");
                };
                self.user_slot = Some(slot);
                tracing::debug!(account = account.id, "imap: login");
                self.state = State::Authenticated(account);
                let caps = self.capabilities();
                Outcome::ok(format!("[CAPABILITY {caps}] Logged in"))
            }
            AuthOutcome::Failed => Outcome::no("[AUTHENTICATIONFAILED] Invalid credentials"),
            AuthOutcome::RateLimited => Outcome::no("[UNAVAILABLE] Too many failed logins, try again later"),
            AuthOutcome::Unavailable => {
                Outcome::no("[UNAVAILABLE] Authentication is temporarily unavailable")
            }
        }
    }

    pub(crate) async fn cmd_authenticate(
        &mut self,
        mechanism: &AuthMechanism<'_>,
        initial: Option<Vec<u8>>,
    ) -> std::io::Result<Outcome> {
        if self.account().is_some() {
            return Ok(Outcome::bad("Already logged in"));
        }
        if !matches!(mechanism, AuthMechanism::Plain) {
            return Ok(Outcome::no("[CANNOT] Unsupported mechanism; use PLAIN"));
        }
        if !self.auth_allowed() {
            return Ok(Outcome::no("[PRIVACYREQUIRED] Use STARTTLS before AUTHENTICATE"));
        }
        let response = match initial {
            // imap-codec has already base64-decoded the SASL-IR argument ("=" is empty).
            Some(r) => r,
            None => {
                self.push("+ ");
                self.flush().await?;
                let line = match self.input.read_line(&mut self.stream).await? {
                    LineOutcome::Line(l) => l,
                    LineOutcome::TooLong => return Ok(Outcome::bad("Response too long")),
                    LineOutcome::Eof => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                };
                let line = line.trim_ascii_end();
                if line == b"*" {
                    return Ok(Outcome::bad("AUTHENTICATE cancelled"));
                }
                match base64::engine::general_purpose::STANDARD.decode(line) {
                    Ok(v) => v,
                    Err(_) => return Ok(Outcome::bad("Invalid base64")),
                }
            }
        };
        // PLAIN (RFC 4616): authzid NUL authcid NUL passwd.
        let mut fields = response.split(|&b| b == 0);
        let (Some(authz), Some(user), Some(pass), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Ok(Outcome::bad("Malformed PLAIN response"));
        };
        if !authz.is_empty() && authz != user {
            return Ok(Outcome::no("[AUTHORIZATIONFAILED] Proxy authorization is not supported"));
        }
        let (Ok(user), Ok(pass)) = (std::str::from_utf8(user), std::str::from_utf8(pass)) else {
            return Ok(Outcome::no("[AUTHENTICATIONFAILED] Invalid credentials"));
        };
        let (user, pass) = (user.to_string(), pass.to_string());
        Ok(self.login(&user, &pass).await)
    }

    pub(crate) fn cmd_id(&mut self) -> Outcome {
        self.push("* ID (\"name\" \"Mailcluster\")");
        Outcome::ok("ID completed")
    }

    pub(crate) fn cmd_namespace(&mut self) -> Outcome {
        if let Some(o) = self.require_auth() {
            return o;
        }
        // One personal namespace; other users' mailboxes are never visible.
        self.push("* NAMESPACE ((\"\" \"/\")) NIL NIL");
        Outcome::ok("NAMESPACE completed")
    }

    /// The first CONDSTORE-enabling command of a session (RFC 7162 §3.1): with a
    /// mailbox selected, its HIGHESTMODSEQ is announced, since the client may not
    /// have asked for it when it selected.
    pub(crate) fn enable_condstore(&mut self) {
        if self.condstore {
            return;
        }
        self.condstore = true;
        if let Some(modseq) = self.selected.as_ref().map(|s| s.modseq.max(1)) {
            self.push(&format!("* OK [HIGHESTMODSEQ {modseq}] Highest"));
        }
    }

    pub(crate) fn cmd_enable(&mut self, caps: &[CapabilityEnable<'_>]) -> Outcome {
        // RFC 5161: only what this command newly enabled is listed; unknown names
        // are ignored. QRESYNC implies CONDSTORE (RFC 7162 §3.2.3).
        let mut enabled = Vec::new();
        for cap in caps {
            match cap.to_string().to_ascii_uppercase().as_str() {
                "CONDSTORE" if !self.condstore => {
                    self.enable_condstore();
                    enabled.push("CONDSTORE");
                }
                "QRESYNC" if !self.qresync => {
                    self.qresync = true;
                    self.enable_condstore();
                    enabled.push("QRESYNC");
                }
                "UTF8=ACCEPT" if !self.utf8 => {
                    self.utf8 = true;
                    enabled.push("UTF8=ACCEPT");
                }
                // RFC 9051 §6.3.1; its mailbox names are UTF-8 (§5.1) as with
                // UTF8=ACCEPT. A session that enabled it is not announced
                // \Recent, so it claims none and leaves them to IMAP4rev1 ones.
                "IMAP4REV2" if !self.rev2 => {
                    self.rev2 = true;
                    self.utf8 = true;
                    enabled.push("IMAP4rev2");
                }
                _ => {}
            }
        }
        self.push(&format!("* ENABLED{}", enabled.iter().map(|c| format!(" {c}")).collect::<String>()));
        Outcome::ok("ENABLE completed")
    }
}
