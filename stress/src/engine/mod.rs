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
//!
//! The files: this one holds the plan and the scheduling (`drive`), `worker.rs`
//! one actor that turns a job into an operation, `smtp.rs`, `imap.rs` and
//! `pop3.rs` the operations of each protocol, and `flood.rs` the connect-flood
//! scenario, which holds connections instead of running operations.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mailcluster_api::stress::{AuthMechanism, MessageSize, Protocol, ScenarioKind, SmtpTarget};
use tokio::sync::{Mutex, mpsc, watch};

use crate::client::Endpoint;
use crate::measure::Recorder;
use crate::slo::Threshold;
use crate::workload::{Messages, Users};
use flood::flood;
use worker::Worker;

mod flood;
mod imap;
mod pop3;
mod smtp;
mod worker;

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
    /// Envelope sender and `From:` instead of the default (see [`worker::Worker`]).
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
