//! The session loop: greeting, read a command (bounded, timed), dispatch, write
//! the answer, repeat; `* BYE` on shutdown or autologout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use imap_codec::decode::Decoder;
use imap_codec::imap_types::command::{Command, CommandBody};
use imap_codec::imap_types::core::Charset;
use imap_codec::imap_types::search::SearchKey;
use tokio::io::AsyncWriteExt;

use super::input::{Input, ReadOutcome};
use super::selected::Selected;
use super::{ImapConfig, Shared};
use crate::app::App;
use crate::net::output::Output;
use crate::net::{SessionCtx, SessionStream};
use crate::proto::frame::Limits;
use crate::proto::imap::encode;
use crate::proto::imap::parse::{self, FetchExtension, Request, SearchKind, StatusItem};
use crate::store::StoreError;
use mailcluster_model::Account;

/// The tagged result of a command; untagged data has already been queued.
#[derive(Debug)]
pub enum Outcome {
    Ok(String),
    No(String),
    Bad(String),
    /// The command ended the session (LOGOUT).
    Close,
    /// The handler already wrote its tagged line (STARTTLS must flush it before
    /// the handshake).
    Sent,
}

impl Outcome {
    pub fn ok(text: impl Into<String>) -> Outcome {
        Outcome::Ok(text.into())
    }
    pub fn no(text: impl Into<String>) -> Outcome {
        Outcome::No(text.into())
    }
    pub fn bad(text: impl Into<String>) -> Outcome {
        Outcome::Bad(text.into())
    }
}

/// A store failure as the client sees it (RFC 5530 response codes).
pub fn store_error(e: StoreError) -> Outcome {
    match e {
        StoreError::NotFound(_) => Outcome::no("[NONEXISTENT] No such mailbox"),
        StoreError::AlreadyExists(_) => Outcome::no("[ALREADYEXISTS] Mailbox already exists"),
        StoreError::Invalid(m) => Outcome::no(format!("[CANNOT] {m}")),
        StoreError::OverQuota(m) => Outcome::no(format!("[OVERQUOTA] {m}")),
        StoreError::Unavailable(m) | StoreError::Internal(m) => {
            tracing::warn!(error = %m, "imap: store failure");
            Outcome::no("[UNAVAILABLE] Temporary failure, try again")
        }
    }
}

/// Why a session whose selected mailbox got a new UIDVALIDITY ends.
pub(crate) const UIDVALIDITY_BYE: &str =
    "* BYE [UNAVAILABLE] The mailbox's UIDVALIDITY changed (the database was restored); select it again";

pub enum State {
    NotAuthenticated,
    Authenticated(Account),
}

pub struct Session {
    pub(crate) app: App,
    pub(crate) cfg: ImapConfig,
    pub(crate) shared: Arc<Shared>,
    pub(crate) stream: SessionStream,
    pub(crate) input: Input,
    pub(crate) out: Output,
    pub(crate) ctx: SessionCtx,
    pub(crate) tls: bool,
    pub(crate) state: State,
    pub(crate) selected: Option<Selected>,
    pub(crate) user_slot: Option<super::limit::UserSlot>,
    /// CONDSTORE is on (RFC 7162 §3.1): FETCH responses carry MODSEQ.
    pub(crate) condstore: bool,
    /// QRESYNC is enabled (RFC 7162 §3.2): expunges are told as VANISHED.
    pub(crate) qresync: bool,
    /// The client enabled UTF8=ACCEPT (RFC 9755): mailbox names are UTF-8 on the
    /// wire both ways, and strings in commands may hold UTF-8.
    pub(crate) utf8: bool,
    /// The client enabled IMAP4rev2 (RFC 9051): no \Recent and no RECENT
    /// response, SEARCH answered with ESEARCH, no UNSEEN code on SELECT.
    pub(crate) rev2: bool,
    /// The command being run had MODSEQ search criteria: its SEARCH answer names
    /// the highest modseq found (RFC 7162 §3.1.5).
    pub(crate) search_modseq: bool,
    rate_window: Instant,
    rate_count: u32,
    /// When an unauthenticated session is logged out, however busy it keeps
    /// itself (`preauth_timeout_secs`).
    login_deadline: Instant,
    /// The command being run, as read: APPEND's messages are slices of it.
    pub(crate) command: bytes::Bytes,
}

