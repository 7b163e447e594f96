//! SEARCH and UID SEARCH (every RFC 3501 key).
//!
//! Searches on flags, keywords, sequence numbers and UIDs — `UNSEEN`, `DELETED`,
//! what clients issue in a loop — are answered from the session's flag map after
//! the usual sync round trip. Everything else loads the stored metadata, and the
//! body only when a BODY/TEXT/unusual HEADER key needs it.

use chrono::NaiveDate;
use imap_codec::imap_types::core::{AString, Charset};
use imap_codec::imap_types::search::SearchKey;
use imap_codec::imap_types::sequence::SequenceSet;

use super::session::{Outcome, Session, store_error};
use crate::proto::imap::encode;
use crate::proto::imap::parse::{ReturnOption, SeqSet};
use mailcluster_model::{Flags, MessageMeta, UidSet};

/// One message as the evaluator sees it.
struct Candidate<'a> {
    seq: u32,
    uid: u32,
    system: Flags,
    /// `\Recent` for this session.
    recent: bool,
    keywords: &'a [String],
    internal_date: Option<chrono::DateTime<chrono::Utc>>,
    meta: Option<&'a MessageMeta>,
    raw: Option<&'a [u8]>,
}

struct Bounds {
    max_seq: u32,
    max_uid: u32,
    /// Each sequence and UID set of the criteria (by address), its ranges
    /// resolved, sorted and merged once: a message is looked up in log time
    /// instead of against every range of a set thousands long, once per message.
    sets: std::collections::HashMap<usize, Vec<(u32, u32)>>,
}

impl Bounds {
    fn new(max_seq: u32, max_uid: u32, criteria: &SearchKey<'_>) -> Bounds {
        let mut b = Bounds { max_seq, max_uid, sets: Default::default() };
        b.resolve(criteria);
        b
    }

    /// Recursion as deep as the criteria, which `imap-codec` parses at most
    /// nine levels deep.
    fn resolve(&mut self, key: &SearchKey<'_>) {
        let (set, max) = match key {
            SearchKey::And(keys) => return keys.as_ref().iter().for_each(|k| self.resolve(k)),
            SearchKey::Not(k) => return self.resolve(k),
            SearchKey::Or(a, b) => {
                self.resolve(a);
                return self.resolve(b);
            }
            SearchKey::SequenceSet(set) => (set, self.max_seq),
            SearchKey::Uid(set) => (set, self.max_uid),
            _ => return,
        };
        let mut ranges: Vec<(u32, u32)> = SeqSet::from_codec(set).ranges(max).collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        self.sets.insert(set as *const SequenceSet as usize, merged);
    }

    fn contains(&self, set: &SequenceSet, n: u32, max: u32) -> bool {
        match self.sets.get(&(set as *const SequenceSet as usize)) {
            Some(ranges) => {
                let after = ranges.partition_point(|&(lo, _)| lo <= n);
                after > 0 && ranges[after - 1].1 >= n
            }
            None => SeqSet::from_codec(set).contains(n, max),
        }
    }
}

/// System-flag-only criteria → (with, without), or `None` when other keys occur.
fn flag_only(key: &SearchKey<'_>, with: &mut Flags, without: &mut Flags) -> bool {
    let (w, wo) = match key {
        SearchKey::All => (Flags::NONE, Flags::NONE),
        SearchKey::Seen => (Flags::SEEN, Flags::NONE),
        SearchKey::Unseen => (Flags::NONE, Flags::SEEN),
        SearchKey::Deleted => (Flags::DELETED, Flags::NONE),
        SearchKey::Undeleted => (Flags::NONE, Flags::DELETED),
        SearchKey::Flagged => (Flags::FLAGGED, Flags::NONE),
        SearchKey::Unflagged => (Flags::NONE, Flags::FLAGGED),
        SearchKey::Answered => (Flags::ANSWERED, Flags::NONE),
        SearchKey::Unanswered => (Flags::NONE, Flags::ANSWERED),
        SearchKey::Draft => (Flags::DRAFT, Flags::NONE),
        SearchKey::Undraft => (Flags::NONE, Flags::DRAFT),
        SearchKey::And(keys) => return keys.as_ref().iter().all(|k| flag_only(k, with, without)),
        _ => return false,
    };
    *with = with.union(w);
    *without = without.union(wo);
    true
}

