//! The session loop: greeting, read a command (bounded, timed), answer, repeat.
//! Answers to pipelined commands are written together (RFC 2449 PIPELINING).

use std::io::Write as _;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use super::Pop3Config;
use super::maildrop::{CommitError, Maildrop, OpenError};
use crate::app::App;
use crate::auth::AuthOutcome;
use crate::net::input::{LineOutcome, read_line};
use crate::net::output::Output;
use crate::net::{SessionCtx, SessionStream};
use crate::proto::frame::LineFramer;
use crate::proto::pop3::{
    Command, ParseError, encode_message, parse_command, sent_as_stored, stored_terminator,
};
use crate::proto::smtp::{SaslPlain, sasl_decode, sasl_plain};
use crate::store::StoreError;

/// Answers are flushed early once this much is queued, so one RETR of a large
/// message does not hold a second copy of it for long.
const FLUSH_AT: usize = 256 * 1024;

/// How a command ended, for metrics, the error budget and the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Ok,
    Err,
    /// The session ends after this answer (QUIT).
    Close,
}

pub(super) struct Session {
    app: App,
    cfg: Pop3Config,
    stream: SessionStream,
    /// Received and not yet framed; kept between commands so that pipelined
    /// ones are answered with one write.
    input: BytesMut,
    lines: LineFramer,
    out: Output,
    ctx: SessionCtx,
    tls: bool,
    /// The name given by USER, waiting for PASS.
    user: Option<String>,
    /// Present in the TRANSACTION state.
    maildrop: Option<Maildrop>,
    errors: u32,
}

impl Session {
    pub(super) fn new(app: App, stream: SessionStream, ctx: SessionCtx, tls: bool) -> Self {
        let cfg = app.config.pop3.clone();
        Session {
            input: BytesMut::with_capacity(512),
            // The configured limit counts the command's text; the framer's counts
            // the CRLF too.
            lines: LineFramer::new(cfg.max_line_bytes.saturating_add(2)),
            app,
            cfg,
            stream,
            out: Output::with_capacity(1024),
            ctx,
            tls,
            user: None,
            maildrop: None,
            errors: 0,
        }
    }

    pub(super) async fn run(mut self) {
        if let Err(e) = self.serve().await {
            tracing::debug!(error = %e, "pop3: session ended with an I/O error");
        }
        // Not through QUIT: no UPDATE state, nothing deleted (RFC 1939 §6).
        if let Some(maildrop) = self.maildrop.take() {
            maildrop.release().await;
        }
        self.stream.close().await;
    }

    fn ok(&mut self, text: &str) -> Step {
        self.line(&format!("+OK {text}"));
        Step::Ok
    }

    fn err(&mut self, text: &str) -> Step {
        self.line(&format!("-ERR {text}"));
        Step::Err
    }

    /// An error that counts towards `max_errors`: the client does not speak POP3
    /// (unknown or malformed commands, wrong state, failed logins). Answers like
    /// "no such message" do not count.
    fn strike(&mut self, text: &str) -> Step {
        self.errors += 1;
        self.err(text)
    }