impl Session {
    pub(crate) fn new(
        app: App,
        shared: Arc<Shared>,
        stream: SessionStream,
        ctx: SessionCtx,
        tls: bool,
    ) -> Self {
        let cfg = app.config.imap.clone();
        let input = Input::new(preauth_limits(&cfg), &app.budget);
        let login_deadline = Instant::now() + Duration::from_secs(cfg.preauth_timeout_secs);
        Session {
            app,
            cfg,
            shared,
            stream,
            input,
            out: Output::with_capacity(4096),
            ctx,
            tls,
            state: State::NotAuthenticated,
            selected: None,
            user_slot: None,
            condstore: false,
            qresync: false,
            utf8: false,
            rev2: false,
            search_modseq: false,
            rate_window: Instant::now(),
            rate_count: 0,
            login_deadline,
            command: bytes::Bytes::new(),
        }
    }

    pub fn account(&self) -> Option<&Account> {
        match &self.state {
            State::Authenticated(a) => Some(a),
            State::NotAuthenticated => None,
        }
    }

    pub(crate) fn push(&mut self, line: &str) {
        self.out.extend_from_slice(line.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    pub(crate) async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.out.write_to(&mut self.stream).await?;
        }
        self.stream.flush().await
    }

    /// The whole session. (`mail_connections_active` is kept by the listener.)
    pub async fn run(mut self) {
        if let Err(e) = self.serve().await {
            tracing::debug!(error = %e, "imap: session ended with an I/O error");
        }
        if let Some(sel) = self.selected.take() {
            drop(sel);
        }
        if let Some(slot) = self.user_slot.take() {
            slot.release().await;
        }
        self.stream.close().await;
    }

    async fn serve(&mut self) -> std::io::Result<()> {
        if self.ctx.shutdown.is_signalled() {
            self.push("* BYE Server shutting down");
            return self.flush().await;
        }
        let caps = self.capabilities();
        self.push(&format!("* OK [CAPABILITY {caps}] Mailcluster IMAP4rev1 ready"));
        self.flush().await?;
        loop {
            let (timeout, limits) = match self.state {
                State::Authenticated(_) => (
                    Duration::from_secs(self.cfg.autologout_secs),
                    Limits { max_line: self.cfg.max_line_bytes, max_literal: self.cfg.max_literal_bytes },
                ),
                State::NotAuthenticated => {
                    (self.login_deadline.saturating_duration_since(Instant::now()), preauth_limits(&self.cfg))
                }
            };
            self.input.set_limits(limits);
            let mut shutdown = self.ctx.shutdown.clone();
            let read = tokio::select! {
                r = tokio::time::timeout(timeout, self.input.read_command(&mut self.stream)) => r,
                _ = shutdown.signalled() => {
                    self.push("* BYE Server shutting down");
                    return self.flush().await;
                }
            };
            let cmd = match read {
                Err(_) => {
                    self.push("* BYE Autologout; idle for too long");
                    return self.flush().await;
                }
                Ok(r) => match r? {
                    ReadOutcome::Command(c) => c,
                    ReadOutcome::Eof => return Ok(()),
                    ReadOutcome::LineTooLong => {
                        self.push("* BAD [TOOBIG] Command line too long");
                        self.push("* BYE Closing connection");
                        return self.flush().await;
                    }
                    // Before login a client has no business sending more than a
                    // password: refused as a protocol error, as Dovecot's login
                    // process does, and never continued.
                    ReadOutcome::LiteralTooLarge { tag, sync: true, size } if self.account().is_none() => {
                        self.push(&format!(
                            "{tag} BAD [TOOBIG] Literal of {size} octets not allowed before login"
                        ));
                        self.flush().await?;
                        continue;
                    }
                    ReadOutcome::Busy { tag, sync } => {
                        self.push(&format!("{tag} NO [LIMIT] Server busy, try again later"));
                        if sync {
                            self.flush().await?;
                            continue;
                        }
                        // The literal is on its way and will not be read: the
                        // client cannot be kept in step (RFC 7888 §4).
                        self.push("* BYE Closing connection");
                        return self.flush().await;
                    }
                    ReadOutcome::LiteralTooLarge { tag, sync: true, size } => {
                        // The client waits for "+" and has sent nothing more: refuse
                        // and carry on (RFC 7888 §4).
                        self.push(&format!("{tag} NO [TOOBIG] Literal of {size} octets exceeds the limit"));
                        self.flush().await?;
                        continue;
                    }
                    ReadOutcome::LiteralTooLarge { tag, sync: false, size } => {
                        self.push(&format!("{tag} BAD [TOOBIG] Literal of {size} octets exceeds the limit"));
                        self.push("* BYE Closing connection");
                        return self.flush().await;
                    }
                },
            };
            self.throttle().await;
            // Shared, so that APPEND stores its literal without copying it.
            let cmd = bytes::Bytes::from(cmd);
            self.command = cmd.clone();
            let keep = self.execute(&cmd).await;
            self.command = bytes::Bytes::new();
            drop(cmd);
            if !keep? {
                return self.flush().await;
            }
            self.flush().await?;
        }
    }

