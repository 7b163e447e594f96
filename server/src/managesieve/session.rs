//! The session loop: greeting (the capabilities), read a command with its
//! literals (bounded, timed, held against the pod's transfer budget), answer,
//! repeat.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use mailcluster_model::Account;
use tokio::io::AsyncWriteExt;

use crate::app::App;
use crate::auth::AuthOutcome;
use crate::config::SieveConfig;
use crate::net::budget::Reservation;
use crate::net::input::fill;
use crate::net::{SessionCtx, SessionStream};
use crate::proto::frame::{Command as Framed, CommandFramer, Limits, Line, take_octets};
use crate::proto::managesieve::{Command, ParseError, encode_string, human_text, parse_command};
use crate::proto::smtp::{SaslPlain, sasl_plain};
use crate::scripts::SieveChecker;
use crate::store::{StoreError, sieve_name_problem};

/// After login, a literal over the limit is read and dropped (so the session
/// stays in step) when it is at most this many times the limit; a larger one
/// ends the session instead of being read.
const DRAIN_FACTOR: usize = 4;

/// How a command ended, for metrics, the error count and the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Ok,
    No,
    /// A command the client should not have sent: counts towards `max_errors`.
    Strike,
    /// The session ends after this answer.
    Close,
}

/// What reading the next command produced.
enum Read {
    Command(Vec<u8>),
    LineTooLong,
    /// A literal above the limit (`busy`: within it, but the pod's transfer
    /// budget is spent); its data is on its way.
    Refused {
        size: u64,
        busy: bool,
    },
    Eof,
}

pub(super) struct Session {
    app: App,
    cfg: SieveConfig,
    stream: SessionStream,
    buf: BytesMut,
    framer: CommandFramer,
    /// The pod's transfer budget held by the command being read: its line
    /// and literals.
    held: Reservation,
    out: Vec<u8>,
    ctx: SessionCtx,
    tls: bool,
    account: Option<Account>,
    errors: u32,
}

impl Session {
    pub(super) fn new(app: App, stream: SessionStream, ctx: SessionCtx, tls: bool) -> Self {
        let cfg = app.config.sieve.clone();
        let limits = preauth_limits(&cfg);
        Session {
            held: app.budget.start("managesieve"),
            app,
            cfg,
            stream,
            buf: BytesMut::with_capacity(1024),
            framer: CommandFramer::new(limits),
            out: Vec::with_capacity(1024),
            ctx,
            tls,
            account: None,
            errors: 0,
        }
    }

    pub(super) async fn run(mut self) {
        if let Err(e) = self.serve().await {
            tracing::debug!(error = %e, "managesieve: session ended with an I/O error");
        }
        self.stream.close().await;
    }

    /// `OK`, `NO` or `BYE`, with a response code and text.
    fn respond(&mut self, kind: &str, code: Option<&str>, text: &str) {
        self.out.extend_from_slice(kind.as_bytes());
        if let Some(code) = code {
            self.out.extend_from_slice(format!(" ({code})").as_bytes());
        }
        self.out.push(b' ');
        self.out.extend_from_slice(&human_text(text));
        self.out.extend_from_slice(b"\r\n");
    }

    fn ok(&mut self, text: &str) -> Step {
        self.respond("OK", None, text);
        Step::Ok
    }

    fn no(&mut self, code: Option<&str>, text: &str) -> Step {
        self.respond("NO", code, text);
        Step::No
    }

