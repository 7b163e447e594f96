//! One complete command (from [`super::reader`]) → [`Request`].

use std::borrow::Cow;

use imap_codec::CommandCodec;
use imap_codec::decode::Decoder;
use imap_codec::imap_types::command::Command;
use imap_codec::imap_types::sequence::{SeqOrUid, Sequence, SequenceSet};

use mailcluster_model::{FlagSet, Flags};

/// STATUS data items (RFC 3501 §6.3.10; SIZE: RFC 8438; HIGHESTMODSEQ: RFC 7162;
/// DELETED and DELETED-STORAGE: RFC 9208).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusItem {
    Messages,
    Recent,
    UidNext,
    UidValidity,
    Unseen,
    Size,
    HighestModseq,
    Deleted,
    DeletedStorage,
    /// APPENDLIMIT (RFC 7889): the largest message APPEND accepts.
    AppendLimit,
    /// MAILBOXID (RFC 8474 §4.3).
    MailboxId,
}

impl StatusItem {
    /// Items `imap-codec` does not know: a STATUS naming one is parsed here.
    fn is_extension(self) -> bool {
        matches!(
            self,
            StatusItem::Size
                | StatusItem::HighestModseq
                | StatusItem::Deleted
                | StatusItem::DeletedStorage
                | StatusItem::AppendLimit
                | StatusItem::MailboxId
        )
    }
}

/// The parameters of `SELECT`/`EXAMINE mailbox (…)` (RFC 7162 §3.1.8, §3.2.5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectParams {
    pub condstore: bool,
    pub qresync: Option<Qresync>,
}

/// `QRESYNC (uidvalidity modseq [known-uids [(seqs uids)]])`. The sequence match
/// data is accepted and not used: expunge tombstones answer exactly without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qresync {
    pub uid_validity: u32,
    pub modseq: u64,
    pub known_uids: Option<SeqSet>,
}

/// What FETCH asks for beyond what `imap-codec` parses: CONDSTORE/QRESYNC's
/// item and modifiers (RFC 7162 §3.1.4, §3.2.6) and OBJECTID's items (RFC 8474
/// §5.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchExtension {
    /// The MODSEQ data item was asked for (CHANGEDSINCE implies it).
    pub item: bool,
    pub changed_since: Option<u64>,
    /// `VANISHED`: expunged UIDs of the set as `VANISHED (EARLIER)` first.
    pub vanished: bool,
    /// The EMAILID data item.
    pub email_id: bool,
    /// The THREADID data item.
    pub thread_id: bool,
    /// These items were the only ones: the `UID` standing in for them in the
    /// rewritten command is not part of the answer (UID FETCH sends UID anyway).
    pub only_extension: bool,
}

/// A FETCH item of the BINARY extension (RFC 3516 §4.2), read as the BODY item of
/// the same section (`BINARY.PEEK[1]<0.10>` as `BODY.PEEK[1]<0.10>`) with this
/// beside it: the section's content-transfer-encoding is removed before it is
/// sent or measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryItem {
    /// `BINARY[section]<partial>` or `BINARY.PEEK[…]`: the decoded octets.
    Content,
    /// `BINARY.SIZE[section]`: their count.
    Size,
}

/// A LIST with RFC 5258 options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListExtended {
    /// Selection SUBSCRIBED: subscribed names only (existing or not).
    pub subscribed: bool,
    /// Selection RECURSIVEMATCH: parents of matching subscribed names too.
    pub recursive: bool,
    /// Selection SPECIAL-USE (RFC 6154): special-use mailboxes only.
    pub special_use: bool,
    pub reference: Vec<u8>,
    pub patterns: Vec<Vec<u8>>,
    /// Return SUBSCRIBED: `\Subscribed` on subscribed names.
    pub return_subscribed: bool,
    /// Return STATUS (LIST-STATUS): a STATUS line after each selectable mailbox.
    pub return_status: Option<Vec<StatusItem>>,
}

/// What a search extension does with the matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchKind {
    ESearch(Vec<ReturnOption>),
    /// SORT, with `RETURN (…)` (ESORT, RFC 5267 §3) when given.
    Sort(Vec<SortKey>, Option<Vec<ReturnOption>>),
    Thread(ThreadAlgorithm),
}

/// THREAD algorithms (RFC 5256 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadAlgorithm {
    OrderedSubject,
    References,
}

/// One SORT criterion (RFC 5256 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    pub reverse: bool,
    pub kind: SortKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKind {
    Arrival,
    Cc,
    Date,
    From,
    Size,
    Subject,
    To,
    /// SORT=DISPLAY (RFC 5957): the first From / To address's display name,
    /// else its addr-spec.
    DisplayFrom,
    DisplayTo,
}

/// ESEARCH RETURN options (RFC 4731 §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnOption {
    Min,
    Max,
    All,
    Count,
    /// SEARCHRES (RFC 5182): keep the result as `$`.
    Save,
}

/// A parsed command.
#[derive(Debug)]
pub enum Request<'a> {
    /// Everything `imap-codec` parses.
    Codec(Command<'a>),
    Id,
    Namespace,
    /// `UID EXPUNGE set` (UIDPLUS).
    UidExpunge(SeqSet),
    /// `COMPRESS mechanism` (RFC 4978).
    Compress(String),
    /// The search extensions: `[UID] SEARCH RETURN (options) criteria` (ESEARCH,
    /// RFC 4731), `[UID] SORT (keys) charset criteria` and `[UID] THREAD algorithm
    /// charset criteria` (RFC 5256). `search` is the command rewritten as the plain
    /// SEARCH `imap-codec` parses, so the criteria have one grammar.
    Searching {
        uid: bool,
        kind: SearchKind,
        search: Vec<u8>,
    },
    /// SELECT/EXAMINE with CONDSTORE or QRESYNC parameters; `select` is the
    /// command without them.
    Select {
        read_only: bool,
        params: SelectParams,
        select: Vec<u8>,
    },
    /// FETCH with the MODSEQ item or modifiers, EMAILID or THREADID, or BINARY
    /// items; `fetch` is the command without the MODSEQ, EMAILID and THREADID
    /// parts (an item list left empty holds `UID`) and with each BINARY item as
    /// its BODY twin; `binary` marks those, one entry per item of `fetch`'s list.
    Fetch {
        ext: FetchExtension,
        binary: Vec<Option<BinaryItem>>,
        fetch: Vec<u8>,
    },
    /// `STORE set (UNCHANGEDSINCE n) …`; `store` is the command without the
    /// modifier.
    Store {
        unchanged_since: u64,
        store: Vec<u8>,
    },
    /// LIST with selection or return options or several patterns (LIST-EXTENDED,
    /// RFC 5258; LIST-STATUS, RFC 5819).
    ListExtended(ListExtended),
    /// STATUS asking for SIZE (RFC 8438): the items, and the command with SIZE
    /// replaced by MESSAGES for `imap-codec` to parse the mailbox name.
    Status {
        items: Vec<StatusItem>,
        status: Vec<u8>,
    },
    /// `CREATE mailbox (USE (attr …))` (RFC 6154 §3, CREATE-SPECIAL-USE): the
    /// attributes asked for, and the command without its parameters for
    /// `imap-codec` to parse the mailbox name.
    Create {
        uses: Vec<String>,
        create: Vec<u8>,
    },
    /// `GETQUOTA root` (RFC 9208 §4.1.1): the root's name as sent.
    GetQuota(Vec<u8>),
    /// `GETQUOTAROOT mailbox` (RFC 9208 §4.1.2): the mailbox name as sent.
    GetQuotaRoot(Vec<u8>),
    /// `SETQUOTA root (resource limit …)` (RFC 9208 §4.1.3).
    SetQuota,
    /// APPEND with one or more messages (MULTIAPPEND).
    Append {
        mailbox: Vec<u8>,
        messages: Vec<AppendMessage<'a>>,
    },
}

#[derive(Debug)]
pub struct AppendMessage<'a> {
    pub flags: FlagSet,
    /// The internal date asked for, in the zone the client wrote it in.
    pub date: Option<chrono::DateTime<chrono::FixedOffset>>,
    pub data: &'a [u8],
}

/// Why a command could not be parsed: `tag BAD <text>`.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub tag: String,
    pub text: &'static str,
}

/// A sequence (or UID) set; [`SeqSet::STAR`] stands for `*`. Wider than the
/// numbers themselves: 4294967295 is a number a client may send (`UID SEARCH
/// UID 4294967295`, `n:4294967295`), and it is not `*` (`n:*` takes the last
/// message even when n is past it; `n:4294967295` does not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSet(pub Vec<(u64, u64)>);

impl SeqSet {
    /// `*`.
    pub const STAR: u64 = u64::MAX;

    pub fn from_codec(set: &SequenceSet) -> SeqSet {
        let v = |s: &SeqOrUid| match s {
            SeqOrUid::Value(n) => u64::from(n.get()),
            SeqOrUid::Asterisk => Self::STAR,
        };
        SeqSet(
            set.0
                .as_ref()
                .iter()
                .map(|s| match s {
                    Sequence::Single(a) => (v(a), v(a)),
                    Sequence::Range(a, b) => (v(a), v(b)),
                })
                .collect(),
        )
    }

    /// Resolves `*` to `max` and orders each range (RFC 3501: `4:2` = `2:4`).
    pub fn ranges(&self, max: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        // Numbers are u32 (nz-number) and `*` becomes `max`: the casts are exact.
        let resolve = move |n: u64| if n == Self::STAR { max } else { n as u32 };
        self.0.iter().map(move |&(a, b)| {
            let (a, b) = (resolve(a), resolve(b));
            (a.min(b), a.max(b))
        })
    }

    pub fn contains(&self, n: u32, max: u32) -> bool {
        self.ranges(max).any(|(lo, hi)| lo <= n && n <= hi)
    }

    fn parse(s: &[u8]) -> Option<SeqSet> {
        let num = |p: &[u8]| -> Option<u64> {
            if p == b"*" {
                return Some(Self::STAR);
            }
            let n: u32 = std::str::from_utf8(p).ok()?.parse().ok()?;
            (n > 0 && p.iter().all(u8::is_ascii_digit)).then_some(u64::from(n))
        };
        let mut out = Vec::new();
        for item in s.split(|&b| b == b',') {
            let mut it = item.splitn(2, |&b| b == b':');
            let a = num(it.next()?)?;
            let b = match it.next() {
                Some(b) => num(b)?,
                None => a,
            };
            out.push((a, b));
        }
        (!out.is_empty()).then_some(SeqSet(out))
    }
}

