//! Relay workers: every SMTP pod delivers the shared outbound queue to other
//! domains. Items are claimed with a lease (`Queue::queue_claim`: FOR UPDATE SKIP
//! LOCKED on PostgreSQL), so pods never send the same item at once, and an item
//! whose pod died mid-delivery is taken over when its lease runs out. Delivery is
//! at least once: a pod killed after the remote server accepted the message and
//! before the queue row was updated leaves it to be sent again by another pod —
//! the one possible duplicate.
//!
//! Per item: recipients are grouped by domain; each domain is routed (smarthost,
//! or MX with the implicit-MX fallback and null MX), its hosts tried in order,
//! STARTTLS used whenever offered. 2xx → sent, 5xx → failed (a DSN to the sender),
//! 4xx or no usable host → retried on `relay.retry_schedule_secs` until
//! `smtp.queue_expiry_secs`, then failed. A delay notice goes out once after
//! `relay.delay_notice_secs`. The null sender never gets a DSN (no bounce loops).
//!
//! Connections are kept for a few seconds after a transaction and reused for the
//! next message to the same host, up to `relay.max_messages_per_connection`.
//!
//! Transport security: opportunistic STARTTLS to MX hosts (certificates not
//! verified, RFC 7435); verified TLS to a smarthost; and, to a domain with an
//! MTA-STS policy in enforce mode (RFC 8461), only the MX hosts it names, STARTTLS
//! required and the certificate verified for the MX host name. DANE (RFC 7672) is
//! not supported: it needs DNSSEC-validated answers.

pub mod client;
pub mod dsn;
pub mod mta_sts;
mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use crate::app::App;
use crate::dns::{Dns, Route};
use crate::net::ShutdownController;
use client::{Client, ClientError, Timeouts};
use dsn::{Action, RecipientReport};
use mailcluster_api::config::split_host_port;
use mailcluster_model::{DsnEvent, DsnRet, QueueAttempt, QueueItem, RecipientOutcome, RecipientStatus};

/// How long a connection waits in the pool for its next message.
const IDLE_KEEP: Duration = Duration::from_secs(5);
/// How often the queue gauges are refreshed.
const STATS_EVERY: Duration = Duration::from_secs(15);

struct RelayMetrics {
    /// Per recipient: sent, deferred, bounced.
    deliveries: IntCounterVec,
    /// Connections opened, by whether TLS was used.
    connections: IntCounterVec,
    /// DSNs sent, by action (failed, delayed).
    dsns: IntCounterVec,
    queue_depth: IntGauge,
    oldest_age: IntGauge,
    /// MX hosts passed over for resolving only to non-global addresses.
    private_targets: IntCounter,
}

impl RelayMetrics {
    fn new() -> RelayMetrics {
        RelayMetrics {
            deliveries: IntCounterVec::new(
                Opts::new(
                    "mail_relay_deliveries_total",
                    "Outbound recipients by result (sent, deferred, bounced)",
                ),
                &["result"],
            )
            .expect("valid metric"),
            connections: IntCounterVec::new(
                Opts::new("mail_relay_connections_total", "Outbound SMTP connections by TLS use (yes, no)"),
                &["tls"],
            )
            .expect("valid metric"),
            dsns: IntCounterVec::new(
                Opts::new("mail_relay_dsn_total", "Delivery status notifications sent, by action"),
                &["action"],
            )
            .expect("valid metric"),
            queue_depth: IntGauge::new("mail_queue_depth", "Messages in the outbound queue")
                .expect("valid metric"),
            oldest_age: IntGauge::new(
                "mail_queue_oldest_age_seconds",
                "Age of the oldest message in the outbound queue (0 when empty)",
            )
            .expect("valid metric"),
            private_targets: IntCounter::new(
                "mail_relay_private_targets_total",
                "MX hosts not connected to because they resolve only to non-global addresses (loopback, private, link-local, …)",
            )
            .expect("valid metric"),
        }
    }
}

