//! Scenario execution: workers, open- and closed-loop scheduling, ramp-up, bounds.
//!
//! **Open loop** (`rate` set): a scheduler computes the intended start time of
//! operation *i* from the target rate (and the ramp), and queues it at that time,
//! whatever the workers are doing. Workers take jobs from the queue and measure
//! latency from the job's *intended* time. When the server stalls, jobs pile up in the
//! queue and every one of them is charged the time it waited — the measurement does
//! not suffer from coordinated omission (a closed-loop generator would simply stop
//! sending during the stall and report only the few requests in flight as slow).
//! Jobs still queued when the drain deadline passes are counted as errors
//! (`backlog`): they were due and never sent.
//!
//! **Closed loop** (no `rate`): each worker issues its next operation as soon as the
//! previous one ends; throughput is whatever the server sustains at that
//! concurrency. Latency is from the actual start.
//!
//! Every scenario is bounded twice: by time (ramp + duration, then a drain of at most
//! one operation timeout) and by an operation budget (`maxOps`). Each operation runs
//! under its own timeout, after which the worker drops its sessions (their state is
//! unknown) and counts `timeout`.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mailcluster_api::stress::{AuthMechanism, MessageSize, Protocol, ScenarioKind, SmtpTarget};
use tokio::sync::{Mutex, mpsc, watch};

use crate::client::imap::ImapClient;
use crate::client::pop3::Pop3Client;
use crate::client::smtp::SmtpClient;
use crate::client::{ClientError, Endpoint, TlsMode};
use crate::measure::Recorder;
use crate::slo::Threshold;
use crate::workload::{Messages, Users};

/// Endpoints of the system under test.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    pub smtp: Option<Endpoint>,
    pub submission: Option<Endpoint>,
    pub submissions: Option<Endpoint>,
    pub imap: Option<Endpoint>,
    pub pop3: Option<Endpoint>,
}

impl Targets {
    pub fn smtp_target(&self, t: SmtpTarget) -> Option<&Endpoint> {
        match t {
            SmtpTarget::Smtp => self.smtp.as_ref(),
            SmtpTarget::Submission => self.submission.as_ref(),
            SmtpTarget::Submissions => self.submissions.as_ref(),
        }
    }
}

/// Operations a scenario can mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// SMTP delivery through the given target, or the scenario's `smtpTarget`.
    Deliver(Option<SmtpTarget>),
    Noop,
    Auth,
    Search,
    Fetch,
    Pop3,
    Seed,
    /// One command of a mail client's IMAP session (see [`ImapCmd`]).
    Imap(ImapCmd),
}

/// The commands of a mail client's IMAP session (`imap-mix`). LOGIN, LIST, STATUS,
/// SELECT and the flag sync open a session, LOGOUT ends it and EXPUNGE follows a
/// delete; the others are drawn by weight in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImapCmd {
    /// Connect and `LOGIN` (or `AUTHENTICATE PLAIN` with `auth: plain`).
    Login,
    /// `LIST "" "*"`: the folder tree.
    List,
    /// `STATUS INBOX (MESSAGES UNSEEN UIDNEXT)`: the counts a folder pane shows.
    Status,
    /// `SELECT INBOX`.
    Select,
    /// `UID FETCH 1:* (FLAGS)`: the flag sync of a client without CONDSTORE.
    FetchFlags,
    /// `UID FETCH lo:hi (UID FLAGS RFC822.SIZE INTERNALDATE ENVELOPE)` over 25
    /// messages: a screenful of the message list.
    FetchEnvelope,
    /// `UID FETCH n BODY.PEEK[]`: opening a message.
    FetchBody,
    /// `UID STORE n ±FLAGS (\Seen)` or `(\Flagged)`: read/unread, flag/unflag.
    Store,
    /// `UID STORE n +FLAGS.SILENT (\Deleted)`, followed by an EXPUNGE.
    Delete,
    /// `EXPUNGE` (only after a delete).
    Expunge,
    /// `APPEND INBOX (\Seen) {n}`: saving a draft or a sent copy.
    Append,
    /// `NOOP`: polling for new mail.
    Noop,
    /// `LOGOUT` after `opsPerConnection` commands.
    Logout,
}