/// Parses one complete command (CRLF included).
pub fn parse(cmd: &[u8]) -> Result<(String, Request<'_>), ParseError> {
    let tag = super::tag_of(cmd);
    let bad = |text| ParseError { tag: tag.clone(), text };
    if tag == "*" {
        return Err(bad("Missing or invalid tag"));
    }
    let mut tok = Tok { s: cmd, pos: tag.len() };
    if !tok.sp() {
        return Err(bad("Missing command"));
    }
    let name = tok.atom().to_ascii_uppercase();
    match name.as_slice() {
        b"ID" => return Ok((tag, Request::Id)),
        b"NAMESPACE" => {
            return tok.end().then_some((tag.clone(), Request::Namespace)).ok_or(bad("Junk after NAMESPACE"));
        }
        b"UID" if tok.sp() && tok.atom().eq_ignore_ascii_case(b"EXPUNGE") => {
            if !tok.sp() {
                return Err(bad("UID EXPUNGE needs a UID set"));
            }
            let set = SeqSet::parse(tok.atom()).ok_or(bad("Invalid UID set"))?;
            return tok
                .end()
                .then_some((tag.clone(), Request::UidExpunge(set)))
                .ok_or(bad("Junk after UID set"));
        }
        b"COMPRESS" => {
            if !tok.sp() {
                return Err(bad("COMPRESS needs a mechanism"));
            }
            let mechanism = String::from_utf8_lossy(tok.atom()).into_owned();
            return (!mechanism.is_empty() && tok.end())
                .then_some((tag.clone(), Request::Compress(mechanism)))
                .ok_or(bad("Invalid COMPRESS arguments"));
        }
        b"GETQUOTA" | b"GETQUOTAROOT" => {
            let arg = if tok.sp() { tok.astring() } else { None };
            return match arg {
                Some(arg) if tok.end() => Ok((
                    tag.clone(),
                    if name == b"GETQUOTA" { Request::GetQuota(arg) } else { Request::GetQuotaRoot(arg) },
                )),
                _ => Err(bad("Invalid quota arguments")),
            };
        }
        b"SETQUOTA" => {
            return parse_setquota(&mut tok)
                .then_some((tag.clone(), Request::SetQuota))
                .ok_or(bad("Invalid SETQUOTA"));
        }
        b"LIST" => {
            if let Some(request) = parse_list_extended(&mut tok) {
                return request
                    .map(|r| (tag.clone(), Request::ListExtended(r)))
                    .ok_or(bad("Invalid LIST arguments"));
            }
        }
        b"STATUS" => {
            if let Some(request) = parse_status_size(cmd, &tag, tok.pos) {
                return request.map(|r| (tag.clone(), r)).ok_or(bad("Invalid STATUS arguments"));
            }
        }
        b"SORT" | b"THREAD" | b"UID" if parse_sort_head(cmd, &tag, tag.len() + 1 + name.len()).is_some() => {
            let after_name = tag.len() + 1 + name.len();
            return parse_sort_head(cmd, &tag, after_name)
                .flatten()
                .map(|r| (tag.clone(), r))
                .ok_or(bad("Invalid SORT or THREAD arguments"));
        }
        b"SEARCH" | b"UID" => {
            // (The UID EXPUNGE guard above may have moved `tok`.)
            let after_name = tag.len() + 1 + name.len();
            if let Some(request) = parse_esearch(cmd, &tag, after_name) {
                return request.map(|r| (tag.clone(), r)).ok_or(bad("Invalid SEARCH RETURN options"));
            }
        }
        b"APPEND" => {
            return parse_append(&mut tok).map(|r| (tag.clone(), r)).ok_or(bad("Invalid APPEND arguments"));
        }
        b"CREATE" => {
            if let Some(request) = parse_create_params(cmd, tok.pos) {
                return request.map(|r| (tag.clone(), r)).ok_or(bad("Invalid CREATE parameters"));
            }
        }
        _ => {}
    }
    match name.as_slice() {
        b"SELECT" | b"EXAMINE" => {
            if let Some(request) = parse_select_params(cmd, &tag, name == b"EXAMINE") {
                return request.map(|r| (tag.clone(), r)).ok_or(bad("Invalid SELECT parameters"));
            }
        }
        b"FETCH" | b"UID"
            if [&b"MODSEQ"[..], b"CHANGEDSINCE", b"BINARY", b"EMAILID", b"THREADID"]
                .iter()
                .any(|k| contains_ci(cmd, k)) =>
        {
            if let Some(request) = parse_fetch_ext(cmd, &tag) {
                return request.map(|r| (tag.clone(), r)).ok_or(bad("Invalid FETCH modifiers"));
            }
        }
        _ => {}
    }
    if matches!(name.as_slice(), b"STORE" | b"UID")
        && let Some(request) = parse_store_unchanged_since(cmd, &tag)
    {
        return request.map(|r| (tag.clone(), r)).ok_or(bad("Invalid STORE modifiers"));
    }
    match CommandCodec::default().decode(cmd) {
        Ok((b"", command)) => Ok((tag, Request::Codec(command))),
        Ok(_) => Err(bad("Junk after command")),
        Err(_) => Err(bad("Unknown command or invalid arguments")),
    }
}

/// `LIST [(selection)] reference pattern-or-(patterns) [RETURN (options)]`:
/// `None` when it is a plain RFC 3501 LIST (`imap-codec` parses those),
/// `Some(None)` when malformed.
fn parse_list_extended(tok: &mut Tok<'_>) -> Option<Option<ListExtended>> {
    let start = tok.pos;
    if !tok.sp() {
        return None;
    }
    let mut list = ListExtended::default();
    let mut extended = false;
    if tok.peek() == Some(b'(') {
        extended = true;
        let Some(options) = paren_atoms(tok) else { return Some(None) };
        for o in options {
            match o.as_slice() {
                b"SUBSCRIBED" => list.subscribed = true,
                b"RECURSIVEMATCH" => list.recursive = true,
                b"SPECIAL-USE" => list.special_use = true,
                // Remote mailboxes: there are none here.
                b"REMOTE" => {}
                _ => return Some(None),
            }
        }
        // RECURSIVEMATCH alone would say nothing (RFC 5258 §3).
        if list.recursive && !list.subscribed || !tok.sp() {
            return Some(None);
        }
    }
    let reference = match tok.quoted() {
        Some(q) => q,
        None => tok.atom().to_vec(),
    };
    list.reference = reference;
    if !tok.sp() {
        return if extended { Some(None) } else { None };
    }
    if tok.peek() == Some(b'(') {
        extended = true;
        tok.pos += 1;
        loop {
            let Some(p) = list_pattern(tok) else { return Some(None) };
            list.patterns.push(p);
            match tok.peek() {
                Some(b')') => {
                    tok.pos += 1;
                    break;
                }
                Some(b' ') => tok.pos += 1,
                _ => return Some(None),
            }
        }
    } else {
        let Some(p) = list_pattern(tok) else { return if extended { Some(None) } else { None } };
        list.patterns.push(p);
    }
    let mut look = Tok { s: tok.s, pos: tok.pos };
    if look.sp() && look.atom().eq_ignore_ascii_case(b"RETURN") {
        extended = true;
        *tok = look;
        if !tok.sp() {
            return Some(None);
        }
        if return_options(tok, &mut list).is_none() {
            return Some(None);
        }
    }
    if !extended {
        tok.pos = start;
        return None;
    }
    tok.end().then_some(Some(list)).or(Some(None))
}

/// A list-mailbox: a quoted string or the characters an atom and `%`/`*` allow.
fn list_pattern(tok: &mut Tok<'_>) -> Option<Vec<u8>> {
    if let Some(q) = tok.quoted() {
        return Some(q);
    }
    let a = tok.atom();
    (!a.is_empty()).then(|| a.to_vec())
}

/// `(item item …)`, each item read by `item`.
fn paren_list<T>(tok: &mut Tok<'_>, mut item: impl FnMut(&mut Tok<'_>) -> Option<T>) -> Option<Vec<T>> {
    if tok.peek() != Some(b'(') {
        return None;
    }
    tok.pos += 1;
    let mut out = Vec::new();
    loop {
        if tok.peek() == Some(b')') {
            tok.pos += 1;
            return Some(out);
        }
        if !out.is_empty() && !tok.sp() {
            return None;
        }
        out.push(item(tok)?);
    }
}

/// `(A B C)`, upper-cased.
fn paren_atoms(tok: &mut Tok<'_>) -> Option<Vec<Vec<u8>>> {
    paren_list(tok, |t| Some(t.atom().to_ascii_uppercase()).filter(|a| !a.is_empty()))
}

/// LIST's `RETURN (SUBSCRIBED CHILDREN SPECIAL-USE STATUS (…))` into `list`.
fn return_options(tok: &mut Tok<'_>, list: &mut ListExtended) -> Option<()> {
    paren_list(tok, |t| {
        match t.atom().to_ascii_uppercase().as_slice() {
            b"SUBSCRIBED" => list.return_subscribed = true,
            // Sent anyway.
            b"CHILDREN" | b"SPECIAL-USE" => {}
            b"STATUS" if t.sp() => list.return_status = Some(status_items(t)?),
            _ => return None,
        }
        Some(())
    })
    .map(|_| ())
}

