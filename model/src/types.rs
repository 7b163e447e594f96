//! Plain data exchanged with the store and between the parts of the server.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One account of a bulk import ([`super::Store::accounts_import`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImportedAccount {
    pub email: String,
    /// Stored as given: the caller has checked it is a hash the server verifies.
    pub password_hash: String,
    /// Its own storage limit in octets; `None`: the domain's default.
    pub quota: Option<u64>,
    /// Addresses at local domains whose mail goes to the account.
    pub aliases: Vec<String>,
}

/// What [`super::Store::accounts_import`] did with a batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImportOutcome {
    pub created: usize,
    /// Addresses that already had an account, left as they were.
    pub existing: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: i64,
    /// Full lower-cased address, `local@domain`.
    pub email: String,
    pub domain: String,
    /// PHC string (argon2id).
    pub password_hash: String,
    pub created_at: DateTime<Utc>,
    /// False when switched off: no login, and mail to it is refused.
    pub enabled: bool,
    /// The name shown for the account, when one was given.
    pub display_name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SpecialUse {
    Drafts,
    Sent,
    Trash,
    Junk,
    Archive,
}

impl SpecialUse {
    pub const ALL: [SpecialUse; 5] = [Self::Drafts, Self::Sent, Self::Trash, Self::Junk, Self::Archive];

    /// The RFC 6154 attribute, e.g. `\Sent`.
    pub fn attribute(self) -> &'static str {
        match self {
            Self::Drafts => "\\Drafts",
            Self::Sent => "\\Sent",
            Self::Trash => "\\Trash",
            Self::Junk => "\\Junk",
            Self::Archive => "\\Archive",
        }
    }

    /// The mailbox name created for new accounts.
    pub fn default_name(self) -> &'static str {
        match self {
            Self::Drafts => "Drafts",
            Self::Sent => "Sent",
            Self::Trash => "Trash",
            Self::Junk => "Junk",
            Self::Archive => "Archive",
        }
    }

    pub fn as_str(self) -> &'static str {
        self.default_name()
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.as_str().eq_ignore_ascii_case(s))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mailbox {
    pub id: i64,
    pub account_id: i64,
    /// Full hierarchical name with `/` as the separator, UTF-8 (the IMAP layer
    /// converts to and from modified UTF-7).
    pub name: String,
    pub uid_validity: u32,
    pub uid_next: u32,
    pub highest_modseq: u64,
    pub special_use: Option<SpecialUse>,
    /// The highest UID already given to a session as `\Recent`: the messages above
    /// it are recent for the next session that selects the mailbox.
    pub recent_floor: u32,
}

/// An account's storage quota (RFC 9208, resource STORAGE), in octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    /// The account's own limit, if one is set.
    pub account_limit: Option<u64>,
    /// Its domain's default limit, if one is set.
    pub domain_limit: Option<u64>,
    /// Octets of the messages in all its mailboxes (a message in two mailboxes
    /// counts twice).
    pub used: u64,
}

impl Quota {
    /// An account's own limit that means "none", whatever its domain's default
    /// (the largest a limit column holds).
    pub const UNLIMITED: u64 = i64::MAX as u64;

    /// The limit that applies: the account's own, else its domain's default.
    pub fn limit(&self) -> Option<u64> {
        self.account_limit.or(self.domain_limit).filter(|&l| l < Self::UNLIMITED)
    }

    /// Whether `more` octets still fit under the limit.
    pub fn fits(&self, more: u64) -> bool {
        self.limit().is_none_or(|limit| self.used.saturating_add(more) <= limit)
    }
}

/// The separator of mailbox hierarchy levels (`Lists/dev`).
pub const MAILBOX_SEPARATOR: char = '/';
/// The longest mailbox name stored, in octets.
pub const MAX_MAILBOX_NAME: usize = 512;

