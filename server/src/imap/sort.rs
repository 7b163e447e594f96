//! SORT (RFC 5256 §3): the messages a search matches, ordered by keys of their
//! headers and metadata, ties in mailbox order.

use std::cmp::Ordering;
use std::fmt::Write as _;

use imap_codec::imap_types::core::Charset;
use imap_codec::imap_types::search::SearchKey;

use super::session::{Outcome, Session, store_error};
use crate::proto::imap::parse::{SortKey, SortKind};
use std::sync::Arc;

use super::sort_cache::SortKeys;
use crate::store::UidSet;

impl Session {
    /// `rows`: what the search matched ([`Session::matching_rows`]).
    pub(crate) fn cmd_sort(&mut self, keys: &[SortKey], mut rows: Vec<Arc<SortKeys>>, uid: bool) -> Outcome {
        // Compared in place, field by field: no key is copied out of the cache, so a
        // sort of n messages allocates nothing per message.
        rows.sort_by(|a, b| {
            keys.iter()
                .map(|k| {
                    let o = compare(k.kind, a, b);
                    if k.reverse { o.reverse() } else { o }
                })
                .find(|o| o.is_ne())
                // Equal by every key: mailbox order (UIDs ascend with it).
                .unwrap_or_else(|| a.uid.cmp(&b.uid))
        });
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        let mut line = String::with_capacity(8 + rows.len() * 7);
        line.push_str("* SORT");
        for row in &rows {
            // Expunged here meanwhile: not in this session's view any more.
            let u = row.uid;
            let Some(n) = (if uid { sel.seq_of(u).map(|_| u) } else { sel.seq_of(u) }) else { continue };
            let _ = write!(line, " {n}");
        }
        self.push(&line);
        Outcome::ok(if uid { "UID SORT completed" } else { "SORT completed" })
    }
}

impl Session {
    /// The sort keys of the messages `criteria` matches, ascending by UID: from the
    /// process's sort cache, the missing ones read from the store and added to it.
    pub(crate) async fn matching_rows(
        &mut self,
        charset: Option<&Charset<'_>>,
        criteria: &SearchKey<'_>,
        uid: bool,
    ) -> Result<Vec<Arc<SortKeys>>, Outcome> {
        let hits = self.search_hits(charset, criteria, uid).await?;
        let Some(mailbox) = self.selected.as_ref().map(|s| (s.mailbox.id, s.mailbox.uid_validity)) else {
            return Err(Outcome::bad("No mailbox selected"));
        };
        let cache = &self.shared.reads.sort_cache;
        let mut keys = cache.get(mailbox, &hits);
        let missing: Vec<u32> =
            hits.iter().zip(&keys).filter(|(_, k)| k.is_none()).map(|(u, _)| *u).collect();
        if !missing.is_empty() {
            let rows = self
                .app
                .store
                .sort_rows(mailbox.0, &UidSet::from_uids(&missing))
                .await
                .map_err(store_error)?;
            let read: Vec<Arc<SortKeys>> = rows.iter().map(|r| Arc::new(SortKeys::of(r))).collect();
            cache.put(mailbox, &read);
            let by_uid: std::collections::HashMap<u32, Arc<SortKeys>> =
                read.into_iter().map(|k| (k.uid, k)).collect();
            for (u, k) in hits.iter().zip(keys.iter_mut()) {
                if k.is_none() {
                    *k = by_uid.get(u).cloned();
                }
            }
        }
        // A message expunged between the search and the read has no keys: left out.
        Ok(keys.into_iter().flatten().collect())
    }
}

/// One sort key of two messages, in ascending order. Times and numbers compare
/// as such; text keys are stored ASCII upper-cased, so byte order is
/// i;ascii-casemap (RFC 5256 §2.2).
fn compare(kind: SortKind, a: &SortKeys, b: &SortKeys) -> Ordering {
    match kind {
        SortKind::Arrival => a.arrival.cmp(&b.arrival),
        SortKind::Date => a.sent.cmp(&b.sent),
        SortKind::Size => a.size.cmp(&b.size),
        SortKind::Subject => a.subject.as_bytes().cmp(b.subject.as_bytes()),
        SortKind::From => a.from.as_bytes().cmp(b.from.as_bytes()),
        SortKind::To => a.to.as_bytes().cmp(b.to.as_bytes()),
        SortKind::Cc => a.cc.as_bytes().cmp(b.cc.as_bytes()),
    }
}

