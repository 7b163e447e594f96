//! One SMTP connection: buffering, pipelining, timeouts, shutdown and dispatch.
//!
//! Buffering follows RFC 2920 (PIPELINING) the way a fast server must: every
//! complete command already in the input buffer is answered in order into the
//! output buffer, and the output is flushed only when the session has to wait for
//! the client (the input holds no complete command). A client that pipelines
//! `MAIL/RCPT/RCPT/DATA` thus gets one TCP segment back, not four. Replies that the
//! client must see before it can go on (354, 334, 220 before TLS) are flushed by the
//! same rule, because the session then waits for input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::auth::AuthExchange;
use super::data::BdatBody;
use super::envelope::Envelope;
use super::{SmtpKind, SmtpMetrics};
use crate::app::App;
use crate::net::{ConnInfo, SessionCtx, SessionStream, Shutdown, TlsProvider};
use crate::proto::frame::{Line, LineFramer, take_octets};
use crate::proto::smtp::{self as proto, Reply, Request, replies};
use mailcluster_model::{Account, SenderRights};

/// Read size while waiting for commands: small, because thousands of idle sessions
/// each hold one buffer.
const COMMAND_READ: usize = 4 * 1024;
/// Read size while receiving message content.
const DATA_READ: usize = 64 * 1024;

/// What the session does after a command.
pub(super) enum Step {
    Continue,
    Close,
    StartTls,
}

pub(super) struct Session {
    pub(super) app: App,
    pub(super) kind: SmtpKind,
    pub(super) metrics: Arc<SmtpMetrics>,
    pub(super) conn: ConnInfo,
    pub(super) tls: Option<TlsProvider>,
    shutdown: Shutdown,
    pub(super) is_tls: bool,
    pub(super) rbuf: BytesMut,
    /// Finds command lines in `rbuf`; DATA and BDAT read content from it directly.
    pub(super) lines: LineFramer,
    wbuf: Vec<u8>,
    /// The EHLO/HELO argument, once given.
    pub(super) helo: Option<String>,
    /// EHLO (true) or HELO (false).
    pub(super) esmtp: bool,
    pub(super) account: Option<Account>,
    /// The account's aliases and allowed senders, read at its last MAIL.
    pub(super) sender_rights: Option<SenderRights>,
    /// The open mail transaction (after MAIL FROM).
    pub(super) envelope: Option<Envelope>,
    /// Body collected by BDAT chunks so far.
    pub(super) bdat: Option<BdatBody>,
    /// An AUTH exchange waiting for the client's next line.
    pub(super) auth_exchange: Option<AuthExchange>,
    pub(super) errors: u32,
    pub(super) junk: u32,
    /// When the command being answered started; DATA/BDAT move it to the end of
    /// the content so the duration metric measures the server, not the upload.
    pub(super) cmd_started: Instant,
    last_class: &'static str,
    /// While message content is read: when the whole of it must have arrived
    /// (`data_deadline_secs`).
    pub(super) data_deadline: Option<Instant>,
    /// Submission: when a session still without AUTH is closed.
    login_deadline: Option<Instant>,
}

impl Session {
    pub(super) fn new(
        app: App,
        kind: SmtpKind,
        metrics: Arc<SmtpMetrics>,
        ctx: SessionCtx,
        is_tls: bool,
    ) -> Session {
        // RFC 5321 §4.5.3.1.4: 512 octets, CRLF included, is the least a server
        // must accept.
        let max_line = app.config.smtp.max_line_length.max(512);
        let login_deadline = kind
            .is_submission()
            .then(|| Instant::now() + Duration::from_secs(app.config.smtp.preauth_timeout_secs));
        Session {
            app,
            kind,
            metrics,
            conn: ctx.conn,
            tls: ctx.tls,
            shutdown: ctx.shutdown,
            is_tls,
            rbuf: BytesMut::with_capacity(COMMAND_READ),
            lines: LineFramer::new(max_line),
            wbuf: Vec::with_capacity(1024),
            helo: None,
            esmtp: false,
            account: None,
            sender_rights: None,
            envelope: None,
            bdat: None,
            auth_exchange: None,
            errors: 0,
            junk: 0,
            cmd_started: Instant::now(),
            last_class: "2xx",
            data_deadline: None,
            login_deadline,
        }
    }

    pub(super) fn hostname(&self) -> &str {
        &self.app.config.hostname
    }

    pub(super) fn config(&self) -> &super::SmtpConfig {
        &self.app.config.smtp
    }

    /// Runs the session to its end.
    pub(super) async fn serve(mut self, mut stream: SessionStream) {
        if self.shutdown.is_signalled() {
            let r = replies::shutting_down(self.hostname());
            self.reply(r);
        } else {
            let r = Reply::new(220, "", format!("{} ESMTP Mailcluster", self.hostname()));
            self.reply(r);
            // Only STARTTLS comes back here; every other outcome ends the session.
            while let Step::StartTls = self.command_loop(&mut stream).await {
                let Some(tls) = self.tls.clone() else { break };
                if self.flush(&mut stream).await.is_err() {
                    return;
                }
                stream = match stream.upgrade(&tls).await {
                    Ok(s) => s,
                    Err(err) => {
                        tracing::debug!(error = %err, remote = %self.conn.remote, "STARTTLS handshake failed");
                        return;
                    }
                };
                self.after_tls();
            }
        }
        let _ = self.flush(&mut stream).await;
        stream.close().await;
    }

