//! What happens to a message once its data is in and its sender is judged: the
//! acceptance rules, written once for every way mail enters the store.
//!
//! - storage quota, per local recipient, with the message's real size;
//! - Junk routing of mail the sender checks marked as such;
//! - the split between local mailboxes (group commit) and other domains (the
//!   outbound queue, DKIM-signed for the domain the sender may use);
//! - the order of the two writes and the rollback that keeps a client's retry
//!   from duplicating anything (queue first, held back until the local commit);
//! - delivery status notifications: success reports and over-quota failures,
//!   limited for senders that may be forged; reports themselves ([`deliver_dsn`],
//!   which the relay also uses);
//! - the "mailbox changed" events that wake IDLE sessions on every pod.
//!
//! - the content filter (`crate::filter`, rspamd) first: its verdict may
//!   refuse or defer the message, mark it and send it to Junk; the score it
//!   gave stays beside the message for the steps after it.
//!
//! The protocol sessions decide who may send what; this module decides what
//! becomes of an accepted message and says so as an [`Outcome`], which each
//! protocol turns into its own reply.

pub mod append;
pub mod sieve;
pub mod vacation;

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use mailcluster_model::{DsnEvent, DsnRequest, DsnRet, FlagSet, NewDelivery, NewQueueItem};
use tokio::sync::Notify;

use crate::app::App;
use crate::cache::MailboxEvent;
use crate::filter::{Judged, Scan, SpamScore};
use crate::relay::dsn::{self, Action, RecipientReport};

/// Messages larger than this are parsed on the blocking pool, so a large
/// message does not hold up the other sessions of a runtime thread.
const PARSE_INLINE_MAX: usize = 256 * 1024;

/// How long the queued copy of a message with local recipients as well waits
/// for the local commit before a relay worker may take it (a crash in between
/// leaves it to go out after this).
const LOCAL_FIRST_HOLD: chrono::Duration = chrono::Duration::minutes(5);

/// The window of an account's outbound limits (messages and recipients per hour).
pub const SENT_WINDOW: Duration = Duration::from_secs(3600);

/// The shared counter of what an account sent in the current window: `what`
/// is `msg` or `rcpt`. Submission and Sieve redirects count on the same one.
pub fn sent_counter_key(what: &str, account_id: i64) -> String {
    format!("smtp:sent:{what}:{account_id}")
}

/// One recipient of a message and where its mail goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub address: String,
    pub target: Target,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A local account's INBOX; `limited` when the account has a storage quota
    /// (checked again with the message's real size once the data is in).
    Local { account_id: i64, mailbox_id: i64, limited: bool },
    /// Another domain's user (submission only): goes to the outbound queue.
    Remote,
}

/// A message whose data is in, with what the session learnt of it.
pub struct Incoming<'a> {
    /// Names the message in logs and in the session's reply.
    pub id: &'a str,
    /// The reverse path; empty for the null sender.
    pub from: &'a str,
    pub recipients: &'a [Recipient],
    /// RET, ENVID, NOTIFY and ORCPT (RFC 3461), already limited for a sender
    /// that may be forged.
    pub dsn: &'a DsnRequest,
    /// The submitting account, when the message came from one.
    pub account_id: Option<i64>,
    /// The sender is known (an account, a trusted network, SPF or DMARC): an
    /// unknown one gets a limited number of failure reports.
    pub verified: bool,
    /// The sender checks marked it as junk: local copies go to Junk.
    pub junk: bool,
    /// The domain the outbound copy is DKIM-signed for, if any.
    pub signing_domain: Option<&'a str>,
    /// The client's address and HELO name, for the content filter (none for
    /// mail that did not come over SMTP).
    pub client_ip: Option<IpAddr>,
    pub helo: Option<&'a str>,
    /// The submitting account's login name.
    pub user: Option<&'a str>,
    /// The `Authentication-Results` field the pod's sender checks added.
    pub authentication_results: Option<&'a str>,
    /// Counts failure reports not sent to a sender over its limit (the
    /// listener's `mail_smtp_bounces_dropped_total`).
    pub bounces_dropped: &'a prometheus::IntCounter,
}