impl ImapCmd {
    /// Weighted commands and their `weights` keys (the rest follow the session).
    const WEIGHTED: [(ImapCmd, &'static str); 7] = [
        (ImapCmd::FetchEnvelope, "imap-fetch-envelope"),
        (ImapCmd::FetchBody, "imap-fetch-body"),
        (ImapCmd::Store, "imap-store"),
        (ImapCmd::Delete, "imap-delete"),
        (ImapCmd::Append, "imap-append"),
        (ImapCmd::Noop, "imap-noop"),
        (ImapCmd::Status, "imap-status"),
    ];

    /// `imap-mix`'s weights when a scenario gives none. A reading session: mostly
    /// opening messages and scrolling the list, a flag change for every few
    /// reads, a poll every few commands; deletes and appends equal, so the
    /// mailbox keeps its size over a long run.
    pub const DEFAULT_WEIGHTS: [(&'static str, u32); 7] = [
        ("imap-fetch-envelope", 20),
        ("imap-fetch-body", 30),
        ("imap-store", 20),
        ("imap-delete", 5),
        ("imap-append", 5),
        ("imap-noop", 15),
        ("imap-status", 5),
    ];

    pub fn name(self) -> &'static str {
        match self {
            ImapCmd::Login => "imap-login",
            ImapCmd::List => "imap-list",
            ImapCmd::Status => "imap-status",
            ImapCmd::Select => "imap-select",
            ImapCmd::FetchFlags => "imap-fetch-flags",
            ImapCmd::FetchEnvelope => "imap-fetch-envelope",
            ImapCmd::FetchBody => "imap-fetch-body",
            ImapCmd::Store => "imap-store",
            ImapCmd::Delete => "imap-delete",
            ImapCmd::Expunge => "imap-expunge",
            ImapCmd::Append => "imap-append",
            ImapCmd::Noop => "imap-noop",
            ImapCmd::Logout => "imap-logout",
        }
    }

    /// Does the command name a message of the mailbox?
    fn needs_message(self) -> bool {
        matches!(self, ImapCmd::FetchEnvelope | ImapCmd::FetchBody | ImapCmd::Store | ImapCmd::Delete)
    }
}

impl Op {
    pub fn parse(s: &str) -> Option<Op> {
        if let Some((cmd, _)) = ImapCmd::WEIGHTED.iter().find(|(_, k)| *k == s) {
            return Some(Op::Imap(*cmd));
        }
        Some(match s {
            "deliver" | "send" => Op::Deliver(None),
            "submission" => Op::Deliver(Some(SmtpTarget::Submission)),
            "submissions" => Op::Deliver(Some(SmtpTarget::Submissions)),
            "noop" => Op::Noop,
            "auth" | "login" => Op::Auth,
            "search" => Op::Search,
            "fetch" | "read" => Op::Fetch,
            "pop3" => Op::Pop3,
            _ => return None,
        })
    }
}

/// A resolved scenario: every knob has its value.
#[derive(Clone, Debug)]
pub struct Plan {
    pub name: String,
    pub kind: ScenarioKind,
    pub protocol: Option<Protocol>,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub duration: Duration,
    pub ramp_up: Duration,
    pub max_ops: u64,
    pub timeout: Duration,
    pub auth: AuthMechanism,
    pub ops_per_connection: u32,
    /// SMTP endpoint of deliveries that do not name one, and of SMTP auth / flood.
    pub smtp_target: SmtpTarget,
    /// Envelope sender and `From:` instead of the default (see [`Worker`]).
    pub sender: Option<String>,
    /// Recipients at this domain (same local parts as the users): outbound mail.
    pub recipient_domain: Option<String>,
    /// Operations with cumulative weights.
    pub mix: Vec<(Op, u64)>,
    pub messages_per_user: u32,
    pub sizes: Vec<MessageSize>,
    pub slo: Vec<Threshold>,
}

impl Plan {
    /// Intended start of operation `i` (open loop), relative to the scenario start.
    /// During the ramp the rate grows linearly from 0 to `rate`, so the cumulative
    /// count is `rate·t²/(2·ramp)`; after it, `rate` per second.
    pub fn offset(&self, i: u64, rate: f64) -> Duration {
        let ramp = self.ramp_up.as_secs_f64();
        let i = i as f64;
        let ramp_ops = rate * ramp / 2.0;
        let t = if ramp > 0.0 && i < ramp_ops {
            (2.0 * i * ramp / rate).sqrt()
        } else {
            ramp + (i - ramp_ops) / rate
        };
        Duration::from_secs_f64(t.max(0.0))
    }

    fn pick(&self, r: u64) -> Op {
        let total = self.mix.last().map_or(1, |(_, w)| *w).max(1);
        let w = r % total;
        self.mix.iter().find(|(_, c)| w < *c).map_or(Op::Deliver(None), |(op, _)| *op)
    }
}

/// Shared inputs of a run.
pub struct Env {
    pub targets: Targets,
    pub users: Users,
    pub messages: Messages,
    pub helo: String,
    rcpt: AtomicUsize,
    /// Left part of every Message-ID this run writes: unique per run, so each
    /// message is findable in the store (and a second copy of one is visible).
    id_prefix: String,
    sent: AtomicU64,
    ack_log: Option<std::sync::Mutex<std::io::BufWriter<std::fs::File>>>,
}

impl Env {
    pub fn new(targets: Targets, users: Users, messages: Messages, run_id: &str) -> Env {
        let id_prefix = format!("{run_id}.{}", std::process::id());
        Env {
            targets,
            users,
            messages,
            helo: "stress.mailcluster.test".into(),
            rcpt: AtomicUsize::new(0),
            id_prefix,
            sent: AtomicU64::new(0),
            ack_log: None,
        }
    }