    /// RFC 3207 §4.2: after TLS starts, forget everything learnt before it.
    fn after_tls(&mut self) {
        self.is_tls = true;
        self.helo = None;
        self.esmtp = false;
        self.account = None;
        self.envelope = None;
        self.bdat = None;
        self.auth_exchange = None;
        self.rbuf.clear();
        self.lines.reset();
    }

    /// Reads and answers commands until the session ends or TLS must start.
    async fn command_loop(&mut self, stream: &mut SessionStream) -> Step {
        loop {
            if self.errors >= self.config().max_errors {
                self.reply(replies::too_many_errors());
                return Step::Close;
            }
            match self.lines.next_line(&mut self.rbuf) {
                Line::NeedMore => {
                    if let Err(step) = self.fill(stream, false).await {
                        return step;
                    }
                }
                // Answered once; the framer drops the rest of the line as it
                // arrives, so memory stays bounded whatever the client sends.
                Line::TooLong => {
                    self.reply(replies::line_too_long());
                    self.record("UNKNOWN");
                }
                Line::Complete(line) => {
                    let step = self.dispatch(&line, stream).await;
                    if !matches!(step, Step::Continue) {
                        return step;
                    }
                }
            }
        }
    }

    async fn dispatch(&mut self, line: &[u8], stream: &mut SessionStream) -> Step {
        self.cmd_started = Instant::now();
        // Set by DATA and BDAT for the content they read, never left over.
        self.data_deadline = None;
        // RFC 5321 §2.3.8: CRLF is the only line ending a server may recognise.
        // A command ended by a bare LF is refused, not run: the same rule as
        // message content, so no line means one thing here and another to the
        // next hop.
        if !line.ends_with(b"\r\n") {
            self.reply(Reply::new(500, "5.5.2", "Command lines must end with CRLF"));
            self.record(label_of(line));
            return Step::Continue;
        }
        if let Some(exchange) = self.auth_exchange.take() {
            let step = self.auth_continue(exchange, line).await;
            self.record("AUTH");
            return step;
        }
        // An address literal is parsed around, then put back.
        let patched;
        let (parsed_line, literal) = match proto::address_literal(line) {
            Some((p, literal)) => {
                patched = p;
                (patched.as_slice(), Some(literal))
            }
            None => (line, None),
        };
        let restore = |address: &mut std::borrow::Cow<'_, str>| {
            if let Some(literal) = &literal {
                *address = std::borrow::Cow::Owned(address.replace(proto::LITERAL_STAND_IN, literal));
            }
        };
        // So is an ORCPT of an address type smtp-proto does not read.
        let orcpt_patched;
        let (parsed_line, foreign_orcpt) = match proto::foreign_orcpt(parsed_line) {
            Some((p, kind, address)) => {
                orcpt_patched = p;
                (orcpt_patched.as_slice(), Some((kind, address)))
            }
            None => (parsed_line, None),
        };
        let (label, step) = match proto::parse_command(parsed_line) {
            Err(err) => {
                self.reply(proto::parse_error_reply(&err));
                (label_of(line), Step::Continue)
            }
            Ok(req) => {
                let label = proto::command_label(&req);
                let step = match req {
                    Request::Ehlo { host } => self.cmd_hello(&host, true),
                    Request::Helo { host } => self.cmd_hello(&host, false),
                    Request::Mail { mut from } => {
                        restore(&mut from.address);
                        self.cmd_mail(from).await
                    }
                    // A mailbox at an address literal is nobody's here (mail is
                    // delivered by domain): refused as a policy, not as a syntax
                    // error (RFC 5321 §4.1.3 allows literals).
                    Request::Rcpt { .. } if literal.is_some() => {
                        self.reply(Reply::new(
                            550,
                            "5.1.2",
                            "Address literals are not accepted as recipients",
                        ));
                        Step::Continue
                    }
                    Request::Rcpt { to } => {
                        let bare_postmaster = to.address.is_empty() && proto::names_bare_postmaster(line);
                        self.cmd_rcpt(to, bare_postmaster, foreign_orcpt).await
                    }
                    Request::Data => self.cmd_data(stream).await,
                    Request::Bdat { chunk_size, is_last } => self.cmd_bdat(chunk_size, is_last, stream).await,
                    Request::Auth { mechanism, initial_response } => {
                        self.cmd_auth(mechanism, &initial_response).await
                    }
                    Request::StartTls => self.cmd_starttls(line),
                    Request::Rset => self.cmd_rset(),
                    Request::Noop { .. } => self.cmd_noop(),
                    Request::Vrfy { .. } => self.cmd_vrfy(),
                    Request::Expn { .. } => self.cmd_expn(),
                    Request::Help { .. } => self.cmd_help(),
                    Request::Quit => self.cmd_quit(),
                    Request::Lhlo { .. }
                    | Request::Etrn { .. }
                    | Request::Atrn { .. }
                    | Request::Burl { .. } => {
                        self.reply(replies::not_implemented());
                        Step::Continue
                    }
                };
                (label, step)
            }
        };
        self.record(label);
        step
    }

    /// Queues a reply. 5xx replies count towards the error limit.
    pub(super) fn reply(&mut self, reply: Reply) {
        if reply.code >= 500 {
            self.errors += 1;
        }
        self.last_class = reply.class();
        reply.write_to(&mut self.wbuf);
    }

    fn record(&self, command: &'static str) {
        let elapsed = self.cmd_started.elapsed().as_secs_f64();
        self.metrics.command_duration.with_label_values(&["smtp", command]).observe(elapsed);
        self.metrics.commands_total.with_label_values(&["smtp", command, self.last_class]).inc();
    }

    pub(super) async fn flush(&mut self, stream: &mut SessionStream) -> std::io::Result<()> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        stream.write_all(&self.wbuf).await?;
        stream.flush().await?;
        self.wbuf.clear();
        Ok(())
    }

    /// Flushes pending replies, then waits for more input. `Err` carries how the
    /// session ends: client gone, timeout (421), or shutdown (421).
    pub(super) async fn fill(&mut self, stream: &mut SessionStream, data: bool) -> Result<(), Step> {
        if self.flush(stream).await.is_err() {
            return Err(Step::Close);
        }
        let (timeout, chunk) = if data {
            (Duration::from_secs(self.config().data_timeout_secs), DATA_READ)
        } else {
            (Duration::from_secs(self.config().command_timeout_secs), COMMAND_READ)
        };
        // The deadlines cut a client that keeps each read inside its timeout.
        let deadline = match (data, self.account.is_none()) {
            (true, _) => self.data_deadline,
            (false, true) => self.login_deadline,
            (false, false) => None,
        };
        let now = Instant::now();
        let cut = deadline.filter(|d| d.saturating_duration_since(now) < timeout);
        let timeout = cut.map_or(timeout, |d| d.saturating_duration_since(now));
        self.rbuf.reserve(chunk);
        let rbuf = &mut self.rbuf;
        let shutdown = &mut self.shutdown;
        let outcome = if data {
            // A message on its way in is finished, not cut off: the client gets its
            // 250 (or its error) as usual, and the drain's 421 comes at the next
            // command. Bounded by the data timeout and by the drain's grace.
            Some(tokio::time::timeout(timeout, stream.read_buf(rbuf)).await)
        } else {
            tokio::select! {
                biased;
                _ = shutdown.signalled() => None,
                r = tokio::time::timeout(timeout, stream.read_buf(rbuf)) => Some(r),
            }
        };
        match outcome {
            None => {
                let r = replies::shutting_down(self.hostname());
                self.reply(r);
                Err(Step::Close)
            }
            Some(Err(_elapsed)) => {
                let r = match (cut.is_some(), data) {
                    (false, _) => replies::timeout(self.hostname()),
                    (true, true) => Reply::new(
                        421,
                        "4.4.2",
                        format!("{} Message content took too long, closing connection", self.hostname()),
                    ),
                    (true, false) => Reply::new(
                        421,
                        "4.7.0",
                        format!("{} No authentication in time, closing connection", self.hostname()),
                    ),
                };
                self.reply(r);
                Err(Step::Close)
            }
            Some(Ok(Ok(0))) | Some(Ok(Err(_))) => Err(Step::Close),
            Some(Ok(Ok(_))) => Ok(()),
        }
    }

    /// Reads and throws away `n` octets of input (a BDAT chunk that cannot be
    /// accepted). `Err` when the client went away or the discard bound is exceeded.
    pub(super) async fn discard(&mut self, stream: &mut SessionStream, mut n: usize) -> Result<(), Step> {
        if n > self.config().max_discard_size {
            return Err(Step::Close);
        }
        while n > 0 {
            if self.rbuf.is_empty() {
                self.fill(stream, true).await?;
            }
            take_octets(&mut self.rbuf, &mut n);
        }
        Ok(())
    }
}

/// Metric label for a line that did not parse: its verb when it is an SMTP verb,
/// `UNKNOWN` otherwise (never client text: label cardinality must stay bounded).
fn label_of(line: &[u8]) -> &'static str {
    const VERBS: [&str; 17] = [
        "EHLO", "HELO", "LHLO", "MAIL", "RCPT", "DATA", "BDAT", "AUTH", "NOOP", "VRFY", "EXPN", "HELP",
        "ETRN", "ATRN", "BURL", "RSET", "QUIT",
    ];
    let verb = line.split(|b| b.is_ascii_whitespace()).next().unwrap_or_default();
    if verb.eq_ignore_ascii_case(b"STARTTLS") {
        return "STARTTLS";
    }
    VERBS.into_iter().find(|v| verb.eq_ignore_ascii_case(v.as_bytes())).unwrap_or("UNKNOWN")
}