/// A mailbox name as the store keeps it, from UTF-8 text whoever wrote it
/// (an IMAP client, a Sieve script): `INBOX` in any case is `INBOX`, one
/// trailing separator is dropped; `None` for an empty name, one too long,
/// with control characters or LIST wildcards, or with an empty, `.` or `..`
/// level.
pub fn mailbox_name(text: &str) -> Option<String> {
    let name = text.strip_suffix(MAILBOX_SEPARATOR).unwrap_or(text);
    if name.eq_ignore_ascii_case("INBOX") {
        return Some("INBOX".into());
    }
    if name.is_empty()
        || name.len() > MAX_MAILBOX_NAME
        || name.chars().any(|c| c.is_control() || c == '*' || c == '%')
        || name.split(MAILBOX_SEPARATOR).any(|level| level.is_empty() || level == "." || level == "..")
    {
        return None;
    }
    Some(name.to_string())
}

/// The key a domain's mail is signed with (DKIM, RFC 6376), as the store holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct DomainKey {
    /// Lower-case.
    pub domain: String,
    pub selector: String,
    /// "ed25519" or "rsa".
    pub algorithm: String,
    /// PEM: PKCS#8 for Ed25519, PKCS#1 or PKCS#8 for RSA.
    pub private_pem: String,
}

/// Never prints the private key.
impl std::fmt::Debug for DomainKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainKey")
            .field("domain", &self.domain)
            .field("selector", &self.selector)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// Whom an account may send as on submission, besides its own address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderRights {
    /// The aliases that deliver to the account, lower-cased.
    pub aliases: Vec<String>,
    /// Its allowed senders: full addresses and `@domain` wildcards, lower-cased.
    pub allowed: Vec<String>,
}

impl SenderRights {
    /// Whether the account `account` may use `address` as a sender: its own
    /// address, one of its aliases or allowed addresses, a subaddress of any of
    /// those (a detail after one of `delimiters`, RFC 5233), or any address of
    /// an allowed `@domain`. Domains compare without case; local parts too, as
    /// accounts and aliases are stored lower-cased.
    pub fn permits(&self, account: &str, address: &str, delimiters: &str) -> bool {
        let address = address.trim().to_lowercase();
        let Some((local, domain)) = address.rsplit_once('@') else { return false };
        let domain = domain.trim_end_matches('.');
        if local.is_empty() || domain.is_empty() {
            return false;
        }
        let user = local
            .char_indices()
            .skip(1)
            .find(|(_, c)| delimiters.contains(*c))
            .map_or(local, |(at, _)| &local[..at]);
        let wildcard = format!("@{domain}");
        [format!("{local}@{domain}"), format!("{user}@{domain}")].iter().any(|candidate| {
            candidate.eq_ignore_ascii_case(account)
                || self.aliases.iter().any(|a| a == candidate)
                || self.allowed.iter().any(|a| a == candidate)
        }) || self.allowed.contains(&wildcard)
    }
}

/// Where mail for an address goes, as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipient {
    /// An account's INBOX; `limited` when a storage limit applies to it.
    Mailbox { account_id: i64, mailbox_id: i64, limited: bool },
    /// An alias: the accounts its mail goes to, in address order.
    Alias(Vec<String>),
    /// A local domain's address that nobody has (or an account without INBOX).
    NoSuchUser,
    /// An address whose domain is not one of ours.
    NotLocal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MailboxStatus {
    pub messages: u32,
    pub unseen: u32,
    pub uid_next: u32,
    pub uid_validity: u32,
    pub highest_modseq: u64,
}

/// The IMAP system flags as a bit set; keywords travel separately in [`FlagSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Flags(pub u32);

impl Flags {
    pub const SEEN: Flags = Flags(1);
    pub const ANSWERED: Flags = Flags(2);
    pub const FLAGGED: Flags = Flags(4);
    pub const DELETED: Flags = Flags(8);
    pub const DRAFT: Flags = Flags(16);
    pub const NONE: Flags = Flags(0);