/// `(MESSAGES UNSEEN SIZE)`.
fn status_items(tok: &mut Tok<'_>) -> Option<Vec<StatusItem>> {
    let names = paren_atoms(tok)?;
    let items = names
        .iter()
        .map(|n| match n.as_slice() {
            b"MESSAGES" => Some(StatusItem::Messages),
            b"RECENT" => Some(StatusItem::Recent),
            b"UIDNEXT" => Some(StatusItem::UidNext),
            b"UIDVALIDITY" => Some(StatusItem::UidValidity),
            b"UNSEEN" => Some(StatusItem::Unseen),
            b"SIZE" => Some(StatusItem::Size),
            b"HIGHESTMODSEQ" => Some(StatusItem::HighestModseq),
            b"DELETED" => Some(StatusItem::Deleted),
            b"DELETED-STORAGE" => Some(StatusItem::DeletedStorage),
            b"APPENDLIMIT" => Some(StatusItem::AppendLimit),
            b"MAILBOXID" => Some(StatusItem::MailboxId),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    (!items.is_empty()).then_some(items)
}

/// `STATUS mailbox (… SIZE …)`, or with another item `imap-codec` does not know
/// (HIGHESTMODSEQ, MAILBOXID, …): `None` without one
/// (`imap-codec` parses it).
fn parse_status_size<'a>(cmd: &[u8], tag: &str, after_name: usize) -> Option<Option<Request<'a>>> {
    let open = cmd.iter().rposition(|&b| b == b'(')?;
    let mut tok = Tok { s: cmd, pos: open };
    let items = status_items(&mut tok).filter(|i| i.iter().any(|i| i.is_extension()))?;
    if !tok.end() || after_name >= open {
        return Some(None);
    }
    let mut status = cmd[..tag.len() + 1].to_vec();
    status.extend_from_slice(b"STATUS");
    status.extend_from_slice(&cmd[after_name..open]);
    status.extend_from_slice(b"(MESSAGES)\r\n");
    Some(Some(Request::Status { items, status }))
}

/// ` mailbox (`: where the mailbox name ends, with `tok` at the parenthesis of
/// the parameters that follow it; `None` when no parameter list follows.
fn mailbox_then_params(tok: &mut Tok<'_>) -> Option<usize> {
    if !tok.sp() {
        return None;
    }
    tok.astring()?;
    let mailbox_end = tok.pos;
    (tok.sp() && tok.peek() == Some(b'(')).then_some(mailbox_end)
}

/// CREATE with parameters (RFC 4466 §2.2); USE (RFC 6154 §3) is the one known.
/// `None`: no parameters (plain CREATE); `Some(None)`: malformed or unknown.
fn parse_create_params<'a>(cmd: &[u8], after_name: usize) -> Option<Option<Request<'a>>> {
    let mut tok = Tok { s: cmd, pos: after_name };
    let mailbox_end = mailbox_then_params(&mut tok)?;
    let params = paren_list(&mut tok, |t| {
        if !t.atom().eq_ignore_ascii_case(b"USE") || !t.sp() {
            return None;
        }
        paren_list(t, |t| {
            (t.peek() == Some(b'\\')).then_some(())?;
            t.pos += 1;
            let name = std::str::from_utf8(t.atom()).ok().filter(|n| !n.is_empty())?;
            Some(format!("\\{name}"))
        })
    });
    let Some(params) = params.filter(|_| tok.end()) else { return Some(None) };
    let mut create = cmd[..mailbox_end].to_vec();
    create.extend_from_slice(b"\r\n");
    Some(Some(Request::Create { uses: params.into_iter().flatten().collect(), create }))
}

/// `SP root SP (resource limit …)`: the resources are atoms and the limits
/// numbers (RFC 9208 §4.1.3), the list may be empty.
fn parse_setquota(tok: &mut Tok<'_>) -> bool {
    let mut syntax = || -> Option<()> {
        (tok.sp() && tok.astring().is_some() && tok.sp()).then_some(())?;
        paren_list(tok, |t| {
            let resource = t.atom();
            let limit = if t.sp() { t.atom() } else { b"" };
            (!resource.is_empty() && !limit.is_empty() && limit.iter().all(u8::is_ascii_digit)).then_some(())
        })?;
        Some(())
    };
    syntax().is_some() && tok.end()
}

/// `[UID] SORT (keys) charset criteria` and `[UID] THREAD algorithm charset
/// criteria`: `None` when the command is neither, `Some(None)` when its arguments
/// are malformed.
fn parse_sort_head<'a>(cmd: &[u8], tag: &str, after_name: usize) -> Option<Option<Request<'a>>> {
    let (uid, verb, mut tok) = uid_verb(cmd, tag)?;
    debug_assert!(uid || tok.pos == after_name);
    enum Head {
        Sort(Vec<SortKey>),
        Thread(ThreadAlgorithm),
    }
    // ESORT (RFC 5267 §3.2): `SORT RETURN (options) (keys) …`; SAVE is not one
    // of its options.
    let mut returns = None;
    if verb == b"SORT" {
        let mut look = Tok { s: cmd, pos: tok.pos };
        if look.sp() && look.atom().eq_ignore_ascii_case(b"RETURN") {
            match return_option_list(&mut look) {
                Some(options) if !options.contains(&ReturnOption::Save) => returns = Some(options),
                _ => return Some(None),
            }
            tok = look;
        }
    }
    let head = match verb.as_slice() {
        b"SORT" => sort_keys(&mut tok).map(Head::Sort),
        b"THREAD" => {
            if !tok.sp() {
                return Some(None);
            }
            match tok.atom().to_ascii_uppercase().as_slice() {
                b"ORDEREDSUBJECT" => Some(Head::Thread(ThreadAlgorithm::OrderedSubject)),
                b"REFERENCES" => Some(Head::Thread(ThreadAlgorithm::References)),
                _ => None,
            }
        }
        _ => return None,
    };
    let Some(head) = head else { return Some(None) };
    if !tok.sp() {
        return Some(None);
    }
    let charset = tok.atom();
    if charset.is_empty() || !tok.sp() {
        return Some(None);
    }
    let mut search = cmd[..tag.len() + 1].to_vec();
    if uid {
        search.extend_from_slice(b"UID ");
    }
    search.extend_from_slice(b"SEARCH CHARSET ");
    search.extend_from_slice(charset);
    search.push(b' ');
    search.extend_from_slice(&cmd[tok.pos..]);
    let kind = match head {
        Head::Sort(keys) => SearchKind::Sort(keys, returns),
        Head::Thread(algorithm) => SearchKind::Thread(algorithm),
    };
    Some(Some(Request::Searching { uid, kind, search }))
}

/// ` (REVERSE SUBJECT DATE)`: the SORT keys.
fn sort_keys(tok: &mut Tok<'_>) -> Option<Vec<SortKey>> {
    if !tok.sp() || tok.peek() != Some(b'(') {
        return None;
    }
    tok.pos += 1;
    let mut keys = Vec::new();
    let mut reverse = false;
    loop {
        let kind = match tok.atom().to_ascii_uppercase().as_slice() {
            b"REVERSE" if !reverse => {
                reverse = true;
                if !tok.sp() {
                    return None;
                }
                continue;
            }
            b"ARRIVAL" => SortKind::Arrival,
            b"CC" => SortKind::Cc,
            b"DATE" => SortKind::Date,
            b"FROM" => SortKind::From,
            b"SIZE" => SortKind::Size,
            b"SUBJECT" => SortKind::Subject,
            b"TO" => SortKind::To,
            b"DISPLAYFROM" => SortKind::DisplayFrom,
            b"DISPLAYTO" => SortKind::DisplayTo,
            _ => return None,
        };
        keys.push(SortKey { reverse, kind });
        reverse = false;
        match tok.peek() {
            Some(b')') => {
                tok.pos += 1;
                return Some(keys);
            }
            Some(b' ') => tok.pos += 1,
            _ => return None,
        }
    }
}

/// `[UID] SEARCH RETURN (…) …`: `None` when there is no RETURN clause (a plain
/// SEARCH), `Some(None)` when the clause is malformed. `after_name` is the position
/// after the command name (`SEARCH`, or `UID`).
fn parse_esearch<'a>(cmd: &[u8], tag: &str, after_name: usize) -> Option<Option<Request<'a>>> {
    let mut tok = Tok { s: cmd, pos: after_name };
    let uid = cmd[tag.len() + 1..after_name].eq_ignore_ascii_case(b"UID");
    let name_end = if uid {
        if !tok.sp() || !tok.atom().eq_ignore_ascii_case(b"SEARCH") {
            return None;
        }
        tok.pos
    } else {
        after_name
    };
    let mut look = Tok { s: cmd, pos: name_end };
    if !look.sp() || !look.atom().eq_ignore_ascii_case(b"RETURN") {
        return None;
    }
    let Some(options) = return_option_list(&mut look) else { return Some(None) };
    if !look.sp() {
        return Some(None);
    }
    // The same command without `RETURN (…)`: the criteria parse as usual.
    let mut search = cmd[..name_end].to_vec();
    search.push(b' ');
    search.extend_from_slice(&cmd[look.pos..]);
    Some(Some(Request::Searching { uid, kind: SearchKind::ESearch(options), search }))
}

/// ` (MIN MAX …)` after RETURN (RFC 4731 §3.1), duplicates dropped; the cursor
/// ends after the closing parenthesis.
fn return_option_list(look: &mut Tok<'_>) -> Option<Vec<ReturnOption>> {
    if !look.sp() || look.peek() != Some(b'(') {
        return None;
    }
    look.pos += 1;
    let mut options = Vec::new();
    loop {
        if look.peek() == Some(b')') {
            look.pos += 1;
            break;
        }
        if !options.is_empty() && !look.sp() {
            return None;
        }
        let option = match look.atom().to_ascii_uppercase().as_slice() {
            b"MIN" => ReturnOption::Min,
            b"MAX" => ReturnOption::Max,
            b"ALL" => ReturnOption::All,
            b"COUNT" => ReturnOption::Count,
            b"SAVE" => ReturnOption::Save,
            _ => return None,
        };
        if !options.contains(&option) {
            options.push(option);
        }
    }
    Some(options)
}

/// ASCII case-insensitive substring test (the fast check before the CONDSTORE
/// rewrites, which most commands skip).
fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

/// Parses `n` (a mod-sequence value, RFC 7162: 1 to 2^63-1; `zero` allows 0).
fn modseq_value(tok: &mut Tok<'_>, zero: bool) -> Option<u64> {
    let a = tok.atom();
    if a.is_empty() || !a.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(a).ok()?.parse().ok()?;
    (n <= i64::MAX as u64 && (zero || n > 0)).then_some(n)
}

/// `SELECT mailbox (CONDSTORE)` / `(QRESYNC (…))`: `None` without parameters
/// (`imap-codec` parses it), `Some(None)` when they are malformed.
fn parse_select_params<'a>(cmd: &[u8], tag: &str, read_only: bool) -> Option<Option<Request<'a>>> {
    let mut tok = Tok { s: cmd, pos: tag.len() + 1 };
    tok.atom();
    let mailbox_end = mailbox_then_params(&mut tok)?;
    let mut params = SelectParams::default();
    let parsed = paren_list(&mut tok, |t| {
        match t.atom().to_ascii_uppercase().as_slice() {
            b"CONDSTORE" if !params.condstore => params.condstore = true,
            b"QRESYNC" if params.qresync.is_none() && t.sp() && t.peek() == Some(b'(') => {
                t.pos += 1;
                let uid_validity = u32::try_from(modseq_value(t, false)?).ok()?;
                if !t.sp() {
                    return None;
                }
                let modseq = modseq_value(t, false)?;
                let mut known_uids = None;
                if t.sp() {
                    if t.peek() != Some(b'(') {
                        known_uids = Some(SeqSet::parse(t.atom())?);
                        t.sp();
                    }
                    // (known-sequence-set known-uid-set): checked, not used.
                    if t.peek() == Some(b'(') {
                        t.pos += 1;
                        SeqSet::parse(t.atom())?;
                        if !t.sp() {
                            return None;
                        }
                        SeqSet::parse(t.atom())?;
                        (t.peek() == Some(b')')).then_some(())?;
                        t.pos += 1;
                    }
                }
                (t.peek() == Some(b')')).then_some(())?;
                t.pos += 1;
                params.qresync = Some(Qresync { uid_validity, modseq, known_uids });
            }
            _ => return None,
        }
        Some(())
    });
    if parsed.is_none_or(|p| p.is_empty()) || !tok.end() {
        return Some(None);
    }
    let mut select = cmd[..mailbox_end].to_vec();
    select.extend_from_slice(b"\r\n");
    Some(Some(Request::Select { read_only, params, select }))
}

/// Where the quoted string opening at `open` ends (its closing quote, or the end
/// of `s`), escapes skipped.
fn closing_quote(s: &[u8], open: usize) -> usize {
    let mut pos = open + 1;
    while pos < s.len() && s[pos] != b'"' {
        pos += if s[pos] == b'\\' { 2 } else { 1 };
    }
    pos.min(s.len())
}

/// The end of a FETCH item (or macro) starting at `pos`: brackets and
/// parentheses nest (`BODY[HEADER.FIELDS (A B)]`), quoted strings are skipped.
fn item_end(s: &[u8], mut pos: usize) -> usize {
    let mut depth = 0i32;
    while pos < s.len() {
        match s[pos] {
            b'"' => pos = closing_quote(s, pos),
            b'[' | b'(' => depth += 1,
            b']' | b')' if depth > 0 => depth -= 1,
            b' ' | b'\r' | b'\n' | b')' if depth == 0 => return pos,
            _ => {}
        }
        pos += 1;
    }
    // An unterminated quoted string runs to the end, not past it.
    pos.min(s.len())
}

/// `[UID] VERB set`: whether it is a UID command, and a cursor right after the
/// set. `None` for another verb.
fn after_set<'a>(cmd: &'a [u8], tag: &str, verb: &[u8]) -> Option<(bool, Tok<'a>)> {
    let (uid, word, mut tok) = uid_verb(cmd, tag)?;
    if word != verb || !tok.sp() {
        return None;
    }
    tok.atom();
    Some((uid, tok))
}

/// `[UID] VERB`: whether it is a UID command, the verb upper-cased, and a cursor
/// right after it. `None` for a lone `UID`.
fn uid_verb<'a>(cmd: &'a [u8], tag: &str) -> Option<(bool, Vec<u8>, Tok<'a>)> {
    let mut tok = Tok { s: cmd, pos: tag.len() + 1 };
    let mut verb = tok.atom().to_ascii_uppercase();
    let uid = verb == b"UID";
    if uid {
        if !tok.sp() {
            return None;
        }
        verb = tok.atom().to_ascii_uppercase();
    }
    Some((uid, verb, tok))
}

