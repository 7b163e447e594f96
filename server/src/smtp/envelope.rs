//! MAIL FROM, RCPT TO, RSET: the mail transaction's envelope, and the recipient
//! check (local domain? existing account?) with a short-lived cache in front of
//! the store, so a burst of mail to one mailbox costs one store lookup.

use std::borrow::Cow;
use std::sync::PoisonError;
use std::time::Duration;

use smtp_proto::{MailFrom, RcptTo};

use super::session::{Session, Step};
pub(super) use crate::accept::{Recipient, Target};
use crate::cache::Cache;
use crate::proto::smtp::{Reply, replies, split_address};
use crate::store::StoreResult;
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
        let targets = match self.resolve_recipient(address).await {
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
            match self.lookup_recipient(account).await {
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

    /// [`Self::lookup_recipient`] with the postmaster rules of RFC 5321 §4.5.1: the
    /// bare `<postmaster>` is always a local recipient, and so is `postmaster@`
    /// every local domain. They go to `smtp.postmaster` when it is set; else to
    /// the domain's own `postmaster@` account (the bare form: the hostname's
    /// domain when it is local, else the first local domain), which is created,
    /// without a known password, the first time mail for it arrives and nobody
    /// made it: the mail is kept until an administrator sets a password.
    async fn resolve_recipient(&self, address: &str) -> StoreResult<Option<Lookup>> {
        let configured = &self.config().postmaster;
        let bare = address.eq_ignore_ascii_case("postmaster");
        // Every RCPT passes here: the local part is looked at before anything
        // is allocated.
        let postmaster_local =
            address.rsplit_once('@').is_some_and(|(l, _)| l.eq_ignore_ascii_case("postmaster"));
        if !bare && !postmaster_local {
            return self.lookup_recipient(address).await;
        }
        let postmaster_of = split_address(address).map(|(_, d)| d);
        if !bare
            && let found @ Some(Lookup::Mailbox { .. } | Lookup::NotLocal) =
                self.lookup_recipient(address).await?
        {
            return Ok(found);
        }
        if !configured.is_empty() {
            return Ok(Some(match self.lookup_recipient(configured).await? {
                Some(found @ Lookup::Mailbox { .. }) => found,
                // Not deliverable here: refuse as unknown, never as a relay attempt.
                _ => Lookup::NoSuchUser,
            }));
        }
        let domain = match postmaster_of {
            Some(d) => d.to_ascii_lowercase(),
            None => {
                let hostname = self.app.config.hostname.to_ascii_lowercase();
                if self.app.store.domain_exists(&hostname).await? {
                    hostname
                } else {
                    match self.app.store.domain_list().await?.into_iter().min() {
                        Some(d) => d,
                        None => return Ok(Some(Lookup::NoSuchUser)),
                    }
                }
            }
        };
        let target = format!("postmaster@{domain}");
        match self.lookup_recipient(&target).await? {
            Some(Lookup::NoSuchUser) => {}
            found => return Ok(found),
        }
        self.create_postmaster(&target).await?;
        let _ = self.app.cache.value_del(&recipient_key(&target)).await;
        Ok(Some(match self.lookup_recipient(&target).await? {
            Some(found @ Lookup::Mailbox { .. }) => found,
            _ => Lookup::NoSuchUser,
        }))
    }

    /// Creates `postmaster@domain` with the hash of a random secret nobody holds
    /// (logging in needs `mailcluster user passwd`). Another session creating it
    /// at the same moment is not an error: the lookup after finds it.
    async fn create_postmaster(&self, email: &str) -> StoreResult<()> {
        let hash = tokio::task::spawn_blocking(|| {
            let mut secret = [0u8; 32];
            rand::fill(&mut secret);
            crate::auth::hash_password(&crate::cache::hex(&secret))
        })
        .await
        .map_err(|e| crate::store::StoreError::Internal(format!("hashing: {e}")))?
        .map_err(|e| crate::store::StoreError::Internal(e.to_string()))?;
        match self.app.store.account_create(email, &hash).await {
            Ok(_) => {
                tracing::warn!(
                    account = email,
                    "mail for postmaster arrived and no such account existed: created it without a password \
                     (RFC 5321 §4.5.1); set one with `mailcluster user passwd` or set smtp.postmaster"
                );
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, account = email, "postmaster account not created (it may exist now)");
                Ok(())
            }
        }
    }

    /// `user@domain` of `user+detail@domain` (RFC 5233), when the local part
    /// has one of the configured delimiters after its first character.
    fn without_detail(&self, address: &str) -> Option<String> {
        let delimiters = &self.config().recipient_delimiter;
        let (local, domain) = address.rsplit_once('@')?;
        let at = local.char_indices().skip(1).find(|(_, c)| delimiters.contains(*c))?.0;
        Some(format!("{}@{domain}", &local[..at]))
    }

    /// Checks a recipient: `None` for an address without a domain, else the
    /// cached answer or [`crate::store::Addresses::recipient`]'s, with its user
    /// after the configured delimiters.
    async fn lookup_recipient(&self, address: &str) -> StoreResult<Option<Lookup>> {
        if split_address(address).is_none() {
            return Ok(None);
        }
        let ttl = Duration::from_secs(self.config().recipient_cache_ttl_secs);
        let user = || self.without_detail(address);
        if ttl.is_zero() {
            return Ok(Some(self.app.store.recipient(address, user().as_deref()).await?));
        }
        let key = recipient_key(address);
        if let Ok(Some(v)) = self.app.cache.value_get_hot(&key).await
            && let Some((hit, written)) = decode_lookup(&v)
        {
            if written.is_some_and(|written| refresh_due(written, ttl)) {
                self.refresh_recipient(key, address.to_string(), user(), ttl);
            }
            return Ok(Some(hit));
        }
        let found = self.app.store.recipient(address, user().as_deref()).await?;
        remember_recipient(&*self.app.cache, &key, &found, ttl).await;
        Ok(Some(found))
    }

    /// Reads an entry that will soon expire again, in the background, and
    /// caches the answer anew: a recipient that keeps getting mail is then
    /// never looked up on its RCPT's path, and entries cached together (by a
    /// burst, or a pod's start) do not all miss together a TTL later. One read
    /// per entry at a time in the process; a failed one leaves the entry to
    /// expire.
    fn refresh_recipient(&self, key: String, address: String, user: Option<String>, ttl: Duration) {
        let refreshing = self.app.refreshing_recipients.clone();
        if !refreshing.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone()) {
            return;
        }
        let (store, cache) = (self.app.store.clone(), self.app.cache.clone());
        tokio::spawn(async move {
            match store.recipient(&address, user.as_deref()).await {
                Ok(found) => remember_recipient(&*cache, &key, &found, ttl).await,
                Err(err) => tracing::debug!(error = %err, "recipient entry not refreshed"),
            }
            refreshing.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
        });
    }
}