    /// Record acknowledged Message-IDs in `path` (see `--ack-log`).
    pub fn with_ack_log(mut self, path: &std::path::Path) -> anyhow::Result<Env> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("cannot create the acknowledgement log {}", path.display()))?;
        self.ack_log = Some(std::sync::Mutex::new(std::io::BufWriter::new(file)));
        Ok(self)
    }

    fn next_message_id(&self) -> String {
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n}@stress.mailcluster.test", self.id_prefix)
    }

    fn acknowledged(&self, message_id: &str) {
        if let Some(log) = &self.ack_log {
            let mut w = log.lock().unwrap_or_else(|e| e.into_inner());
            // A write error surfaces at the final flush.
            let _ = writeln!(w, "{message_id}");
        }
    }

    /// Flush the acknowledgement log; an error here means the log is incomplete.
    pub fn finish(&self) -> anyhow::Result<()> {
        if let Some(log) = &self.ack_log {
            log.lock().unwrap_or_else(|e| e.into_inner()).flush().context("acknowledgement log")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
struct Job {
    intended: Instant,
    seq: u64,
}

/// Wait until the flag turns true (or forever when the sender is gone).
pub async fn cancelled(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Run one scenario's load to completion (or cancellation). Returns the number of
/// operations that were due but never started.
pub async fn drive(plan: Arc<Plan>, env: Arc<Env>, rec: Arc<Recorder>, cancel: watch::Receiver<bool>) -> u64 {
    if plan.kind == ScenarioKind::ConnectFlood {
        flood(plan, env, rec, cancel).await;
        return 0;
    }
    let start = Instant::now();
    let deadline = start + plan.ramp_up + plan.duration;
    let hard_deadline = deadline + plan.timeout;
    let mut workers = tokio::task::JoinSet::new();
    let mut backlog = 0;
    match plan.rate {
        Some(rate) if rate > 0.0 => {
            let (tx, rx) = mpsc::unbounded_channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            let sched_plan = Arc::clone(&plan);
            let mut sched_cancel = cancel.clone();
            let scheduler = tokio::spawn(async move {
                for i in 0..sched_plan.max_ops {
                    let intended = start + sched_plan.offset(i, rate);
                    if intended >= deadline {
                        break;
                    }
                    // Jobs already due are queued without sleeping, so a late wake-up
                    // (timer granularity is 1 ms) releases a burst that keeps the mean
                    // rate exact; their latency still counts from `intended`.
                    if intended > Instant::now() {
                        tokio::select! {
                            _ = tokio::time::sleep_until(intended.into()) => {}
                            _ = cancelled(&mut sched_cancel) => break,
                        }
                    }
                    if tx.send(Job { intended, seq: i }).is_err() {
                        break;
                    }
                }
            });
            for id in 0..plan.concurrency {
                let mut w = Worker::new(id, &plan, &env, &rec);
                let rx = Arc::clone(&rx);
                let mut c = cancel.clone();
                workers.spawn(async move {
                    loop {
                        let job = {
                            let mut q = rx.lock().await;
                            tokio::select! {
                                j = q.recv() => j,
                                _ = tokio::time::sleep_until(hard_deadline.into()) => None,
                                _ = cancelled(&mut c) => None,
                            }
                        };
                        let Some(job) = job else { break };
                        tokio::select! {
                            _ = w.run(job) => {}
                            _ = tokio::time::sleep_until(hard_deadline.into()) => break,
                            _ = cancelled(&mut c) => break,
                        }
                    }
                    w.close().await;
                });
            }
            while workers.join_next().await.is_some() {}
            scheduler.abort();
            let _ = scheduler.await;
            // What is left was due and never sent: that is load the server did not
            // take, and hiding it would be coordinated omission again.
            let mut q = rx.lock().await;
            while let Ok(job) = q.try_recv() {
                let op =
                    if plan.kind == ScenarioKind::Seed { Op::Seed } else { plan.pick(mix_seed(job.seq)) };
                rec.error(op_family(op), "backlog");
                backlog += 1;
            }
        }
        _ => {
            let budget = Arc::new(AtomicU64::new(0));
            for id in 0..plan.concurrency {
                let mut w = Worker::new(id, &plan, &env, &rec);
                let budget = Arc::clone(&budget);
                let mut c = cancel.clone();
                let delay = plan.ramp_up.mul_f64(id as f64 / plan.concurrency.max(1) as f64);
                let max_ops = plan.max_ops;
                workers.spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = cancelled(&mut c) => return,
                    }
                    while Instant::now() < deadline {
                        let seq = budget.fetch_add(1, Ordering::Relaxed);
                        if seq >= max_ops {
                            break;
                        }
                        let job = Job { intended: Instant::now(), seq };
                        tokio::select! {
                            _ = w.run(job) => {}
                            _ = tokio::time::sleep_until(hard_deadline.into()) => break,
                            _ = cancelled(&mut c) => break,
                        }
                    }
                    w.close().await;
                });
            }
            while workers.join_next().await.is_some() {}
        }
    }
    backlog
}

/// Spread job sequence numbers over the mix deterministically.
fn mix_seed(seq: u64) -> u64 {
    // SplitMix64 finaliser: consecutive sequence numbers land on unrelated weights.
    let mut z = seq.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Report name of an operation family (used for errors before the variant is known).
fn op_family(op: Op) -> &'static str {
    match op {
        Op::Deliver(via) => deliver_name(via),
        Op::Noop => "noop",
        Op::Auth => "auth",
        Op::Search => "search",
        Op::Fetch => "fetch",
        Op::Pop3 => "pop3-session",
        Op::Seed => "seed",
        Op::Imap(cmd) => cmd.name(),
    }
}

/// Report name of a delivery: `deliver` through the scenario's target; a mix that
/// names the submission ports reports each apart (the `deliver` family covers both).
fn deliver_name(via: Option<SmtpTarget>) -> &'static str {
    match via {
        None => "deliver",
        Some(SmtpTarget::Smtp) => "deliver-smtp",
        Some(SmtpTarget::Submission) => "deliver-submission",
        Some(SmtpTarget::Submissions) => "deliver-submissions",
    }
}