/// `BINARY[section]<partial>`, `BINARY.PEEK[…]<…>` or `BINARY.SIZE[section]` as
/// the BODY item `imap-codec` parses: `None` for another item, `Some(None)` when
/// malformed. The section may be any BODY section, as Dovecot accepts (RFC 3516
/// allows part numbers only); only a part's own body is decoded.
fn binary_as_body(item: &[u8]) -> Option<Option<(BinaryItem, Vec<u8>)>> {
    let upper = item.to_ascii_uppercase();
    let (kind, body, rest) = if let Some(rest) = upper.strip_prefix(b"BINARY.PEEK") {
        (BinaryItem::Content, &b"BODY.PEEK"[..], rest)
    } else if let Some(rest) = upper.strip_prefix(b"BINARY.SIZE") {
        (BinaryItem::Size, &b"BODY.PEEK"[..], rest)
    } else if let Some(rest) = upper.strip_prefix(b"BINARY") {
        (BinaryItem::Content, &b"BODY"[..], rest)
    } else {
        return None;
    };
    if !rest.starts_with(b"[") {
        return Some(None);
    }
    // The original bytes from the bracket on (header field names keep their case).
    let tail = &item[item.len() - rest.len()..];
    if kind == BinaryItem::Size && tail.ends_with(b">") {
        return Some(None);
    }
    // `<offset>` alone, as Dovecot takes it: from the offset to the end.
    if tail.ends_with(b">")
        && let Some(open) = tail.iter().rposition(|&b| b == b'<')
        && !tail[open..].contains(&b'.')
    {
        let offset = &tail[open + 1..tail.len() - 1];
        if offset.is_empty() || !offset.iter().all(u8::is_ascii_digit) {
            return Some(None);
        }
        return Some(Some((kind, [body, &tail[..open + 1], offset, b".4294967295>"].concat())));
    }
    Some(Some((kind, [body, tail].concat())))
}

/// `[UID] FETCH set items [(CHANGEDSINCE n [VANISHED])]` with the MODSEQ,
/// EMAILID or THREADID item, modifiers or BINARY items: `None` when it has none
/// of them, `Some(None)` when malformed.
fn parse_fetch_ext<'a>(cmd: &[u8], tag: &str) -> Option<Option<Request<'a>>> {
    let (uid, mut tok) = after_set(cmd, tag, b"FETCH")?;
    let set_end = tok.pos;
    if !tok.sp() {
        return None;
    }
    // The items: kept, except MODSEQ, EMAILID and THREADID; BINARY ones as
    // their BODY twins.
    let mut ext = FetchExtension::default();
    let mut items: Vec<Cow<'_, [u8]>> = Vec::new();
    let mut binary: Vec<Option<BinaryItem>> = Vec::new();
    let list = tok.peek() == Some(b'(');
    let mut p = tok.pos + usize::from(list);
    loop {
        let end = item_end(cmd, p);
        if end == p {
            return Some(None);
        }
        let item = &cmd[p..end];
        if item.eq_ignore_ascii_case(b"MODSEQ") {
            ext.item = true;
        } else if item.eq_ignore_ascii_case(b"EMAILID") {
            ext.email_id = true;
        } else if item.eq_ignore_ascii_case(b"THREADID") {
            ext.thread_id = true;
        } else {
            match binary_as_body(item) {
                None => {
                    items.push(Cow::Borrowed(item));
                    binary.push(None);
                }
                Some(Some((kind, body))) => {
                    items.push(Cow::Owned(body));
                    binary.push(Some(kind));
                }
                Some(None) => return Some(None),
            }
        }
        p = end;
        match cmd.get(p) {
            Some(b' ') if list => p += 1,
            Some(b')') if list => {
                p += 1;
                break;
            }
            _ if !list => break,
            _ => return Some(None),
        }
    }
    let mut tok = Tok { s: cmd, pos: p };
    if tok.sp() {
        let parsed = paren_list(&mut tok, |t| {
            match t.atom().to_ascii_uppercase().as_slice() {
                b"CHANGEDSINCE" if ext.changed_since.is_none() && t.sp() => {
                    ext.changed_since = Some(modseq_value(t, true)?)
                }
                b"VANISHED" if !ext.vanished => ext.vanished = true,
                _ => return None,
            }
            Some(())
        });
        if parsed.is_none_or(|p| p.is_empty()) {
            return Some(None);
        }
    }
    if !tok.end() {
        return Some(None);
    }
    if !ext.item
        && ext.changed_since.is_none()
        && !ext.vanished
        && !ext.email_id
        && !ext.thread_id
        && binary.iter().all(Option::is_none)
    {
        return None;
    }
    // VANISHED: UID FETCH with CHANGEDSINCE only (RFC 7162 §3.2.6).
    if ext.vanished && (!uid || ext.changed_since.is_none()) {
        return Some(None);
    }
    ext.item |= ext.changed_since.is_some();
    let mut fetch = cmd[..set_end].to_vec();
    fetch.push(b' ');
    if items.is_empty() {
        ext.only_extension = true;
        fetch.extend_from_slice(b"UID");
    } else {
        fetch.push(b'(');
        fetch.extend_from_slice(&items.join(&b' '));
        fetch.push(b')');
    }
    fetch.extend_from_slice(b"\r\n");
    Some(Some(Request::Fetch { ext, binary, fetch }))
}

/// `[UID] STORE set (UNCHANGEDSINCE n) …`: `None` without modifiers,
/// `Some(None)` when they are malformed.
fn parse_store_unchanged_since<'a>(cmd: &[u8], tag: &str) -> Option<Option<Request<'a>>> {
    let (_, mut tok) = after_set(cmd, tag, b"STORE")?;
    let set_end = tok.pos;
    if !tok.sp() || tok.peek() != Some(b'(') {
        return None;
    }
    let mut unchanged_since = None;
    let parsed = paren_list(&mut tok, |t| {
        match t.atom().to_ascii_uppercase().as_slice() {
            b"UNCHANGEDSINCE" if unchanged_since.is_none() && t.sp() => {
                unchanged_since = Some(modseq_value(t, true)?)
            }
            _ => return None,
        }
        Some(())
    });
    let (Some(_), Some(unchanged_since)) = (parsed, unchanged_since) else { return Some(None) };
    if tok.peek() != Some(b' ') {
        return Some(None);
    }
    let mut store = cmd[..set_end].to_vec();
    store.extend_from_slice(&cmd[tok.pos..]);
    Some(Some(Request::Store { unchanged_since, store }))
}