/// What the evaluation needs loaded.
fn needs(key: &SearchKey<'_>, meta: &mut bool, raw: &mut bool) {
    match key {
        SearchKey::And(keys) => keys.as_ref().iter().for_each(|k| needs(k, meta, raw)),
        SearchKey::Not(k) => needs(k, meta, raw),
        SearchKey::Or(a, b) => {
            needs(a, meta, raw);
            needs(b, meta, raw);
        }
        SearchKey::Body(_) | SearchKey::Text(_) => *raw = true,
        SearchKey::Header(name, value) => {
            *meta = true;
            // An empty value asks whether the field is there at all, which the
            // summary (empty for an absent field) cannot tell: read the header.
            if summary_field(name.as_ref()).is_none() || value.as_ref().is_empty() {
                *raw = true;
            }
        }
        SearchKey::Bcc(_)
        | SearchKey::Cc(_)
        | SearchKey::From(_)
        | SearchKey::To(_)
        | SearchKey::Subject(_)
        | SearchKey::Before(_)
        | SearchKey::On(_)
        | SearchKey::Since(_)
        | SearchKey::SentBefore(_)
        | SearchKey::SentOn(_)
        | SearchKey::SentSince(_)
        | SearchKey::Larger(_)
        | SearchKey::Smaller(_) => *meta = true,
        _ => {}
    }
}

/// Header names answered from the stored summary.
fn summary_field(name: &[u8]) -> Option<fn(&MessageMeta) -> &str> {
    let name = name.to_ascii_lowercase();
    Some(match name.as_slice() {
        b"subject" => |m| m.subject.as_str(),
        b"from" => |m| m.from.as_str(),
        b"to" => |m| m.to.as_str(),
        b"cc" => |m| m.cc.as_str(),
        b"bcc" => |m| m.bcc.as_str(),
        b"message-id" => |m| m.message_id.as_str(),
        _ => return None,
    })
}

fn lower(s: &AString<'_>) -> String {
    String::from_utf8_lossy(s.as_ref()).to_lowercase()
}

fn contains_ci(hay: &str, needle: &str) -> bool {
    needle.is_empty() || hay.to_lowercase().contains(needle)
}

fn bytes_contain_ci(hay: &[u8], needle: &str) -> bool {
    if needle.is_empty() {
        return true;
    }
    String::from_utf8_lossy(hay).to_lowercase().contains(needle)
}

/// BODY: the raw body, and the decoded text of every text part (so base64 or
/// quoted-printable bodies are searchable).
fn body_contains(raw: &[u8], header_size: usize, needle: &str) -> bool {
    if bytes_contain_ci(raw.get(header_size..).unwrap_or_default(), needle) {
        return true;
    }
    let Some(message) = mail_parser::MessageParser::default().parse(raw) else { return false };
    message.parts.iter().any(|p| match &p.body {
        mail_parser::PartType::Text(t) | mail_parser::PartType::Html(t) => contains_ci(t, needle),
        _ => false,
    })
}

fn header_value_contains(header: &[u8], name: &[u8], needle: &str) -> bool {
    let fields = super::fetch::header_fields(header, &[name], false);
    if fields.len() <= 2 {
        return false;
    }
    // Only the value part counts ("Subject: x" must not match "subject").
    let value: Vec<u8> = fields
        .split(|&b| b == b'\n')
        .filter_map(|l| l.iter().position(|&b| b == b':').map(|p| l[p + 1..].to_vec()).or(Some(l.to_vec())))
        .flatten()
        .collect();
    bytes_contain_ci(&value, needle)
}

fn date_of(d: &imap_codec::imap_types::datetime::NaiveDate) -> NaiveDate {
    *d.as_ref()
}