/// What became of a message; each protocol answers it its own way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stored and queued as it should be: the client may forget it.
    Accepted,
    /// No recipient had room for it: nothing was stored.
    QuotaExceeded,
    /// Nothing was kept (or what was queued was taken back): the client retries.
    TryLater,
    /// Refused for good (550 5.7.1), with this text: by the content filter,
    /// or by the recipient's Sieve script when it was the only recipient.
    Rejected(String),
    /// The content filter deferred it (451 4.7.1), with this text.
    Deferred(String),
}

/// One copy of the message for the group commit: its bytes, the flags it
/// starts with, and the mailboxes (with their accounts) it goes to.
struct LocalCopy {
    raw: Bytes,
    flags: FlagSet,
    targets: Vec<(i64, i64)>,
}

/// Adds `(account_id, mailbox_id)` to the copy with these bytes and flags
/// (one store write for all of them), or starts one.
fn add_copy(copies: &mut Vec<LocalCopy>, raw: &Bytes, flags: FlagSet, account_id: i64, mailbox_id: i64) {
    let same = |c: &LocalCopy| c.flags == flags && c.raw.as_ptr() == raw.as_ptr() && c.raw.len() == raw.len();
    match copies.iter_mut().find(|c| same(c)) {
        Some(copy) => {
            if !copy.targets.iter().any(|(_, m)| *m == mailbox_id) {
                copy.targets.push((account_id, mailbox_id));
            }
        }
        None => copies.push(LocalCopy { raw: raw.clone(), flags, targets: vec![(account_id, mailbox_id)] }),
    }
}

/// A local recipient whose Sieve script ran, and what it said.
struct Scripted<'m> {
    address: &'m str,
    account_id: i64,
    email: std::sync::Arc<str>,
    filtered: sieve::Filtered,
}