/// The cache key of `address`'s recipient entry (admin commands drop it).
pub fn recipient_key(address: &str) -> String {
    format!("smtp:rcpt:{}", address.to_lowercase())
}

/// Caches a recipient's lookup. Negative answers (and aliases, whose accounts
/// are cached on their own) are kept briefly so that a newly created user is
/// not refused for long. Cache trouble only costs a store lookup.
async fn remember_recipient(cache: &dyn Cache, key: &str, found: &Lookup, ttl: Duration) {
    let ttl = if matches!(found, Lookup::Mailbox { .. }) { ttl } else { ttl.min(NEGATIVE_TTL) };
    let _ = cache.value_put(key, encode_lookup(found, unix_millis()).as_bytes(), ttl).await;
}

/// How long an answer other than an account's INBOX is cached, at most.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);

/// Whether an account's entry written at `written` (Unix milliseconds) is in
/// the last quarter of its `ttl`, when it is read again. Entries of a TTL
/// under 4 s are left to expire.
fn refresh_due(written: u64, ttl: Duration) -> bool {
    let ttl = ttl.as_millis() as u64;
    ttl >= 4_000 && unix_millis().saturating_sub(written) >= ttl - ttl / 4
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// An entry: `m:account:mailbox:limited:written` (pods that know only the
/// first three fields read it too), `a:` and a line per target, `u` or `r`.
fn encode_lookup(l: &Lookup, written_millis: u64) -> String {
    match l {
        Lookup::Mailbox { account_id, mailbox_id, limited } => {
            format!("m:{account_id}:{mailbox_id}:{}:{written_millis}", u8::from(*limited))
        }
        // addresses hold no control characters: a line per target
        Lookup::Alias(targets) => format!("a:{}", targets.join("\n")),
        Lookup::NoSuchUser => "u".into(),
        Lookup::NotLocal => "r".into(),
    }
}

/// An entry and, for an account's, when it was written (absent in entries of
/// older pods).
fn decode_lookup(v: &[u8]) -> Option<(Lookup, Option<u64>)> {
    let s = std::str::from_utf8(v).ok()?;
    match s {
        "u" => Some((Lookup::NoSuchUser, None)),
        "r" => Some((Lookup::NotLocal, None)),
        _ if s.starts_with("a:") => {
            Some((Lookup::Alias(s[2..].split('\n').map(str::to_string).collect()), None))
        }
        _ => {
            let mut it = s.strip_prefix("m:")?.split(':');
            let account_id = it.next()?.parse().ok()?;
            let mailbox_id = it.next()?.parse().ok()?;
            let limited = match it.next()? {
                "0" => false,
                "1" => true,
                _ => return None,
            };
            let written = it.next().and_then(|w| w.parse().ok());
            Some((Lookup::Mailbox { account_id, mailbox_id, limited }, written))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_cache_encoding_round_trips() {
        for l in [
            Lookup::Mailbox { account_id: 7, mailbox_id: 42, limited: false },
            Lookup::Mailbox { account_id: 7, mailbox_id: 42, limited: true },
            Lookup::Alias(vec!["a@example.com".into()]),
            Lookup::Alias(vec!["a@example.com".into(), "b@example.com".into()]),
            Lookup::NoSuchUser,
            Lookup::NotLocal,
        ] {
            let written = matches!(l, Lookup::Mailbox { .. }).then_some(1_700_000_000_123);
            assert_eq!(decode_lookup(encode_lookup(&l, 1_700_000_000_123).as_bytes()), Some((l, written)));
        }
        // an entry of a pod that did not write the time is read, and expires
        let older = Lookup::Mailbox { account_id: 7, mailbox_id: 42, limited: true };
        assert_eq!(decode_lookup(b"m:7:42:1"), Some((older, None)));
        assert_eq!(decode_lookup(b"m:x:1:0"), None);
        // an entry cached by a pod without quotas is a miss, not a wrong answer
        assert_eq!(decode_lookup(b"m:7:42"), None);
        assert_eq!(decode_lookup(b"garbage"), None);
    }

    #[test]
    fn entries_are_refreshed_in_the_last_quarter_of_their_ttl() {
        let ttl = Duration::from_secs(30);
        let now = unix_millis();
        assert!(!refresh_due(now, ttl));
        assert!(!refresh_due(now - 22_000, ttl));
        assert!(refresh_due(now - 23_000, ttl));
        assert!(refresh_due(now - 40_000, ttl), "an entry kept past its time");
        assert!(!refresh_due(now + 60_000, ttl), "a clock behind the writer's");
        assert!(!refresh_due(now - 3_000, Duration::from_secs(3)), "short TTLs are left to expire");
    }
}
