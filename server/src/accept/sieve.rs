//! Each account's Sieve filter (RFC 5228), run at delivery once per local
//! recipient that has an active script, on whichever pod takes the message.
//!
//! - Which accounts have a script, and the compiled scripts, are the
//!   process's [`Filters`] (`crate::scripts`).
//! - A script runs on the blocking pool, bounded by the interpreter's limits
//!   (steps, actions, redirects, variable sizes); the few questions it asks the
//!   store (does a mailbox exist, was this message seen, an included script)
//!   are answered from there.
//! - A script that fails never loses mail: the message goes where it would
//!   have gone without one, and the owner is told why (at most once an hour).
//! - What a script does beyond the mailbox — redirect, vacation, reject — is
//!   carried out by the acceptance step only once the message is stored, and
//!   under the sender rules: redirects count against the account's hourly
//!   recipient limit and never loop; vacation answers once per sender per
//!   period across pods, never to lists, robots or bounces.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use mailcluster_model::{DsnRequest, FlagSet, Flags, NewQueueItem};
use mailcluster_sieve::{self as sieve, Action, Script};

use super::vacation;
use crate::app::App;
use crate::scripts::{Digest32, Filters};
use crate::store::Store;
use mailcluster_model::Recipient as Lookup;

/// The header a redirected copy carries: a copy that comes back to the same
/// account is kept rather than sent round again.
pub const REDIRECTED_HEADER: &str = "X-Sieve-Redirected-From";

/// Copies of a message redirected through this many accounts are kept by the
/// next, whatever its script says.
const MAX_REDIRECT_HOPS: usize = 8;

/// What a recipient's script made of a message.
#[derive(Debug, Default)]
pub struct Filtered {
    /// Mailboxes the recipient's copy is stored in, each with its flags;
    /// empty: none (discarded, redirected away or rejected).
    pub stores: Vec<(i64, FlagSet)>,
    /// The message as the script's header edits left it.
    pub edited: Option<Bytes>,
    /// Addresses a copy goes to.
    pub redirects: Vec<String>,
    /// The script refused the message, with this reason.
    pub reject: Option<String>,
    pub vacation: Option<sieve::Vacation>,
    /// Why the script could not be followed, for its owner.
    pub failure: Option<String>,
    /// Where the message goes when it is kept.
    pub keep: i64,
}

/// What a recipient's script is run with.
pub struct Recipient<'a> {
    pub account_id: i64,
    /// The account's own address.
    pub account: &'a str,
    /// The address the mail came to (the RCPT, which may be an alias).
    pub address: &'a str,
    /// Where the message goes without a script (INBOX, or Junk when the
    /// sender checks said so).
    pub keep: i64,
    /// The digest of its active script, as the index has it.
    pub digest: Digest32,
}

/// Runs the recipient's active script on `raw`; `None` without one.
pub async fn filter(
    app: &App,
    from: &str,
    auth: Option<&str>,
    spam: Option<(u8, u8)>,
    rcpt: &Recipient<'_>,
    raw: &Bytes,
) -> Option<Filtered> {
    let filters = &app.sieve;
    let script = match filters.script_of(app.store.as_ref(), rcpt.account_id, &rcpt.digest).await {
        Ok(None) => return None,
        Ok(Some(script)) => script,
        Err(failure) => {
            return Some(Filtered {
                stores: vec![(rcpt.keep, FlagSet::default())],
                failure: Some(failure),
                keep: rcpt.keep,
                ..Default::default()
            });
        }
    };
    if redirect_hops(raw, rcpt.account) {
        // Sent round by scripts (ours or another's) too often, or back to an
        // account that sent it on already: kept where it is, so no script
        // can make mail circle.
        return Some(Filtered {
            stores: vec![(rcpt.keep, FlagSet::default())],
            keep: rcpt.keep,
            ..Default::default()
        });
    }
    let outcome = run(app, script, from, auth, spam, rcpt, raw.clone()).await;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(failure) => {
            return Some(Filtered {
                stores: vec![(rcpt.keep, FlagSet::default())],
                failure: Some(failure),
                keep: rcpt.keep,
                ..Default::default()
            });
        }
    };
    let mut filtered =
        Filtered { edited: outcome.edited_message.map(Bytes::from), keep: rcpt.keep, ..Default::default() };
    for action in outcome.actions {
        match action {
            Action::Keep { flags } => push_store(&mut filtered.stores, rcpt.keep, flag_set(&flags)),
            Action::FileInto { mailbox, flags, create } => {
                let id = match mailbox_for(app.store.as_ref(), rcpt.account_id, &mailbox, create).await {
                    Some(id) => id,
                    None => {
                        // RFC 5228 §4.1 lets a missing mailbox mean INBOX:
                        // the message is kept, the owner told.
                        filtered
                            .failure
                            .get_or_insert_with(|| format!("mailbox \"{mailbox}\" does not exist"));
                        rcpt.keep
                    }
                };
                push_store(&mut filtered.stores, id, flag_set(&flags));
            }
            Action::Redirect { address, .. } => {
                if valid_address(&address) {
                    filtered.redirects.push(address);
                } else {
                    filtered
                        .failure
                        .get_or_insert_with(|| format!("redirect to \"{address}\": not an address"));
                    push_store(&mut filtered.stores, rcpt.keep, FlagSet::default());
                }
            }
            Action::Reject { reason, .. } => filtered.reject = Some(reason),
            Action::Discard => {}
            Action::Vacation(v) => filtered.vacation = Some(v),
        }
    }
    Some(filtered)
}