    pub const NAMED: [(Flags, &'static str); 5] = [
        (Self::SEEN, "\\Seen"),
        (Self::ANSWERED, "\\Answered"),
        (Self::FLAGGED, "\\Flagged"),
        (Self::DELETED, "\\Deleted"),
        (Self::DRAFT, "\\Draft"),
    ];

    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn intersects(self, other: Flags) -> bool {
        self.0 & other.0 != 0
    }
    pub fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
    pub fn difference(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }
    /// `\Seen` → SEEN (case-insensitive); `None` for keywords and `\Recent`.
    pub fn from_name(name: &str) -> Option<Flags> {
        Self::NAMED.iter().find(|(_, n)| n.eq_ignore_ascii_case(name)).map(|(f, _)| *f)
    }
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMED.into_iter().filter(move |(f, _)| self.contains(*f)).map(|(_, n)| n)
    }
}

/// System flags plus keywords (`$Forwarded`, `Junk`, …), keywords kept sorted and
/// unique.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlagSet {
    pub system: Flags,
    pub keywords: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagOp {
    Add,
    Remove,
    Replace,
}

/// A set of UIDs as inclusive ranges; `u32::MAX` as an upper bound means `*`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UidSet(pub Vec<(u32, u32)>);

impl UidSet {
    pub fn all() -> Self {
        UidSet(vec![(1, u32::MAX)])
    }
    pub fn single(uid: u32) -> Self {
        UidSet(vec![(uid, uid)])
    }
    pub fn from_uids(uids: &[u32]) -> Self {
        let mut sorted: Vec<u32> = uids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        for uid in sorted {
            match ranges.last_mut() {
                Some((_, hi)) if *hi + 1 == uid => *hi = uid,
                _ => ranges.push((uid, uid)),
            }
        }
        UidSet(ranges)
    }
    pub fn contains(&self, uid: u32) -> bool {
        self.0.iter().any(|&(lo, hi)| lo.min(hi) <= uid && uid <= lo.max(hi))
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Location of one MIME part inside the raw message, so that `BODY[1.2]` and
/// `BODY[1.MIME]` are byte slices, not a re-parse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PartInfo {
    /// IMAP section path, e.g. `[1, 2]`; empty for the whole message.
    pub path: Vec<u32>,
    pub header_start: u32,
    pub body_start: u32,
    pub body_end: u32,
    /// For `message/rfc822` parts: the embedded message's header end, so that
    /// `BODY[2.HEADER]` works.
    pub is_message: bool,
}

/// Everything FETCH, SEARCH and STATUS need, computed once at delivery
/// (see [`crate::message::parse_meta`]) and stored beside the body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MessageMeta {
    /// RFC822.SIZE: octets of the stored message.
    pub size: u32,
    /// Octets of the header block including the blank line.
    pub header_size: u32,
    /// The IMAP ENVELOPE, already in response syntax.
    pub envelope: String,
    /// The IMAP BODYSTRUCTURE (with extension data), in response syntax.
    pub body_structure: String,
    /// The IMAP BODY (non-extensible form), in response syntax.
    pub body: String,
    pub parts: Vec<PartInfo>,
    /// Header summary for SEARCH and sorting (decoded, UTF-8).
    pub subject: String,
    pub from: String,
    pub to: String,
    pub cc: String,
    pub bcc: String,
    pub message_id: String,
    /// The Date: header, if parseable (SENTBEFORE/SENTON/SENTSINCE).
    pub sent_date: Option<DateTime<Utc>>,
    /// The Date: header's own zone, in minutes east of UTC. SENT* searches compare
    /// the date as the header writes it, in that zone (RFC 3501 §6.4.4), not
    /// shifted to UTC: a message sent at 23:30 -0800 was sent "on" that day.
    /// None in rows stored before it was kept (those compare in UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_offset_minutes: Option<i32>,
    /// The zone an APPEND gave the internal date in, in minutes east of UTC:
    /// INTERNALDATE is sent back as the client wrote it, and BEFORE/ON/SINCE
    /// compare its day there (RFC 3501 §6.4.4 "disregarding time and timezone").
    /// None for delivered mail (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_offset_minutes: Option<i32>,
}

