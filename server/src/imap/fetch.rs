//! FETCH and UID FETCH.
//!
//! Three cost levels, chosen from what the client asks for:
//! - FLAGS/UID only → `store.flags_by_uid` (no metadata, no body);
//! - ENVELOPE, BODYSTRUCTURE, sizes, dates → `store.messages_by_uid` (the
//!   pre-rendered metadata, still no body);
//! - any body section → additionally `store.message_body` per message, and the
//!   section is a byte slice located by the stored part offsets.

use std::borrow::Cow;
use std::fmt::Write as _;

use imap_codec::imap_types::core::AString;
use imap_codec::imap_types::fetch::{MacroOrMessageDataItemNames, MessageDataItemName, Part, Section};
use imap_codec::imap_types::sequence::SequenceSet;

use super::session::{Outcome, Session, store_error};
use crate::message::find_header_end;
use crate::proto::imap::encode;
use crate::proto::imap::parse::SeqSet;
use crate::store::{FlagOp, FlagSet, Flags, MessageMeta, UidSet};

/// Output is flushed to the client whenever this much is queued, so a large FETCH
/// streams instead of building one huge buffer.
const FLUSH_AT: usize = 256 * 1024;

impl Session {
    pub(crate) async fn cmd_fetch(
        &mut self,
        set: &SequenceSet,
        items: MacroOrMessageDataItemNames<'_>,
        uid: bool,
    ) -> Outcome {
        let mut items: Vec<MessageDataItemName<'_>> = match items {
            MacroOrMessageDataItemNames::Macro(m) => m.expand().into_iter().map(static_item).collect(),
            MacroOrMessageDataItemNames::MessageDataItemNames(v) => v,
        };
        if uid && !items.contains(&MessageDataItemName::Uid) {
            items.insert(0, MessageDataItemName::Uid);
        }
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        let Some(uids) = sel.resolve(&SeqSet::from_codec(set), uid) else {
            return Outcome::bad("Invalid sequence number");
        };
        let (mailbox_id, read_only) = (sel.mailbox.id, sel.read_only);
        use MessageDataItemName as I;
        let needs_meta = items.iter().any(|i| !matches!(i, I::Flags | I::Uid));
        let needs_body = items
            .iter()
            .any(|i| matches!(i, I::BodyExt { .. } | I::Rfc822 | I::Rfc822Header | I::Rfc822Text));
        let sets_seen = !read_only
            && items.iter().any(|i| matches!(i, I::BodyExt { peek: false, .. } | I::Rfc822 | I::Rfc822Text));
        let store = self.app.store.clone();