/// Where one group of recipients goes.
struct Destination {
    /// Pool and limit key.
    key: String,
    hosts: Vec<(String, u16)>,
    smarthost: bool,
    /// MTA-STS enforce: verified STARTTLS or nothing.
    require_verified_tls: bool,
}

/// One recipient's result in one attempt.
#[derive(Debug, Clone)]
enum RcptResult {
    /// Accepted by the next hop; `true` when it took the DSN request along (it
    /// reports success itself).
    Sent(String, bool),
    Deferred(String),
    Failed {
        status: String,
        diagnostic: String,
        remote: Option<String>,
    },
}

pub struct Relay {
    app: App,
    dns: Arc<Dns>,
    wake: Arc<Notify>,
    worker: String,
    timeouts: Arc<Timeouts>,
    tls_any: tokio_rustls::TlsConnector,
    /// To the smarthost (unverified when `relay.smarthost_tls_verify` is off).
    tls_smarthost: tokio_rustls::TlsConnector,
    /// To MX hosts under an MTA-STS policy: always verified.
    tls_verified: tokio_rustls::TlsConnector,
    mta_sts: mta_sts::MtaStsCache,
    idle: Mutex<HashMap<String, Vec<(Client, Instant)>>>,
    limits: Mutex<HashMap<String, Arc<Semaphore>>>,
    metrics: RelayMetrics,
}

impl Relay {
    pub fn new(app: App, dns: Arc<Dns>, wake: Arc<Notify>) -> anyhow::Result<Arc<Relay>> {
        let c = &app.config.relay;
        let timeouts = Arc::new(Timeouts {
            connect: Duration::from_secs(c.connect_timeout_secs),
            command: Duration::from_secs(c.command_timeout_secs),
            data: Duration::from_secs(c.data_timeout_secs),
            max_reply_bytes: c.max_reply_bytes,
        });
        let worker = format!("{}:{}:{}", app.config.hostname, std::process::id(), rand::random::<u32>());
        Ok(Arc::new(Relay {
            dns,
            wake,
            worker,
            timeouts,
            tls_any: tls::opportunistic()?,
            tls_smarthost: if c.smarthost_tls_verify {
                tls::verified(c.tls_ca_file.as_deref())?
            } else {
                tls::opportunistic()?
            },
            tls_verified: tls::verified(c.tls_ca_file.as_deref())?,
            mta_sts: mta_sts::MtaStsCache::new(tls::verified(c.tls_ca_file.as_deref())?, c.mta_sts_port),
            idle: Mutex::new(HashMap::new()),
            limits: Mutex::new(HashMap::new()),
            metrics: RelayMetrics::new(),
            app,
        }))
    }