/// Every `MODSEQ [entry-name entry-type] n` search criterion (RFC 7162 §3.1.5),
/// and every `YOUNGER n` / `OLDER n` (RFC 5032), of a `[UID] SEARCH`, `SORT` or
/// `THREAD` command, at any depth (`OR NOT MODSEQ n LARGER 5`): the byte range
/// of each and its value. The session replaces each with the UIDs it matches
/// (from every message's modseq, or its internal date), so the criteria keep
/// one grammar. One modseq is kept per message, so an entry (a flag's own
/// modseq) is accepted and answered with the message's. Empty for other
/// commands, and when a key is malformed (the command then fails to parse).
pub fn rewritten_criteria(cmd: &[u8]) -> Vec<(std::ops::Range<usize>, Rewritten)> {
    let mut out = Vec::new();
    // Every command passes through here: the verb first, so an APPEND's literal is
    // never scanned.
    let tag = super::tag_of(cmd);
    let Some((_, verb, _)) = uid_verb(cmd, &tag) else { return out };
    if !matches!(verb.as_slice(), b"SEARCH" | b"SORT" | b"THREAD")
        || ![&b"MODSEQ"[..], b"YOUNGER", b"OLDER", b"EMAILID", b"THREADID"]
            .iter()
            .any(|k| contains_ci(cmd, k))
    {
        return out;
    }
    let mut i = tag.len() + 1;
    // Tokens still to come that are arguments of the key before them, so that
    // `SUBJECT OLDER 5` searches for "OLDER" and is not rewritten.
    let mut args = 0usize;
    while i < cmd.len() {
        match cmd[i] {
            b' ' | b'(' | b')' => i += 1,
            b'\r' | b'\n' => break,
            b'"' => {
                i = closing_quote(cmd, i) + 1;
                args = args.saturating_sub(1);
            }
            b'{' => {
                let mut t = Tok { s: cmd, pos: i };
                if t.literal().is_none() {
                    return Vec::new();
                }
                i = t.pos;
                args = args.saturating_sub(1);
            }
            _ => {
                let end = cmd[i..]
                    .iter()
                    .position(|b| matches!(b, b' ' | b'(' | b')' | b'\r' | b'\n'))
                    .map_or(cmd.len(), |p| i + p);
                let word = &cmd[i..end];
                if args > 0 {
                    args -= 1;
                } else if word.eq_ignore_ascii_case(b"MODSEQ") && cmd.get(end) == Some(&b' ') {
                    let mut t = Tok { s: cmd, pos: end + 1 };
                    if t.peek() == Some(b'"') {
                        if t.quoted().is_none() || !t.sp() {
                            return Vec::new();
                        }
                        let kind = t.atom().to_ascii_uppercase();
                        if !matches!(kind.as_slice(), b"PRIV" | b"SHARED" | b"ALL") || !t.sp() {
                            return Vec::new();
                        }
                    }
                    let Some(n) = modseq_value(&mut t, true) else { return Vec::new() };
                    out.push((i..t.pos, Rewritten::Modseq(n)));
                    i = t.pos;
                    continue;
                } else if let Some((len, younger)) = within_key(&cmd[i..]) {
                    // WITHIN (RFC 5032): `YOUNGER n` / `OLDER n`, n seconds.
                    let mut t = Tok { s: cmd, pos: i + len };
                    let digits = t.atom();
                    let Some(n) = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|d| d.parse::<u32>().ok())
                        .filter(|&n| n > 0)
                    else {
                        return Vec::new();
                    };
                    let key = if younger { Rewritten::Younger(n) } else { Rewritten::Older(n) };
                    out.push((i..t.pos, key));
                    i = t.pos;
                    continue;
                } else if (word.eq_ignore_ascii_case(b"EMAILID") || word.eq_ignore_ascii_case(b"THREADID"))
                    && cmd.get(end) == Some(&b' ')
                {
                    // OBJECTID (RFC 8474 §6): `EMAILID objectid`, `THREADID objectid`;
                    // quoted too, as clients that send every argument as a string do.
                    let mut t = Tok { s: cmd, pos: end + 1 };
                    let Some(id) = t.astring().filter(|id| is_object_id(id)) else { return Vec::new() };
                    let key = if word.eq_ignore_ascii_case(b"EMAILID") {
                        Rewritten::EmailId(super::encode::email_id_value(&id))
                    } else {
                        Rewritten::ThreadId
                    };
                    out.push((i..t.pos, key));
                    i = t.pos;
                    continue;
                } else {
                    args = search_key_arguments(word);
                }
                i = end;
            }
        }
    }
    out
}

/// How many arguments follow a search key (RFC 3501 §6.4.4, RFC 5032, RFC
/// 7162), and the SEARCH, SORT and THREAD words that take one (CHARSET).
fn search_key_arguments(word: &[u8]) -> usize {
    const ONE: [&[u8]; 19] = [
        b"BCC",
        b"BEFORE",
        b"BODY",
        b"CC",
        b"FROM",
        b"KEYWORD",
        b"LARGER",
        b"ON",
        b"SENTBEFORE",
        b"SENTON",
        b"SENTSINCE",
        b"SINCE",
        b"SMALLER",
        b"SUBJECT",
        b"TEXT",
        b"TO",
        b"UID",
        b"UNKEYWORD",
        b"CHARSET",
    ];
    if word.eq_ignore_ascii_case(b"HEADER") {
        2
    } else if ONE.iter().any(|k| word.eq_ignore_ascii_case(k)) {
        1
    } else {
        0
    }
}

/// How deep `imap-codec` lets search keys nest: its parser stops at nine levels
/// (a key inside `OR`, `NOT` or parentheses is one level deeper).
const CODEC_SEARCH_DEPTH: usize = 9;
/// How deep [`shallow_or_chains`] follows keys (its own recursion's bound).
const MAX_SEARCH_DEPTH: usize = 256;

/// A `[UID] SEARCH`, `SORT` or `THREAD` whose criteria nest deeper than
/// `imap-codec` parses, rewritten so that they do not: every chain of ORs of
/// three or more alternatives becomes `NOT (NOT a NOT b NOT c …)`, the same
/// messages at constant depth. Clients write "any of these n" as n − 1 nested
/// ORs (`OR OR OR FROM a FROM b FROM c FROM d`, or a list of Message-IDs), so a
/// tenth alternative would otherwise get BAD. `None` when nothing needs it
/// (the command is parsed as it came) or it cannot be read as search keys.
pub fn shallow_or_chains(cmd: &[u8]) -> Option<Vec<u8>> {
    let tag = super::tag_of(cmd);
    let (_, verb, _) = uid_verb(cmd, &tag)?;
    if !matches!(verb.as_slice(), b"SEARCH" | b"SORT" | b"THREAD") || !contains_ci(cmd, b"OR ") {
        return None;
    }
    // The whole command after the tag as keys: the verb, RETURN options, sort
    // criteria and charset read as keys too and are written back as they came.
    let mut tok = Tok { s: cmd, pos: tag.len() + 1 };
    let mut keys = Vec::new();
    loop {
        keys.push(search_key(&mut tok, 1)?);
        if !tok.sp() {
            break;
        }
    }
    if !tok.end() || keys.iter().map(SearchNode::depth).max()? < CODEC_SEARCH_DEPTH {
        return None;
    }
    let mut out = cmd[..tag.len() + 1].to_vec();
    for (n, key) in keys.iter().enumerate() {
        if n > 0 {
            out.push(b' ');
        }
        key.write(cmd, &mut out);
    }
    out.extend_from_slice(b"\r\n");
    Some(out)
}

/// A search key as it stands in a command: byte ranges of the command.
enum SearchNode {
    /// A key with its arguments, or any other token, kept as it is.
    Leaf(std::ops::Range<usize>),
    Not(Box<SearchNode>),
    Or(Box<SearchNode>, Box<SearchNode>),
    Group(Vec<SearchNode>),
}

impl SearchNode {
    fn depth(&self) -> usize {
        match self {
            SearchNode::Leaf(_) => 1,
            SearchNode::Not(k) => 1 + k.depth(),
            SearchNode::Or(a, b) => 1 + a.depth().max(b.depth()),
            SearchNode::Group(keys) => 1 + keys.iter().map(SearchNode::depth).max().unwrap_or(0),
        }
    }

    /// The alternatives of an OR chain, however it nests (`OR OR a b c`,
    /// `OR a (OR b c)`).
    fn alternatives<'n>(&'n self, out: &mut Vec<&'n SearchNode>) {
        match self {
            SearchNode::Or(a, b) => {
                a.alternatives(out);
                b.alternatives(out);
            }
            SearchNode::Group(keys) if matches!(keys.as_slice(), [SearchNode::Or(..)]) => {
                keys[0].alternatives(out)
            }
            other => out.push(other),
        }
    }

    fn write(&self, cmd: &[u8], out: &mut Vec<u8>) {
        match self {
            SearchNode::Leaf(range) => out.extend_from_slice(&cmd[range.clone()]),
            SearchNode::Not(k) => {
                out.extend_from_slice(b"NOT ");
                k.write(cmd, out);
            }
            SearchNode::Group(keys) => {
                out.push(b'(');
                for (n, k) in keys.iter().enumerate() {
                    if n > 0 {
                        out.push(b' ');
                    }
                    k.write(cmd, out);
                }
                out.push(b')');
            }
            SearchNode::Or(a, b) => {
                let mut alternatives = Vec::new();
                self.alternatives(&mut alternatives);
                if alternatives.len() == 2 {
                    out.extend_from_slice(b"OR ");
                    a.write(cmd, out);
                    out.push(b' ');
                    b.write(cmd, out);
                    return;
                }
                // De Morgan: none of them fails to match.
                out.extend_from_slice(b"NOT (");
                for (n, k) in alternatives.iter().enumerate() {
                    if n > 0 {
                        out.push(b' ');
                    }
                    out.extend_from_slice(b"NOT ");
                    k.write(cmd, out);
                }
                out.push(b')');
            }
        }
    }
}

/// One search key (RFC 3501 §6.4.4 and the extensions here) at `tok`.
fn search_key(tok: &mut Tok<'_>, depth: usize) -> Option<SearchNode> {
    if depth > MAX_SEARCH_DEPTH {
        return None;
    }
    let start = tok.pos;
    if tok.peek()? == b'(' {
        tok.pos += 1;
        let mut keys = Vec::new();
        loop {
            keys.push(search_key(tok, depth + 1)?);
            if tok.peek() == Some(b')') {
                tok.pos += 1;
                return Some(SearchNode::Group(keys));
            }
            if !tok.sp() {
                return None;
            }
        }
    }
    let word = search_token(tok)?;
    let upper = word.to_ascii_uppercase();
    match upper.as_slice() {
        b"OR" => {
            let a = tok.sp().then(|| search_key(tok, depth + 1))??;
            let b = tok.sp().then(|| search_key(tok, depth + 1))??;
            return Some(SearchNode::Or(Box::new(a), Box::new(b)));
        }
        b"NOT" => {
            let k = tok.sp().then(|| search_key(tok, depth + 1))??;
            return Some(SearchNode::Not(Box::new(k)));
        }
        _ => {}
    }
    let arguments = match upper.as_slice() {
        // `MODSEQ ["entry-name" entry-type] n` (RFC 7162 §3.1.5).
        b"MODSEQ" if tok.s.get(tok.pos..tok.pos + 2) == Some(b" \"") => 3,
        b"MODSEQ" | b"YOUNGER" | b"OLDER" | b"EMAILID" | b"THREADID" => 1,
        _ => search_key_arguments(&upper),
    };
    for _ in 0..arguments {
        if !tok.sp() {
            return None;
        }
        search_token(tok)?;
    }
    Some(SearchNode::Leaf(start..tok.pos))
}