    fn strike(&mut self, text: &str) -> Step {
        self.respond("NO", None, text);
        Step::Strike
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.out.clear();
        }
        self.stream.flush().await
    }

    async fn bye(&mut self, code: Option<&str>, text: &str) -> std::io::Result<()> {
        self.respond("BYE", code, text);
        self.flush().await
    }

    async fn serve(&mut self) -> std::io::Result<()> {
        if self.ctx.shutdown.is_signalled() {
            return self.bye(Some("TRYLATER"), "Server shutting down").await;
        }
        self.capabilities();
        self.ok("Mailcluster ManageSieve ready");
        let login_deadline = Instant::now() + Duration::from_secs(self.cfg.preauth_timeout_secs);
        loop {
            self.flush().await?;
            // Before login the session also ends at its deadline, however busy
            // the client keeps it.
            let idle = Duration::from_secs(self.cfg.idle_timeout_secs);
            let timeout = match self.account {
                Some(_) => idle,
                None => idle.min(login_deadline.saturating_duration_since(Instant::now())),
            };
            let mut shutdown = self.ctx.shutdown.clone();
            let read = tokio::select! {
                r = tokio::time::timeout(timeout, self.read_command()) => r,
                _ = shutdown.signalled() => return self.bye(Some("TRYLATER"), "Server shutting down").await,
            };
            let started = Instant::now();
            let (label, step) = match read {
                Err(_) => return self.bye(None, "Idle for too long").await,
                Ok(read) => match read? {
                    Read::Eof => return Ok(()),
                    Read::LineTooLong => return self.bye(None, "Command line too long").await,
                    Read::Refused { size, busy } => {
                        let Some(step) = self.refuse_literal(size, busy).await? else { return Ok(()) };
                        ("literal", step)
                    }
                    Read::Command(line) => match parse_command(&line) {
                        Ok(cmd) => (cmd.label(), self.dispatch(cmd).await?),
                        Err(ParseError::Unknown) => ("unknown", self.strike("Unknown command")),
                        Err(ParseError::Syntax(why)) => {
                            ("syntax", self.strike(&format!("Syntax error: {why}")))
                        }
                    },
                },
            };
            let m = &self.app.metrics;
            let result = if step == Step::Ok || step == Step::Close { "ok" } else { "err" };
            m.commands_total.with_label_values(&["managesieve", label, result]).inc();
            m.command_duration
                .with_label_values(&["managesieve", label])
                .observe(started.elapsed().as_secs_f64());
            if step == Step::Close {
                return self.flush().await;
            }
            if step == Step::Strike {
                self.errors += 1;
                if self.cfg.max_errors > 0 && self.errors >= self.cfg.max_errors {
                    return self.bye(None, "Too many errors").await;
                }
            }
        }
    }

    /// The next command, its literals inlined. Its line and literals are held
    /// against the pod's transfer budget before they are read.
    async fn read_command(&mut self) -> std::io::Result<Read> {
        self.held.clear();
        if !self.held.grow_to(self.framer.lines.max_line()) {
            return Ok(Read::Refused { size: 0, busy: true });
        }
        loop {
            let held = &mut self.held;
            let max_line = self.framer.lines.max_line();
            match self.framer.next_command_with(&mut self.buf, |size| held.grow_to(size + max_line)) {
                Framed::Complete(cmd) => return Ok(Read::Command(cmd)),
                Framed::LineTooLong => return Ok(Read::LineTooLong),
                Framed::LiteralTooLarge { size, .. } => return Ok(Read::Refused { size, busy: false }),
                Framed::LiteralRefused { size, .. } => return Ok(Read::Refused { size, busy: true }),
                // No continuation in ManageSieve: the data of `{n}` follows as
                // that of `{n+}` does.
                Framed::SendContinuation => {}
                Framed::NeedMore => {
                    if !fill(&mut self.stream, &mut self.buf, self.framer.literal_left()).await? {
                        return Ok(Read::Eof);
                    }
                }
            }
        }
    }

    /// A literal not taken: its data is already on its way. Before login the
    /// session ends (nothing of it is read); after, it is read and dropped
    /// when not too large, and the command refused. `None`: the session ends.
    async fn refuse_literal(&mut self, size: u64, busy: bool) -> std::io::Result<Option<Step>> {
        let drain_cap = (self.cfg.max_script_bytes.saturating_mul(DRAIN_FACTOR)) as u64;
        if self.account.is_none() || size > drain_cap {
            let text = format!("Literal of {size} octets refused");
            self.bye(if busy { Some("TRYLATER") } else { None }, &text).await?;
            return Ok(None);
        }
        let mut left = size as usize;
        loop {
            drop(take_octets(&mut self.buf, &mut left));
            if left == 0 {
                break;
            }
            if !fill(&mut self.stream, &mut self.buf, left).await? {
                return Ok(None);
            }
        }
        // The rest of the command's line goes with it.
        while let Line::NeedMore = self.framer.lines.next_line(&mut self.buf) {
            if !fill(&mut self.stream, &mut self.buf, 0).await? {
                return Ok(None);
            }
        }
        self.framer.reset();
        Ok(Some(if busy {
            self.no(Some("TRYLATER"), "Server busy, try again later")
        } else {
            let max = self.cfg.max_script_bytes;
            self.no(Some("QUOTA/MAXSIZE"), &format!("Literal of {size} octets is over the limit of {max}"))
        }))
    }

    /// Plaintext credentials only over TLS unless configured otherwise.
    fn auth_allowed(&self) -> bool {
        self.tls || self.app.config.tls.allow_plaintext_auth
    }

    /// The capability lines (RFC 5804 §1.7), without the OK after them.
    fn capabilities(&mut self) {
        let mut caps: Vec<(&str, String)> = vec![("IMPLEMENTATION", "Mailcluster".into())];
        let sasl = if self.account.is_none() && self.auth_allowed() { "PLAIN" } else { "" };
        caps.push(("SASL", sasl.into()));
        caps.push(("SIEVE", self.app.sieve.extensions().join(" ")));
        if !self.tls && self.account.is_none() && self.ctx.tls.is_some() {
            caps.push(("STARTTLS", String::new()));
        }
        caps.push(("MAXREDIRECTS", self.cfg.max_redirects.to_string()));
        caps.push(("VERSION", "1.0".into()));
        if let Some(account) = &self.account {
            caps.push(("OWNER", account.email.clone()));
        }
        for (name, value) in caps {
            encode_string(&mut self.out, name.as_bytes());
            if name != "STARTTLS" {
                self.out.push(b' ');
                encode_string(&mut self.out, value.as_bytes());
            }
            self.out.extend_from_slice(b"\r\n");
        }
    }

    async fn dispatch(&mut self, cmd: Command) -> std::io::Result<Step> {
        let Some(account) = self.account.clone() else {
            return match cmd {
                Command::StartTls => self.starttls().await,
                Command::Authenticate { mechanism, initial } => self.authenticate(&mechanism, initial).await,
                Command::Capability => Ok(self.capability()),
                Command::Noop(tag) => Ok(self.noop(tag)),
                Command::Logout => Ok(self.logout()),
                _ => Ok(self.strike("Authenticate first")),
            };
        };
        let id = account.id;
        let store = self.app.store.clone();
        let quota = crate::scripts::quota_of(&self.app.config);
        Ok(match cmd {
            Command::StartTls | Command::Authenticate { .. } => self.strike("Already authenticated"),
            Command::HaveSpace { name, size } => {
                if let Some(why) = sieve_name_problem(&name) {
                    return Ok(self.no(None, why));
                }
                if size > quota.max_bytes as u64 {
                    let text = format!("A script may have {} octets at most", quota.max_bytes);
                    return Ok(self.no(Some("QUOTA/MAXSIZE"), &text));
                }
                match store.sieve_list(id).await {
                    Ok(list) if list.len() >= quota.max_scripts && !list.iter().any(|e| e.name == name) => {
                        let text = format!("An account may have {} scripts at most", quota.max_scripts);
                        self.no(Some("QUOTA/MAXSCRIPTS"), &text)
                    }
                    Ok(_) => self.ok("Putscript would succeed"),
                    Err(e) => self.store_error(e),
                }
            }
            Command::PutScript { name, script } => {
                if let Some(why) = sieve_name_problem(&name) {
                    return Ok(self.no(None, why));
                }
                if let Some(step) = self.check(&script) {
                    return Ok(step);
                }
                match store.sieve_put(id, &name, &script, quota).await {
                    Ok(()) => {
                        // The active script may be the one replaced.
                        self.app.sieve.forget(id);
                        self.ok("Putscript completed")
                    }
                    Err(StoreError::OverQuota(_)) if script.len() <= quota.max_bytes => {
                        let text = format!("An account may have {} scripts at most", quota.max_scripts);
                        self.no(Some("QUOTA/MAXSCRIPTS"), &text)
                    }
                    Err(e) => self.store_error(e),
                }
            }
            Command::CheckScript(script) => match self.check(&script) {
                Some(step) => step,
                None => self.ok("Script is valid"),
            },
            Command::ListScripts => match store.sieve_list(id).await {
                Ok(list) => {
                    for entry in list {
                        encode_string(&mut self.out, entry.name.as_bytes());
                        if entry.active {
                            self.out.extend_from_slice(b" ACTIVE");
                        }
                        self.out.extend_from_slice(b"\r\n");
                    }
                    self.ok("Listscripts completed")
                }
                Err(e) => self.store_error(e),
            },
            Command::SetActive(name) => {
                let name = (!name.is_empty()).then_some(name);
                match store.sieve_activate(id, name.as_deref()).await {
                    Ok(()) => {
                        self.app.sieve.forget(id);
                        self.ok("Setactive completed")
                    }
                    Err(StoreError::NotFound(_)) | Err(StoreError::Invalid(_)) => self.nonexistent(),
                    Err(e) => self.store_error(e),
                }
            }
            Command::GetScript(name) => match store.sieve_get(id, &name).await {
                Ok(Some(source)) => {
                    self.out.extend_from_slice(format!("{{{}}}\r\n", source.len()).as_bytes());
                    self.out.extend_from_slice(&source);
                    self.out.extend_from_slice(b"\r\n");
                    self.ok("Getscript completed")
                }
                Ok(None) => self.nonexistent(),
                Err(e) => self.store_error(e),
            },
            Command::DeleteScript(name) => {
                if sieve_name_problem(&name).is_some() {
                    return Ok(self.nonexistent());
                }
                match store.sieve_delete(id, &name).await {
                    Ok(()) => self.ok("Deletescript completed"),
                    Err(StoreError::Invalid(_)) => {
                        self.no(Some("ACTIVE"), "The active script cannot be deleted")
                    }
                    Err(e) => self.store_error(e),
                }
            }
            Command::RenameScript { from, to } => {
                if sieve_name_problem(&from).is_some() {
                    return Ok(self.nonexistent());
                }
                if let Some(why) = sieve_name_problem(&to) {
                    return Ok(self.no(None, why));
                }
                match store.sieve_rename(id, &from, &to).await {
                    Ok(()) => self.ok("Renamescript completed"),
                    Err(e) => self.store_error(e),
                }
            }
            Command::Capability => self.capability(),
            Command::Noop(tag) => self.noop(tag),
            Command::Logout => self.logout(),
        })
    }

    /// CAPABILITY, NOOP and LOGOUT: the same in every state.
    fn capability(&mut self) -> Step {
        self.capabilities();
        self.ok("Capability completed")
    }

    fn noop(&mut self, tag: Option<String>) -> Step {
        match tag {
            Some(tag) => {
                let mut code = b"TAG ".to_vec();
                encode_string(&mut code, tag.as_bytes());
                self.respond("OK", Some(&String::from_utf8_lossy(&code)), "Done");
                Step::Ok
            }
            None => self.ok("Done"),
        }
    }

    fn logout(&mut self) -> Step {
        self.ok("Logout completed");
        Step::Close
    }

    /// The checker's verdict on a script: `None` when it passes.
    fn check(&mut self, script: &[u8]) -> Option<Step> {
        let max = self.cfg.max_script_bytes;
        if script.len() > max {
            return Some(self.no(Some("QUOTA/MAXSIZE"), &format!("A script may have {max} octets at most")));
        }
        let checker = self.app.sieve.clone();
        checker.check(script).err().map(|why| self.no(None, &why))
    }

    fn nonexistent(&mut self) -> Step {
        self.no(Some("NONEXISTENT"), "There is no script by that name")
    }

    fn store_error(&mut self, e: StoreError) -> Step {
        match e {
            StoreError::Invalid(why) => self.no(None, &why),
            StoreError::OverQuota(why) => self.no(Some("QUOTA"), &why),
            StoreError::NotFound(_) => self.nonexistent(),
            StoreError::AlreadyExists(_) => self.no(Some("ALREADYEXISTS"), "A script by that name exists"),
            StoreError::Unavailable(m) | StoreError::Internal(m) => {
                tracing::warn!(error = %m, "managesieve: store failure");
                self.no(Some("TRYLATER"), "Temporary failure, try again")
            }
        }
    }

    async fn starttls(&mut self) -> std::io::Result<Step> {
        if self.tls {
            return Ok(self.strike("TLS is already active"));
        }
        let Some(tls) = self.ctx.tls.clone() else {
            return Ok(self.no(None, "TLS is not available"));
        };
        self.ok("Begin TLS negotiation");
        self.flush().await?;
        // Anything pipelined after STARTTLS arrived in plaintext: dropped.
        self.buf.clear();
        self.framer.reset();
        let plain = std::mem::replace(&mut self.stream, SessionStream::Memory(tokio::io::duplex(1).0));
        self.stream = plain.upgrade(&tls).await?;
        self.tls = true;
        // RFC 5804 §2.2: the capabilities again, now over TLS.
        self.capabilities();
        Ok(self.ok("TLS negotiation successful"))
    }

    async fn authenticate(&mut self, mechanism: &str, initial: Option<Vec<u8>>) -> std::io::Result<Step> {
        if mechanism != "PLAIN" {
            return Ok(self.no(None, "Unsupported SASL mechanism; use PLAIN"));
        }
        if !self.auth_allowed() {
            return Ok(self.no(Some("ENCRYPT-NEEDED"), "Plaintext authentication needs TLS; use STARTTLS"));
        }
        let response = match initial {
            Some(r) => r,
            None => {
                // An empty challenge, and the client's response as a string.
                self.out.extend_from_slice(b"\"\"\r\n");
                self.flush().await?;
                match self.read_command().await? {
                    Read::Command(line) => match parse_response(&line) {
                        Some(r) => r,
                        None => return Ok(self.strike("Malformed SASL response")),
                    },
                    Read::Eof => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Read::LineTooLong => return Ok(self.strike("SASL response too long")),
                    Read::Refused { size, busy } => {
                        return Ok(self.refuse_literal(size, busy).await?.unwrap_or(Step::Close));
                    }
                }
            }
        };
        if response == b"*" {
            return Ok(self.no(None, "Authentication cancelled"));
        }
        let decoded = std::str::from_utf8(&response).ok().and_then(crate::proto::smtp::sasl_decode);
        let (user, password) = match decoded.as_deref().and_then(sasl_plain) {
            Some(SaslPlain::Credentials(user, password)) => (user, password),
            Some(SaslPlain::OtherIdentity) => {
                return Ok(self.strike("Authorization as another identity is not supported"));
            }
            None => return Ok(self.strike("Malformed PLAIN response")),
        };
        Ok(match self.app.auth.verify(&user, &password, self.ctx.conn.remote.ip()).await {
            AuthOutcome::Ok(account) => {
                tracing::debug!(account = account.id, "managesieve: login");
                self.account = Some(account);
                self.framer.set_limits(Limits {
                    max_line: self.cfg.max_line_bytes,
                    max_literal: self.cfg.max_script_bytes,
                });
                self.ok("Logged in")
            }
            AuthOutcome::Failed => self.strike("Authentication failed"),
            AuthOutcome::RateLimited => self.no(Some("TRYLATER"), "Too many failed logins; try again later"),
            AuthOutcome::Unavailable => {
                self.no(Some("TRYLATER"), "Authentication is temporarily unavailable")
            }
        })
    }
}

fn preauth_limits(cfg: &SieveConfig) -> Limits {
    Limits { max_line: cfg.preauth_max_literal_bytes, max_literal: cfg.preauth_max_literal_bytes }
}

/// A client's SASL response line: one string (RFC 5804 §2.1).
fn parse_response(line: &[u8]) -> Option<Vec<u8>> {
    // Parsed as the argument of a command of that one string.
    let mut cmd = b"CHECKSCRIPT ".to_vec();
    cmd.extend_from_slice(line);
    match parse_command(&cmd) {
        Ok(Command::CheckScript(s)) => Some(s),
        _ => None,
    }
}