/// Concrete action of one job.
#[derive(Clone, Copy, Debug)]
enum Action {
    Deliver(Option<SmtpTarget>),
    Seed(usize),
    Noop,
    ImapLogin,
    ImapAuthPlain,
    SmtpAuthPlain,
    SmtpAuthLogin,
    Search,
    FetchBody,
    FetchHeader,
    Pop3,
    Imap(ImapCmd),
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Deliver(via) => deliver_name(via),
            Action::Seed(_) => "seed",
            Action::Noop => "noop",
            Action::ImapLogin => "imap-login",
            Action::ImapAuthPlain => "imap-authenticate-plain",
            Action::SmtpAuthPlain => "smtp-auth-plain",
            Action::SmtpAuthLogin => "smtp-auth-login",
            Action::Search => "search",
            Action::FetchBody => "fetch-body",
            Action::FetchHeader => "fetch-header",
            Action::Pop3 => "pop3-session",
            Action::Imap(cmd) => cmd.name(),
        }
    }
}

/// A mail client's IMAP session (`imap-mix`).
struct MuaSession {
    client: ImapClient,
    /// Index of the user logged in.
    user: usize,
    /// UIDs of INBOX as this session knows them (flag sync, APPENDUID, deletes).
    uids: Vec<u32>,
    cursor: usize,
    /// Commands after LOGIN so far.
    ops: u32,
    /// Commands the session does next, before any drawn one.
    pending: std::collections::VecDeque<ImapCmd>,
}

struct ImapSession {
    client: ImapClient,
    uids: Vec<u32>,
    /// Next index into `uids`.
    cursor: usize,
    /// Operations on this session so far.
    ops: u32,
}

struct SmtpSession {
    client: SmtpClient,
    /// Transactions on this session so far.
    uses: u32,
    /// Index of the user the session authenticated as.
    user: Option<usize>,
}

/// One concurrent actor with its lazily opened sessions.
///
/// The sender of a delivery (envelope and `From:`) is the scenario's `sender` when
/// set; otherwise the user the SMTP session authenticated as, which is what a mail
/// client sends and all a submission server accepts (anything else is a 553); on an
/// unauthenticated session, the test user after the recipient.
struct Worker {
    id: usize,
    plan: Arc<Plan>,
    env: Arc<Env>,
    rec: Arc<Recorder>,
    /// One session per SMTP target, so a mix over both submission ports keeps both.
    smtp: [Option<SmtpSession>; 3],
    imap: Option<ImapSession>,
    mua: Option<MuaSession>,
    /// Index of the user this worker acts as; see [`user_after`].
    user: usize,
    counter: u64,
    rng: u64,
}

impl Worker {
    fn new(id: usize, plan: &Arc<Plan>, env: &Arc<Env>, rec: &Arc<Recorder>) -> Worker {
        Worker {
            id,
            plan: Arc::clone(plan),
            env: Arc::clone(env),
            rec: Arc::clone(rec),
            smtp: Default::default(),
            imap: None,
            mua: None,
            user: id,
            counter: 0,
            rng: mix_seed(id as u64 + 1),
        }
    }

    fn random(&mut self) -> u64 {
        self.rng = mix_seed(self.rng);
        self.rng
    }

    fn next_user(&mut self) -> usize {
        let u = self.user;
        self.user = user_after(u, self.id, self.plan.concurrency.max(1), self.env.users.len());
        u
    }

    fn action(&mut self, job: &Job) -> Action {
        self.counter += 1;
        let op =
            if self.plan.kind == ScenarioKind::Seed { Op::Seed } else { self.plan.pick(mix_seed(job.seq)) };
        match op {
            Op::Deliver(via) => Action::Deliver(via),
            Op::Seed => Action::Seed(job.seq as usize),
            Op::Noop => Action::Noop,
            Op::Search => Action::Search,
            Op::Pop3 => Action::Pop3,
            Op::Imap(drawn) => Action::Imap(self.next_imap_cmd(drawn)),
            Op::Fetch => {
                if self.counter.is_multiple_of(2) {
                    Action::FetchHeader
                } else {
                    Action::FetchBody
                }
            }
            Op::Auth => {
                let t = &self.env.targets;
                let use_imap = match self.plan.protocol {
                    Some(Protocol::Imap) => true,
                    Some(_) => false,
                    None => {
                        t.imap.is_some()
                            && (t.smtp_target(self.plan.smtp_target).is_none()
                                || self.counter.is_multiple_of(2))
                    }
                };
                let plain = match self.plan.auth {
                    AuthMechanism::Plain => true,
                    AuthMechanism::Login => false,
                    _ => (self.counter / 2).is_multiple_of(2),
                };
                match (use_imap, plain) {
                    (true, true) => Action::ImapAuthPlain,
                    (true, false) => Action::ImapLogin,
                    (false, true) => Action::SmtpAuthPlain,
                    (false, false) => Action::SmtpAuthLogin,
                }
            }
        }
    }

    async fn run(&mut self, job: Job) {
        let action = self.action(&job);
        let name = action.name();
        let result = tokio::time::timeout(self.plan.timeout, self.exec(action)).await;
        match result {
            Ok(Ok(bytes)) => self.rec.ok(name, job.intended.elapsed(), bytes),
            Ok(Err(e)) => {
                self.rec.error(name, &e.key());
                tracing::debug!(worker = self.id, op = name, error = %e, "operation failed");
                // A reply error leaves the session in a known state; anything else
                // (I/O, protocol confusion) does not, so start over.
                if !matches!(e, ClientError::Smtp(..) | ClientError::Imap(..)) {
                    self.smtp = Default::default();
                    self.imap = None;
                    self.mua = None;
                }
            }
            Err(_) => {
                self.rec.error(name, "timeout");
                self.smtp = Default::default();
                self.imap = None;
                self.mua = None;
            }
        }
    }