async fn run(
    app: &App,
    script: Arc<Script>,
    from: &str,
    auth: Option<&str>,
    spam: Option<(u8, u8)>,
    rcpt: &Recipient<'_>,
    raw: Bytes,
) -> Result<sieve::Outcome, String> {
    let store = app.store.clone();
    let filters = app.sieve.clone();
    let handle = tokio::runtime::Handle::current();
    let from = from.to_string();
    let to = rcpt.address.to_string();
    let auth = auth.map(str::to_string);
    // The account's own address; its aliases are read only when a vacation
    // reply is to be sent.
    let addresses = vec![rcpt.account.to_string()];
    let account_id = rcpt.account_id;
    let task = tokio::task::spawn_blocking(move || {
        let start = crate::accept::return_path_end(&raw);
        let ctx = sieve::Context {
            envelope: sieve::Envelope { from: &from, to: &to, auth: auth.as_deref() },
            now: chrono::Local::now().fixed_offset(),
            spam: spam.map(|(value, _)| value),
            spam_percent: spam.map(|(_, percent)| percent),
            virus: None,
            user_addresses: &addresses,
        };
        let mut host = StoreHost { handle, store, filters: filters.clone(), account_id };
        sieve::run(&script, &raw[start..], &ctx, &mut host, filters.limits()).map_err(|e| e.to_string())
    });
    match task.await {
        Ok(result) => result,
        Err(err) => Err(format!("the script stopped: {err}")),
    }
}

/// The store's answers to a running script, on the blocking thread it runs on.
struct StoreHost {
    handle: tokio::runtime::Handle,
    store: Arc<dyn Store>,
    filters: Arc<Filters>,
    account_id: i64,
}

impl sieve::Host for StoreHost {
    fn mailbox_exists(&mut self, name: &str) -> bool {
        let store = &self.store;
        matches!(self.handle.block_on(store.mailbox_get(self.account_id, name)), Ok(Some(_)))
    }

    fn duplicate(&mut self, tracking_key: &str, period_secs: u64, _last: bool) -> bool {
        let store = &self.store;
        // A store that cannot answer says "not seen": the message is
        // delivered rather than dropped as a duplicate.
        self.handle
            .block_on(store.sieve_duplicate_seen(self.account_id, tracking_key, period_secs))
            .unwrap_or(false)
    }

    fn include(&mut self, name: &str, global: bool) -> Option<Arc<Script>> {
        if global {
            // Global scripts are the administrator's; none are kept yet.
            return None;
        }
        let store = &self.store;
        let source = self.handle.block_on(store.sieve_get(self.account_id, name)).ok().flatten()?;
        self.filters.compile(&source).ok()
    }
}

fn push_store(stores: &mut Vec<(i64, FlagSet)>, mailbox_id: i64, flags: FlagSet) {
    // One copy per mailbox (RFC 5228 §2.10.3: the same fileinto twice is one).
    if !stores.iter().any(|(m, _)| *m == mailbox_id) {
        stores.push((mailbox_id, flags));
    }
}

/// Sieve flags (RFC 5232: names separated by spaces) as a flag set; what is
/// not a valid IMAP flag (RFC 3501 `flag-keyword` is an atom) is left out.
pub fn flag_set(flags: &[String]) -> FlagSet {
    let mut set = FlagSet::default();
    for name in flags.iter().flat_map(|f| f.split_ascii_whitespace()) {
        if let Some(f) = Flags::from_name(name) {
            set.system = set.system.union(f);
        } else if !name.starts_with('\\')
            && name.len() <= 128
            && name.bytes().all(|b| b.is_ascii_graphic() && !b"(){%*\"\\]".contains(&b))
            && !set.keywords.iter().any(|k| k.eq_ignore_ascii_case(name))
        {
            set.keywords.push(name.to_string());
        }
    }
    set.keywords.sort();
    set
}