/// The local part (addr-mailbox) of the first address of a header summary
/// (`Name <local@domain>, …`); empty when there is none.
pub(crate) fn first_mailbox(summary: &str) -> &str {
    let address = match summary.find('<') {
        Some(open) => summary[open + 1..].split('>').next().unwrap_or(""),
        None => summary.split(',').next().unwrap_or("").trim(),
    };
    address.rsplit_once('@').map_or(address, |(local, _)| local)
}

/// The base subject (RFC 5256 §2.1): whitespace runs made single spaces, and the
/// `Re:`/`Fw:`/`Fwd:` leaders, `[blob]`s, `(fwd)` trailers and `[fwd: …]` wrappers
/// that replies and forwards add taken away, until none is left.
///
/// Also whether a reply or forward marker was taken away (THREAD REFERENCES
/// prefers a thread's original message over replies to it).
pub fn base_subject_of(subject: &str) -> (String, bool) {
    let mut reply = false;
    let mut s: String = subject.split_whitespace().collect::<Vec<_>>().join(" ");
    loop {
        // (2) trailers
        loop {
            let t = s.trim_end();
            if t.len() >= 5 && t[t.len() - 5..].eq_ignore_ascii_case("(fwd)") {
                s = t[..t.len() - 5].to_string();
                reply = true;
            } else {
                s = t.to_string();
                break;
            }
        }
        // (3)-(5) leaders and blobs
        loop {
            let before = s.len();
            s = s.trim_start().to_string();
            if let Some(rest) = strip_leader(&s) {
                s = rest.to_string();
                reply = true;
            } else if let Some(rest) = strip_blob(&s)
                && !rest.trim().is_empty()
            {
                s = rest.to_string();
            }
            if s.len() == before {
                break;
            }
        }
        // (6) a forward wrapper
        if s.len() >= 6 && s[..5].eq_ignore_ascii_case("[fwd:") && s.ends_with(']') {
            s = s[5..s.len() - 1].to_string();
            reply = true;
            continue;
        }
        return (s, reply);
    }
}

/// `*subj-blob subj-refwd`: blobs, then `re`/`fw`/`fwd`, optional spaces, an
/// optional blob, and `:`. The rest of the subject after it, if there is one.
fn strip_leader(s: &str) -> Option<&str> {
    let mut rest = s;
    while let Some(r) = strip_blob(rest) {
        rest = r;
    }
    let lower = rest.get(..3).map(str::to_ascii_lowercase).unwrap_or_default();
    rest = if lower == "fwd" {
        &rest[3..]
    } else if lower.starts_with("re") || lower.starts_with("fw") {
        &rest[2..]
    } else {
        return None;
    };
    rest = rest.trim_start();
    if let Some(r) = strip_blob(rest) {
        rest = r;
    }
    rest.strip_prefix(':')
}

/// `"[" *BLOBCHAR "]" *WSP` at the start: the rest after it.
fn strip_blob(s: &str) -> Option<&str> {
    let inner = s.strip_prefix('[')?;
    let close = inner.find(']')?;
    if inner[..close].contains('[') {
        return None;
    }
    Some(inner[close + 1..].trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_subjects_per_rfc5256() {
        for (subject, base) in [
            ("Hello", "Hello"),
            ("Re: Hello", "Hello"),
            ("RE: re: Fwd: Hello", "Hello"),
            ("Re: [mailcluster] Hello", "Hello"),
            ("[mailcluster] Re: Hello", "Hello"),
            ("Re [2]: Hello", "Hello"),
            ("Fw:  Hello   world (fwd)", "Hello world"),
            ("Hello (fwd) (FWD)", "Hello"),
            ("[Fwd: Re: Hello]", "Hello"),
            ("[only a blob]", "[only a blob]"),
            ("Re:", ""),
            ("Reply to all", "Reply to all"),
            ("Fwd", "Fwd"),
            ("", ""),
        ] {
            assert_eq!(base_subject_of(subject).0, base, "{subject:?}");
        }
    }

    #[test]
    fn first_mailbox_is_the_local_part_of_the_first_address() {
        assert_eq!(first_mailbox("Alice <alice@example.com>, bob@example.org"), "alice");
        assert_eq!(first_mailbox("\"Doe, John\" <john@example.com>"), "john");
        assert_eq!(first_mailbox("bob@example.org, carol@example.org"), "bob");
        assert_eq!(first_mailbox(""), "");
    }
}