    async fn close(&mut self) {
        for slot in &mut self.smtp {
            if let Some(s) = slot.take() {
                let _ = tokio::time::timeout(Duration::from_secs(1), s.client.quit()).await;
            }
        }
        if let Some(s) = self.imap.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), s.client.logout()).await;
        }
        if let Some(s) = self.mua.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), s.client.logout()).await;
        }
    }

    /// The command a client session does next: opening it, what it queued, LOGOUT
    /// once it has done `opsPerConnection` commands, else the drawn one (an APPEND
    /// when the mailbox is empty and the drawn command needs a message).
    fn next_imap_cmd(&mut self, drawn: ImapCmd) -> ImapCmd {
        let limit = self.plan.ops_per_connection;
        let Some(s) = &mut self.mua else { return ImapCmd::Login };
        if let Some(cmd) = s.pending.pop_front() {
            return cmd;
        }
        if limit > 0 && s.ops >= limit {
            return ImapCmd::Logout;
        }
        if drawn.needs_message() && s.uids.is_empty() { ImapCmd::Append } else { drawn }
    }

    async fn imap_client_command(&mut self, cmd: ImapCmd) -> Result<u64, ClientError> {
        match cmd {
            ImapCmd::Login => self.imap_client_login().await,
            ImapCmd::Logout => {
                let s = self.mua.take().ok_or(ClientError::Closed)?;
                s.client.logout().await?;
                Ok(0)
            }
            cmd => self.imap_client_in_session(cmd).await,
        }
    }

    async fn imap_client_login(&mut self) -> Result<u64, ClientError> {
        let (client, u) = self.imap_connect_login().await?;
        let cursor = self.random() as usize;
        let pending = [ImapCmd::List, ImapCmd::Status, ImapCmd::Select, ImapCmd::FetchFlags].into();
        self.mua = Some(MuaSession { client, user: u, uids: Vec::new(), cursor, ops: 0, pending });
        Ok(0)
    }

    /// A new IMAP connection logged in as the next user (LOGIN, or AUTHENTICATE
    /// PLAIN with `auth: plain`), and that user's index.
    async fn imap_connect_login(&mut self) -> Result<(ImapClient, usize), ClientError> {
        let ep = self.endpoint(Protocol::Imap)?;
        let u = self.next_user();
        let env = Arc::clone(&self.env);
        let (user, pass) = env.users.get(u);
        let mut client = ImapClient::connect(&ep).await?;
        if self.plan.auth == AuthMechanism::Plain {
            client.authenticate_plain(user, pass).await?;
        } else {
            client.login(user, pass).await?;
        }
        Ok((client, u))
    }

    async fn imap_client_in_session(&mut self, cmd: ImapCmd) -> Result<u64, ClientError> {
        let r = self.random();
        let env = Arc::clone(&self.env);
        let counter = self.counter;
        let s = self.mua.as_mut().ok_or(ClientError::Closed)?;
        s.ops += 1;
        // A message of the session's list: consecutive reads walk it from a random
        // start, as a reader going down the list does.
        let at = |s: &mut MuaSession| {
            s.cursor = s.cursor.wrapping_add(1);
            s.cursor % s.uids.len().max(1)
        };
        if cmd.needs_message() && s.uids.is_empty() {
            return Err(ClientError::Imap("empty-mailbox".into(), "INBOX has no messages".into()));
        }
        let bytes = match cmd {
            ImapCmd::List => {
                s.client.command(r#"LIST "" "*""#).await?;
                0
            }
            ImapCmd::Status => {
                s.client.command("STATUS INBOX (MESSAGES UNSEEN UIDNEXT)").await?;
                0
            }
            ImapCmd::Select => {
                s.client.select("INBOX", false).await?;
                0
            }
            ImapCmd::FetchFlags => {
                // Messages already \Deleted are left out: the next EXPUNGE (this
                // session's or another's) takes them, as a client hides them.
                let resp = s.client.command("UID FETCH 1:* (FLAGS)").await?;
                s.uids = resp.uids;
                s.uids.retain(|u| !resp.deleted.contains(u));
                s.uids.sort_unstable();
                s.uids.dedup();
                0
            }
            ImapCmd::FetchEnvelope => {
                let first = at(s);
                let last = (first + 24).min(s.uids.len() - 1);
                let (lo, hi) = (s.uids[first], s.uids[last]);
                let cmd = format!("UID FETCH {lo}:{hi} (UID FLAGS RFC822.SIZE INTERNALDATE ENVELOPE)");
                s.client.command(&cmd).await?.literal_bytes
            }
            ImapCmd::FetchBody => {
                let i = at(s);
                s.client.uid_fetch(s.uids[i], "BODY.PEEK[]").await?
            }
            ImapCmd::Store => {
                let uid = s.uids[r as usize % s.uids.len()];
                let change =
                    ["+FLAGS (\\Seen)", "-FLAGS (\\Seen)", "+FLAGS (\\Flagged)", "-FLAGS (\\Flagged)"]
                        [(counter % 4) as usize];
                s.client.command(&format!("UID STORE {uid} {change}")).await?;
                0
            }
            ImapCmd::Delete => {
                let uid = s.uids.remove(r as usize % s.uids.len());
                s.client.command(&format!("UID STORE {uid} +FLAGS.SILENT (\\Deleted)")).await?;
                s.pending.push_back(ImapCmd::Expunge);
                0
            }
            ImapCmd::Expunge => {
                s.client.command("EXPUNGE").await?;
                0
            }
            ImapCmd::Append => {
                let msg = env.messages.pick(r);
                let from = env.users.get(s.user).0;
                let header = format!("From: {from}\r\nMessage-ID: <{}>\r\n", env.next_message_id());
                if let Some(uid) = s.client.append("INBOX", "\\Seen", &[header.as_bytes(), msg]).await? {
                    s.uids.push(uid);
                }
                (header.len() + msg.len()) as u64
            }
            ImapCmd::Noop => {
                s.client.noop().await?;
                0
            }
            ImapCmd::Login | ImapCmd::Logout => {
                return Err(ClientError::Protocol(format!("{} inside a session", cmd.name())));
            }
        };
        Ok(bytes)
    }

    fn endpoint(&self, p: Protocol) -> Result<Endpoint, ClientError> {
        let t = &self.env.targets;
        let ep = match p {
            Protocol::Smtp => t.smtp_target(self.plan.smtp_target),
            Protocol::Imap => t.imap.as_ref(),
            Protocol::Pop3 => t.pop3.as_ref(),
        };
        ep.cloned().ok_or_else(|| ClientError::Protocol(format!("no {p:?} target configured")))
    }

    async fn exec(&mut self, action: Action) -> Result<u64, ClientError> {
        match action {
            Action::Deliver(via) => {
                let rcpt_idx = self.env.rcpt.fetch_add(1, Ordering::Relaxed);
                self.deliver(rcpt_idx, via.unwrap_or(self.plan.smtp_target)).await
            }
            Action::Seed(seq) => self.deliver(seq, self.plan.smtp_target).await,
            Action::Noop => {
                let target = self.plan.smtp_target;
                self.smtp_session(target).await?.client.noop().await?;
                self.smtp_used(target).await;
                Ok(0)
            }
            Action::SmtpAuthPlain | Action::SmtpAuthLogin => {
                let ep = self.endpoint(Protocol::Smtp)?;
                let u = self.next_user();
                let (user, pass) = self.env.users.get(u);
                let t0 = Instant::now();
                let mut c = SmtpClient::connect(&ep, &self.env.helo).await?;
                self.rec.ok_aux("smtp-connect", t0.elapsed());
                if matches!(action, Action::SmtpAuthPlain) {
                    c.auth_plain(user, pass).await?;
                } else {
                    c.auth_login(user, pass).await?;
                }
                let _ = c.quit().await;
                Ok(0)
            }
            Action::ImapLogin | Action::ImapAuthPlain => {
                let ep = self.endpoint(Protocol::Imap)?;
                let u = self.next_user();
                let (user, pass) = self.env.users.get(u);
                let t0 = Instant::now();
                let mut c = ImapClient::connect(&ep).await?;
                self.rec.ok_aux("imap-connect", t0.elapsed());
                if matches!(action, Action::ImapLogin) {
                    c.login(user, pass).await?;
                } else {
                    c.authenticate_plain(user, pass).await?;
                }
                let _ = c.logout().await;
                Ok(0)
            }
            Action::Search => {
                let s = self.imap_session().await?;
                let n = s.client.uid_search("UNSEEN").await?.len();
                self.imap_used().await;
                Ok(n as u64)
            }
            Action::FetchBody | Action::FetchHeader => {
                let s = self.imap_session().await?;
                // The UID list is loaded on first use (a session opened by a search has
                // none yet) and reloaded while empty (a mixed run fills the mailbox).
                if s.uids.is_empty() {
                    s.uids = s.client.uid_search("ALL").await?;
                }
                if s.uids.is_empty() {
                    return Err(ClientError::Imap("empty-mailbox".into(), "INBOX has no messages".into()));
                }
                let uid = s.uids[s.cursor % s.uids.len()];
                s.cursor += 1;
                let item =
                    if matches!(action, Action::FetchBody) { "BODY.PEEK[]" } else { "BODY.PEEK[HEADER]" };
                let bytes = s.client.uid_fetch(uid, item).await?;
                self.imap_used().await;
                Ok(bytes)
            }
            Action::Pop3 => self.pop3_session().await,
            Action::Imap(cmd) => self.imap_client_command(cmd).await,
        }
    }

    /// One message to user `rcpt_idx` through `target`; returns the bytes sent.
    async fn deliver(&mut self, rcpt_idx: usize, target: SmtpTarget) -> Result<u64, ClientError> {
        let r = self.random();
        let (env, plan) = (Arc::clone(&self.env), Arc::clone(&self.plan));
        let smtp = self.smtp_session(target).await?;
        let from = match (&plan.sender, smtp.user) {
            (Some(sender), _) => sender.as_str(),
            (None, Some(u)) => env.users.get(u).0,
            (None, None) => env.users.get(rcpt_idx.wrapping_add(1)).0,
        };
        let (user, _) = env.users.get(rcpt_idx);
        let elsewhere = plan.recipient_domain.as_ref().map(|d| {
            let local = user.rsplit_once('@').map_or(user, |(l, _)| l);
            format!("{local}@{d}")
        });
        let rcpt = elsewhere.as_deref().unwrap_or(user);
        let msg = env.messages.pick(r);
        // The pooled messages carry no From: and no Message-ID (one pool serves every
        // sender and every send); they go in front, in the same write as the rest.
        let message_id = env.next_message_id();
        let header = format!("From: {from}\r\nMessage-ID: <{message_id}>\r\n");
        smtp.client.send(from, &[rcpt], &[header.as_bytes(), msg]).await?;
        env.acknowledged(&message_id);
        self.smtp_used(target).await;
        Ok((header.len() + msg.len()) as u64)
    }

    async fn smtp_session(&mut self, target: SmtpTarget) -> Result<&mut SmtpSession, ClientError> {
        let slot = target as usize;
        // A cached session the server has since closed (a Pod draining says 421 and
        // hangs up) is dropped before use, as a connection-caching MTA does; the
        // count shows in the report, so a server that hangs up idle sessions
        // without cause is still visible.
        if let Some(s) = &mut self.smtp[slot]
            && s.client.server_hung_up()
        {
            self.smtp[slot] = None;
            self.rec.ok_aux("smtp-closed-by-server", Duration::ZERO);
        }
        if self.smtp[slot].is_none() {
            let ep = self.env.targets.smtp_target(target).cloned().ok_or_else(|| {
                ClientError::Protocol(format!("no SMTP target {} configured", target.name()))
            })?;
            let t0 = Instant::now();
            let mut client = SmtpClient::connect(&ep, &self.env.helo).await?;
            self.rec.ok_aux("smtp-connect", t0.elapsed());
            let env = Arc::clone(&self.env);
            let user = match self.plan.auth {
                AuthMechanism::None => None,
                mech => {
                    let u = self.next_user();
                    let (user, pass) = env.users.get(u);
                    let t1 = Instant::now();
                    if mech == AuthMechanism::Login || (mech == AuthMechanism::Both && u % 2 == 1) {
                        client.auth_login(user, pass).await?;
                    } else {
                        client.auth_plain(user, pass).await?;
                    }
                    self.rec.ok_aux("smtp-session-auth", t1.elapsed());
                    Some(u)
                }
            };
            self.smtp[slot] = Some(SmtpSession { client, uses: 0, user });
        }
        self.smtp[slot].as_mut().ok_or(ClientError::Closed)
    }

    async fn smtp_used(&mut self, target: SmtpTarget) {
        let limit = self.plan.ops_per_connection;
        let slot = &mut self.smtp[target as usize];
        if let Some(s) = slot {
            s.uses += 1;
            if limit > 0
                && s.uses >= limit
                && let Some(s) = slot.take()
            {
                let _ = s.client.quit().await;
            }
        }
    }

    async fn imap_session(&mut self) -> Result<&mut ImapSession, ClientError> {
        if self.imap.is_none() {
            let t0 = Instant::now();
            let (mut client, _) = self.imap_connect_login().await?;
            client.select("INBOX", false).await?;
            self.rec.ok_aux("imap-session", t0.elapsed());
            // Start each session at a different message so workers on the same
            // mailbox do not all fetch the same UID.
            let cursor = (self.random() % 1024) as usize;
            self.imap = Some(ImapSession { client, uids: Vec::new(), cursor, ops: 0 });
        }
        match &mut self.imap {
            Some(s) => Ok(s),
            None => Err(ClientError::Closed),
        }
    }

    async fn imap_used(&mut self) {
        let limit = self.plan.ops_per_connection;
        let done = match &mut self.imap {
            Some(s) => {
                s.ops += 1;
                limit > 0 && s.ops >= limit
            }
            None => false,
        };
        if done && let Some(s) = self.imap.take() {
            let _ = s.client.logout().await;
        }
    }

    async fn pop3_session(&mut self) -> Result<u64, ClientError> {
        let ep = self.endpoint(Protocol::Pop3)?;
        let u = self.next_user();
        let env = Arc::clone(&self.env);
        let (user, pass) = env.users.get(u);
        let t = Instant::now();
        let mut c = Pop3Client::connect(&ep).await?;
        c.login(user, pass).await?;
        self.rec.ok_aux("pop3-login", t.elapsed());
        let t = Instant::now();
        let (n, _) = c.stat().await?;
        self.rec.ok_aux("pop3-stat", t.elapsed());
        let t = Instant::now();
        c.list().await?;
        self.rec.ok_aux("pop3-list", t.elapsed());
        let mut bytes = 0;
        if n > 0 {
            let t = Instant::now();
            bytes = c.retr((self.random() % n as u64) as u32 + 1).await?;
            self.rec.ok_aux("pop3-retr", t.elapsed());
        }
        c.quit().await?;
        Ok(bytes)
    }
}