fn eval(key: &SearchKey<'_>, c: &Candidate<'_>, b: &Bounds) -> bool {
    let has = |f: Flags| c.system.contains(f);
    let meta_str = |get: fn(&MessageMeta) -> &str, needle: &AString<'_>| {
        c.meta.is_some_and(|m| contains_ci(get(m), &lower(needle)))
    };
    let internal = c.internal_date.map(|d| match c.meta {
        Some(m) => m.internal_in_zone(&d).date_naive(),
        None => d.date_naive(),
    });
    let sent = c.meta.and_then(|m| m.sent_day()).or(internal);
    match key {
        SearchKey::And(keys) => keys.as_ref().iter().all(|k| eval(k, c, b)),
        SearchKey::SequenceSet(set) => b.contains(set, c.seq, b.max_seq),
        SearchKey::Uid(set) => b.contains(set, c.uid, b.max_uid),
        SearchKey::All => true,
        SearchKey::Answered => has(Flags::ANSWERED),
        SearchKey::Unanswered => !has(Flags::ANSWERED),
        SearchKey::Deleted => has(Flags::DELETED),
        SearchKey::Undeleted => !has(Flags::DELETED),
        SearchKey::Draft => has(Flags::DRAFT),
        SearchKey::Undraft => !has(Flags::DRAFT),
        SearchKey::Flagged => has(Flags::FLAGGED),
        SearchKey::Unflagged => !has(Flags::FLAGGED),
        SearchKey::Seen => has(Flags::SEEN),
        SearchKey::Unseen => !has(Flags::SEEN),
        SearchKey::Recent => c.recent,
        SearchKey::New => c.recent && !has(Flags::SEEN),
        SearchKey::Old => !c.recent,
        SearchKey::Keyword(k) => c.keywords.iter().any(|x| x.eq_ignore_ascii_case(k.as_ref())),
        SearchKey::Unkeyword(k) => !c.keywords.iter().any(|x| x.eq_ignore_ascii_case(k.as_ref())),
        SearchKey::Before(d) => internal.is_some_and(|i| i < date_of(d)),
        SearchKey::On(d) => internal.is_some_and(|i| i == date_of(d)),
        SearchKey::Since(d) => internal.is_some_and(|i| i >= date_of(d)),
        SearchKey::SentBefore(d) => sent.is_some_and(|i| i < date_of(d)),
        SearchKey::SentOn(d) => sent.is_some_and(|i| i == date_of(d)),
        SearchKey::SentSince(d) => sent.is_some_and(|i| i >= date_of(d)),
        SearchKey::Larger(n) => c.meta.is_some_and(|m| m.size > *n),
        SearchKey::Smaller(n) => c.meta.is_some_and(|m| m.size < *n),
        SearchKey::Subject(s) => meta_str(|m| m.subject.as_str(), s),
        SearchKey::From(s) => meta_str(|m| m.from.as_str(), s),
        SearchKey::To(s) => meta_str(|m| m.to.as_str(), s),
        SearchKey::Cc(s) => meta_str(|m| m.cc.as_str(), s),
        SearchKey::Bcc(s) => meta_str(|m| m.bcc.as_str(), s),
        // The summary keeps the id without its angle brackets (as the parser
        // gives it); the field holds them, and clients search for `<id>`.
        SearchKey::Header(name, value)
            if name.as_ref().eq_ignore_ascii_case(b"message-id") && !value.as_ref().is_empty() =>
        {
            c.meta.is_some_and(|m| {
                !m.message_id.is_empty() && contains_ci(&format!("<{}>", m.message_id), &lower(value))
            })
        }
        SearchKey::Header(name, value) => match summary_field(name.as_ref()) {
            Some(get) if !value.as_ref().is_empty() => meta_str(get, value),
            _ => match (c.raw, c.meta) {
                (Some(raw), Some(m)) => {
                    let header = raw.get(..m.header_size as usize).unwrap_or(raw);
                    header_value_contains(header, name.as_ref(), &lower(value))
                }
                _ => false,
            },
        },
        SearchKey::Body(s) => match (c.raw, c.meta) {
            (Some(raw), Some(m)) => body_contains(raw, m.header_size as usize, &lower(s)),
            _ => false,
        },
        SearchKey::Text(s) => match (c.raw, c.meta) {
            (Some(raw), Some(m)) => {
                let needle = lower(s);
                bytes_contain_ci(raw.get(..m.header_size as usize).unwrap_or(raw), &needle)
                    || body_contains(raw, m.header_size as usize, &needle)
            }
            _ => false,
        },
        SearchKey::Not(k) => !eval(k, c, b),
        SearchKey::Or(x, y) => eval(x, c, b) || eval(y, c, b),
    }
}

