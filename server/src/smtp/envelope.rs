//! MAIL FROM, RCPT TO, RSET: the mail transaction's envelope, and the recipient
//! check (local domain? existing account?) with a short-lived cache in front of
//! the store, so a burst of mail to one mailbox costs one store lookup.

use std::borrow::Cow;

use smtp_proto::{MailFrom, RcptTo};

use super::session::{Session, Step};
pub(super) use crate::accept::{Recipient, Target};
use crate::proto::smtp::{Reply, replies, split_address};
use mailcluster_model::{DsnNotify, DsnRequest, DsnRet, RecipientDsn};

/// The open transaction.
#[derive(Debug)]
pub(super) struct Envelope {
    /// Reverse path; empty for the null sender `<>` (bounces).
    pub from: String,
    pub smtputf8: bool,
    /// The size the client declared with `MAIL FROM … SIZE=n` (RFC 1870), 0 if none.
    pub declared_size: u64,
    pub rcpts: Vec<Recipient>,
    /// Identifies the message in logs, the Received header and the 250 reply.
    pub id: String,
    /// RET, ENVID and the recipients' NOTIFY and ORCPT (RFC 3461).
    pub dsn: DsnRequest,
}

/// Result of checking an address against the store (and the cache before it);
/// an alias's accounts are each looked up in turn.
use mailcluster_model::Recipient as Lookup;

/// MAIL parameters we implement: BODY=7BIT/8BITMIME, SMTPUTF8 and DSN's RET
/// (plus SIZE, ENVID and AUTH=, which are fields, not flags). REQUIRETLS,
/// BINARYMIME, … are not advertised, so a client using them gets 555 (RFC 5321
/// §4.1.1.11).
const MAIL_FLAGS_SUPPORTED: u64 = smtp_proto::MAIL_BODY_7BIT
    | smtp_proto::MAIL_BODY_8BITMIME
    | smtp_proto::MAIL_SMTPUTF8
    | smtp_proto::MAIL_RET_FULL
    | smtp_proto::MAIL_RET_HDRS;

/// DSN's NOTIFY values, the RCPT parameters we implement besides ORCPT.
const RCPT_NOTIFY: u64 = smtp_proto::RCPT_NOTIFY_SUCCESS
    | smtp_proto::RCPT_NOTIFY_FAILURE
    | smtp_proto::RCPT_NOTIFY_DELAY
    | smtp_proto::RCPT_NOTIFY_NEVER;

fn new_message_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let micros = chrono::Utc::now().timestamp_micros() as u64;
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{micros:x}{:04x}", seq & 0xffff)
}

impl Session {
    pub(super) async fn cmd_mail(&mut self, from: MailFrom<Cow<'_, str>>) -> Step {
        if self.helo.is_none() {
            self.reply(replies::bad_sequence("Send EHLO/HELO first"));
            return Step::Continue;
        }
        if self.kind.is_submission() && self.account.is_none() {
            self.reply(Reply::new(530, "5.7.0", "Authentication required"));
            return Step::Continue;
        }
        if self.envelope.is_some() {
            self.reply(replies::bad_sequence("Sender already specified"));
            return Step::Continue;
        }
        let unsupported = from.flags & !MAIL_FLAGS_SUPPORTED != 0
            || from.trans_id.is_some()
            || from.solicit.is_some()
            || from.mtrk.is_some()
            || from.by != 0
            || from.hold_for != 0
            || from.hold_until != 0
            || from.mt_priority != 0;
        if unsupported {
            self.reply(Reply::new(555, "5.5.4", "Unsupported MAIL parameter"));
            return Step::Continue;
        }
        let ret = match (
            from.flags & smtp_proto::MAIL_RET_FULL != 0,
            from.flags & smtp_proto::MAIL_RET_HDRS != 0,
        ) {
            (true, true) => {
                self.reply(Reply::new(501, "5.5.4", "RET may be given once"));
                return Step::Continue;
            }
            (true, false) => Some(DsnRet::Full),
            (false, true) => Some(DsnRet::Hdrs),
            (false, false) => None,
        };
        if from.size > self.config().max_message_size {
            self.reply(replies::message_too_big());
            return Step::Continue;
        }
        let smtputf8 = from.flags & smtp_proto::MAIL_SMTPUTF8 != 0;
        let address = from.address.as_ref();
        if !address.is_ascii() && !smtputf8 {
            self.reply(Reply::new(553, "5.6.7", "Non-ASCII address requires SMTPUTF8"));
            return Step::Continue;
        }
        if !address.is_empty() && split_address(address).is_none() {
            self.reply(Reply::new(553, "5.1.7", "Sender address must be fully qualified"));
            return Step::Continue;
        }
        if let Some(reply) = self.mail_from_refusal(address).await {
            self.reply(reply);
            return Step::Continue;
        }
        if let Some(reply) = self.message_rate_refusal().await {
            self.reply(reply);
            return Step::Continue;
        }
        self.envelope = Some(Envelope {
            from: address.to_string(),
            smtputf8,
            declared_size: from.size as u64,
            rcpts: Vec::new(),
            id: new_message_id(),
            dsn: DsnRequest {
                ret,
                envid: from.env_id.as_deref().map(str::to_string),
                recipients: Vec::new(),
            },
        });
        self.reply(Reply::new(250, "2.1.0", "Sender OK"));
        Step::Continue
    }