    pub fn register_metrics(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.metrics.deliveries.clone()))?;
        registry.register(Box::new(self.metrics.connections.clone()))?;
        registry.register(Box::new(self.metrics.dsns.clone()))?;
        registry.register(Box::new(self.metrics.queue_depth.clone()))?;
        registry.register(Box::new(self.metrics.oldest_age.clone()))?;
        registry.register(Box::new(self.metrics.private_targets.clone()))?;
        Ok(())
    }

    /// Works the queue until the drain starts, then gives the deliveries in flight
    /// the grace period; deliveries cut off keep their claim until the lease ends.
    pub async fn run(self: Arc<Self>, shutdown: ShutdownController) {
        let config = &self.app.config.relay;
        let permits = Arc::new(Semaphore::new(config.concurrency));
        let lease = Duration::from_secs(config.lease_secs);
        let poll = Duration::from_millis(config.poll_interval_ms);
        let mut tasks = JoinSet::new();
        let mut stats_due = Instant::now();
        loop {
            if shutdown.is_draining() {
                break;
            }
            while tasks.try_join_next().is_some() {}
            if stats_due <= Instant::now() {
                self.refresh_stats().await;
                self.close_idle(false).await;
                stats_due = Instant::now() + STATS_EVERY.min(IDLE_KEEP);
            }
            let free = permits.available_permits();
            if free == 0 {
                tokio::select! {
                    _ = tasks.join_next() => {}
                    _ = shutdown.triggered() => break,
                }
                continue;
            }
            let claim = u32::try_from(free.min(64)).unwrap_or(64);
            let items = match self.app.store.queue_claim(&self.worker, claim, lease).await {
                Ok(items) => items,
                Err(e) => {
                    tracing::warn!(error = %e, "relay: cannot claim from the queue");
                    tokio::select! {
                        _ = tokio::time::sleep(poll) => {}
                        _ = shutdown.triggered() => break,
                    }
                    continue;
                }
            };
            if items.is_empty() {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(poll.min(IDLE_KEEP)) => {}
                    _ = shutdown.triggered() => break,
                }
                continue;
            }
            for item in items {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    self.release(&item).await;
                    continue;
                };
                let me = self.clone();
                let drain = shutdown.clone();
                tasks.spawn(async move {
                    me.deliver_item(item, &drain).await;
                    drop(permit);
                });
            }
        }
        let grace = shutdown.grace();
        let _ = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        tasks.abort_all();
        self.close_idle(true).await;
        tracing::info!("relay workers stopped");
    }

    async fn refresh_stats(&self) {
        match self.app.store.queue_stats().await {
            Ok(stats) => {
                self.metrics.queue_depth.set(i64::try_from(stats.depth).unwrap_or(i64::MAX));
                let age = stats.oldest.map(|t| (Utc::now() - t).num_seconds().max(0)).unwrap_or(0);
                self.metrics.oldest_age.set(age);
            }
            Err(e) => tracing::debug!(error = %e, "queue stats unavailable"),
        }
    }

    async fn close_idle(&self, all: bool) {
        let stale: Vec<Client> = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let mut out = Vec::new();
            for conns in idle.values_mut() {
                let (keep, old): (Vec<_>, Vec<_>) =
                    conns.drain(..).partition(|(_, since)| !all && since.elapsed() < IDLE_KEEP);
                *conns = keep;
                out.extend(old.into_iter().map(|(c, _)| c));
            }
            idle.retain(|_, v| !v.is_empty());
            out
        };
        for c in stale {
            c.quit().await;
        }
    }

    /// One attempt at one item, ending with the queue row updated (or removed) —
    /// or, when the drain started before any of it was sent, with the claim given
    /// back so another pod takes it at once.
    async fn deliver_item(&self, item: QueueItem, shutdown: &ShutdownController) {
        if shutdown.is_draining() {
            self.release(&item).await;
            return;
        }
        let mut by_domain: Vec<(String, Vec<String>)> = Vec::new();
        let mut results: Vec<(String, RcptResult)> = Vec::new();
        for rcpt in &item.recipients {
            match rcpt.rsplit_once('@') {
                Some((_, domain)) if !domain.is_empty() => {
                    let domain = domain.trim_end_matches('.').to_ascii_lowercase();
                    match by_domain.iter_mut().find(|(d, _)| *d == domain) {
                        Some((_, list)) => list.push(rcpt.clone()),
                        None => by_domain.push((domain, vec![rcpt.clone()])),
                    }
                }
                _ => results.push((
                    rcpt.clone(),
                    RcptResult::Failed {
                        status: "5.1.3".into(),
                        diagnostic: "recipient address has no domain".into(),
                        remote: None,
                    },
                )),
            }
        }
        for (domain, rcpts) in by_domain {
            results.extend(self.deliver_domain(&item, &domain, &rcpts).await);
        }
        self.finish(item, results).await;
    }

    async fn release(&self, item: &QueueItem) {
        if let Err(e) = self.app.store.queue_release(item.id, &self.worker).await {
            tracing::warn!(queue_id = item.id, error = %e, "relay: claim not released; it lapses with its lease");
        }
    }

    async fn finish(&self, item: QueueItem, results: Vec<(String, RcptResult)>) {
        let now = Utc::now();
        let expired = now >= item.expires_at;
        let mut outcomes = Vec::with_capacity(results.len());
        let mut remaining = Vec::new();
        let mut failed = Vec::new();
        let mut deferred_reports = Vec::new();
        let mut relayed = Vec::new();
        let mut last_error = None;
        let dsn = &item.dsn;
        let orcpt = |rcpt: &str| dsn.recipient(rcpt).and_then(|d| d.original_recipient());
        for (rcpt, result) in results {
            let (status, reply) = match result {
                RcptResult::Sent(reply, dsn_passed) => {
                    self.metrics.deliveries.with_label_values(&["sent"]).inc();
                    // RFC 3461 §5.2.2: a next hop without DSN ends the chain of
                    // reports here, so the success asked for is told now.
                    if !dsn_passed && dsn.wants(&rcpt, DsnEvent::Success) {
                        // `reply` is "host: the reply".
                        let (host, answer) = reply.split_once(": ").unwrap_or(("", reply.as_str()));
                        relayed.push(RecipientReport {
                            recipient: rcpt.clone(),
                            status: "2.0.0".into(),
                            remote_mta: (!host.is_empty()).then(|| host.to_string()),
                            diagnostic: answer.to_string(),
                            original_recipient: orcpt(&rcpt),
                        });
                    }
                    (RecipientStatus::Sent, reply)
                }
                RcptResult::Deferred(reason) if expired => {
                    self.metrics.deliveries.with_label_values(&["bounced"]).inc();
                    let diagnostic =
                        format!("message expired after {} attempts; last error: {reason}", item.attempts);
                    if dsn.wants(&rcpt, DsnEvent::Failure) {
                        failed.push(RecipientReport {
                            recipient: rcpt.clone(),
                            status: "4.4.7".into(),
                            remote_mta: None,
                            diagnostic: diagnostic.clone(),
                            original_recipient: orcpt(&rcpt),
                        });
                    }
                    (RecipientStatus::Failed, diagnostic)
                }
                RcptResult::Deferred(reason) => {
                    self.metrics.deliveries.with_label_values(&["deferred"]).inc();
                    remaining.push(rcpt.clone());
                    last_error = Some(reason.clone());
                    if dsn.wants(&rcpt, DsnEvent::Delay) {
                        deferred_reports.push(RecipientReport {
                            recipient: rcpt.clone(),
                            status: "4.0.0".into(),
                            remote_mta: None,
                            diagnostic: reason.clone(),
                            original_recipient: orcpt(&rcpt),
                        });
                    }
                    (RecipientStatus::Deferred, reason)
                }
                RcptResult::Failed { status, diagnostic, remote } => {
                    self.metrics.deliveries.with_label_values(&["bounced"]).inc();
                    if dsn.wants(&rcpt, DsnEvent::Failure) {
                        failed.push(RecipientReport {
                            recipient: rcpt.clone(),
                            status,
                            remote_mta: remote,
                            diagnostic: diagnostic.clone(),
                            original_recipient: orcpt(&rcpt),
                        });
                    }
                    (RecipientStatus::Failed, diagnostic)
                }
            };
            outcomes.push(RecipientOutcome { recipient: rcpt, status, reply, at: now });
        }
        if !failed.is_empty() {
            self.notify_sender(&item, Action::Failed, &failed).await;
        }
        if !relayed.is_empty() {
            self.notify_sender(&item, Action::Relayed, &relayed).await;
        }
        let config = &self.app.config.relay;
        let mut delay_notified = item.delay_notified;
        let waited = (now - item.created_at).num_seconds().max(0) as u64;
        if !remaining.is_empty()
            && !delay_notified
            && config.delay_notice_secs > 0
            && waited >= config.delay_notice_secs
        {
            self.notify_sender(&item, Action::Delayed, &deferred_reports).await;
            delay_notified = true;
        }
        let step = item.attempts.saturating_sub(1) as usize;
        let delay = config
            .retry_schedule_secs
            .get(step)
            .or(config.retry_schedule_secs.last())
            .copied()
            .unwrap_or(300);
        // The last attempt happens at expiry, not after it.
        let retry_at = (now + chrono::Duration::seconds(i64::try_from(delay).unwrap_or(i64::MAX / 2)))
            .min(item.expires_at);
        let attempt = QueueAttempt { remaining, outcomes, last_error, retry_at, delay_notified };
        match self.app.store.queue_finish(item.id, &self.worker, &attempt).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                queue_id = item.id,
                "relay: lease lost before the attempt was recorded (another worker took the item over)"
            ),
            Err(e) => tracing::error!(
                queue_id = item.id,
                error = %e,
                "relay: attempt not recorded; the item is retried when its lease ends"
            ),
        }
    }

    async fn destination(&self, domain: &str) -> Result<Destination, RcptResult> {
        let config = &self.app.config.relay;
        if let Some(smarthost) = &config.smarthost {
            let (host, port) = split_host_port(smarthost).ok_or_else(|| {
                RcptResult::Deferred(format!("relay.smarthost {smarthost:?} is not host:port"))
            })?;
            return Ok(Destination {
                key: format!("smarthost {host}:{port}"),
                hosts: vec![(host, port)],
                smarthost: true,
                require_verified_tls: false,
            });
        }
        match self.dns.route(domain, config.max_mx_hosts).await {
            Err(e) => Err(RcptResult::Deferred(e.to_string())),
            Ok(Route::NullMx) => Err(RcptResult::Failed {
                status: "5.1.10".into(),
                diagnostic: format!("{domain} accepts no mail (null MX, RFC 7505)"),
                remote: None,
            }),
            Ok(Route::NoSuchDomain) => Err(RcptResult::Failed {
                status: "5.1.2".into(),
                diagnostic: format!("{domain} has no mail exchanger and no address"),
                remote: None,
            }),
            Ok(Route::Hosts(mut hosts)) => {
                let me = self.app.config.hostname.to_ascii_lowercase();
                if hosts.contains(&me) {
                    // RFC 5321 §5.1: an MX list naming this host means the mail
                    // would come back here (and should have been local).
                    return Err(RcptResult::Failed {
                        status: "5.4.6".into(),
                        diagnostic: format!("mail for {domain} loops back to myself ({me})"),
                        remote: None,
                    });
                }
                let mut require_verified_tls = false;
                if config.mta_sts
                    && let Some(policy) = self.mta_sts.policy(&self.dns, domain).await
                {
                    match policy.mode {
                        mta_sts::Mode::Enforce => {
                            hosts.retain(|h| policy.allows(h));
                            if hosts.is_empty() {
                                return Err(RcptResult::Deferred(format!(
                                    "no MX host of {domain} is named by its MTA-STS policy"
                                )));
                            }
                            require_verified_tls = true;
                        }
                        mta_sts::Mode::Testing if hosts.iter().any(|h| !policy.allows(h)) => {
                            tracing::info!(domain, "MX hosts outside the MTA-STS policy (testing mode)");
                        }
                        _ => {}
                    }
                }
                let port = config.remote_port;
                Ok(Destination {
                    key: domain.to_string(),
                    hosts: hosts.into_iter().map(|h| (h, port)).collect(),
                    smarthost: false,
                    require_verified_tls,
                })
            }
        }
    }

    async fn deliver_domain(
        &self,
        item: &QueueItem,
        domain: &str,
        rcpts: &[String],
    ) -> Vec<(String, RcptResult)> {
        let all = |r: RcptResult| rcpts.iter().map(|x| (x.clone(), r.clone())).collect::<Vec<_>>();
        let dest = match self.destination(domain).await {
            Ok(d) => d,
            Err(r) => return all(r),
        };
        let limit = {
            let mut limits = self.limits.lock().unwrap_or_else(|e| e.into_inner());
            limits
                .entry(dest.key.clone())
                .or_insert_with(|| {
                    Arc::new(Semaphore::new(self.app.config.relay.max_connections_per_destination))
                })
                .clone()
        };
        let Ok(_slot) = limit.acquire_owned().await else {
            return all(RcptResult::Deferred("relay stopping".into()));
        };
        let mut last_error = String::from("no mail exchanger could be reached");
        for (host, port) in &dest.hosts {
            // Connections made under an MTA-STS policy are kept apart from others.
            let pool_key = format!("{host}:{port}{}", if dest.require_verified_tls { " sts" } else { "" });
            // A pooled connection first; if it broke while idle (before anything of
            // this message was sent), a fresh one.
            if let Some(mut client) = self.take_idle(&pool_key) {
                match client.send(&item.sender, rcpts, &item.raw, &item.dsn).await {
                    Ok(sent) => return self.sent(client, pool_key, host, rcpts, sent),
                    Err(e) if !client.content_sent => {
                        tracing::debug!(host, error = %e, "pooled connection unusable; opening another");
                    }
                    Err(e) => return all(RcptResult::Deferred(format!("{host}: {e}"))),
                }
            }
            let mut client = match self.open(host, *port, &dest).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(host, port, error = %e, "relay: host unusable");
                    last_error = format!("{host}: {e}");
                    continue;
                }
            };
            return match client.send(&item.sender, rcpts, &item.raw, &item.dsn).await {
                Ok(sent) => self.sent(client, pool_key, host, rcpts, sent),
                // The connection broke during the transaction: whether the server
                // took the message is unknown, so it is retried later (at least
                // once) rather than sent to the next host now.
                Err(e) => all(RcptResult::Deferred(format!("{host}: {e}"))),
            };
        }
        all(RcptResult::Deferred(last_error))
    }

    fn sent(
        &self,
        client: Client,
        pool_key: String,
        host: &str,
        rcpts: &[String],
        sent: client::Sent,
    ) -> Vec<(String, RcptResult)> {
        if client.transactions < self.app.config.relay.max_messages_per_connection {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.entry(pool_key).or_default().push((client, Instant::now()));
        } else {
            tokio::spawn(client.quit());
        }
        rcpts
            .iter()
            .zip(sent.per_recipient)
            .map(|(rcpt, reply)| {
                let result = if reply.is_positive() {
                    RcptResult::Sent(format!("{host}: {reply}"), sent.dsn_passed)
                } else if reply.is_permanent() {
                    RcptResult::Failed {
                        status: dsn::status_of(reply.code, reply.enhanced()),
                        diagnostic: reply.to_string(),
                        remote: Some(host.to_string()),
                    }
                } else {
                    RcptResult::Deferred(format!("{host}: {reply}"))
                };
                (rcpt.clone(), result)
            })
            .collect()
    }

    fn take_idle(&self, key: &str) -> Option<Client> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.get_mut(key)?;
        while let Some((client, since)) = conns.pop() {
            if since.elapsed() < IDLE_KEEP {
                return Some(client);
            }
            tokio::spawn(client.quit());
        }
        None
    }

    /// Connects to one host (each of its addresses in turn) and greets it.
    async fn open(&self, host: &str, port: u16, dest: &Destination) -> Result<Client, ClientError> {
        let config = &self.app.config.relay;
        let mut addrs = self.dns.addresses(host).await.map_err(|e| ClientError::Io(e.to_string()))?;
        if addrs.is_empty() {
            return Err(ClientError::Io(format!("{host} has no address")));
        }
        if !dest.smarthost {
            let allowed = &config.allowed_private_networks;
            let refused: Vec<_> = addrs
                .iter()
                .filter(|ip| !is_global(**ip) && !allowed.iter().any(|n| n.contains(*ip)))
                .copied()
                .collect();
            addrs.retain(|ip| !refused.contains(ip));
            if addrs.is_empty() {
                self.metrics.private_targets.inc();
                let list: Vec<String> = refused.iter().map(|ip| ip.to_string()).collect();
                return Err(ClientError::Io(format!(
                    "{host} resolves only to non-global addresses ({}), which the relay does not reach \
                     (relay.allowed_private_networks)",
                    list.join(", ")
                )));
            }
        }
        let helo = if config.helo_name.is_empty() { &self.app.config.hostname } else { &config.helo_name };
        let mut last = ClientError::Io(format!("{host} has no address"));
        for ip in addrs {
            let addr = SocketAddr::new(ip, port);
            let attempt = async {
                if dest.require_verified_tls {
                    let mut c = Client::connect(addr, self.timeouts.clone()).await?;
                    c.hello(helo, Some((&self.tls_verified, host)), true).await?;
                    Ok(c)
                } else if dest.smarthost {
                    let require = config.smarthost_tls == "required";
                    let mut c = Client::connect(addr, self.timeouts.clone()).await?;
                    c.hello(helo, require.then_some((&self.tls_smarthost, host)), require).await?;
                    if let (Some(user), Some(password)) =
                        (&config.smarthost_username, &config.smarthost_password)
                    {
                        c.auth_plain(user, password.expose()).await?;
                    }
                    Ok(c)
                } else {
                    let mut c = Client::connect(addr, self.timeouts.clone()).await?;
                    match c.hello(helo, Some((&self.tls_any, host)), false).await {
                        Ok(()) => Ok(c),
                        // A broken TLS handshake: opportunistic TLS falls back to a
                        // plain connection (RFC 7435) rather than not delivering.
                        Err(ClientError::Io(e)) if e.starts_with("TLS handshake") => {
                            tracing::info!(host, error = %e, "STARTTLS failed; sending without TLS");
                            let mut c = Client::connect(addr, self.timeouts.clone()).await?;
                            c.hello(helo, None, false).await?;
                            Ok(c)
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match attempt.await {
                Ok(c) => {
                    self.metrics.connections.with_label_values(&[if c.tls { "yes" } else { "no" }]).inc();
                    return Ok(c);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A DSN to the sender: into its INBOX when the sender is a local account,
    /// else queued (with the null sender, so it is never bounced in turn).
    async fn notify_sender(&self, item: &QueueItem, action: Action, recipients: &[RecipientReport]) {
        if item.sender.is_empty() || recipients.is_empty() {
            return;
        }
        let message = dsn::build(&dsn::Report {
            action,
            reporting_mta: &self.app.config.hostname,
            sender: &item.sender,
            arrival: item.created_at,
            expires: item.expires_at,
            recipients,
            original: &item.raw,
            envid: item.dsn.envid.as_deref(),
            return_full: item.dsn.ret == Some(DsnRet::Full),
        });
        let result = crate::accept::deliver_dsn(&self.app, &self.wake, &item.sender, message).await;
        match result {
            Ok(()) => self.metrics.dsns.with_label_values(&[action.name()]).inc(),
            Err(e) => tracing::error!(queue_id = item.id, error = %e, "DSN to {} not sent", item.sender),
        }
    }
}

/// Whether an address is reachable on the public Internet: not loopback,
/// private (RFC 1918, shared CGN space, ULA), link-local, unspecified,
/// multicast, documentation, benchmarking or otherwise reserved (the IANA
/// special-purpose registries), nor an IPv4-mapped or -compatible form of one.
pub(crate) fn is_global(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(a == 0
                || a == 10
                || a == 127
                || (a == 100 && (64..128).contains(&b))
                || (a == 169 && b == 254)
                || (a == 172 && (16..32).contains(&b))
                || (a == 192 && b == 168)
                || (a == 192 && b == 0 && (c == 0 || c == 2))
                || (a == 198 && (b == 18 || b == 19))
                || (a == 198 && b == 51 && c == 100)
                || (a == 203 && b == 0 && c == 113)
                || a >= 224)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_global(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(s[..6].iter().all(|s| *s == 0) // ::, ::1 and the deprecated ::a.b.c.d
                || (s[0] & 0xfe00) == 0xfc00 // ULA fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10
                || (s[0] & 0xff00) == 0xff00 // multicast
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x0100 && s[1..4].iter().all(|s| *s == 0))) // discard 100::/64
        }
    }
}

#[cfg(test)]
mod address_tests {
    use super::is_global;

    #[test]
    fn private_and_special_addresses_are_not_global() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.18.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "fec0::1",
        ] {
            assert!(!is_global(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "172.32.0.1", "100.128.0.1", "2a00:1450::1", "::ffff:8.8.8.8", "2001:4860::1"] {
            assert!(is_global(ip.parse().unwrap()), "{ip}");
        }
    }
}