/// Stores an accepted message: remote recipients into the outbound queue, local
/// ones through the group commit (where their Sieve scripts file them); then
/// what the scripts asked beyond that, the events and the reports.
pub async fn accept(app: &App, message: &Incoming<'_>, raw: Bytes) -> Outcome {
    let (raw, junk, spam) = match filtered(app, message, raw).await {
        Ok(judged) => judged,
        Err(outcome) => return outcome,
    };
    if let Some(spam) = &spam {
        tracing::info!(id = %message.id, score = spam.spam_score, required = spam.required_score, junk, "scanned");
    }
    // What a Sieve spamtest sees (RFC 5235).
    let spam = spam.map(|s| sieve::spam_values(s.spam_score, s.required_score));
    let mut copies: Vec<LocalCopy> = Vec::new();
    let mut scripted: Vec<Scripted<'_>> = Vec::new();
    let mut remotes: Vec<String> = Vec::new();
    let mut over_quota: Vec<String> = Vec::new();
    for r in message.recipients {
        match r.target {
            Target::Local { account_id, mailbox_id, limited } => {
                if limited {
                    match app.store.quota(account_id).await {
                        Ok(q) if q.fits(raw.len() as u64) => {}
                        Ok(_) => {
                            over_quota.push(r.address.clone());
                            continue;
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, id = %message.id, "quota lookup failed");
                            return Outcome::TryLater;
                        }
                    }
                }
                let keep =
                    if junk { junk_of(app, account_id).await.unwrap_or(mailbox_id) } else { mailbox_id };
                let indexed = app.sieve.indexed(app.store.as_ref(), account_id).await;
                let filtered = match &indexed {
                    None => None,
                    Some(entry) => {
                        let rcpt = sieve::Recipient {
                            account_id,
                            account: &entry.email,
                            address: &r.address,
                            keep,
                            digest: entry.digest,
                        };
                        let auth = message.account_id.and(message.user);
                        sieve::filter(app, message.from, auth, spam, &rcpt, &raw).await
                    }
                };
                match (filtered, indexed) {
                    (Some(filtered), Some(entry)) => {
                        let content = filtered.edited.as_ref().unwrap_or(&raw);
                        for (mailbox, flags) in &filtered.stores {
                            add_copy(&mut copies, content, flags.clone(), account_id, *mailbox);
                        }
                        scripted.push(Scripted {
                            address: &r.address,
                            account_id,
                            email: entry.email,
                            filtered,
                        });
                    }
                    _ => add_copy(&mut copies, &raw, FlagSet::default(), account_id, keep),
                }
            }
            Target::Remote => remotes.push(r.address.clone()),
        }
    }
    // A script's refusal of the message's only recipient is the answer to the
    // client (RFC 5429 §2.1: at the protocol level where it can be).
    if let [only] = message.recipients
        && let [s] = scripted.as_slice()
        && s.address == only.address
        && let Some(reason) = &s.filtered.reject
        && copies.is_empty()
        && s.filtered.redirects.is_empty()
    {
        return Outcome::Rejected(sieve::reject_text(reason));
    }
    // Copies the scripts send on: to local accounts as copies of their own,
    // to other domains through the queue.
    let mut redirected: Vec<NewQueueItem> = Vec::new();
    for s in &mut scripted {
        let content = s.filtered.edited.clone().unwrap_or_else(|| raw.clone());
        let plan = sieve::redirects(app, message, s.account_id, &s.email, &mut s.filtered, &content).await;
        for (account_id, mailbox_id, copy) in plan.local {
            add_copy(&mut copies, &copy, FlagSet::default(), account_id, mailbox_id);
        }
        if let Some(keep) = plan.keep {
            add_copy(&mut copies, &content, FlagSet::default(), s.account_id, keep);
        }
        redirected.extend(plan.queued);
    }
    // The header section a DSN quotes (a reference, not a copy).
    let original = (!over_quota.is_empty()).then(|| raw.clone());
    // The local recipients whose sender asked to hear of their delivery (RFC
    // 3461 NOTIFY=SUCCESS), and the message their report quotes.
    let rejected: Vec<&str> =
        scripted.iter().filter(|s| s.filtered.reject.is_some()).map(|s| s.address).collect();
    let delivered: Vec<&String> = message
        .recipients
        .iter()
        .filter(|r| {
            matches!(r.target, Target::Local { .. })
                && !over_quota.contains(&r.address)
                && !rejected.contains(&r.address.as_str())
                && message.dsn.wants(&r.address, DsnEvent::Success)
        })
        .map(|r| &r.address)
        .collect();
    let delivered_original = (!delivered.is_empty()).then(|| raw.clone());
    if !over_quota.is_empty() && copies.is_empty() && remotes.is_empty() && scripted.is_empty() {
        // Every recipient is over quota: one answer says it all.
        return Outcome::QuotaExceeded;
    }
    // The queue goes first: if it fails, nothing was stored anywhere and the
    // client's retry duplicates nothing. If the local delivery then fails, the
    // queued copies are taken back before the 4xx, so the retry does not send
    // the remote copies twice. Until the local delivery is committed the queued
    // copies are held back (not due before `LOCAL_FIRST_HOLD`), so no relay
    // worker of any pod sends what may yet be answered with an error; a
    // crash in between leaves them to go out after the hold.
    let now = Utc::now();
    let expiry = chrono::Duration::seconds(app.config.smtp.queue_expiry_secs.min(i64::MAX as u64) as i64);
    let hold = if copies.is_empty() { chrono::Duration::zero() } else { LOCAL_FIRST_HOLD };
    let mut items = Vec::new();
    if !remotes.is_empty() {
        items.push(NewQueueItem {
            sender: message.from.to_string(),
            dsn: message.dsn.only(&remotes),
            recipients: remotes,
            raw: outbound_copy(app, &raw, message.signing_domain),
            account_id: message.account_id,
            not_before: now + hold,
            expires_at: now + expiry,
        });
    }
    for mut item in redirected {
        item.not_before = now + hold;
        item.expires_at = now + expiry;
        items.push(item);
    }
    let mut queued = Vec::new();
    for item in &items {
        match app.store.queue_enqueue(item).await {
            Ok(id) => queued.push(id),
            Err(err) => {
                tracing::warn!(error = %err, id = %message.id, "queueing failed");
                withdraw(app, message, &queued).await;
                return Outcome::TryLater;
            }
        }
    }
    if !copies.is_empty() {
        let mut parsed: Vec<(Bytes, mailcluster_model::MessageMeta)> = Vec::new();
        for copy in &copies {
            if parsed.iter().any(|(r, _)| r.as_ptr() == copy.raw.as_ptr() && r.len() == copy.raw.len()) {
                continue;
            }
            match parse_meta(copy.raw.clone()).await {
                Some(meta) => parsed.push((copy.raw.clone(), meta)),
                None => {
                    withdraw(app, message, &queued).await;
                    return Outcome::TryLater;
                }
            }
        }
        // Each copy is its own durable write; they usually share one group
        // commit. A failure of any is the client's 4xx: a retry may store a
        // copy twice, never lose one.
        let writes = copies.iter().map(|copy| {
            let meta = parsed
                .iter()
                .find(|(r, _)| r.as_ptr() == copy.raw.as_ptr() && r.len() == copy.raw.len())
                .map(|(_, m)| m.clone())
                .unwrap_or_default();
            app.deliverer.deliver(NewDelivery {
                raw: copy.raw.clone(),
                meta,
                internal_date: Utc::now(),
                targets: copy.targets.iter().map(|(_, m)| *m).collect(),
                flags: copy.flags.clone(),
            })
        });
        for result in futures::future::join_all(writes).await {
            if let Err(err) = result {
                tracing::warn!(error = %err, id = %message.id, "delivery failed");
                withdraw(app, message, &queued).await;
                return Outcome::TryLater;
            }
        }
        for &id in &queued {
            if let Err(err) = app.store.queue_retry(Some(id)).await {
                tracing::warn!(error = %err, id = %message.id, queue_id = id, "queued copy goes after its hold");
            }
        }
        // Wake IDLE sessions on every pod. Publishing only queues the event (a
        // serving pod's cache never waits on Redis here), so it needs no task of
        // its own on this path.
        let mut woken: Vec<i64> = Vec::new();
        for (account_id, mailbox_id) in copies.iter().flat_map(|c| c.targets.iter().copied()) {
            if woken.contains(&mailbox_id) {
                continue;
            }
            woken.push(mailbox_id);
            // The store does not report the new modseq; 0 means "re-check".
            let event = MailboxEvent { account_id, mailbox_id, modseq: 0 };
            if let Err(err) = app.cache.publish(event).await {
                tracing::debug!(error = %err, "mailbox event not published");
            }
        }
    }
    if !queued.is_empty() {
        app.mail.relay_wake.notify_one();
    }
    for s in &scripted {
        sieve::after_delivery(app, message, s.account_id, &s.email, s.address, &s.filtered, &raw).await;
        if let Some(reason) = &s.filtered.reject {
            report_rejected(app, message, &raw, s.address, reason).await;
        }
    }
    if let Some(original) = original {
        report_over_quota(app, message, &original, &over_quota).await;
    }
    if let Some(original) = delivered_original {
        // The mailbox has the message, so no other server will report on it.
        let diagnostic = "250 2.0.0 delivered to the mailbox";
        report(app, message, &original, Action::Delivered, delivered.into_iter(), "2.0.0", diagnostic).await;
    }
    Outcome::Accepted
}