/// The mailbox a `fileinto` names, made first with `:create` (RFC 5490 §3.2).
async fn mailbox_for(store: &dyn Store, account_id: i64, name: &str, create: bool) -> Option<i64> {
    let name = mailcluster_model::mailbox_name(name)?;
    if let Ok(Some(m)) = store.mailbox_get(account_id, &name).await {
        return Some(m.id);
    }
    if !create {
        return None;
    }
    match store.mailbox_create(account_id, &name, None).await {
        Ok(m) => Some(m.id),
        // Made at the same moment by another delivery.
        Err(_) => store.mailbox_get(account_id, &name).await.ok().flatten().map(|m| m.id),
    }
}

/// An address a copy may be sent to: `local@domain`, nothing a header or an
/// SMTP command could be split at.
pub fn valid_address(address: &str) -> bool {
    address.len() <= 254
        && address
            .rsplit_once('@')
            .is_some_and(|(l, d)| !l.is_empty() && d.contains('.') && !d.starts_with('.'))
        && !address.bytes().any(|b| b.is_ascii_control() || b == b' ' || b == b'<' || b == b'>' || b == b',')
}

/// Whether a message was redirected by `account` already, or through too many
/// accounts: each redirect adds a [`REDIRECTED_HEADER`] line at the top.
pub fn redirect_hops(raw: &[u8], account: &str) -> bool {
    let mut hops = 0;
    let header_end = memchr::memmem::find(raw, b"\r\n\r\n").unwrap_or(raw.len());
    for line in raw[..header_end].split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else { continue };
        if !line[..colon].eq_ignore_ascii_case(REDIRECTED_HEADER.as_bytes()) {
            continue;
        }
        hops += 1;
        let value = String::from_utf8_lossy(&line[colon + 1..]);
        if value.trim().trim_matches(['<', '>']).eq_ignore_ascii_case(account) || hops >= MAX_REDIRECT_HOPS {
            return true;
        }
    }
    false
}

/// RFC 5235's values from a spam filter's score: `spamtest` 1 (clean) to 10
/// (at or over the filter's threshold), `spamtestplus :percent` 0 to 100.
pub fn spam_values(score: f64, threshold: f64) -> (u8, u8) {
    if !score.is_finite() || !threshold.is_finite() || threshold <= 0.0 {
        return (0, 0);
    }
    let ratio = (score / threshold).clamp(0.0, 1.0);
    ((1.0 + 9.0 * ratio).round() as u8, (100.0 * ratio).round() as u8)
}

/// A refusal's text as one SMTP reply line: printable ASCII only (the
/// client sees it after `550 5.7.1`), at most 200 characters.
pub fn reject_text(reason: &str) -> String {
    let text: String = reason
        .chars()
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let text: String = text.chars().take(200).collect();
    if text.is_empty() { "Refused by the recipient's filter".into() } else { text }
}

/// Where a recipient's redirects go.
pub struct Redirects {
    /// Local accounts' INBOXes: `(account_id, mailbox_id, copy)`.
    pub local: Vec<(i64, i64, Bytes)>,
    /// Copies for other domains, queued by the caller with its hold.
    pub queued: Vec<NewQueueItem>,
    /// A redirect was refused and nothing else keeps the message: it goes to
    /// this mailbox of the owner's.
    pub keep: Option<i64>,
}