    /// Spreads bursts over time instead of refusing: a client over the per-second
    /// budget waits for the next window.
    async fn throttle(&mut self) {
        let max = self.cfg.max_commands_per_second;
        if max == 0 {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.rate_window) >= Duration::from_secs(1) {
            self.rate_window = now;
            self.rate_count = 0;
        }
        self.rate_count += 1;
        if self.rate_count > max {
            tokio::time::sleep_until((self.rate_window + Duration::from_secs(1)).into()).await;
            self.rate_window = Instant::now();
            self.rate_count = 1;
        }
    }

    /// Parses and runs one command; false when the session must end.
    async fn execute(&mut self, cmd: &[u8]) -> std::io::Result<bool> {
        if self.uidvalidity_renewed() {
            self.push(UIDVALIDITY_BYE);
            return Ok(false);
        }
        let as_literals;
        let cmd = match parse::eight_bit_quoted_as_literals(cmd) {
            Some(c) => {
                as_literals = c;
                as_literals.as_slice()
            }
            None => cmd,
        };
        let substituted;
        let cmd = match self.with_saved_result(cmd) {
            Ok(Some(c)) => {
                substituted = c;
                substituted.as_slice()
            }
            Ok(None) => cmd,
            Err(reply) => {
                self.push(&reply);
                return Ok(true);
            }
        };
        let rewritten;
        let cmd = match self.with_rewritten_criteria(cmd).await {
            Some((c, modseq)) => {
                rewritten = c;
                self.search_modseq = modseq;
                rewritten.as_slice()
            }
            None => cmd,
        };
        let shallow;
        let cmd = match parse::shallow_or_chains(cmd) {
            Some(c) => {
                shallow = c;
                shallow.as_slice()
            }
            None => cmd,
        };
        let (tag, request) = match parse::parse(cmd) {
            Ok(v) => v,
            Err(e) => {
                self.push(&format!("{} BAD {}", e.tag, e.text));
                self.count("UNKNOWN", "bad", Duration::ZERO);
                return Ok(true);
            }
        };
        let name = request_name(&request);
        let started = Instant::now();
        let outcome = match request {
            Request::Codec(Command { body, .. }) => self.dispatch(&tag, body).await?,
            Request::Id => self.cmd_id(),
            Request::Namespace => self.cmd_namespace(),
            Request::UidExpunge(set) => match self.require_selected() {
                Some(o) => o,
                None => self.cmd_expunge(Some(set)).await,
            },
            Request::Append { mailbox, messages } => match self.require_auth() {
                Some(o) => o,
                None => self.cmd_append(&mailbox, messages).await,
            },
            Request::Create { uses, create } => match self.require_auth() {
                Some(o) => o,
                None => match imap_codec::CommandCodec::default().decode(&create) {
                    Ok((b"", Command { body: CommandBody::Create { mailbox }, .. })) => {
                        self.cmd_create(&mailbox, &uses).await
                    }
                    _ => Outcome::bad("Invalid CREATE arguments"),
                },
            },
            Request::GetQuota(root) => match self.require_auth() {
                Some(o) => o,
                None => self.cmd_getquota(&root).await,
            },
            Request::GetQuotaRoot(mailbox) => match self.require_auth() {
                Some(o) => o,
                None => self.cmd_getquotaroot(&mailbox).await,
            },
            Request::SetQuota => match self.require_auth() {
                Some(o) => o,
                None => self.cmd_setquota(),
            },
            Request::Compress(mechanism) => match self.require_auth() {
                Some(o) => o,
                None => self.cmd_compress(&tag, &mechanism).await?,
            },
            Request::ListExtended(list) => match self.require_auth() {
                Some(o) => o,
                None => self.cmd_list_extended(&list).await,
            },
            Request::Status { items, status } => match self.require_auth() {
                Some(o) => o,
                None => match imap_codec::CommandCodec::default().decode(&status) {
                    Ok((b"", Command { body: CommandBody::Status { mailbox, .. }, .. })) => {
                        self.cmd_status(&mailbox, &items).await
                    }
                    _ => Outcome::bad("Invalid STATUS arguments"),
                },
            },
            Request::Select { read_only, params, select } => match self.require_auth() {
                Some(o) => o,
                None if params.qresync.is_some() && !self.qresync => {
                    Outcome::bad("QRESYNC parameter without ENABLE QRESYNC")
                }
                None => match imap_codec::CommandCodec::default().decode(&select) {
                    Ok((
                        b"",
                        Command {
                            body: CommandBody::Select { mailbox } | CommandBody::Examine { mailbox },
                            ..
                        },
                    )) => {
                        self.condstore = true;
                        self.cmd_select(&mailbox, read_only, params.qresync.as_ref()).await
                    }
                    _ => Outcome::bad("Invalid SELECT arguments"),
                },
            },
            Request::Fetch { ext, binary, fetch } => match self.require_selected() {
                Some(o) => o,
                None if ext.vanished && !self.qresync => Outcome::bad("VANISHED without ENABLE QRESYNC"),
                None => match imap_codec::CommandCodec::default().decode(&fetch) {
                    Ok((
                        b"",
                        Command {
                            body: CommandBody::Fetch { sequence_set, macro_or_item_names, uid }, ..
                        },
                    )) => {
                        // A MODSEQ item enables CONDSTORE (RFC 7162 §3.1); BINARY
                        // items alone do not.
                        if ext.item {
                            self.enable_condstore();
                        }
                        self.cmd_fetch(&sequence_set, macro_or_item_names, uid, ext, binary).await
                    }
                    _ => Outcome::bad("Invalid FETCH arguments"),
                },
            },
            Request::Store { unchanged_since, store } => match self.require_selected() {
                Some(o) => o,
                None => match imap_codec::CommandCodec::default().decode(&store) {
                    Ok((
                        b"",
                        Command {
                            body: CommandBody::Store { sequence_set, kind, response, flags, uid }, ..
                        },
                    )) => {
                        self.enable_condstore();
                        self.cmd_store(&sequence_set, kind, response, &flags, uid, Some(unchanged_since))
                            .await
                    }
                    _ => Outcome::bad("Invalid STORE arguments"),
                },
            },
            Request::Searching { kind, search, .. } => match (self.require_selected(), search_of(&search)) {
                (Some(o), _) => o,
                (None, None) => Outcome::bad("Invalid search criteria"),
                (None, Some((charset, criteria, uid))) => {
                    let charset = charset.as_ref();
                    match &kind {
                        SearchKind::ESearch(options) => {
                            self.cmd_search(Some((&tag, options)), charset, &criteria, uid).await
                        }
                        SearchKind::Sort(keys, returns) => {
                            let esort = returns.as_deref().map(|r| (tag.as_str(), r));
                            self.cmd_sort(esort, charset, &criteria, keys, uid).await
                        }
                        SearchKind::Thread(algorithm) => {
                            match self.matching_rows(charset, &criteria, uid).await {
                                Ok(rows) => self.cmd_thread(*algorithm, rows, uid).await,
                                Err(o) => o,
                            }
                        }
                    }
                }
            },
        };
        self.search_modseq = false;
        let (result, keep) = match outcome {
            Outcome::Ok(text) => {
                self.push(&format!("{tag} OK {text}"));
                ("ok", true)
            }
            Outcome::No(text) => {
                self.push(&format!("{tag} NO {text}"));
                ("no", true)
            }
            Outcome::Bad(text) => {
                self.push(&format!("{tag} BAD {text}"));
                ("bad", true)
            }
            Outcome::Sent => ("ok", true),
            Outcome::Close => {
                self.push(&format!("{tag} OK LOGOUT completed"));
                ("ok", false)
            }
        };
        self.count(name, result, started.elapsed());
        Ok(keep)
    }