/// The message's metadata, parsed on the blocking pool when it is large.
async fn parse_meta(raw: Bytes) -> Option<mailcluster_model::MessageMeta> {
    if raw.len() <= PARSE_INLINE_MAX {
        return Some(mailcluster_model::message::parse_meta(&raw));
    }
    match tokio::task::spawn_blocking(move || mailcluster_model::message::parse_meta(&raw)).await {
        Ok(meta) => Some(meta),
        Err(err) => {
            tracing::error!(error = %err, "message parsing task failed");
            None
        }
    }
}

/// Takes back what was queued for a message the client is told to send again.
async fn withdraw(app: &App, message: &Incoming<'_>, queued: &[i64]) {
    for &id in queued {
        if let Err(err) = app.store.queue_complete(id).await {
            // The relay worker will send it; the client's retry may then
            // send a second copy — logged so it can be traced.
            tracing::error!(error = %err, id = %message.id, queue_id = id, "queued copy not withdrawn");
        }
    }
}

/// A recipient's script refused the message, but others took it: the sender
/// hears of it by a DSN (RFC 5429 §2.1.1), within the limits of a sender that
/// may be forged.
async fn report_rejected(app: &App, message: &Incoming<'_>, raw: &Bytes, recipient: &str, reason: &str) {
    let recipient = recipient.to_string();
    if !message.dsn.wants(&recipient, DsnEvent::Failure) || message.from.is_empty() {
        return;
    }
    if !message.verified && !bounce_allowed(app, message.from).await {
        message.bounces_dropped.inc();
        return;
    }
    let diagnostic = format!("550 5.7.1 {}", sieve::reject_text(reason));
    report(app, message, raw, Action::Failed, std::iter::once(&recipient), "5.7.1", &diagnostic).await;
}