impl MessageMeta {
    /// The internal date `utc` in the zone it was given in.
    pub fn internal_in_zone(&self, utc: &DateTime<Utc>) -> DateTime<chrono::FixedOffset> {
        let offset = self
            .internal_offset_minutes
            .and_then(|m| chrono::FixedOffset::east_opt(m.saturating_mul(60)))
            .unwrap_or(chrono::FixedOffset::east_opt(0).expect("UTC"));
        utc.with_timezone(&offset)
    }

    /// The calendar day of the Date: header, in the header's own zone.
    pub fn sent_day(&self) -> Option<chrono::NaiveDate> {
        let utc = self.sent_date?;
        let offset = chrono::Duration::minutes(i64::from(self.sent_offset_minutes.unwrap_or(0)));
        Some((utc + offset).date_naive())
    }
}

/// One message to deliver: stored once, linked into every mailbox of `targets`.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub raw: bytes::Bytes,
    pub meta: MessageMeta,
    pub internal_date: DateTime<Utc>,
    pub targets: Vec<i64>,
    /// Initial flags (APPEND may set them; SMTP delivers with none).
    pub flags: FlagSet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveredTo {
    pub mailbox_id: i64,
    pub uid: u32,
    /// The mailbox's modseq after the delivery.
    pub modseq: u64,
    /// Messages the change at `modseq` added to the mailbox: more than this
    /// delivery's own when group commit stored others with it. A session whose
    /// view stood at the modseq before, and that knows of all of them, needs no
    /// read of the changes.
    pub added: u32,
}

/// What an EXPUNGE removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Expunged {
    /// The UIDs removed, ascending.
    pub uids: Vec<u32>,
    /// The mailbox's modseq after the removal; 0 when nothing was removed (the
    /// mailbox did not change).
    pub modseq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagRow {
    pub uid: u32,
    pub flags: FlagSet,
    pub modseq: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MessageRow {
    pub uid: u32,
    pub message_id: i64,
    pub flags: FlagSet,
    pub modseq: u64,
    pub internal_date: DateTime<Utc>,
    pub meta: MessageMeta,
}

/// What SORT and THREAD read of a message: its link and the summary columns stored
/// beside its body, not its metadata document (decoding that for every message of
/// a large mailbox on every SORT would cost more than the sort).
#[derive(Debug, Clone, PartialEq)]
pub struct SortRow {
    pub uid: u32,
    /// The stored message's id (for reading its headers).
    pub message_id: i64,
    pub internal_date: DateTime<Utc>,
    pub size: u32,
    /// The Date: header (UTC), when it parsed.
    pub sent_date: Option<DateTime<Utc>>,
    /// Decoded header summaries, as [`MessageMeta`] has them.
    pub subject: String,
    pub from: String,
    pub to: String,
    pub cc: String,
    /// The Message-ID header.
    pub message_id_header: String,
}

impl SortRow {
    pub fn of(row: &MessageRow) -> SortRow {
        SortRow {
            uid: row.uid,
            message_id: row.message_id,
            internal_date: row.internal_date,
            size: row.meta.size,
            sent_date: row.meta.sent_date,
            subject: row.meta.subject.clone(),
            from: row.meta.from.clone(),
            to: row.meta.to.clone(),
            cc: row.meta.cc.clone(),
            message_id_header: row.meta.message_id.clone(),
        }
    }
}

/// Where one message of a mailbox is stored: a row of
/// the store's `message_links`.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageLink {
    pub mailbox_id: i64,
    pub uid: u32,
    pub message_id: i64,
    pub flags: FlagSet,
    pub internal_date: DateTime<Utc>,
}

/// What the store's `message_links` returns, all read in
/// one snapshot.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MessageLinks {
    /// `(mailbox id, highest modseq)` of each asked mailbox that exists. Equal to a
    /// session's own, it means nothing changed since that session's last sync, so
    /// the links' flags are the ones the session already announced.
    pub mailboxes: Vec<(i64, u64)>,
    /// The asked messages that exist, in no particular order.
    pub links: Vec<MessageLink>,
}