/// An atom, quoted string or literal.
fn search_token<'a>(tok: &mut Tok<'a>) -> Option<&'a [u8]> {
    let start = tok.pos;
    match tok.peek()? {
        b'"' => {
            tok.quoted()?;
        }
        b'{' => {
            tok.literal()?;
        }
        _ => {
            if tok.atom().is_empty() {
                return None;
            }
        }
    }
    Some(&tok.s[start..tok.pos])
}

/// A search key the command is rewritten around before `imap-codec` parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewritten {
    /// `MODSEQ n` (RFC 7162 §3.1.5), with or without an entry name.
    Modseq(u64),
    /// `YOUNGER n` (RFC 5032): internal date within the last n seconds.
    Younger(u32),
    /// `OLDER n` (RFC 5032): internal date more than n seconds ago.
    Older(u32),
    /// `EMAILID objectid` (RFC 8474 §6): the stored message it names, `None`
    /// when it names none this server gave out (it matches nothing).
    EmailId(Option<i64>),
    /// `THREADID objectid`: THREADID is always NIL here, so it matches nothing
    /// (RFC 8474 §5.2).
    ThreadId,
}

/// `objectid = 1*255(ALPHA / DIGIT / "_" / "-")` (RFC 8474 §7).
fn is_object_id(s: &[u8]) -> bool {
    (1..=255).contains(&s.len()) && s.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `YOUNGER ` or `OLDER ` at the start of `s`: its length and which.
fn within_key(s: &[u8]) -> Option<(usize, bool)> {
    if s.len() > 8 && s[..7].eq_ignore_ascii_case(b"YOUNGER") && s[7] == b' ' {
        Some((8, true))
    } else if s.len() > 6 && s[..5].eq_ignore_ascii_case(b"OLDER") && s[5] == b' ' {
        Some((6, false))
    } else {
        None
    }
}

fn parse_append<'a>(tok: &mut Tok<'a>) -> Option<Request<'a>> {
    if !tok.sp() {
        return None;
    }
    let mailbox = tok.astring()?;
    let mut messages = Vec::new();
    while tok.sp() {
        let mut flags = FlagSet::default();
        let mut date = None;
        if tok.peek() == Some(b'(') {
            flags = tok.flag_list()?;
            if !tok.sp() {
                return None;
            }
        }
        if tok.peek() == Some(b'"') {
            date = Some(parse_date_time(tok.quoted()?)?);
            if !tok.sp() {
                return None;
            }
        }
        // `UTF8 (literal8)` (RFC 9755 §4): a message whose header may hold UTF-8
        // (RFC 6532). Stored as any other; the parentheses only frame it.
        let utf8 = tok.s.get(tok.pos..tok.pos + 6).is_some_and(|w| w.eq_ignore_ascii_case(b"UTF8 ("));
        if utf8 {
            tok.pos += 6;
        }
        // A literal8 (`~{n}`, RFC 3516 §4.4): binary content, NUL octets and all.
        if tok.peek() == Some(b'~') {
            tok.pos += 1;
        }
        let data = tok.literal()?;
        if utf8 {
            if tok.peek() != Some(b')') {
                return None;
            }
            tok.pos += 1;
        }
        messages.push(AppendMessage { flags, date, data });
    }
    (tok.end() && !messages.is_empty()).then_some(Request::Append { mailbox, messages })
}

/// `dd-Mon-yyyy hh:mm:ss +zzzz` (day may be space-padded).
pub fn parse_date_time(s: Vec<u8>) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    let s = String::from_utf8(s).ok()?;
    chrono::DateTime::parse_from_str(s.trim_start(), "%d-%b-%Y %H:%M:%S %z").ok()
}

/// A cursor over a complete command for the few hand-parsed commands.
struct Tok<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Tok<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }
    fn sp(&mut self) -> bool {
        if self.peek() == Some(b' ') {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    /// At CRLF (or LF) and nothing after.
    fn end(&self) -> bool {
        matches!(&self.s[self.pos.min(self.s.len())..], b"\r\n" | b"\n")
    }
    fn atom(&mut self) -> &'a [u8] {
        // A cursor may start past the end: after the tag and its space, on a
        // line that is a bare LF.
        let start = self.pos.min(self.s.len());
        self.pos = start;
        while let Some(b) = self.peek() {
            if b <= b' ' || b >= 0x7f || b"(){\"".contains(&b) {
                break;
            }
            self.pos += 1;
        }
        &self.s[start..self.pos]
    }
    fn quoted(&mut self) -> Option<Vec<u8>> {
        if self.peek() != Some(b'"') {
            return None;
        }
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.pos += 1;
                    let c = self.peek()?;
                    if c != b'"' && c != b'\\' {
                        return None;
                    }
                    out.push(c);
                }
                b'\r' | b'\n' => return None,
                c => out.push(c),
            }
            self.pos += 1;
        }
    }
    fn literal(&mut self) -> Option<&'a [u8]> {
        if self.peek() != Some(b'{') {
            return None;
        }
        let close = self.s[self.pos..].iter().position(|&b| b == b'}')? + self.pos;
        let inner = &self.s[self.pos + 1..close];
        let digits = inner.strip_suffix(b"+").unwrap_or(inner);
        let n: usize = std::str::from_utf8(digits).ok()?.parse().ok()?;
        let mut p = close + 1;
        if self.s.get(p) == Some(&b'\r') {
            p += 1;
        }
        if self.s.get(p) != Some(&b'\n') {
            return None;
        }
        p += 1;
        let data = self.s.get(p..p.checked_add(n)?)?;
        self.pos = p + n;
        Some(data)
    }
    fn astring(&mut self) -> Option<Vec<u8>> {
        match self.peek()? {
            b'"' => self.quoted(),
            b'{' => self.literal().map(<[u8]>::to_vec),
            _ => {
                let a = self.atom();
                (!a.is_empty()).then(|| a.to_vec())
            }
        }
    }
    fn flag_list(&mut self) -> Option<FlagSet> {
        if self.peek() != Some(b'(') {
            return None;
        }
        self.pos += 1;
        let mut flags = FlagSet::default();
        loop {
            match self.peek()? {
                b')' => {
                    self.pos += 1;
                    flags.keywords.sort();
                    flags.keywords.dedup();
                    return Some(flags);
                }
                b' ' => self.pos += 1,
                b'\\' => {
                    self.pos += 1;
                    let name = self.atom();
                    let name = format!("\\{}", std::str::from_utf8(name).ok()?);
                    match Flags::from_name(&name) {
                        Some(f) => flags.system = flags.system.union(f),
                        // \Recent cannot be set by a client; other system-looking
                        // flags are not ours.
                        None if name.eq_ignore_ascii_case("\\Recent") => {}
                        None => return None,
                    }
                }
                _ => {
                    let kw = self.atom();
                    if kw.is_empty() {
                        return None;
                    }
                    flags.keywords.push(String::from_utf8(kw.to_vec()).ok()?);
                }
            }
        }
    }
}

/// `cmd` with every quoted string that holds 8-bit bytes turned into a literal
/// of the same octets, or `None` when it has none. RFC 3501 allows only 7-bit
/// text in a quoted string, but clients send UTF-8 search strings, passwords and
/// names that way (Python's imaplib with bytes arguments, for one), and the
/// common servers take them; refusing them with BAD would break those clients
/// for no one's benefit. Literal data is left as it is.
pub fn eight_bit_quoted_as_literals(cmd: &[u8]) -> Option<Vec<u8>> {
    if cmd.is_ascii() {
        return None;
    }
    // Built only once a string needs it: an APPEND of 8-bit mail is skipped over,
    // not copied.
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < cmd.len() {
        match cmd[i] {
            b'"' => {
                let mut j = i + 1;
                while j < cmd.len() && !matches!(cmd[j], b'"' | b'\r' | b'\n') {
                    j += if cmd[j] == b'\\' { 2 } else { 1 };
                }
                if cmd.get(j) != Some(&b'"') {
                    // Unterminated: left for the parser to refuse.
                    break;
                }
                let inner = &cmd[i + 1..j];
                if !inner.is_ascii() {
                    let mut text = Vec::with_capacity(inner.len());
                    let mut escaped = false;
                    for &b in inner {
                        escaped = !escaped && b == b'\\';
                        if !escaped {
                            text.push(b);
                        }
                    }
                    let out = out.get_or_insert_with(|| Vec::with_capacity(cmd.len() + 16));
                    out.extend_from_slice(&cmd[copied..i]);
                    out.extend_from_slice(format!("{{{}}}\r\n", text.len()).as_bytes());
                    out.extend_from_slice(&text);
                    copied = j + 1;
                }
                i = j + 1;
            }
            b'{' => i = literal_end(cmd, i).unwrap_or(i + 1),
            _ => i += 1,
        }
    }
    let mut out = out?;
    out.extend_from_slice(&cmd[copied..]);
    Some(out)
}

/// Where the literal announced at `cmd[i]` (`{n}` or `{n+}`, CRLF, n octets of
/// data) ends; `None` when no literal starts there.
fn literal_end(cmd: &[u8], i: usize) -> Option<usize> {
    let digits = cmd.get(i + 1..)?.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let n: usize = std::str::from_utf8(&cmd[i + 1..i + 1 + digits]).ok()?.parse().ok()?;
    let nl = cmd[i..].iter().position(|&b| b == b'\n')?;
    Some((i + nl + 1).saturating_add(n).min(cmd.len()))
}