    /// `foreign_orcpt`: an ORCPT of another address type than rfc822 (type,
    /// address), read around smtp-proto.
    pub(super) async fn cmd_rcpt(
        &mut self,
        to: RcptTo<Cow<'_, str>>,
        bare_postmaster: bool,
        foreign_orcpt: Option<(String, String)>,
    ) -> Step {
        let Some(envelope) = self.envelope.as_ref() else {
            self.reply(replies::bad_sequence("Need MAIL before RCPT"));
            return Step::Continue;
        };
        if to.flags & !RCPT_NOTIFY != 0 || to.rrvs != 0 {
            self.reply(Reply::new(555, "5.5.4", "Unsupported RCPT parameter"));
            return Step::Continue;
        }
        let notify = (to.flags & RCPT_NOTIFY != 0).then_some(DsnNotify {
            success: to.flags & smtp_proto::RCPT_NOTIFY_SUCCESS != 0,
            failure: to.flags & smtp_proto::RCPT_NOTIFY_FAILURE != 0,
            delay: to.flags & smtp_proto::RCPT_NOTIFY_DELAY != 0,
        });
        if to.flags & smtp_proto::RCPT_NOTIFY_NEVER != 0
            && to.flags & RCPT_NOTIFY != smtp_proto::RCPT_NOTIFY_NEVER
        {
            // RFC 3461 §4.1: NEVER stands alone.
            self.reply(Reply::new(501, "5.5.4", "NOTIFY=NEVER cannot be combined with other values"));
            return Step::Continue;
        }
        if envelope.rcpts.len() >= self.config().max_recipients {
            self.reply(Reply::new(452, "4.5.3", "Too many recipients"));
            return Step::Continue;
        }
        let address = if bare_postmaster { "postmaster" } else { to.address.as_ref() };
        if address.is_empty() {
            self.reply(Reply::new(501, "5.1.3", "Invalid recipient address"));
            return Step::Continue;
        }
        if !address.is_ascii() && !envelope.smtputf8 {
            self.reply(Reply::new(553, "5.6.7", "Non-ASCII address requires SMTPUTF8"));
            return Step::Continue;
        }
        if envelope.rcpts.iter().any(|r| r.address.eq_ignore_ascii_case(address)) {
            // Same recipient twice: deliver once.
            self.reply(Reply::new(250, "2.1.5", "Recipient OK"));
            return Step::Continue;
        }
        if let Some(reply) = self.recipient_rate_refusal().await {
            self.reply(reply);
            return Step::Continue;
        }
        let targets = match crate::directory::resolve(&self.app, address).await {
            Err(err) => {
                tracing::warn!(error = %err, "recipient lookup failed");
                self.reply(replies::temp_failure());
                return Step::Continue;
            }
            Ok(None) => {
                self.reply(Reply::new(501, "5.1.3", "Recipient address must be fully qualified"));
                return Step::Continue;
            }
            Ok(Some(Lookup::Mailbox { account_id, mailbox_id, limited })) => {
                if limited && let Some(reply) = self.quota_refusal(account_id).await {
                    self.reply(reply);
                    return Step::Continue;
                }
                vec![Target::Local { account_id, mailbox_id, limited }]
            }
            Ok(Some(Lookup::Alias(accounts))) => match self.alias_targets(&accounts).await {
                Ok(targets) => targets,
                Err(reply) => {
                    self.reply(reply);
                    return Step::Continue;
                }
            },
            Ok(Some(Lookup::NoSuchUser)) => {
                self.reply(Reply::new(550, "5.1.1", "Mailbox unavailable"));
                return Step::Continue;
            }
            Ok(Some(Lookup::NotLocal)) if self.kind.is_submission() => vec![Target::Remote],
            Ok(Some(Lookup::NotLocal)) => {
                self.reply(Reply::new(550, "5.7.1", "Relaying denied"));
                return Step::Continue;
            }
        };
        if let Some(envelope) = self.envelope.as_mut() {
            for target in targets {
                envelope.rcpts.push(Recipient { address: address.to_string(), target });
            }
            let (orcpt, orcpt_type) = match foreign_orcpt {
                Some((kind, address)) => (Some(address), Some(kind)),
                None => (to.orcpt.as_deref().map(str::to_string), None),
            };
            if notify.is_some() || orcpt.is_some() {
                envelope.dsn.recipients.push(RecipientDsn {
                    recipient: address.to_string(),
                    notify,
                    orcpt,
                    orcpt_type,
                });
            }
        }
        self.reply(Reply::new(250, "2.1.5", "Recipient OK"));
        Step::Continue
    }