        if !uids.is_empty() {
            let uid_set = UidSet::from_uids(&uids);
            // \Seen first, so the FLAGS we report are the new ones.
            let mut seen_changed: Vec<u32> = Vec::new();
            if sets_seen {
                let seen = FlagSet { system: Flags::SEEN, keywords: Vec::new() };
                match store.store_flags(mailbox_id, &uid_set, FlagOp::Add, &seen).await {
                    Ok(rows) => seen_changed = rows.iter().map(|r| r.uid).collect(),
                    Err(e) => return store_error(e),
                }
                if let Some(last) = seen_changed.last() {
                    let _ = last;
                    let modseq =
                        store.mailbox_status(mailbox_id).await.map(|s| s.highest_modseq).unwrap_or_default();
                    self.notify(mailbox_id, modseq).await;
                }
            }
            if needs_meta {
                let rows = match store.messages_by_uid(mailbox_id, &uid_set).await {
                    Ok(r) => r,
                    Err(e) => return store_error(e),
                };
                for row in rows {
                    self.announce_keywords(&row.flags);
                    let Some(seq) = self.selected.as_ref().and_then(|s| s.seq_of(row.uid)) else { continue };
                    let body = if needs_body {
                        match store.message_body(row.message_id).await {
                            Ok(b) => Some(b),
                            Err(e) => return store_error(e),
                        }
                    } else {
                        None
                    };
                    let mut line = format!("* {seq} FETCH (").into_bytes();
                    let mut first = true;
                    let mut flags_sent = false;
                    for item in &items {
                        if !first {
                            line.push(b' ');
                        }
                        first = false;
                        match item {
                            I::Uid => {
                                let _ = write!(Bytes(&mut line), "UID {}", row.uid);
                            }
                            I::Flags => {
                                flags_sent = true;
                                let _ = write!(Bytes(&mut line), "FLAGS {}", encode::flag_list(&row.flags));
                            }
                            I::InternalDate => {
                                let _ = write!(
                                    Bytes(&mut line),
                                    "INTERNALDATE {}",
                                    encode::internal_date(&row.internal_date)
                                );
                            }
                            I::Rfc822Size => {
                                let _ = write!(Bytes(&mut line), "RFC822.SIZE {}", row.meta.size);
                            }
                            I::Envelope => {
                                let _ = write!(Bytes(&mut line), "ENVELOPE {}", row.meta.envelope);
                            }
                            I::Body => {
                                let _ = write!(Bytes(&mut line), "BODY {}", row.meta.body);
                            }
                            I::BodyStructure => {
                                let _ = write!(Bytes(&mut line), "BODYSTRUCTURE {}", row.meta.body_structure);
                            }
                            I::Rfc822 | I::Rfc822Header | I::Rfc822Text | I::BodyExt { .. } => {
                                let raw = body.as_deref().unwrap_or_default();
                                let (label, data) = match item {
                                    I::Rfc822 => ("RFC822".to_string(), Cow::Borrowed(raw)),
                                    I::Rfc822Header => {
                                        ("RFC822.HEADER".to_string(), Cow::Borrowed(header(raw, &row.meta)))
                                    }
                                    I::Rfc822Text => {
                                        ("RFC822.TEXT".to_string(), Cow::Borrowed(text(raw, &row.meta)))
                                    }
                                    I::BodyExt { section, partial, .. } => {
                                        let (spec, data) = section_bytes(raw, &row.meta, section.as_ref());
                                        match partial {
                                            Some((offset, len)) => {
                                                let start = (*offset as usize).min(data.len());
                                                let end =
                                                    start.saturating_add(len.get() as usize).min(data.len());
                                                let sliced = match data {
                                                    Cow::Borrowed(d) => Cow::Borrowed(&d[start..end]),
                                                    Cow::Owned(d) => Cow::Owned(d[start..end].to_vec()),
                                                };
                                                (format!("BODY[{spec}]<{offset}>"), sliced)
                                            }
                                            None => (format!("BODY[{spec}]"), data),
                                        }
                                    }
                                    _ => continue,
                                };
                                let _ = write!(Bytes(&mut line), "{label} {{{}}}\r\n", data.len());
                                line.extend_from_slice(&data);
                            }
                        }
                    }
                    if !flags_sent && seen_changed.binary_search(&row.uid).is_ok() {
                        let _ = write!(Bytes(&mut line), " FLAGS {}", encode::flag_list(&row.flags));
                    }
                    line.extend_from_slice(b")\r\n");
                    self.out.extend_from_slice(&line);
                    if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
                        return Outcome::no("[UNAVAILABLE] Connection lost");
                    }
                }
            } else {
                let rows = match store.flags_by_uid(mailbox_id, &uid_set).await {
                    Ok(r) => r,
                    Err(e) => return store_error(e),
                };
                for row in rows {
                    self.announce_keywords(&row.flags);
                    let Some(seq) = self.selected.as_ref().and_then(|s| s.seq_of(row.uid)) else { continue };
                    let mut parts = Vec::with_capacity(2);
                    for item in &items {
                        match item {
                            I::Uid => parts.push(format!("UID {}", row.uid)),
                            I::Flags => parts.push(format!("FLAGS {}", encode::flag_list(&row.flags))),
                            _ => {}
                        }
                    }
                    self.push(&format!("* {seq} FETCH ({})", parts.join(" ")));
                    if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
                        return Outcome::no("[UNAVAILABLE] Connection lost");
                    }
                }
            }
        }
        if let Err(e) = self.sync(uid).await {
            return store_error(e);
        }
        Outcome::ok(if uid { "UID FETCH completed" } else { "FETCH completed" })
    }

    /// Sends FLAGS/PERMANENTFLAGS before the first response that uses a keyword
    /// the client has not been told about.
    pub(crate) fn announce_keywords(&mut self, flags: &FlagSet) {
        let Some(sel) = self.selected.as_mut() else { return };
        if flags.keywords.is_empty() || !sel.learn_keywords(flags.keywords.iter()) {
            return;
        }
        for line in sel.flags_lines() {
            self.push(&line);
        }
    }
}

/// Macro expansions only contain plain items; rebuilt so they outlive the macro.
fn static_item(item: MessageDataItemName<'_>) -> MessageDataItemName<'static> {
    use MessageDataItemName as I;
    match item {
        I::Flags => I::Flags,
        I::InternalDate => I::InternalDate,
        I::Rfc822Size => I::Rfc822Size,
        I::Envelope => I::Envelope,
        I::Body => I::Body,
        _ => I::Uid,
    }
}

/// `write!` into a byte buffer.
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

fn header<'a>(raw: &'a [u8], meta: &MessageMeta) -> &'a [u8] {
    &raw[..(meta.header_size as usize).min(raw.len())]
}

fn text<'a>(raw: &'a [u8], meta: &MessageMeta) -> &'a [u8] {
    &raw[(meta.header_size as usize).min(raw.len())..]
}

