//! One concurrent actor of a scenario: it turns each job the scheduler hands it
//! into an operation of the mix, runs it under the operation timeout, records
//! the result and keeps its sessions (one per protocol) between jobs. The
//! operations themselves are in the protocol files, so that this file is only
//! the choice and the bookkeeping.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mailcluster_api::stress::{AuthMechanism, Protocol, ScenarioKind, SmtpTarget};

use super::imap::{ImapSession, MuaSession};
use super::smtp::SmtpSession;
use super::{Env, ImapCmd, Job, Op, Plan, deliver_name, mix_seed};
use crate::client::{ClientError, Endpoint};
use crate::measure::Recorder;

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

/// One concurrent actor with its lazily opened sessions.
///
/// The sender of a delivery (envelope and `From:`) is the scenario's `sender` when
/// set; otherwise the user the SMTP session authenticated as, which is what a mail
/// client sends and all a submission server accepts (anything else is a 553); on an
/// unauthenticated session, the test user after the recipient.
pub(super) struct Worker {
    id: usize,
    pub(super) plan: Arc<Plan>,
    pub(super) env: Arc<Env>,
    pub(super) rec: Arc<Recorder>,
    /// One session per SMTP target, so a mix over both submission ports keeps both.
    pub(super) smtp: [Option<SmtpSession>; 3],
    pub(super) imap: Option<ImapSession>,
    pub(super) mua: Option<MuaSession>,
    /// Index of the user this worker acts as; see [`user_after`].
    user: usize,
    pub(super) counter: u64,
    rng: u64,
}

impl Worker {
    pub(super) fn new(id: usize, plan: &Arc<Plan>, env: &Arc<Env>, rec: &Arc<Recorder>) -> Worker {
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

    pub(super) fn random(&mut self) -> u64 {
        self.rng = mix_seed(self.rng);
        self.rng
    }

    pub(super) fn next_user(&mut self) -> usize {
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

    pub(super) async fn run(&mut self, job: Job) {
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

    pub(super) async fn close(&mut self) {
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

    pub(super) fn endpoint(&self, p: Protocol) -> Result<Endpoint, ClientError> {
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
            Action::Noop => self.smtp_noop().await,
            Action::SmtpAuthPlain | Action::SmtpAuthLogin => {
                self.smtp_auth(matches!(action, Action::SmtpAuthPlain)).await
            }
            Action::ImapLogin | Action::ImapAuthPlain => {
                self.imap_auth(matches!(action, Action::ImapAuthPlain)).await
            }
            Action::Search => self.imap_search().await,
            Action::FetchBody | Action::FetchHeader => {
                self.imap_fetch(matches!(action, Action::FetchBody)).await
            }
            Action::Pop3 => self.pop3_session().await,
            Action::Imap(cmd) => self.imap_client_command(cmd).await,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
                    u = user_after(u, id, workers, users);
                }
            }
            assert!(seen.iter().all(Option::is_some), "{workers} workers, {users} users: {seen:?}");
        }
        // More workers than users: they share, and stay in range through `get`'s modulo.
        assert_eq!(user_after(1, 1, 8, 3), 9);
    }
}