/// Where a command names `$` (SEARCHRES, RFC 5182): the byte ranges of every `$`
/// that stands alone as an argument (not inside a quoted string or a literal, not
/// part of a longer atom such as `$Junk`).
pub fn saved_result_refs(cmd: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    // Every command passes through here: most have no `$` at all.
    if memchr::memchr(b'$', cmd).is_none() {
        return out;
    }
    // After the tag (a tag may itself be `$`).
    let mut i = cmd.iter().position(|&b| b == b' ').unwrap_or(cmd.len());
    while i < cmd.len() {
        match cmd[i] {
            b'"' => {
                i += 1;
                while i < cmd.len() && cmd[i] != b'"' {
                    i += if cmd[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            // Literal data is skipped whole.
            b'{' => i = literal_end(cmd, i).unwrap_or(i + 1),
            b'$' => {
                let before = if i == 0 { b' ' } else { cmd[i - 1] };
                let after = cmd.get(i + 1).copied().unwrap_or(b'\r');
                if matches!(before, b' ' | b'(') && matches!(after, b' ' | b')' | b'\r' | b'\n') {
                    out.push(i);
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_result_refs_are_standalone_arguments_only() {
        let at = |cmd: &[u8]| saved_result_refs(cmd);
        assert_eq!(at(b"a FETCH $ (UID)\r\n"), [8]);
        assert_eq!(at(b"$ FETCH 1 FLAGS\r\n"), Vec::<usize>::new(), "a tag of $");
        assert_eq!(at(b"a SEARCH KEYWORD $Junk\r\n"), Vec::<usize>::new());
        assert_eq!(at(b"a SEARCH SUBJECT \"$\" OR $ ALL\r\n"), [24]);
        assert_eq!(at(b"a SEARCH BODY {3}\r\n $ $\r\n"), [22], "literal data is skipped");
        assert_eq!(at(b"a SEARCH ($)\r\n"), [10]);
    }
    use imap_codec::imap_types::command::CommandBody;

    #[test]
    fn eight_bit_quoted_strings_become_literals() {
        let lit = |cmd: &[u8]| eight_bit_quoted_as_literals(cmd);
        assert_eq!(lit(b"a SEARCH SUBJECT \"plain\"\r\n"), None, "7-bit only: untouched");
        assert_eq!(
            lit("a SEARCH CHARSET UTF-8 BODY \"w\u{f6}rld\" SUBJECT \"x\"\r\n".as_bytes()).as_deref(),
            Some("a SEARCH CHARSET UTF-8 BODY {6}\r\nw\u{f6}rld SUBJECT \"x\"\r\n".as_bytes())
        );
        // Escapes are undone: the literal holds the string's octets.
        assert_eq!(
            lit("a LOGIN bob \"p\u{e4}\\\"ss\\\\\"\r\n".as_bytes()).as_deref(),
            Some("a LOGIN bob {7}\r\np\u{e4}\"ss\\\r\n".as_bytes())
        );
        // 8-bit literal data (an APPENDed message) is not a quoted string.
        assert_eq!(lit("a APPEND INBOX {9}\r\n\"\u{fc}\"\"\"\"\r\n".as_bytes()), None);
        let appended = "a APPEND \"S\u{fc}\" {4}\r\n\"\u{fc}\"\r\n".as_bytes();
        assert_eq!(
            lit(appended).as_deref(),
            Some("a APPEND {3}\r\nS\u{fc} {4}\r\n\"\u{fc}\"\r\n".as_bytes())
        );
        // Unterminated: left for the parser to refuse.
        assert_eq!(lit("a SEARCH BODY \"\u{fc}\r\n".as_bytes()), None);

        let rewritten = lit("a SEARCH CHARSET UTF-8 BODY \"w\u{f6}rld\"\r\n".as_bytes()).unwrap();
        let (_, req) = parse(&rewritten).expect("parses as a literal");
        assert!(matches!(req, Request::Codec(Command { body: CommandBody::Search { .. }, .. })));
    }

    #[test]
    fn codec_commands() {
        let (tag, req) = parse(b"a1 LOGIN bob \"secret\"\r\n").expect("parse");
        assert_eq!(tag, "a1");
        assert!(matches!(req, Request::Codec(Command { body: CommandBody::Login { .. }, .. })));
        let (_, req) = parse(b"a2 UID FETCH 1:* (FLAGS BODY.PEEK[HEADER.FIELDS (FROM)])\r\n").expect("parse");
        assert!(matches!(req, Request::Codec(Command { body: CommandBody::Fetch { uid: true, .. }, .. })));
        assert_eq!(
            parse(b"a3 FROB\r\n").err(),
            Some(ParseError { tag: "a3".into(), text: "Unknown command or invalid arguments" })
        );
        assert_eq!(parse(b"\r\n").err().map(|e| e.tag), Some("*".into()));
    }

    #[test]
    fn condstore_and_qresync_syntax() {
        let select = |cmd: &[u8]| match parse(cmd) {
            Ok((_, Request::Select { read_only, params, select })) => Some((read_only, params, select)),
            _ => None,
        };
        assert!(matches!(parse(b"a SELECT INBOX\r\n"), Ok((_, Request::Codec(_)))));
        let (ro, p, rest) = select(b"a EXAMINE \"My Box\" (CONDSTORE)\r\n").expect("condstore");
        assert!(ro && p.condstore && p.qresync.is_none());
        assert_eq!(rest, b"a EXAMINE \"My Box\"\r\n");
        let (_, p, _) = select(b"a SELECT INBOX (QRESYNC (67890007 90060115194045000 41:211,214:541))\r\n")
            .expect("qresync");
        let q = p.qresync.expect("qresync");
        assert_eq!((q.uid_validity, q.modseq), (67890007, 90060115194045000));
        assert_eq!(q.known_uids, Some(SeqSet(vec![(41, 211), (214, 541)])));
        let (_, p, _) =
            select(b"a SELECT INBOX (QRESYNC (1 2 1:9 (1:3 4:6)))\r\n").expect("with a sequence match");
        assert_eq!(p.qresync.map(|q| q.modseq), Some(2));
        for bad in [
            &b"a SELECT INBOX (QRESYNC (0 5))\r\n"[..],
            b"a SELECT INBOX (QRESYNC (1))\r\n",
            b"a SELECT INBOX (FROB)\r\n",
            b"a SELECT INBOX ()\r\n",
            b"a SELECT INBOX (CONDSTORE) x\r\n",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }

        let fetch = |cmd: &[u8]| match parse(cmd) {
            Ok((_, Request::Fetch { ext: modseq, fetch, .. })) => {
                Some((modseq, String::from_utf8(fetch).unwrap()))
            }
            _ => None,
        };
        let (m, f) = fetch(b"a UID FETCH 1:* (FLAGS MODSEQ BODY.PEEK[HEADER.FIELDS (MODSEQ)])\r\n").unwrap();
        assert!(m.item && m.changed_since.is_none());
        assert_eq!(f, "a UID FETCH 1:* (FLAGS BODY.PEEK[HEADER.FIELDS (MODSEQ)])\r\n");
        let (m, f) = fetch(b"a UID FETCH 300:500 (FLAGS) (CHANGEDSINCE 12345 VANISHED)\r\n").unwrap();
        assert_eq!((m.item, m.changed_since, m.vanished), (true, Some(12345), true));
        assert_eq!(f, "a UID FETCH 300:500 (FLAGS)\r\n");
        let (_, f) = fetch(b"a FETCH 2 MODSEQ\r\n").unwrap();
        assert_eq!(f, "a FETCH 2 UID\r\n");
        // OBJECTID's items (RFC 8474 §5.3).
        let (m, f) = fetch(b"a FETCH 1:* (FLAGS emailid THREADID)\r\n").unwrap();
        assert!(m.email_id && m.thread_id && !m.item && !m.only_extension);
        assert_eq!(f, "a FETCH 1:* (FLAGS)\r\n");
        let (m, f) = fetch(b"a UID FETCH 5 EMAILID\r\n").unwrap();
        assert!(m.email_id && !m.thread_id && m.only_extension);
        assert_eq!(f, "a UID FETCH 5 UID\r\n");
        assert!(matches!(parse(b"a FETCH 1 BODY[HEADER.FIELDS (EMAILID)]\r\n"), Ok((_, Request::Codec(_)))));
        assert!(matches!(parse(b"a FETCH 1 BODY[HEADER.FIELDS (X-MODSEQ)]\r\n"), Ok((_, Request::Codec(_)))));
        assert!(
            parse(b"a FETCH 1 (FLAGS) (CHANGEDSINCE 5 VANISHED)\r\n").is_err(),
            "VANISHED is UID FETCH only"
        );
        assert!(parse(b"a UID FETCH 1 (FLAGS) (VANISHED)\r\n").is_err(), "VANISHED needs CHANGEDSINCE");
        assert!(parse(b"a FETCH 1 (FLAGS) (CHANGEDSINCE 99999999999999999999)\r\n").is_err());
        // Found by the fuzzer: an unterminated quoted string in the item list.
        assert!(parse(b"a UID FETCH 1 (FLAGS MODSEQ\"BODY.PEEK[HEADER])\r\n").is_err());

        // BINARY (RFC 3516): the BODY twin of each item, marked.
        match parse(b"a UID FETCH 1 (FLAGS binary.peek[1.2]<0.10> BINARY[] BINARY.SIZE[2] MODSEQ)\r\n") {
            Ok((_, Request::Fetch { ext: modseq, binary, fetch })) => {
                assert!(modseq.item);
                assert_eq!(
                    binary,
                    [None, Some(BinaryItem::Content), Some(BinaryItem::Content), Some(BinaryItem::Size)]
                );
                assert_eq!(fetch, b"a UID FETCH 1 (FLAGS BODY.PEEK[1.2]<0.10> BODY[] BODY.PEEK[2])\r\n");
            }
            other => panic!("{other:?}"),
        }
        match parse(b"a FETCH 1:* BINARY.PEEK[2.HEADER.FIELDS (From x-Binary)]\r\n") {
            Ok((_, Request::Fetch { binary, fetch, .. })) => {
                assert_eq!(binary, [Some(BinaryItem::Content)]);
                assert_eq!(fetch, b"a FETCH 1:* (BODY.PEEK[2.HEADER.FIELDS (From x-Binary)])\r\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse(b"a FETCH 1 BODY[HEADER.FIELDS (X-BINARY)]\r\n"), Ok((_, Request::Codec(_)))));
        // `<offset>` without a length reads to the end.
        match parse(b"a FETCH 1 BINARY.PEEK[5]<15>\r\n") {
            Ok((_, Request::Fetch { fetch, .. })) => {
                assert_eq!(fetch, b"a FETCH 1 (BODY.PEEK[5]<15.4294967295>)\r\n")
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            &b"a FETCH 1 BINARY.SIZE[1]<0.5>\r\n"[..],
            b"a FETCH 1 (BINARY)\r\n",
            b"a FETCH 1 (BINARY.FOO[1])\r\n",
            b"a FETCH 1 (BINARY[1\r\n",
            b"a FETCH 1 (BINARY[1]<x>)\r\n",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }

        match parse(b"a UID STORE 7,5,9 (UNCHANGEDSINCE 320162338) +FLAGS.SILENT (\\Deleted)\r\n") {
            Ok((_, Request::Store { unchanged_since, store })) => {
                assert_eq!(unchanged_since, 320162338);
                assert_eq!(store, b"a UID STORE 7,5,9 +FLAGS.SILENT (\\Deleted)\r\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse(b"a STORE 1 +FLAGS (\\Seen)\r\n"), Ok((_, Request::Codec(_)))));
        assert!(parse(b"a STORE 1 (UNCHANGEDSINCE x) +FLAGS (\\Seen)\r\n").is_err());

        let found = |cmd: &[u8]| {
            rewritten_criteria(cmd)
                .into_iter()
                .filter_map(|(r, k)| match k {
                    Rewritten::Modseq(n) => Some((String::from_utf8_lossy(&cmd[r]).into_owned(), n)),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            found(b"a UID SEARCH MODSEQ \"/flags/\\\\draft\" all 620162338 UNSEEN\r\n"),
            [("MODSEQ \"/flags/\\\\draft\" all 620162338".to_string(), 620162338)]
        );
        assert_eq!(
            found(b"t SEARCH OR NOT MODSEQ 720162338 LARGER 50000 (MODSEQ 5)\r\n"),
            [("MODSEQ 720162338".to_string(), 720162338), ("MODSEQ 5".to_string(), 5)]
        );
        assert_eq!(found(b"a SEARCH RETURN (MIN) MODSEQ 5\r\n").len(), 1);
        assert!(found(b"a SEARCH SUBJECT \"MODSEQ 5\"\r\n").is_empty());
        assert!(found(b"a SEARCH BODY {8}\r\nMODSEQ 5\r\n").is_empty());
        assert!(found(b"a FETCH 1 (MODSEQ)\r\n").is_empty());
        assert!(found(b"a SEARCH MODSEQ x\r\n").is_empty());
        // WITHIN (RFC 5032).
        let within = |cmd: &[u8]| {
            rewritten_criteria(cmd)
                .into_iter()
                .map(|(r, k)| (String::from_utf8_lossy(&cmd[r]).into_owned(), k))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            within(b"a UID SEARCH OR YOUNGER 3600 (older 60 MODSEQ 4)\r\n"),
            [
                ("YOUNGER 3600".to_string(), Rewritten::Younger(3600)),
                ("older 60".to_string(), Rewritten::Older(60)),
                ("MODSEQ 4".to_string(), Rewritten::Modseq(4)),
            ]
        );
        assert!(within(b"a SEARCH SUBJECT \"OLDER 5\"\r\n").is_empty());
        // A key-like word that is another key's argument is that argument.
        assert!(within(b"a SEARCH SUBJECT OLDER 5\r\n").is_empty());
        assert!(within(b"a SEARCH OR FROM younger TEXT MODSEQ 1:5\r\n").is_empty());
        assert_eq!(
            within(b"a SEARCH HEADER X-Age YOUNGER OLDER 5 CHARSET OLDER\r\n"),
            [("OLDER 5".to_string(), Rewritten::Older(5))]
        );
        assert_eq!(
            within(b"a UID SORT (DATE) UTF-8 NOT SUBJECT {5}\r\nOLDER YOUNGER 9\r\n"),
            [("YOUNGER 9".to_string(), Rewritten::Younger(9))]
        );
        assert!(within(b"a SEARCH YOUNGER 0\r\n").is_empty(), "n is a nz-number");
        assert!(within(b"a SEARCH OLDER x\r\n").is_empty());
        // OBJECTID (RFC 8474 §6): ids this server gave out, quoted or not.
        assert_eq!(
            within(b"a UID SEARCH OR EMAILID M42 emailid \"M7\" NOT THREADID T42 EMAILID Mx_-9\r\n"),
            [
                ("EMAILID M42".to_string(), Rewritten::EmailId(Some(42))),
                ("emailid \"M7\"".to_string(), Rewritten::EmailId(Some(7))),
                ("THREADID T42".to_string(), Rewritten::ThreadId),
                ("EMAILID Mx_-9".to_string(), Rewritten::EmailId(None)),
            ]
        );
        assert_eq!(
            within(b"a SEARCH EMAILID M042 EMAILID m42\r\n")
                .iter()
                .filter(|(_, k)| k == &Rewritten::EmailId(None))
                .count(),
            2
        );
        assert!(within(b"a SEARCH SUBJECT EMAILID\r\n").is_empty());
        assert!(
            within(b"a SEARCH EMAILID M1.2\r\n").is_empty(),
            "not an objectid: left for the parser to refuse"
        );
        assert!(
            within(&[&b"a SEARCH EMAILID M"[..], &[b'1'; 255], b"\r\n"].concat()).is_empty(),
            "256 characters"
        );
        assert!(matches!(parse(b"a SEARCH SUBJECT \"MODSEQ 5\"\r\n"), Ok((_, Request::Codec(_)))));
        // OR chains deeper than imap-codec parses, in De Morgan form.
        let shallow = |cmd: &str| shallow_or_chains(cmd.as_bytes()).map(|c| String::from_utf8(c).unwrap());
        let chain = |n: usize| {
            let keys: Vec<String> = (0..n).map(|i| format!("FROM a{i}")).collect();
            format!("{}{}", "OR ".repeat(n - 1), keys.join(" "))
        };
        assert_eq!(shallow(&format!("a SEARCH {}\r\n", chain(8))), None, "imap-codec takes it as it is");
        assert!(parse(format!("a SEARCH {}\r\n", chain(9)).as_bytes()).is_ok());
        assert!(parse(format!("a SEARCH {}\r\n", chain(10)).as_bytes()).is_err(), "imap-codec's limit");
        let keys: Vec<String> = (0..9).map(|i| format!("NOT FROM a{i}")).collect();
        assert_eq!(
            shallow(&format!("a SEARCH {}\r\n", chain(9))),
            Some(format!("a SEARCH NOT ({})\r\n", keys.join(" ")))
        );
        let deep = format!(
            "t UID SORT RETURN (COUNT) (REVERSE DATE) UTF-8 UNSEEN {} HEADER Message-ID {{4}}\r\n<x>  OR SEEN (OR DRAFT {})\r\n",
            chain(12),
            chain(10)
        );
        let flat = shallow(&deep).expect("rewritten");
        assert!(
            flat.starts_with("t UID SORT RETURN (COUNT) (REVERSE DATE) UTF-8 UNSEEN NOT (NOT FROM a0 "),
            "{flat}"
        );
        assert!(
            flat.contains(" HEADER Message-ID {4}\r\n<x>  NOT (NOT SEEN NOT DRAFT NOT FROM a0 "),
            "{flat}"
        );
        assert!(parse(flat.as_bytes()).is_ok(), "{flat}");
        assert_eq!(shallow("a SEARCH OR OR SEEN DRAFT FLAGGED\r\n"), None, "shallow enough already");
        assert_eq!(shallow(&format!("a FETCH 1 {}\r\n", chain(12))), None, "SEARCH, SORT and THREAD only");
        assert_eq!(
            shallow(&format!("a SEARCH {} FROM\r\n", chain(12))),
            None,
            "malformed: left to the parser"
        );
        assert_eq!(shallow(&format!("a SEARCH {}{}\r\n", "(".repeat(300), ")".repeat(300))), None);
        let (_, status) = parse(b"a STATUS INBOX (HIGHESTMODSEQ UIDNEXT)\r\n").expect("status");
        assert!(
            matches!(status, Request::Status { items, .. } if items == [StatusItem::HighestModseq, StatusItem::UidNext])
        );
        let (_, status) = parse(b"a STATUS \"a b\" (MAILBOXID)\r\n").expect("status");
        assert!(
            matches!(status, Request::Status { items, status } if items == [StatusItem::MailboxId] && status == b"a STATUS \"a b\" (MESSAGES)\r\n")
        );
    }

    #[test]
    fn hand_parsed_commands() {
        assert!(matches!(parse(b"x ID (\"name\" \"t\")\r\n"), Ok((_, Request::Id))));
        assert!(matches!(parse(b"x namespace\r\n"), Ok((_, Request::Namespace))));
        match parse(b"x UID EXPUNGE 3:5,9,*\r\n") {
            Ok((_, Request::UidExpunge(set))) => {
                assert_eq!(set.0, vec![(3, 5), (9, 9), (SeqSet::STAR, SeqSet::STAR)])
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(b"x UID EXPUNGE 0\r\n").is_err());
        let cmd = b"x APPEND \"Sent Items\" (\\Seen $Fwd) \" 7-Feb-1994 21:52:25 -0800\" {5}\r\nhello {3+}\r\nabc\r\n";
        match parse(cmd) {
            Ok((_, Request::Append { mailbox, messages })) => {
                assert_eq!(mailbox, b"Sent Items");
                assert_eq!(messages.len(), 2);
                assert_eq!(messages[0].data, b"hello");
                assert_eq!(messages[0].flags.system, Flags::SEEN);
                assert_eq!(messages[0].flags.keywords, vec!["$Fwd".to_string()]);
                assert_eq!(messages[0].date.map(|d| d.timestamp()), Some(760686745));
                assert_eq!(messages[1].data, b"abc");
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(b"x APPEND INBOX {10}\r\nshort\r\n").is_err());
        assert!(parse(b"x APPEND INBOX (\\Bogus) {1}\r\na\r\n").is_err());
    }

    #[test]
    fn append_utf8_data_item() {
        // RFC 9755 §4: `UTF8 (literal8)`, beside plain messages in one MULTIAPPEND.
        let cmd = "x APPEND INBOX (\\Seen) UTF8 (~{6}\r\nS\u{fc}b:\r) {3}\r\nabc utf8 ({2+}\r\nhi)\r\n";
        match parse(cmd.as_bytes()) {
            Ok((_, Request::Append { messages, .. })) => {
                let data: Vec<&[u8]> = messages.iter().map(|m| m.data).collect();
                assert_eq!(data, vec!["S\u{fc}b:\r".as_bytes(), b"abc", b"hi"]);
                assert_eq!(messages[0].flags.system, Flags::SEEN);
            }
            other => panic!("{other:?}"),
        }
        // The parenthesis must close right after the literal.
        assert!(parse(b"x APPEND INBOX UTF8 (~{2}\r\nhi\r\n").is_err());
        assert!(parse(b"x APPEND INBOX UTF8 (~{2}\r\nhi x)\r\n").is_err());
    }
}