/// The content filter's judgement of a message that comes from outside (or
/// from a user, with `filter.rspamd.scan_submission`): the message with the
/// filter's header fields, whether it goes to Junk (the sender checks may
/// already have said so), and rspamd's score; or the refusal.
async fn filtered(
    app: &App,
    message: &Incoming<'_>,
    raw: Bytes,
) -> Result<(Bytes, bool, Option<SpamScore>), Outcome> {
    if !app.filter.enabled() || (message.account_id.is_some() && !app.filter.scans_submission()) {
        return Ok((raw, message.junk, None));
    }
    let scan = Scan {
        queue_id: message.id,
        from: message.from,
        recipients: message.recipients.iter().map(|r| r.address.as_str()).collect(),
        ip: message.client_ip,
        helo: message.helo,
        user: message.user,
        authentication_results: message.authentication_results,
        header_at: return_path_end(&raw),
    };
    match app.filter.judge(&scan, raw).await {
        Judged::Deliver { raw, junk, score } => Ok((raw, junk || message.junk, score)),
        Judged::Reject(text) => Err(Outcome::Rejected(text)),
        Judged::Defer(text) => Err(Outcome::Deferred(text)),
    }
}

/// Some recipients of an accepted message had no room for it: the others got
/// it, so the transaction's one reply is a success and these are told to the
/// sender by a DSN, as any MTA does for a recipient that fails after acceptance.
/// A sender that may be forged gets a limited number of them (its address's and
/// its domain's hourly `inbound.bounces_per_*`).
async fn report_over_quota(app: &App, message: &Incoming<'_>, raw: &Bytes, recipients: &[String]) {
    let failed: Vec<&String> =
        recipients.iter().filter(|r| message.dsn.wants(r, DsnEvent::Failure)).collect();
    if failed.is_empty() || message.from.is_empty() {
        return;
    }
    if !message.verified && !bounce_allowed(app, message.from).await {
        tracing::info!(id = %message.id, to = %message.from, "bounce to an unverified sender dropped: over its limit");
        message.bounces_dropped.inc();
        return;
    }
    report(app, message, raw, Action::Failed, failed.into_iter(), "5.2.2", "552 5.2.2 Quota exceeded").await;
}

/// One DSN to the sender about `recipients` (none: nothing is sent).
async fn report(
    app: &App,
    message: &Incoming<'_>,
    raw: &Bytes,
    action: Action,
    recipients: impl Iterator<Item = &String>,
    status: &str,
    diagnostic: &str,
) {
    let reports: Vec<RecipientReport> = recipients
        .map(|r| RecipientReport {
            recipient: r.clone(),
            status: status.into(),
            remote_mta: None,
            diagnostic: diagnostic.into(),
            original_recipient: message.dsn.recipient(r).and_then(|d| d.original_recipient()),
        })
        .collect();
    if message.from.is_empty() || reports.is_empty() {
        return;
    }
    let now = Utc::now();
    let report = dsn::build(&dsn::Report {
        action,
        reporting_mta: &app.config.hostname,
        sender: message.from,
        arrival: now,
        expires: now,
        recipients: &reports,
        original: raw,
        envid: message.dsn.envid.as_deref(),
        return_full: message.dsn.ret == Some(DsnRet::Full),
    });
    if let Err(err) = deliver_dsn(app, &app.mail.relay_wake, message.from, report).await {
        tracing::error!(error = %err, id = %message.id, "{} DSN to {} not sent", action.name(), message.from);
    }
}

/// Counts a bounce to `address` against its and its domain's hourly limits
/// (one counter each, shared by the pods through the cache): whether it
/// may go.
async fn bounce_allowed(app: &App, address: &str) -> bool {
    let inbound = &app.config.inbound;
    let address = address.to_lowercase();
    let domain = address.rsplit_once('@').map_or("", |(_, d)| d);
    let window = Duration::from_secs(3600);
    for (key, limit) in [
        (format!("smtp:bounce:addr:{address}"), inbound.bounces_per_address_per_hour),
        (format!("smtp:bounce:domain:{domain}"), inbound.bounces_per_domain_per_hour),
    ] {
        match app.cache.counter_incr(&key, window).await {
            Ok(n) if n > limit => return false,
            Ok(_) => {}
            // Cannot count: the bounce is dropped rather than sent unbounded.
            Err(_) => return false,
        }
    }
    true
}