    /// `$` (SEARCHRES, RFC 5182) replaced by the saved result, in the form the
    /// command takes: `UID set` as a search key, a UID set in UID commands, sequence
    /// numbers otherwise. `Ok(None)`: no `$`. `Err(line)`: the command's whole
    /// answer (nothing selected; or an empty result, which names no message).
    fn with_saved_result(&self, cmd: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let refs = parse::saved_result_refs(cmd);
        if refs.is_empty() {
            return Ok(None);
        }
        let tag = crate::proto::imap::tag_of(cmd);
        let Some(sel) = self.selected.as_ref() else { return Err(format!("{tag} BAD No mailbox selected")) };
        let words: Vec<String> = cmd
            .split(|&b| b == b' ')
            .skip(1)
            .take(2)
            .map(|w| String::from_utf8_lossy(w).trim_end().to_ascii_uppercase())
            .collect();
        let uid = words.first().is_some_and(|w| w == "UID");
        let verb = if uid { words.get(1) } else { words.first() }.cloned().unwrap_or_default();
        let present: Vec<u32> = sel.saved.iter().copied().filter(|&u| sel.seq_of(u).is_some()).collect();
        let replacement = if matches!(verb.as_str(), "SEARCH" | "SORT" | "THREAD") {
            if present.is_empty() {
                "NOT ALL".to_string()
            } else {
                format!("UID {}", encode::sequence_set(&present))
            }
        } else if present.is_empty() {
            let name = if uid { format!("UID {verb}") } else { verb };
            return Err(format!("{tag} OK {name} completed (the saved result is empty)"));
        } else if uid {
            encode::sequence_set(&present)
        } else {
            let seqs: Vec<u32> = present.iter().filter_map(|&u| sel.seq_of(u)).collect();
            encode::sequence_set(&seqs)
        };
        let mut out = Vec::with_capacity(cmd.len() + replacement.len());
        let mut last = 0;
        for at in refs {
            out.extend_from_slice(&cmd[last..at]);
            out.extend_from_slice(replacement.as_bytes());
            last = at + 1;
        }
        out.extend_from_slice(&cmd[last..]);
        Ok(Some(out))
    }