    fn line(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.out.write_to(&mut self.stream).await?;
        }
        self.stream.flush().await
    }

    async fn serve(&mut self) -> std::io::Result<()> {
        if self.ctx.shutdown.is_signalled() {
            self.err("[SYS/TEMP] Server shutting down");
            return self.flush().await;
        }
        // The command line being read, at its longest, held against the pod's
        // transfer budget for the session's life: POP3 takes nothing larger in.
        let mut held = self.app.budget.start("pop3");
        if !held.grow_to(self.lines.max_line()) {
            self.err("[SYS/TEMP] Server busy, try again later");
            return self.flush().await;
        }
        self.ok("Mailcluster POP3 server ready");
        let autologout = Duration::from_secs(self.cfg.autologout_secs);
        let login_deadline = Instant::now() + Duration::from_secs(self.cfg.preauth_timeout_secs);
        loop {
            // Before login the session also ends at its deadline, however busy
            // the client keeps it.
            let timeout = match self.maildrop {
                Some(_) => autologout,
                None => autologout.min(login_deadline.saturating_duration_since(Instant::now())),
            };
            if !self.lines.has_line(&self.input) || self.out.len() >= FLUSH_AT {
                self.flush().await?;
            }
            let mut shutdown = self.ctx.shutdown.clone();
            let read = tokio::select! {
                r = tokio::time::timeout(timeout, read_line(&mut self.stream, &mut self.input, &mut self.lines)) => r,
                _ = shutdown.signalled() => {
                    self.err("[SYS/TEMP] Server shutting down");
                    return self.flush().await;
                }
            };
            let started = Instant::now();
            let (label, step) = match read {
                Err(_) => {
                    self.err("Autologout; idle for too long");
                    return self.flush().await;
                }
                Ok(read) => match read? {
                    LineOutcome::Eof => return Ok(()),
                    LineOutcome::TooLong => ("unknown", self.strike("Command line too long")),
                    LineOutcome::Line(line) => match parse_command(&line) {
                        Ok(cmd) => {
                            let label = cmd.label();
                            (label, self.dispatch(cmd).await?)
                        }
                        Err(ParseError::Unknown) => ("unknown", self.strike("Unknown command")),
                        Err(ParseError::Syntax(why)) => {
                            ("syntax", self.strike(&format!("Syntax error: {why}")))
                        }
                    },
                },
            };
            let m = &self.app.metrics;
            let result = if step == Step::Err { "err" } else { "ok" };
            m.commands_total.with_label_values(&["pop3", label, result]).inc();
            m.command_duration.with_label_values(&["pop3", label]).observe(started.elapsed().as_secs_f64());
            if step == Step::Close {
                return self.flush().await;
            }
            if self.cfg.max_errors > 0 && self.errors >= self.cfg.max_errors {
                self.err("Too many errors; closing connection");
                return self.flush().await;
            }
        }
    }

    async fn dispatch(&mut self, cmd: Command) -> std::io::Result<Step> {
        if let Command::Capa = cmd {
            return Ok(self.capa());
        }
        if let Command::Noop = cmd
            && self.maildrop.is_some()
        {
            return Ok(self.ok(""));
        }
        if let Command::Quit = cmd {
            return Ok(self.quit().await);
        }
        if self.maildrop.is_none() {
            return Ok(match cmd {
                Command::Stls => self.stls().await?,
                Command::User(name) => self.cmd_user(name),
                Command::Pass(password) => self.cmd_pass(password).await,
                Command::Auth(None) => {
                    self.ok("Supported SASL mechanisms follow");
                    self.line("PLAIN");
                    self.line(".");
                    Step::Ok
                }
                Command::Auth(Some((mechanism, initial))) => self.cmd_auth(&mechanism, initial).await?,
                Command::Apop => self.err("APOP is not supported; use USER/PASS or AUTH PLAIN"),
                _ => self.strike("Not logged in"),
            });
        }
        Ok(match cmd {
            Command::Stat => {
                let (n, octets) = self.maildrop().stat();
                self.ok(&format!("{n} {octets}"))
            }
            Command::List(msg) => self.cmd_list(msg, false),
            Command::Uidl(msg) => self.cmd_list(msg, true),
            Command::Retr(n) => self.cmd_retr(n, None).await,
            Command::Top(n, lines) => self.cmd_retr(n, Some(lines)).await,
            Command::Dele(n) => match self.maildrop_mut().delete(n) {
                Ok(()) => self.ok(&format!("Message {n} deleted")),
                Err(true) => self.err(&format!("Message {n} already deleted")),
                Err(false) => self.err("No such message"),
            },
            Command::Rset => {
                self.maildrop_mut().undelete_all();
                let (n, octets) = self.maildrop().stat();
                self.ok(&format!("Maildrop has {n} messages ({octets} octets)"))
            }
            _ => self.strike("Not valid in the TRANSACTION state"),
        })
    }

    fn maildrop(&self) -> &Maildrop {
        self.maildrop.as_ref().expect("TRANSACTION state has a maildrop")
    }

    fn maildrop_mut(&mut self) -> &mut Maildrop {
        self.maildrop.as_mut().expect("TRANSACTION state has a maildrop")
    }

    /// Plaintext credentials are accepted only over TLS unless configured otherwise.
    fn auth_allowed(&self) -> bool {
        self.tls || self.app.config.tls.allow_plaintext_auth
    }

    fn capa(&mut self) -> Step {
        self.ok("Capability list follows");
        for cap in ["TOP", "UIDL", "RESP-CODES", "AUTH-RESP-CODE", "PIPELINING", "EXPIRE NEVER"] {
            self.line(cap);
        }
        if self.maildrop.is_none() {
            if self.auth_allowed() {
                self.line("USER");
                self.line("SASL PLAIN");
            }
            if !self.tls && self.ctx.tls.is_some() {
                self.line("STLS");
            }
        }
        self.line("IMPLEMENTATION Mailcluster");
        self.line(".");
        Step::Ok
    }

    async fn stls(&mut self) -> std::io::Result<Step> {
        if self.tls {
            return Ok(self.err("TLS is already active"));
        }
        let Some(tls) = self.ctx.tls.clone() else {
            return Ok(self.err("TLS is not available"));
        };
        self.ok("Begin TLS negotiation");
        self.flush().await?;
        // Anything pipelined after STLS arrived in plaintext: drop it (RFC 2595 §4).
        self.input.clear();
        self.lines.reset();
        self.user = None;
        let plain = std::mem::replace(&mut self.stream, SessionStream::Memory(tokio::io::duplex(1).0));
        self.stream = plain.upgrade(&tls).await?;
        self.tls = true;
        Ok(Step::Ok)
    }

    fn cmd_user(&mut self, name: String) -> Step {
        if !self.auth_allowed() {
            return self.err("[AUTH] Plaintext authentication is disallowed without TLS; use STLS");
        }
        // Always accepted: whether the user exists is not revealed before PASS.
        self.user = Some(name);
        self.ok("Send your password")
    }

    async fn cmd_pass(&mut self, password: String) -> Step {
        let Some(user) = self.user.take() else {
            return self.strike("USER first");
        };
        if !self.auth_allowed() {
            return self.err("[AUTH] Plaintext authentication is disallowed without TLS; use STLS");
        }
        self.login(&user, &password).await
    }

    async fn cmd_auth(&mut self, mechanism: &str, initial: Option<String>) -> std::io::Result<Step> {
        if mechanism != "PLAIN" {
            return Ok(self.err("Unsupported SASL mechanism; use PLAIN"));
        }
        if !self.auth_allowed() {
            return Ok(self.err("[AUTH] Plaintext authentication is disallowed without TLS; use STLS"));
        }
        let response = match initial {
            Some(r) => r,
            None => {
                self.line("+ ");
                self.flush().await?;
                match read_line(&mut self.stream, &mut self.input, &mut self.lines).await? {
                    LineOutcome::Line(l) => String::from_utf8_lossy(l.trim_ascii_end()).into_owned(),
                    LineOutcome::TooLong => return Ok(self.err("SASL response too long")),
                    LineOutcome::Eof => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            }
        };
        if response.trim() == "*" {
            return Ok(self.err("Authentication cancelled"));
        }
        match sasl_decode(&response).as_deref().and_then(sasl_plain) {
            Some(SaslPlain::Credentials(user, password)) => Ok(self.login(&user, &password).await),
            Some(SaslPlain::OtherIdentity) => {
                Ok(self.err("[AUTH] Authorization as another identity is not supported"))
            }
            None => Ok(self.err("[AUTH] Malformed PLAIN response")),
        }
    }

    async fn login(&mut self, user: &str, password: &str) -> Step {
        let account = match self.app.auth.verify(user, password, self.ctx.conn.remote.ip()).await {
            AuthOutcome::Ok(account) => account,
            AuthOutcome::Failed => return self.strike("[AUTH] Invalid credentials"),
            AuthOutcome::RateLimited => {
                return self.err("[SYS/TEMP] Too many failed logins; try again later");
            }
            AuthOutcome::Unavailable => {
                return self.err("[SYS/TEMP] Authentication is temporarily unavailable");
            }
        };
        let ttl = Duration::from_secs(self.cfg.lock_ttl_secs.max(1));
        match Maildrop::open(&self.app, &account, ttl).await {
            Ok(maildrop) => {
                let (n, octets) = maildrop.stat();
                tracing::debug!(account = account.id, messages = n, "pop3: login");
                self.maildrop = Some(maildrop);
                self.ok(&format!("Logged in; maildrop has {n} messages ({octets} octets)"))
            }
            Err(OpenError::InUse) => self.err("[IN-USE] Maildrop is in use by another session"),
            Err(OpenError::NoMaildrop) => self.err("[SYS/PERM] This account has no maildrop"),
            Err(OpenError::Unavailable(e)) => {
                tracing::warn!(error = %e, "pop3: cannot open maildrop");
                self.err("[SYS/TEMP] Maildrop is temporarily unavailable")
            }
        }
    }

    /// LIST or UIDL, for one message or all.
    fn cmd_list(&mut self, msg: Option<u32>, uidl: bool) -> Step {
        let md = self.maildrop();
        let value = |e| if uidl { md.unique_id(e) } else { e.size.to_string() };
        match msg {
            Some(n) => match md.get(n).map(value) {
                Some(v) => self.ok(&format!("{n} {v}")),
                None => self.err("No such message"),
            },
            None => {
                // Written into one buffer with no allocation per line: a maildrop
                // that keeps its mail lists thousands of lines at every login.
                let mut lines = Vec::new();
                for (n, e) in md.live() {
                    // Writing to a Vec cannot fail.
                    let _ = if uidl {
                        write!(lines, "{n} {}\r\n", md.unique_id_display(e))
                    } else {
                        write!(lines, "{n} {}\r\n", e.size)
                    };
                }
                let (count, octets) = md.stat();
                let head = if uidl {
                    "Unique-ID listing follows".to_string()
                } else {
                    format!("{count} messages ({octets} octets)")
                };
                self.ok(&head);
                self.out.extend_from_slice(&lines);
                self.line(".");
                Step::Ok
            }
        }
    }

    /// RETR (`top` = None) or TOP.
    async fn cmd_retr(&mut self, n: u32, top: Option<u32>) -> Step {
        let Some(entry) = self.maildrop().get(n).copied() else {
            return self.err("No such message");
        };
        let read = self.app.view.bodies().bodies(&[(entry.message_id, entry.internal_date)]).await;
        let body = match read.map(|mut b| b.pop().flatten()) {
            Ok(Some(stored)) => stored.body,
            Ok(None) | Err(StoreError::NotFound(_)) => {
                return self.err("Message was removed by another session");
            }
            Err(e) => {
                tracing::warn!(error = %e, "pop3: cannot read a message");
                return self.err("[SYS/TEMP] Message is temporarily unavailable");
            }
        };
        match top {
            None => {
                self.ok(&format!("{} octets", entry.size));
                self.maildrop_mut().mark_retrieved(n);
            }
            Some(_) => {
                self.ok("Top of message follows");
            }
        }
        if top.is_none() && sent_as_stored(&body) {
            let end = stored_terminator(&body);
            self.out.put_shared(body);
            self.out.extend_from_slice(end);
        } else {
            encode_message(&body, top, self.out.text());
        }
        Step::Ok
    }

    async fn quit(&mut self) -> Step {
        let Some(maildrop) = self.maildrop.take() else {
            self.ok("Mailcluster POP3 server signing off");
            return Step::Close;
        };
        match maildrop.commit(&self.app, self.cfg.mark_seen_on_retr).await {
            Ok(left) => self.ok(&format!("Mailcluster POP3 server signing off ({left} messages left)")),
            Err(CommitError::LockLost) => self.err("[SYS/TEMP] Maildrop lock lost; no messages deleted"),
            Err(CommitError::Store(e)) => {
                tracing::warn!(error = %e, "pop3: UPDATE failed");
                self.err("[SYS/TEMP] Deleted messages could not be removed; try again")
            }
        };
        Step::Close
    }
}