fn path_of(part: &Part) -> Vec<u32> {
    part.0.as_ref().iter().map(|n| n.get()).collect()
}

fn path_label(part: &Part) -> String {
    path_of(part).iter().map(u32::to_string).collect::<Vec<_>>().join(".")
}

/// The bytes of a part's body by section path; empty when there is no such part.
fn part_body<'a>(raw: &'a [u8], meta: &MessageMeta, path: &[u32]) -> &'a [u8] {
    match meta.parts.iter().find(|p| p.path == path) {
        Some(p) => raw.get(p.body_start as usize..p.body_end as usize).unwrap_or_default(),
        // A message stored before part offsets existed, or `BODY[1]` of a
        // single-part message described without parts: the body is part 1.
        None if path == [1] && meta.parts.is_empty() => text(raw, meta),
        None => &[],
    }
}

/// `(section text, bytes)` for `BODY[section]`.
pub fn section_bytes<'a>(
    raw: &'a [u8],
    meta: &MessageMeta,
    section: Option<&Section<'_>>,
) -> (String, Cow<'a, [u8]>) {
    // For HEADER/TEXT/HEADER.FIELDS of a part: the part must be message/rfc822 and
    // the section applies to the embedded message.
    let embedded = |part: &Option<Part>| -> (&'a [u8], usize) {
        match part {
            None => (raw, (meta.header_size as usize).min(raw.len())),
            Some(p) => {
                let path = path_of(p);
                match meta.parts.iter().find(|i| i.path == path && i.is_message) {
                    Some(info) => {
                        let inner =
                            raw.get(info.body_start as usize..info.body_end as usize).unwrap_or_default();
                        (inner, find_header_end(inner).unwrap_or(inner.len()))
                    }
                    None => (&[], 0),
                }
            }
        }
    };
    let prefix =
        |part: &Option<Part>| part.as_ref().map(|p| format!("{}.", path_label(p))).unwrap_or_default();
    match section {
        None => (String::new(), Cow::Borrowed(raw)),
        Some(Section::Part(p)) => (path_label(p), Cow::Borrowed(part_body(raw, meta, &path_of(p)))),
        Some(Section::Mime(p)) => {
            let path = path_of(p);
            let data = match meta.parts.iter().find(|i| i.path == path) {
                Some(i) => raw.get(i.header_start as usize..i.body_start as usize).unwrap_or_default(),
                None => &[],
            };
            (format!("{}.MIME", path_label(p)), Cow::Borrowed(data))
        }
        Some(Section::Header(part)) => {
            let (msg, end) = embedded(part);
            (format!("{}HEADER", prefix(part)), Cow::Borrowed(&msg[..end]))
        }
        Some(Section::Text(part)) => {
            let (msg, end) = embedded(part);
            (format!("{}TEXT", prefix(part)), Cow::Borrowed(&msg[end..]))
        }
        Some(Section::HeaderFields(part, names)) | Some(Section::HeaderFieldsNot(part, names)) => {
            let not = matches!(section, Some(Section::HeaderFieldsNot(..)));
            let (msg, end) = embedded(part);
            let names: Vec<&[u8]> = names.as_ref().iter().map(|n: &AString<'_>| n.as_ref()).collect();
            let label_names: Vec<String> =
                names.iter().map(|n| String::from_utf8_lossy(n).to_ascii_uppercase()).collect();
            let data = header_fields(&msg[..end], &names, not);
            let kind = if not { "HEADER.FIELDS.NOT" } else { "HEADER.FIELDS" };
            (format!("{}{kind} ({})", prefix(part), label_names.join(" ")), Cow::Owned(data))
        }
    }
}

/// The header fields of `header` whose names are (or, with `not`, are not) in
/// `names`, followed by the blank line (RFC 3501 §6.4.5).
pub fn header_fields(header: &[u8], names: &[&[u8]], not: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut include = false;
    for line in header.split_inclusive(|&b| b == b'\n') {
        if line == b"\r\n" || line == b"\n" {
            break;
        }
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            // A continuation line follows its field's fate.
            if include {
                out.extend_from_slice(line);
            }
            continue;
        }
        let name = line.split(|&b| b == b':').next().unwrap_or_default().trim_ascii();
        let listed = names.iter().any(|n| n.eq_ignore_ascii_case(name));
        include = listed != not;
        if include {
            out.extend_from_slice(line);
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_field_selection() {
        let h = b"From: a@b\r\nSubject: hi\r\n there\r\nTo: c@d\r\n\r\n";
        assert_eq!(header_fields(h, &[b"subject"], false), b"Subject: hi\r\n there\r\n\r\n");
        assert_eq!(header_fields(h, &[b"SUBJECT"], true), b"From: a@b\r\nTo: c@d\r\n\r\n");
        assert_eq!(header_fields(h, &[b"X-None"], false), b"\r\n");
    }
}