    /// MODSEQ search criteria (RFC 7162 §3.1.5) replaced by the UIDs they match,
    /// from each message's modseq in the session's map, and YOUNGER/OLDER (RFC
    /// 5032) from each message's internal date and EMAILID/THREADID (RFC 8474 §6)
    /// from its stored message id (the sort keys' cache): nested in
    /// OR or NOT (`OR NOT MODSEQ n LARGER 5`) as well as alone, with one search
    /// grammar. `None`: no such criterion, or nothing selected (the command then
    /// fails as usual); else the command and whether a MODSEQ was among them.
    async fn with_rewritten_criteria(&mut self, cmd: &[u8]) -> Option<(Vec<u8>, bool)> {
        let criteria = parse::rewritten_criteria(cmd);
        if criteria.is_empty() || self.selected.is_none() {
            return None;
        }
        // Current first, without announcing EXPUNGE (the search syncs again and
        // reports a store error if there is one).
        let _ = self.sync(false).await;
        let modseq = criteria.iter().any(|(_, k)| matches!(k, parse::Rewritten::Modseq(_)));
        if modseq {
            self.enable_condstore();
        }
        // Internal dates (microseconds) and stored message ids of the messages in
        // view, when asked for.
        let mut arrivals: Option<Vec<(u32, i64, i64)>> = None;
        if criteria.iter().any(|(_, k)| {
            matches!(
                k,
                parse::Rewritten::Younger(_)
                    | parse::Rewritten::Older(_)
                    | parse::Rewritten::EmailId(Some(_))
            )
        }) {
            let sel = self.selected.as_ref()?;
            let mailbox = (sel.mailbox.id, sel.mailbox.uid_validity);
            let uids = sel.uids.clone();
            let keys = self.keys_of(mailbox, &uids).await.ok()?;
            arrivals = Some(keys.iter().map(|k| (k.uid, k.arrival, k.message_id)).collect());
        }
        let now = chrono::Utc::now().timestamp_micros();
        let sel = self.selected.as_ref()?;
        let mut out = Vec::with_capacity(cmd.len());
        let mut last = 0;
        for (range, key) in criteria {
            let within = |seconds: u32, younger: bool| -> Vec<u32> {
                let cutoff = now - i64::from(seconds) * 1_000_000;
                arrivals
                    .iter()
                    .flatten()
                    .filter(|&&(_, at, _)| if younger { at >= cutoff } else { at < cutoff })
                    .map(|&(u, _, _)| u)
                    .collect()
            };
            let uids: Vec<u32> = match key {
                parse::Rewritten::Modseq(n) => sel
                    .uids
                    .iter()
                    .zip(&sel.modseqs)
                    .filter(|&(u, &m)| m >= n && !sel.pending_expunge.contains(u))
                    .map(|(&u, _)| u)
                    .collect(),
                parse::Rewritten::Younger(s) => within(s, true),
                parse::Rewritten::Older(s) => within(s, false),
                parse::Rewritten::EmailId(Some(id)) => {
                    arrivals.iter().flatten().filter(|&&(_, _, m)| m == id).map(|&(u, _, _)| u).collect()
                }
                parse::Rewritten::EmailId(None) | parse::Rewritten::ThreadId => Vec::new(),
            };
            out.extend_from_slice(&cmd[last..range.start]);
            if uids.is_empty() {
                out.extend_from_slice(b"NOT ALL");
            } else {
                out.extend_from_slice(format!("UID {}", encode::sequence_set(&uids)).as_bytes());
            }
            last = range.end;
        }
        out.extend_from_slice(&cmd[last..]);
        Some((out, modseq))
    }