/// A stored message body: a row of
/// the store's `message_bodies`. Bodies never change
/// once stored, so they may be cached by id.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredBody {
    pub message_id: i64,
    /// Octets of the header block including the blank line ([`MessageMeta::header_size`]).
    pub header_size: u32,
    /// The raw RFC 5322 bytes as delivered (decompressed).
    pub body: bytes::Bytes,
}

/// One message of a POP3 maildrop listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaildropEntry {
    pub uid: u32,
    pub message_id: i64,
    /// Octets of the stored message.
    pub size: u32,
    /// INTERNALDATE of the link: what a shared body cache checks a message id
    /// against (see `view::bodies`).
    pub internal_date: DateTime<Utc>,
}

/// A mailbox's message list with every message's flags, read in one snapshot:
/// what a session keeps while the mailbox is selected, so flag searches and
/// FLAGS fetches are answered without a query.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MailboxIndex {
    /// The modseq this snapshot reflects: changes after it come from
    /// the store's `changes_since`.
    pub highest_modseq: u64,
    pub uid_next: u32,
    /// Ascending.
    pub uids: Vec<u32>,
    /// System flags, parallel to `uids`.
    pub flags: Vec<Flags>,
    /// Each message's modseq (its last flag change, or its arrival), parallel to
    /// `uids`: what CONDSTORE's FETCH MODSEQ, CHANGEDSINCE and SEARCH MODSEQ
    /// answer from.
    pub modseqs: Vec<u64>,
    /// Keywords of the messages that have any, by UID (ascending).
    pub keywords: Vec<(u32, Vec<String>)>,
}

/// What a conditional STORE (`UNCHANGEDSINCE`, RFC 7162 §3.1.3) did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConditionalStore {
    /// The rows changed, with their new modseq.
    pub changed: Vec<FlagRow>,
    /// The UIDs left alone because their modseq was above the one given,
    /// ascending.
    pub modified: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MailboxChanges {
    pub highest_modseq: u64,
    /// Rows (new or with changed flags) stamped after the asked modseq, by UID.
    pub changed: Vec<FlagRow>,
    /// UIDs expunged after the asked modseq, ascending.
    pub expunged: Vec<u32>,
    /// Set when the asked modseq is older than the tombstones still kept (they are
    /// pruned after a while): `expunged` may then miss some, and this is every UID
    /// in the mailbox now, ascending — whatever the caller knows and is not here
    /// was expunged.
    pub present: Option<Vec<u32>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    pub max: u32,
    pub idle: u32,
    pub in_use: u32,
}

#[derive(Debug, Clone)]
pub struct NewQueueItem {
    /// Envelope sender (may be empty for bounces).
    pub sender: String,
    pub recipients: Vec<String>,
    pub raw: bytes::Bytes,
    /// The submitting account, for accounting and DSNs.
    pub account_id: Option<i64>,
    pub not_before: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub dsn: DsnRequest,
}

/// What the sender asked of delivery status notifications with the SMTP DSN
/// extension (RFC 3461), kept with the message until every recipient is done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DsnRequest {
    /// `RET`: whether a failure report returns the whole message or only its
    /// header section; `None`: not asked (the header section is returned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<DsnRet>,
    /// `ENVID`: the sender's identifier of the transaction, decoded from xtext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envid: Option<String>,
    /// Recipients that came with NOTIFY or ORCPT; the others have the defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recipients: Vec<RecipientDsn>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DsnRet {
    #[serde(rename = "FULL")]
    Full,
    #[serde(rename = "HDRS")]
    Hdrs,
}

/// One recipient's `NOTIFY` and `ORCPT` (RFC 3461 §4.1, §4.2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecipientDsn {
    pub recipient: String,
    /// `None`: no NOTIFY, so failures and delays are reported (§4.1 leaves
    /// DELAY to the MTA). `Some` with nothing set: NOTIFY=NEVER.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<DsnNotify>,
    /// `ORCPT=rfc822;…`: the address as the original sender wrote it
    /// (xtext decoded); with another [`orcpt_type`](Self::orcpt_type), as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orcpt: Option<String>,
    /// The ORCPT's address type when it is not rfc822 (`utf-8`, RFC 6533; any
    /// type RFC 3461 §4.2 allows): passed on and reported as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orcpt_type: Option<String>,
}

