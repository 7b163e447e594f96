//! connect-flood: connections opened and held rather than operations run, to
//! see how many a server keeps open at once. Apart from the workers because it
//! shares none of their scheduling.

use std::sync::Arc;
use std::time::Instant;

use mailcluster_api::stress::Protocol;
use tokio::sync::watch;

use super::{Env, Plan, cancelled};
use crate::client::imap::ImapClient;
use crate::client::pop3::Pop3Client;
use crate::client::smtp::SmtpClient;
use crate::client::{ClientError, Endpoint, TlsMode};
use crate::measure::Recorder;

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
pub(super) async fn flood(plan: Arc<Plan>, env: Arc<Env>, rec: Arc<Recorder>, cancel: watch::Receiver<bool>) {
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