    fn count(&self, command: &str, result: &str, took: Duration) {
        let m = &self.app.metrics;
        m.commands_total.with_label_values(&["imap", command, result]).inc();
        m.command_duration.with_label_values(&["imap", command]).observe(took.as_secs_f64());
    }

    pub(crate) fn require_auth(&self) -> Option<Outcome> {
        match self.state {
            State::Authenticated(_) => None,
            State::NotAuthenticated => Some(Outcome::bad("Log in first")),
        }
    }

    pub(crate) fn require_selected(&self) -> Option<Outcome> {
        self.require_auth().or_else(|| match self.selected {
            Some(_) => None,
            None => Some(Outcome::bad("No mailbox selected")),
        })
    }

    async fn dispatch(&mut self, tag: &str, body: CommandBody<'_>) -> std::io::Result<Outcome> {
        use CommandBody as C;
        // State checks first: RFC 3501 §3 says which commands are valid where.
        let needs = match &body {
            C::Capability | C::Noop | C::Logout => Needs::Any,
            C::StartTLS | C::Authenticate { .. } | C::Login { .. } => Needs::Any,
            C::Select { .. }
            | C::Examine { .. }
            | C::Create { .. }
            | C::Delete { .. }
            | C::Rename { .. }
            | C::Subscribe { .. }
            | C::Unsubscribe { .. }
            | C::List { .. }
            | C::Lsub { .. }
            | C::Status { .. }
            | C::Append { .. }
            | C::Idle
            | C::Enable { .. } => Needs::Authenticated,
            _ => Needs::Selected,
        };
        let refused = match needs {
            Needs::Authenticated => self.require_auth(),
            Needs::Selected => self.require_selected(),
            Needs::Any => None,
        };
        if let Some(o) = refused {
            return Ok(o);
        }
        Ok(match body {
            C::Capability => self.cmd_capability(),
            C::Noop => self.cmd_noop("NOOP").await,
            // RFC 3501 §6.4.1: a checkpoint; every write is durable already.
            C::Check => self.cmd_noop("CHECK").await,
            C::Logout => {
                if let Some(slot) = self.user_slot.take() {
                    slot.release().await;
                }
                self.push("* BYE Logging out");
                Outcome::Close
            }
            C::StartTLS => return self.cmd_starttls(tag).await,
            C::Login { username, password } => {
                self.cmd_login(username.as_ref(), password.declassify().as_ref()).await
            }
            C::Authenticate { mechanism, initial_response } => {
                let ir = initial_response.map(|s| s.declassify().to_vec());
                return self.cmd_authenticate(&mechanism, ir).await;
            }
            C::Enable { capabilities } => self.cmd_enable(capabilities.as_ref()),
            C::Select { mailbox } => self.cmd_select(&mailbox, false, None).await,
            C::Examine { mailbox } => self.cmd_select(&mailbox, true, None).await,
            C::Create { mailbox } => self.cmd_create(&mailbox, &[]).await,
            C::Delete { mailbox } => self.cmd_delete(&mailbox).await,
            C::Rename { from, to } => self.cmd_rename(&from, &to).await,
            C::Subscribe { mailbox } => self.cmd_subscribe(&mailbox, true).await,
            C::Unsubscribe { mailbox } => self.cmd_subscribe(&mailbox, false).await,
            C::List { reference, mailbox_wildcard } => {
                self.cmd_list(&reference, &mailbox_wildcard, false).await
            }
            C::Lsub { reference, mailbox_wildcard } => {
                self.cmd_list(&reference, &mailbox_wildcard, true).await
            }
            C::Status { mailbox, item_names } => {
                use imap_codec::imap_types::status::StatusDataItemName as N;
                // DELETED / DELETED-STORAGE (RFC 9051) are not announced: not answered.
                let items: Vec<StatusItem> = item_names
                    .as_ref()
                    .iter()
                    .filter_map(|i| match i {
                        N::Messages => Some(StatusItem::Messages),
                        N::Recent => Some(StatusItem::Recent),
                        N::UidNext => Some(StatusItem::UidNext),
                        N::UidValidity => Some(StatusItem::UidValidity),
                        N::Unseen => Some(StatusItem::Unseen),
                        _ => None,
                    })
                    .collect();
                self.cmd_status(&mailbox, &items).await
            }
            C::Append { .. } => Outcome::bad("APPEND is parsed elsewhere"),
            C::Idle => return self.cmd_idle(tag).await,
            C::Unselect => self.cmd_close(false).await,
            C::Close => self.cmd_close(true).await,
            C::Expunge => self.cmd_expunge(None).await,
            C::Search { charset, criteria, uid } => {
                // IMAP4rev2 has no SEARCH response: a SEARCH without RETURN is
                // answered as `RETURN (ALL)` would be (RFC 9051 §6.4.4).
                let esearch = self.rev2.then_some((tag, &[][..]));
                self.cmd_search(esearch, charset.as_ref(), &criteria, uid).await
            }
            C::Fetch { sequence_set, macro_or_item_names, uid } => {
                self.cmd_fetch(&sequence_set, macro_or_item_names, uid, FetchExtension::default(), Vec::new())
                    .await
            }
            C::Store { sequence_set, kind, response, flags, uid } => {
                self.cmd_store(&sequence_set, kind, response, &flags, uid, None).await
            }
            C::Copy { sequence_set, mailbox, uid } => {
                self.cmd_copy(&sequence_set, &mailbox, uid, false).await
            }
            C::Move { sequence_set, mailbox, uid } => self.cmd_copy(&sequence_set, &mailbox, uid, true).await,
            _ => Outcome::bad("Command not supported"),
        })
    }