/// The account's Junk mailbox, if it has one.
async fn junk_of(app: &App, account_id: i64) -> Option<i64> {
    match app.store.mailbox_get(account_id, "Junk").await {
        Ok(Some(m)) => Some(m.id),
        _ => None,
    }
}

/// The copy that leaves for other domains: without `Return-Path` (RFC 5321
/// §4.4: only the final delivery adds it) and, when the sender may use its
/// `From:` domain and a key covers it, DKIM-signed for that domain.
fn outbound_copy(app: &App, raw: &Bytes, signing_domain: Option<&str>) -> Bytes {
    let content = raw.slice(return_path_end(raw)..);
    match signing_domain.and_then(|d| app.mail.signer.sign(d, &content)) {
        Some(signature) => {
            let mut signed = Vec::with_capacity(signature.len() + content.len());
            signed.extend_from_slice(signature.as_bytes());
            signed.extend_from_slice(&content);
            Bytes::from(signed)
        }
        None => content,
    }
}

/// Sends an automatic message (a vacation reply) with the null reverse path:
/// into `to`'s INBOX when it is a local account, else queued, DKIM-signed for
/// `signing_domain` when a key covers it (the reply is from one of our
/// domains, and other domains check that).
pub(crate) async fn send_automatic(
    app: &App,
    to: &str,
    message: Vec<u8>,
    signing_domain: Option<&str>,
) -> anyhow::Result<()> {
    let message = match signing_domain.and_then(|d| app.mail.signer.sign(d, &message)) {
        Some(signature) => {
            let mut signed = signature.into_bytes();
            signed.extend_from_slice(&message);
            signed
        }
        None => message,
    };
    deliver_dsn(app, &app.mail.relay_wake, to, message).await
}

/// Stores a DSN for `to`: into its INBOX when it is a local account (quota or
/// not: a report must reach its sender), else into the outbound queue with the
/// null sender, so it is never bounced in turn.
pub(crate) async fn deliver_dsn(app: &App, wake: &Notify, to: &str, message: Vec<u8>) -> anyhow::Result<()> {
    let store = &app.store;
    if let Some(account) = store.account_get(to).await? {
        let inbox = store
            .mailbox_get(account.id, "INBOX")
            .await?
            .ok_or_else(|| anyhow::anyhow!("{to} has no INBOX"))?;
        let mut raw = b"Return-Path: <>\r\n".to_vec();
        raw.extend_from_slice(&message);
        let meta = mailcluster_model::message::parse_meta(&raw);
        let delivery = NewDelivery {
            raw: Bytes::from(raw),
            meta,
            internal_date: Utc::now(),
            targets: vec![inbox.id],
            flags: FlagSet::default(),
        };
        app.deliverer.deliver(delivery).await?;
        let event = MailboxEvent { account_id: account.id, mailbox_id: inbox.id, modseq: 0 };
        let _ = app.cache.publish(event).await;
        return Ok(());
    }
    let now = Utc::now();
    let expiry =
        chrono::Duration::seconds(i64::try_from(app.config.smtp.queue_expiry_secs).unwrap_or(i64::MAX / 2));
    store
        .queue_enqueue(&NewQueueItem {
            sender: String::new(),
            recipients: vec![to.to_string()],
            raw: Bytes::from(message),
            account_id: None,
            not_before: now,
            expires_at: now + expiry,
            // A report is sent with the null sender and never reported on.
            dsn: DsnRequest::default(),
        })
        .await?;
    wake.notify_one();
    Ok(())
}

/// Where the message proper starts: after the `Return-Path:` line the MX
/// writes first, if there is one.
pub(crate) fn return_path_end(raw: &[u8]) -> usize {
    if raw.starts_with(b"Return-Path:") {
        memchr::memmem::find(raw, b"\r\n").map(|p| p + 2).unwrap_or(0)
    } else {
        0
    }
}