impl RecipientDsn {
    /// The ORCPT as a report's `Original-Recipient` field holds it (RFC 3464
    /// §2.3.1): `address-type; address`.
    pub fn original_recipient(&self) -> Option<String> {
        let orcpt = self.orcpt.as_ref()?;
        Some(format!("{}; {orcpt}", self.orcpt_type.as_deref().unwrap_or("rfc822")))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DsnNotify {
    #[serde(default)]
    pub success: bool,
    #[serde(default)]
    pub failure: bool,
    #[serde(default)]
    pub delay: bool,
}

/// The events a DSN reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DsnEvent {
    Success,
    Failure,
    Delay,
}

impl DsnRequest {
    pub fn recipient(&self, address: &str) -> Option<&RecipientDsn> {
        self.recipients.iter().find(|r| r.recipient.eq_ignore_ascii_case(address))
    }

    /// Whether the sender wants to hear of `event` for `address`.
    pub fn wants(&self, address: &str, event: DsnEvent) -> bool {
        match self.recipient(address).and_then(|r| r.notify) {
            None => event != DsnEvent::Success,
            Some(n) => match event {
                DsnEvent::Success => n.success,
                DsnEvent::Failure => n.failure,
                DsnEvent::Delay => n.delay,
            },
        }
    }

    /// What a sender whose address may be forged still gets (RFC 3461 leaves
    /// it to the MTA): no reports of success or delay, and failure reports with
    /// the header section only, so that nobody can make this server mail a
    /// message, or a note about one, to a third party's address.
    pub fn limit_to_unverified_sender(&mut self) {
        self.ret = None;
        for r in &mut self.recipients {
            if let Some(n) = r.notify.as_mut() {
                n.success = false;
                n.delay = false;
            }
        }
    }

    /// What goes on with the recipients in `addresses` (a queue item split off
    /// from a transaction with more).
    pub fn only(&self, addresses: &[String]) -> DsnRequest {
        DsnRequest {
            ret: self.ret,
            envid: self.envid.clone(),
            recipients: self
                .recipients
                .iter()
                .filter(|r| addresses.iter().any(|a| a.eq_ignore_ascii_case(&r.recipient)))
                .cloned()
                .collect(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct QueueItem {
    pub id: i64,
    pub sender: String,
    pub recipients: Vec<String>,
    pub raw: bytes::Bytes,
    pub account_id: Option<i64>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The sender was already told the message is late.
    pub delay_notified: bool,
    pub dsn: DsnRequest,
}

/// What became of one recipient in one attempt.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecipientOutcome {
    pub recipient: String,
    pub status: RecipientStatus,
    /// The remote server's reply, or why there was none.
    pub reply: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecipientStatus {
    Sent,
    Deferred,
    Failed,
}

/// The end of one delivery attempt of a queue item, written by the worker that
/// claimed it.
#[derive(Debug, Clone)]
pub struct QueueAttempt {
    /// Recipients for the next attempt; empty: the item is done and removed.
    pub remaining: Vec<String>,
    /// Appended to the item's record.
    pub outcomes: Vec<RecipientOutcome>,
    pub last_error: Option<String>,
    /// When the next attempt is due (ignored when nothing remains).
    pub retry_at: DateTime<Utc>,
    pub delay_notified: bool,
}

/// A queue item as the `queue` admin commands show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueEntry {
    pub id: i64,
    pub sender: String,
    pub recipients: Vec<String>,
    pub size: u64,
    pub attempts: u32,
    pub next_attempt: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub last_error: Option<String>,
    /// The worker delivering it now, if its lease is live.
    pub locked_by: Option<String>,
    pub outcomes: Vec<RecipientOutcome>,
}

/// Queue depth and age, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    pub depth: u64,
    pub oldest: Option<DateTime<Utc>>,
}