/// The user a worker acts as after `current`: worker `id` of `workers` keeps to the
/// users `id, id + workers, id + 2·workers, …` below `users` and starts over, so two
/// workers never log in as the same user at once (a POP3 maildrop is locked by its
/// session: a second login would get `-ERR [IN-USE]`, a refusal the runner caused).
/// With more workers than users, sharing cannot be avoided and the stride goes on.
fn user_after(current: usize, id: usize, workers: usize, users: usize) -> usize {
    let next = current.wrapping_add(workers);
    if workers <= users && next >= users { id } else { next }
}

/// A held connection of connect-flood.
enum Held {
    Smtp(SmtpClient),
    Imap(ImapClient),
    Pop3(Pop3Client),
}

impl Held {
    async fn open(p: Protocol, ep: &Endpoint, helo: &str) -> Result<Held, ClientError> {
        Ok(match p {
            Protocol::Smtp if ep.tls_mode == TlsMode::Starttls => {
                Held::Smtp(SmtpClient::connect(ep, helo).await?)
            }
            Protocol::Smtp => Held::Smtp(SmtpClient::connect_greeting(ep).await?),
            Protocol::Imap => Held::Imap(ImapClient::connect(ep).await?),
            Protocol::Pop3 => Held::Pop3(Pop3Client::connect(ep).await?),
        })
    }