/// The copies `filtered.redirects` asks for. Each address counts against
/// the account's hourly recipient limit (`smtp.submission_recipients_per_hour`,
/// the same count as the mail it submits): a script cannot send more than its
/// owner could. A redirect that is refused (over the limit, or to an address
/// nobody has) keeps the message for the owner instead and says why.
pub async fn redirects(
    app: &App,
    message: &super::Incoming<'_>,
    account_id: i64,
    account: &str,
    filtered: &mut Filtered,
    content: &Bytes,
) -> Redirects {
    let mut plan = Redirects { local: Vec::new(), queued: Vec::new(), keep: None };
    if filtered.redirects.is_empty() {
        return plan;
    }
    // Each copy says who sent it on, so that it never comes round again.
    let body = content.slice(super::return_path_end(content)..);
    let mut copy = Vec::with_capacity(body.len() + 64);
    copy.extend_from_slice(format!("{REDIRECTED_HEADER}: <{account}>\r\n").as_bytes());
    copy.extend_from_slice(&body);
    let copy = Bytes::from(copy);
    let mut remote = Vec::new();
    let mut kept = false;
    for address in std::mem::take(&mut filtered.redirects) {
        if !within_hourly_limit(app, account_id).await {
            filtered.failure.get_or_insert_with(|| {
                "redirects are over the hourly limit of recipients: the message was kept".into()
            });
            kept = true;
            continue;
        }
        match crate::directory::resolve(app, &address).await {
            Ok(Some(Lookup::Mailbox { account_id: to, mailbox_id, .. })) => {
                plan.local.push((to, mailbox_id, copy.clone()))
            }
            Ok(Some(Lookup::Alias(accounts))) => {
                for a in &accounts {
                    if let Ok(Some(Lookup::Mailbox { account_id: to, mailbox_id, .. })) =
                        crate::directory::lookup(app, a).await
                    {
                        plan.local.push((to, mailbox_id, copy.clone()));
                    }
                }
            }
            Ok(Some(Lookup::NotLocal)) => remote.push(address.clone()),
            Ok(_) => {
                filtered.failure.get_or_insert_with(|| format!("redirect to <{address}>: no such address"));
                kept = true;
                continue;
            }
            Err(err) => {
                // Cannot tell now: the message is kept, not lost.
                tracing::warn!(error = %err, id = %message.id, "redirect target not looked up");
                kept = true;
                continue;
            }
        }
        filtered.redirects.push(address);
    }
    if kept && filtered.stores.is_empty() {
        filtered.stores.push((filtered.keep, FlagSet::default()));
        plan.keep = Some(filtered.keep);
    }
    if !remote.is_empty() {
        plan.queued.push(NewQueueItem {
            // RFC 5228 §4.2 lets the sender stay: bounces of the copy go to
            // whoever sent the message.
            sender: message.from.to_string(),
            recipients: remote,
            raw: copy,
            account_id: Some(account_id),
            not_before: Utc::now(),
            expires_at: Utc::now(),
            dsn: DsnRequest::default(),
        });
    }
    plan
}

/// Counts one recipient against the account's hourly limit; whether it fits.
async fn within_hourly_limit(app: &App, account_id: i64) -> bool {
    let limit = app.config.smtp.submission_recipients_per_hour;
    if limit == 0 {
        return true;
    }
    let key = super::sent_counter_key("rcpt", account_id);
    match app.cache.counter_incr(&key, super::SENT_WINDOW).await {
        Ok(n) => n <= limit,
        // Cannot count: no copy leaves unbounded.
        Err(_) => false,
    }
}

/// What a script asked beyond the mailbox, once the message is stored: a
/// vacation reply, and a word to the owner when the script could not be
/// followed.
pub async fn after_delivery(
    app: &App,
    message: &super::Incoming<'_>,
    account_id: i64,
    account: &str,
    address: &str,
    filtered: &Filtered,
    raw: &Bytes,
) {
    if let Some(v) = &filtered.vacation {
        vacation(app, message, account_id, account, address, v, raw).await;
    }
    if let Some(failure) = &filtered.failure {
        tell_owner(app, account_id, account, failure).await;
    }
}

async fn vacation(
    app: &App,
    message: &super::Incoming<'_>,
    account_id: i64,
    account: &str,
    address: &str,
    v: &sieve::Vacation,
    raw: &Bytes,
) {
    let rights = match app.store.sender_rights(account).await {
        Ok(rights) => rights,
        Err(err) => {
            tracing::warn!(error = %err, id = %message.id, "vacation: the account's addresses not read");
            return;
        }
    };
    let mut addresses: Vec<String> = vec![account.to_string()];
    addresses.extend(rights.aliases.iter().cloned());
    addresses.extend(v.addresses.iter().filter(|a| valid_address(a)).cloned());
    let content = &raw[super::return_path_end(raw)..];
    if let Some(why) = vacation::refusal(message.from, &addresses, content) {
        tracing::debug!(id = %message.id, ?why, "vacation: no reply");
        return;
    }
    match app.store.sieve_vacation_seen(account_id, &v.handle, message.from, v.period_secs).await {
        Ok(false) => {}
        Ok(true) => return,
        Err(err) => {
            // Not knowing whether it was answered, it is not answered again.
            tracing::warn!(error = %err, id = %message.id, "vacation: not recorded, no reply");
            return;
        }
    }
    let delimiters = &app.config.smtp.recipient_delimiter;
    // `:from` only when the account may send as it (the sender rules of
    // submission), else the address the mail came to, if it is the
    // account's, else the account's own.
    let from = match v.from.as_deref().map(bare_address) {
        Some(f) if rights.permits(account, f, delimiters) => f.to_string(),
        _ if rights.permits(account, address, delimiters) => address.to_string(),
        _ => account.to_string(),
    };
    let reply = vacation::Reply {
        from: &from,
        to: message.from,
        subject: v.subject.as_deref(),
        reason: &v.reason,
        mime: v.mime,
        hostname: &app.config.hostname,
    };
    let built = vacation::build(&reply, content);
    let domain = from.rsplit_once('@').map(|(_, d)| d.to_lowercase());
    if let Err(err) = super::send_automatic(app, message.from, built, domain.as_deref()).await {
        tracing::warn!(error = %err, id = %message.id, "vacation reply not sent");
    }
}