    /// NOOP, or CHECK (`name`): reports what changed in the selected mailbox.
    pub(crate) async fn cmd_noop(&mut self, name: &str) -> Outcome {
        if self.selected.is_some()
            && let Err(e) = self.sync(true).await
        {
            return store_error(e);
        }
        Outcome::ok(format!("{name} completed"))
    }
}

/// Before login: lines and literals no longer than a password or a SASL token
/// needs.
fn preauth_limits(cfg: &ImapConfig) -> Limits {
    let cap = cfg.preauth_max_command_bytes;
    Limits { max_line: cfg.max_line_bytes.min(cap), max_literal: cfg.max_literal_bytes.min(cap) }
}

/// The session state a command is valid in (RFC 3501 §3): any, authenticated
/// (selected included), or selected.
enum Needs {
    Any,
    Authenticated,
    Selected,
}

fn request_name(r: &Request<'_>) -> &'static str {
    match r {
        Request::Codec(c) => match &c.body {
            CommandBody::Fetch { uid: true, .. } => "UID FETCH",
            CommandBody::Search { uid: true, .. } => "UID SEARCH",
            CommandBody::Store { uid: true, .. } => "UID STORE",
            CommandBody::Copy { uid: true, .. } => "UID COPY",
            CommandBody::Move { uid: true, .. } => "UID MOVE",
            body => body.name(),
        },
        Request::Id => "ID",
        Request::Namespace => "NAMESPACE",
        Request::Create { .. } => "CREATE",
        Request::GetQuota(_) => "GETQUOTA",
        Request::GetQuotaRoot(_) => "GETQUOTAROOT",
        Request::SetQuota => "SETQUOTA",
        Request::UidExpunge(_) => "UID EXPUNGE",
        Request::Append { .. } => "APPEND",
        Request::Compress(_) => "COMPRESS",
        Request::ListExtended(_) => "LIST",
        Request::Status { .. } => "STATUS",
        Request::Select { read_only: false, .. } => "SELECT",
        Request::Select { read_only: true, .. } => "EXAMINE",
        Request::Fetch { fetch, .. } if fetch_is_uid(fetch) => "UID FETCH",
        Request::Fetch { .. } => "FETCH",
        Request::Store { store, .. } if fetch_is_uid(store) => "UID STORE",
        Request::Store { .. } => "STORE",
        Request::Searching { uid, kind, .. } => match (kind, uid) {
            (SearchKind::ESearch(_), true) => "UID SEARCH",
            (SearchKind::ESearch(_), false) => "SEARCH",
            (SearchKind::Sort(..), true) => "UID SORT",
            (SearchKind::Sort(..), false) => "SORT",
            (SearchKind::Thread(_), true) => "UID THREAD",
            (SearchKind::Thread(_), false) => "THREAD",
        },
    }
}

/// Whether a rewritten command is a UID command (its second word).
fn fetch_is_uid(cmd: &[u8]) -> bool {
    cmd.split(|&b| b == b' ').nth(1).is_some_and(|w| w.eq_ignore_ascii_case(b"UID"))
}

/// The SEARCH a search extension's command was rewritten into: its charset,
/// criteria and UID-ness.
fn search_of(search: &[u8]) -> Option<(Option<Charset<'_>>, SearchKey<'_>, bool)> {
    match imap_codec::CommandCodec::default().decode(search) {
        Ok((b"", Command { body: CommandBody::Search { charset, criteria, uid }, .. })) => {
            Some((charset, criteria, uid))
        }
        _ => None,
    }
}