    /// Prove the connection survived the hold (one round trip), then say goodbye.
    async fn close(self) -> Result<(), ClientError> {
        match self {
            Held::Smtp(mut c) => {
                c.noop().await?;
                let _ = c.quit().await;
            }
            Held::Imap(mut c) => {
                c.noop().await?;
                let _ = c.logout().await;
            }
            Held::Pop3(mut c) => {
                c.noop().await?;
                let _ = c.quit().await;
            }
        }
        Ok(())
    }
}

/// connect-flood: open `concurrency` connections (spread over the ramp), hold them
/// all for `duration`, then check and close each.
async fn flood(plan: Arc<Plan>, env: Arc<Env>, rec: Arc<Recorder>, cancel: watch::Receiver<bool>) {
    let t = &env.targets;
    let proto = plan.protocol.unwrap_or(if t.imap.is_some() {
        Protocol::Imap
    } else if t.smtp_target(plan.smtp_target).is_some() {
        Protocol::Smtp
    } else {
        Protocol::Pop3
    });
    let ep = match proto {
        Protocol::Smtp => t.smtp_target(plan.smtp_target).cloned(),
        Protocol::Imap => t.imap.clone(),
        Protocol::Pop3 => t.pop3.clone(),
    };
    let Some(ep) = ep else {
        rec.error("connect", "no-target");
        return;
    };
    let ep = Arc::new(ep);
    let start = Instant::now();
    let hold_until = start + plan.ramp_up + plan.duration;
    let n = plan.concurrency.min(plan.max_ops as usize);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let delay = plan.ramp_up.mul_f64(i as f64 / n.max(1) as f64);
        let (ep, rec, env, plan) = (Arc::clone(&ep), Arc::clone(&rec), Arc::clone(&env), Arc::clone(&plan));
        let mut c = cancel.clone();
        set.spawn(async move {
            tokio::time::sleep_until((start + delay).into()).await;
            if *c.borrow() {
                return;
            }
            let t0 = Instant::now();
            let held = match tokio::time::timeout(plan.timeout, Held::open(proto, &ep, &env.helo)).await {
                Ok(Ok(h)) => {
                    rec.ok("connect", t0.elapsed(), 0);
                    h
                }
                Ok(Err(e)) => return rec.error("connect", &e.key()),
                Err(_) => return rec.error("connect", "timeout"),
            };
            tokio::select! {
                _ = tokio::time::sleep_until(hold_until.into()) => {}
                _ = cancelled(&mut c) => {}
            }
            let t1 = Instant::now();
            match tokio::time::timeout(plan.timeout, held.close()).await {
                Ok(Ok(())) => rec.ok("hold", t1.elapsed(), 0),
                Ok(Err(e)) => rec.error("hold", &e.key()),
                Err(_) => rec.error("hold", "timeout"),
            }
        });
    }
    while set.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(ramp: u64) -> Plan {
        Plan {
            name: "t".into(),
            kind: ScenarioKind::Deliver,
            protocol: None,
            concurrency: 1,
            rate: Some(100.0),
            duration: Duration::from_secs(10),
            ramp_up: Duration::from_secs(ramp),
            max_ops: 1000,
            timeout: Duration::from_secs(1),
            auth: AuthMechanism::None,
            ops_per_connection: 0,
            smtp_target: SmtpTarget::Smtp,
            sender: None,
            recipient_domain: None,
            mix: vec![(Op::Deliver(None), 60), (Op::Fetch, 100)],
            messages_per_user: 0,
            sizes: vec![],
            slo: vec![],
        }
    }

    #[test]
    fn workers_visit_disjoint_users_and_every_user() {
        for (workers, users) in [(2, 5), (3, 9), (4, 4), (1, 3), (5, 17)] {
            let mut seen = vec![None::<usize>; users];
            for id in 0..workers {
                let mut u = id;
                for _ in 0..3 * users {
                    assert!(u < users, "{workers} workers, {users} users: {u} out of range");
                    assert!(
                        seen[u].is_none_or(|w| w == id),
                        "user {u} shared by workers {:?} and {id}",
                        seen[u]
                    );
                    seen[u] = Some(id);
                    u = super::user_after(u, id, workers, users);
                }
            }
            assert!(seen.iter().all(Option::is_some), "{workers} workers, {users} users: {seen:?}");
        }
        // More workers than users: they share, and stay in range through `get`'s modulo.
        assert_eq!(super::user_after(1, 1, 8, 3), 9);
    }

    #[test]
    fn open_loop_offsets() {
        let p = plan(0);
        assert_eq!(p.offset(0, 100.0), Duration::ZERO);
        assert!((p.offset(250, 100.0).as_secs_f64() - 2.5).abs() < 1e-9);
        // Ramp of 10 s to 100/s: 500 operations during the ramp, the 500th at 10 s.
        let p = plan(10);
        assert!((p.offset(500, 100.0).as_secs_f64() - 10.0).abs() < 1e-6);
        assert!((p.offset(125, 100.0).as_secs_f64() - 5.0).abs() < 1e-6);
        assert!((p.offset(600, 100.0).as_secs_f64() - 11.0).abs() < 1e-6);
    }

    #[test]
    fn mix_follows_weights() {
        let p = plan(0);
        let sends = (0..10_000u64).filter(|s| p.pick(mix_seed(*s)) == Op::Deliver(None)).count();
        assert!((5_700..6_300).contains(&sends), "{sends}");
    }
}