impl Session {
    /// SEARCH, and with RETURN options (`esearch`: ESEARCH, RFC 4731) one
    /// `* ESEARCH` line with what was asked for instead of `* SEARCH`.
    pub(crate) async fn cmd_search(
        &mut self,
        esearch: Option<(&str, &[ReturnOption])>,
        charset: Option<&Charset<'_>>,
        criteria: &SearchKey<'_>,
        uid: bool,
    ) -> Outcome {
        let hits = match self.search_hits(charset, criteria, uid).await {
            Ok(hits) => hits,
            Err(o) => return o,
        };
        let search_modseq = self.search_modseq;
        let Some(sel) = self.selected.as_mut() else { return Outcome::bad("No mailbox selected") };
        // With MODSEQ criteria (RFC 7162 §3.1.5) the answer names the highest
        // modseq among the messages it returns: with only MIN and/or MAX asked
        // for, those one or two (RFC 4731 §3.2); else every match.
        let highest = match esearch {
            _ if !search_modseq => None,
            Some((_, options))
                if options.iter().any(|o| matches!(o, ReturnOption::Min | ReturnOption::Max))
                    && options
                        .iter()
                        .all(|o| matches!(o, ReturnOption::Min | ReturnOption::Max | ReturnOption::Save)) =>
            {
                let min = hits.first().filter(|_| options.contains(&ReturnOption::Min));
                let max = hits.last().filter(|_| options.contains(&ReturnOption::Max));
                min.into_iter().chain(max).filter_map(|&u| sel.modseq_of(u)).max()
            }
            _ => hits.iter().filter_map(|&u| sel.modseq_of(u)).max(),
        };
        let numbers: Vec<u32> =
            if uid { hits.clone() } else { hits.iter().filter_map(|&u| sel.seq_of(u)).collect() };
        if let Some((_, options)) = esearch
            && options.contains(&ReturnOption::Save)
        {
            sel.saved = saved_result(&hits, options);
        }
        let line = match esearch {
            // SAVE alone answers nothing but the tagged OK (RFC 5182 §2.4).
            Some((_, [ReturnOption::Save])) => None,
            Some((tag, options)) => Some(esearch_line(tag, options, uid, &numbers)).map(|mut line| {
                if let Some(m) = highest {
                    line.push_str(&format!(" MODSEQ {m}"));
                }
                line
            }),
            None => Some(numbers_line("* SEARCH", &numbers)).map(|mut line| {
                if let Some(m) = highest {
                    line.push_str(&format!(" (MODSEQ {m})"));
                }
                line
            }),
        };
        if let Some(line) = line {
            self.push(&line);
        }
        Outcome::ok(if uid { "UID SEARCH completed" } else { "SEARCH completed" })
    }

    /// The UIDs matching `criteria`, ascending, or the reply that ends the command.
    pub(crate) async fn search_hits(
        &mut self,
        charset: Option<&Charset<'_>>,
        criteria: &SearchKey<'_>,
        uid: bool,
    ) -> Result<Vec<u32>, Outcome> {
        if let Some(cs) = charset {
            let cs = cs.as_ref();
            if !cs.eq_ignore_ascii_case("UTF-8") && !cs.eq_ignore_ascii_case("US-ASCII") {
                // Under UTF8=ACCEPT every string is UTF-8, so another label
                // contradicts it: BAD (RFC 9755 §3). A redundant `CHARSET UTF-8`
                // is taken, as clients written for both modes send it.
                if self.utf8 {
                    return Err(Outcome::bad("Strings are UTF-8 once UTF8=ACCEPT is enabled"));
                }
                return Err(Outcome::no("[BADCHARSET (UTF-8 US-ASCII)] Unsupported charset"));
            }
        }
        // Brought up to date first: flag criteria are answered from the session's
        // flag map, which must be as current as a query would be. EXPUNGE is only
        // announced for UID SEARCH (RFC 3501 §7.4.1); messages expunged elsewhere
        // and not yet announced match nothing.
        if let Err(e) = self.sync(uid).await {
            return Err(store_error(e));
        }
        let Some(sel) = self.selected.as_ref() else { return Err(Outcome::bad("No mailbox selected")) };
        let mailbox_id = sel.mailbox.id;
        let recent = sel.recent.clone();
        let bounds = Bounds::new(sel.uids.len() as u32, sel.max_uid(), criteria);
        let gone = |uid: &u32| sel.pending_expunge.contains(uid);
        let mut hits: Vec<u32> = Vec::new(); // UIDs

        let (mut with, mut without) = (Flags::NONE, Flags::NONE);
        let (mut need_meta, mut need_raw) = (false, false);
        needs(criteria, &mut need_meta, &mut need_raw);
        if flag_only(criteria, &mut with, &mut without) {
            for (&uid, &f) in sel.uids.iter().zip(&sel.flags) {
                if f.contains(with) && f.0 & without.0 == 0 && !gone(&uid) {
                    hits.push(uid);
                }
            }
        } else if !need_meta && !need_raw {
            for (pos, (&uid, &system)) in sel.uids.iter().zip(&sel.flags).enumerate() {
                let c = Candidate {
                    seq: pos as u32 + 1,
                    uid,
                    system,
                    recent: recent.contains(uid),
                    keywords: sel.keywords_of(uid),
                    internal_date: None,
                    meta: None,
                    raw: None,
                };
                if !gone(&uid) && eval(criteria, &c, &bounds) {
                    hits.push(uid);
                }
            }
        } else if !sel.uids.is_empty() {
            let known = sel.uids.clone();
            let store = self.app.store.clone();
            let rows = match store.messages_by_uid(mailbox_id, &UidSet::from_uids(&known)).await {
                Ok(r) => r,
                Err(e) => return Err(store_error(e)),
            };
            for row in &rows {
                let Ok(pos) = known.binary_search(&row.uid) else { continue };
                let raw = if need_raw {
                    match store.message_body(row.message_id).await {
                        Ok(b) => Some(b),
                        Err(e) => return Err(store_error(e)),
                    }
                } else {
                    None
                };
                let c = Candidate {
                    seq: pos as u32 + 1,
                    uid: row.uid,
                    system: row.flags.system,
                    recent: recent.contains(row.uid),
                    keywords: &row.flags.keywords,
                    internal_date: Some(row.internal_date),
                    meta: Some(&row.meta),
                    raw: raw.as_deref(),
                };
                if eval(criteria, &c, &bounds) {
                    hits.push(row.uid);
                }
            }
        }
        // Ascending already: every path walks the mailbox (or its rows) by UID.
        Ok(hits)
    }
}