    /// The INBOXes of an alias's accounts. An account deleted since the alias
    /// was made is passed over; an alias with none left is unknown (550), and
    /// one whose every account is refused by its quota gets the first refusal.
    async fn alias_targets(&self, accounts: &[String]) -> Result<Vec<Target>, Reply> {
        let mut targets = Vec::new();
        let mut refusal = None;
        for account in accounts {
            match crate::directory::lookup(&self.app, account).await {
                Err(err) => {
                    tracing::warn!(error = %err, "alias target lookup failed");
                    return Err(replies::temp_failure());
                }
                Ok(Some(Lookup::Mailbox { account_id, mailbox_id, limited })) => {
                    if limited && let Some(reply) = self.quota_refusal(account_id).await {
                        refusal.get_or_insert(reply);
                        continue;
                    }
                    let target = Target::Local { account_id, mailbox_id, limited };
                    if !targets.contains(&target) {
                        targets.push(target);
                    }
                }
                // aliases name accounts, not other aliases
                Ok(_) => {}
            }
        }
        match (targets.is_empty(), refusal) {
            (false, _) => Ok(targets),
            (true, Some(reply)) => Err(reply),
            (true, None) => Err(Reply::new(550, "5.1.1", "Mailbox unavailable")),
        }
    }

    /// RFC 9208 at delivery: a recipient whose account is already at its storage
    /// limit is refused for now (`452 4.2.2`, it may be cleaned up), and one whose
    /// free space is below the size the client declared with SIZE= for good
    /// (`552 5.2.2`). The real size is checked again after DATA.
    async fn quota_refusal(&self, account_id: i64) -> Option<Reply> {
        let declared = self.envelope.as_ref().map_or(0, |e| e.declared_size);
        match self.app.store.quota(account_id).await {
            Ok(q) if !q.fits(1) => Some(Reply::new(452, "4.2.2", "Mailbox full")),
            Ok(q) if !q.fits(declared) => {
                Some(Reply::new(552, "5.2.2", "Message too large for the mailbox's quota"))
            }
            Ok(_) => None,
            Err(err) => {
                tracing::warn!(error = %err, "quota lookup failed");
                Some(replies::temp_failure())
            }
        }
    }

    pub(super) fn cmd_rset(&mut self) -> Step {
        self.junk_command();
        self.envelope = None;
        self.bdat = None;
        self.reply(Reply::new(250, "2.0.0", "OK"));
        Step::Continue
    }
}