/// The address inside `Name <address>`, or the text as it is.
fn bare_address(text: &str) -> &str {
    match (text.rfind('<'), text.rfind('>')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].trim(),
        _ => text.trim(),
    }
}

/// Tells the owner their script could not be followed: once an hour at
/// most (the count shared by the pods), into their INBOX.
async fn tell_owner(app: &App, account_id: i64, account: &str, failure: &str) {
    tracing::info!(account = %account, failure = %failure, "sieve script not followed");
    let key = format!("sieve:notice:{account_id}");
    match app.cache.counter_incr(&key, Duration::from_secs(3600)).await {
        Ok(1) => {}
        _ => return,
    }
    let hostname = &app.config.hostname;
    let text = format!(
        "From: Mail filter <postmaster@{hostname}>\r\nTo: <{account}>\r\n\
         Subject: Your mail filter could not be followed\r\nDate: {date}\r\n\
         Auto-Submitted: auto-generated\r\nMIME-Version: 1.0\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\r\n\
         Your Sieve script could not be followed for a message you received:\r\n\r\n  {failure}\r\n\r\n\
         The message was kept in your mailbox. Further problems within the\r\n\
         hour are not reported.\r\n",
        date = Utc::now().to_rfc2822(),
        failure = failure.replace(['\r', '\n'], " "),
    );
    if let Err(err) = super::deliver_dsn(app, &app.mail.relay_wake, account, text.into_bytes()).await {
        tracing::warn!(error = %err, account = %account, "sieve failure notice not stored");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sieve_flags_become_imap_flags() {
        let set =
            flag_set(&["\\Seen \\flagged".into(), "$Label1 Junk".into(), "\\Recent".into(), "bad(".into()]);
        assert_eq!(set.system, Flags::SEEN.union(Flags::FLAGGED));
        assert_eq!(set.keywords, vec!["$Label1".to_string(), "Junk".to_string()]);
    }

    #[test]
    fn redirect_loops_are_seen() {
        let raw = b"X-Sieve-Redirected-From: <alice@example.com>\r\nSubject: x\r\n\r\nbody\r\n";
        assert!(redirect_hops(raw, "alice@example.com"));
        assert!(!redirect_hops(raw, "bob@example.com"));
        let many = "X-Sieve-Redirected-From: a@x.test\r\n".repeat(MAX_REDIRECT_HOPS) + "\r\nbody";
        assert!(redirect_hops(many.as_bytes(), "new@example.com"));
        // Only the header counts, not a body line.
        let body = b"Subject: x\r\n\r\nX-Sieve-Redirected-From: alice@example.com\r\n";
        assert!(!redirect_hops(body, "alice@example.com"));
    }

    #[test]
    fn only_plain_addresses_are_redirect_targets() {
        assert!(valid_address("bob@example.org"));
        for bad in
            ["bob", "@example.org", "bob@localhost", "a@b.c>\r\nRCPT TO:<x@y.z", "a b@c.d", "a@b.c,d@e.f"]
        {
            assert!(!valid_address(bad), "{bad}");
        }
    }

    #[test]
    fn spam_scores_map_to_rfc5235_values() {
        assert_eq!(spam_values(-2.0, 15.0), (1, 0));
        assert_eq!(spam_values(0.0, 15.0), (1, 0));
        assert_eq!(spam_values(7.5, 15.0), (6, 50));
        assert_eq!(spam_values(15.0, 15.0), (10, 100));
        assert_eq!(spam_values(999.0, 15.0), (10, 100));
        assert_eq!(spam_values(1.0, 0.0), (0, 0));
    }
}
