//! The SMTP operations of a worker: deliveries (and the seeding of
//! mailboxes), NOOPs and logins, over a session kept per SMTP target and
//! reopened after `opsPerConnection` transactions, as an MTA caches its
//! connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mailcluster_api::stress::{AuthMechanism, Protocol, SmtpTarget};

use super::worker::Worker;
use crate::client::ClientError;
use crate::client::smtp::SmtpClient;

pub(super) struct SmtpSession {
    pub(super) client: SmtpClient,
    /// Transactions on this session so far.
    pub(super) uses: u32,
    /// Index of the user the session authenticated as.
    pub(super) user: Option<usize>,
}

impl Worker {
    /// One message to user `rcpt_idx` through `target`; returns the bytes sent.
    pub(super) async fn deliver(&mut self, rcpt_idx: usize, target: SmtpTarget) -> Result<u64, ClientError> {
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

    pub(super) async fn smtp_noop(&mut self) -> Result<u64, ClientError> {
        let target = self.plan.smtp_target;
        self.smtp_session(target).await?.client.noop().await?;
        self.smtp_used(target).await;
        Ok(0)
    }

    /// A login on a connection of its own (AUTH PLAIN, or AUTH LOGIN), closed after.
    pub(super) async fn smtp_auth(&mut self, plain: bool) -> Result<u64, ClientError> {
        let ep = self.endpoint(Protocol::Smtp)?;
        let u = self.next_user();
        let (user, pass) = self.env.users.get(u);
        let t0 = Instant::now();
        let mut c = SmtpClient::connect(&ep, &self.env.helo).await?;
        self.rec.ok_aux("smtp-connect", t0.elapsed());
        if plain {
            c.auth_plain(user, pass).await?;
        } else {
            c.auth_login(user, pass).await?;
        }
        let _ = c.quit().await;
        Ok(0)
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
}