/// What SEARCH RETURN (SAVE …) keeps as `$`: every match, or with MIN and/or MAX
/// but neither ALL nor COUNT, just those (RFC 5182 §2.4).
fn saved_result(hits: &[u32], options: &[ReturnOption]) -> Vec<u32> {
    let only_ends = !options.contains(&ReturnOption::All)
        && !options.contains(&ReturnOption::Count)
        && (options.contains(&ReturnOption::Min) || options.contains(&ReturnOption::Max));
    if !only_ends {
        return hits.to_vec();
    }
    let mut out = Vec::new();
    if options.contains(&ReturnOption::Min) {
        out.extend(hits.first());
    }
    if options.contains(&ReturnOption::Max) {
        out.extend(hits.last());
    }
    out.dedup();
    out
}

/// `* SEARCH 2 3 5` (`head` and the numbers).
pub(crate) fn numbers_line(head: &str, numbers: &[u32]) -> String {
    // itoa, not `write!`: formatting a thousand numbers per UNSEEN search through
    // core::fmt was 6 % of the server's CPU (bench/imap.sh profile), and 11 % of
    // it when sorting 10,000 messages (bench/imap-sort.sh profile).
    let mut line = String::with_capacity(head.len() + numbers.len() * 7);
    line.push_str(head);
    let mut digits = itoa::Buffer::new();
    for &n in numbers {
        line.push(' ');
        line.push_str(digits.format(n));
    }
    line
}

/// `* ESEARCH (TAG "a") [UID] MIN … MAX … COUNT … ALL …`, the items `options`
/// asks for (none means ALL); MIN, MAX and ALL are left out when nothing matched.
pub(crate) fn esearch_line(tag: &str, options: &[ReturnOption], uid: bool, numbers: &[u32]) -> String {
    let mut line = format!("* ESEARCH (TAG \"{tag}\")");
    if uid {
        line.push_str(" UID");
    }
    // No option but SAVE (or none at all) asks for ALL (RFC 4731 §3.1).
    let only_save = options.iter().all(|o| *o == ReturnOption::Save);
    let wants = |o: ReturnOption| only_save && o == ReturnOption::All || options.contains(&o);
    if let (true, Some(min)) = (wants(ReturnOption::Min), numbers.first()) {
        line.push_str(&format!(" MIN {min}"));
    }
    if let (true, Some(max)) = (wants(ReturnOption::Max), numbers.last()) {
        line.push_str(&format!(" MAX {max}"));
    }
    if wants(ReturnOption::Count) {
        line.push_str(&format!(" COUNT {}", numbers.len()));
    }
    if wants(ReturnOption::All) && !numbers.is_empty() {
        line.push_str(" ALL ");
        line.push_str(&encode::sequence_set(numbers));
    }
    line
}
