//! FETCH and UID FETCH.
//!
//! Cost levels, chosen from what the client asks for:
//! - FLAGS/UID only → the session's flag map (no query);
//! - whole messages and top-level sections (`BODY[]`, `BODY[HEADER]`, `RFC822*`)
//!   → the message links, batched with other sessions' FETCHes, and the bodies
//!   from the per-process body cache ([`crate::view::bodies`]);
//! - ENVELOPE, BODYSTRUCTURE, sizes, dates → the pre-rendered metadata, from the
//!   per-process metadata cache ([`crate::view::meta_cache`]) or `store.messages_by_uid`,
//!   with flags from the session's view; plus the bodies as above when a section
//!   inside a MIME part is asked for: a byte slice located by the stored part
//!   offsets.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use imap_codec::imap_types::core::AString;
use imap_codec::imap_types::fetch::{MacroOrMessageDataItemNames, MessageDataItemName, Part, Section};
use imap_codec::imap_types::sequence::SequenceSet;

use super::session::{Outcome, Session, store_error};
use crate::net::output::Output;
use crate::proto::imap::encode;
use crate::proto::imap::parse::{BinaryItem, FetchExtension, SeqSet};
use crate::view::meta_cache::CachedMeta;
use mailcluster_model::message::find_header_end;
use mailcluster_model::{FlagOp, FlagSet, Flags, MessageMeta, UidSet};

/// Output is flushed to the client whenever this much is queued, so a large FETCH
/// streams instead of building one huge buffer.
const FLUSH_AT: usize = 256 * 1024;

/// Whole messages are loaded this many at a time: one round trip for the usual
/// single-message FETCH, and a bound on the bodies held for `1:* BODY[]`.
const FETCH_BATCH: usize = 8;

impl Session {
    pub(crate) async fn cmd_fetch(
        &mut self,
        set: &SequenceSet,
        items: MacroOrMessageDataItemNames<'_>,
        uid: bool,
        ext: FetchExtension,
        mut binary: Vec<Option<BinaryItem>>,
    ) -> Outcome {
        let mut items: Vec<MessageDataItemName<'_>> = match items {
            MacroOrMessageDataItemNames::Macro(m) => m.expand().into_iter().map(static_item).collect(),
            MacroOrMessageDataItemNames::MessageDataItemNames(v) => v,
        };
        if ext.only_extension && !uid {
            items.clear();
        }
        if uid && !items.contains(&MessageDataItemName::Uid) {
            items.insert(0, MessageDataItemName::Uid);
            if !binary.is_empty() {
                binary.insert(0, None);
            }
        }
        // One entry per item from here on (none at all without BINARY items).
        if !binary.is_empty() {
            binary.resize(items.len(), None);
        }
        let Some(read_only) = self.selected.as_ref().map(|s| s.read_only) else {
            return Outcome::bad("No mailbox selected");
        };
        let FetchPlan { source, needs_body, sets_seen } = FetchPlan::of(&items, read_only, ext.email_id);
        let from_bodies = source == FetchSource::Bodies;
        // Brought up to date first (without EXPUNGE, RFC 3501 §7.4.1): FLAGS are
        // answered from the session's flag map. The body query reports the
        // mailbox's modseq from its own snapshot, so when it is used the sync waits
        // for that answer and is skipped when nothing changed: one round trip for
        // `UID FETCH n BODY.PEEK[]` instead of two.
        let mut synced = false;
        // A message still in this session's view whose body another session's
        // EXPUNGE removed between our reads: its content cannot be served, and an
        // empty or different value would be cached by the client as that UID's
        // content for ever. It gets no FETCH line and the command says why.
        let mut expunge_issued = false;
        // MODSEQ and CHANGEDSINCE are answered from the session's map: current first.
        if !from_bodies || sets_seen || ext.item {
            if let Err(e) = self.sync(false).await {
                return store_error(e);
            }
            synced = true;
        }
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        let Some(mut uids) = sel.resolve(&SeqSet::from_codec(set), uid) else {
            return Outcome::bad("Invalid sequence number");
        };
        let mailbox_id = sel.mailbox.id;
        if let Some(since) = ext.changed_since {
            // CHANGEDSINCE (RFC 7162 §3.1.4.1): only what changed after `since`;
            // VANISHED (§3.2.6) first tells which UIDs of the set were expunged.
            if ext.vanished {
                let changes = match self.app.store.changes_since(mailbox_id, since).await {
                    Ok(c) => c,
                    Err(e) => return store_error(e),
                };
                let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
                let gone = sel.vanished_in(&changes, Some(&SeqSet::from_codec(set)));
                if !gone.is_empty() {
                    self.push(&format!("* VANISHED (EARLIER) {}", encode::uid_ranges(&gone)));
                }
            }
            let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
            uids.retain(|&u| sel.modseq_of(u).is_some_and(|m| m > since));
        }
        if uids.is_empty()
            && !synced
            && let Err(e) = self.sync(false).await
        {
            return store_error(e);
        }
        let store = self.app.store.clone();

        if !uids.is_empty() {
            // \Seen first, so the FLAGS we report are the new ones.
            let mut seen_changed: Vec<u32> = Vec::new();
            if sets_seen {
                let seen = FlagSet { system: Flags::SEEN, keywords: Vec::new() };
                let rows = match store
                    .store_flags(mailbox_id, &UidSet::from_uids(&uids), FlagOp::Add, &seen)
                    .await
                {
                    Ok(rows) => rows,
                    Err(e) => return store_error(e),
                };
                seen_changed = rows.iter().map(|r| r.uid).collect();
                if let Some(modseq) = rows.iter().map(|r| r.modseq).max() {
                    if let Some(sel) = self.selected.as_mut() {
                        // Answered in this FETCH; not again at the next sync.
                        sel.own_changes.extend(rows.iter().map(|r| (r.uid, r.modseq)));
                        for r in &rows {
                            sel.set_flags(r);
                        }
                    }
                    self.notify(mailbox_id, modseq).await;
                }
            }
            let mut run = FetchRun {
                mailbox_id,
                items: &items,
                binary: &binary,
                needs_body,
                modseq: ext.item,
                email_id: ext.email_id,
                thread_id: ext.thread_id,
                seen_changed,
                synced,
                expunge_issued: false,
                unknown_cte: false,
            };
            let written = match source {
                FetchSource::Bodies => self.fetch_from_bodies(&mut run, &uids).await,
                FetchSource::Metadata => self.fetch_from_metadata(&mut run, &uids).await,
                FetchSource::FlagMap => self.fetch_from_flag_map(&run, &uids).await,
            };
            if let Err(o) = written {
                return o;
            }
            expunge_issued = run.expunge_issued;
            if run.unknown_cte {
                // RFC 3516 §4.2: the command fails; the messages whose section
                // could not be decoded got no FETCH line.
                return Outcome::no("[UNKNOWN-CTE] A section's content-transfer-encoding cannot be decoded");
            }
        }
        if uid {
            // UID FETCH may announce EXPUNGE (RFC 3501 §7.4.1); no second round trip.
            let vanished = self.qresync;
            let lines = self.selected.as_mut().map(|s| s.take_pending_expunges(vanished)).unwrap_or_default();
            for l in lines {
                self.push(&l);
            }
        }
        if expunge_issued {
            // RFC 5530; the EXPUNGE itself reaches the client at its next command.
            return Outcome::no("[EXPUNGEISSUED] Some of the requested messages no longer exist");
        }
        Outcome::ok(if uid { "UID FETCH completed" } else { "FETCH completed" })
    }

    /// Whole messages and top-level sections: links a few messages at a time,
    /// read together with other sessions' (see `bodies`), and their bodies; memory
    /// stays bounded by FETCH_BATCH bodies.
    async fn fetch_from_bodies(&mut self, run: &mut FetchRun<'_, '_>, uids: &[u32]) -> Result<(), Outcome> {
        // Links of a few messages at a time, read together with other
        // sessions' (see `bodies`); memory stays bounded by FETCH_BATCH bodies.
        let shared = self.shared.clone();
        for chunk in uids.chunks(FETCH_BATCH) {
            let found = match shared.reads.bodies.links(run.mailbox_id, chunk).await {
                Ok(r) => r,
                Err(e) => return Err(store_error(e)),
            };
            if !run.synced {
                run.synced = true;
                let known = self.selected.as_ref().map(|s| s.modseq);
                if (found.highest_modseq.is_none() || found.highest_modseq != known)
                    && let Err(e) = self.sync_changes(false).await
                {
                    return Err(store_error(e));
                }
            }
            let ids: Vec<_> = found.links.iter().map(|l| (l.message_id, l.internal_date)).collect();
            let bodies = match shared.reads.bodies.bodies(&ids).await {
                Ok(b) => b,
                Err(e) => return Err(store_error(e)),
            };
            for (link, stored) in found.links.iter().zip(bodies) {
                self.announce_keywords(&link.flags);
                let Some(seq) = self.selected.as_ref().and_then(|s| s.seq_of(link.uid)) else {
                    continue;
                };
                // Linked when the links were read; gone since (expunged and
                // its body removed by another session in between).
                let Some(stored) = stored else {
                    run.expunge_issued = true;
                    continue;
                };
                let meta = MessageMeta {
                    size: stored.body.len() as u32,
                    header_size: stored.header_size,
                    ..MessageMeta::default()
                };
                let message = Message {
                    uid: link.uid,
                    modseq: self.modseq_item(link.uid, run.modseq),
                    email_id: run.email_id.then_some(link.message_id),
                    thread_id: run.thread_id,
                    flags: &link.flags,
                    recent: self.is_recent(link.uid),
                    internal_date: &link.internal_date,
                    meta: &meta,
                    body: Some(&stored.body),
                };
                let seen = run.seen_changed.binary_search(&link.uid).is_ok();
                run.unknown_cte |= fetch_line(&mut self.out, seq, run.items, run.binary, &message, seen);
                if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
                    return Err(Outcome::no("[UNAVAILABLE] Connection lost"));
                }
            }
        }
        Ok(())
    }

    /// ENVELOPE, BODYSTRUCTURE, sections inside parts: the stored metadata (from
    /// the process's metadata cache, the store for what it lacks), flags from the
    /// session's view (synced just before), and bodies a FETCH_BATCH at a time when
    /// asked for.
    async fn fetch_from_metadata(&mut self, run: &mut FetchRun<'_, '_>, uids: &[u32]) -> Result<(), Outcome> {
        let Some(uid_validity) = self.selected.as_ref().map(|s| s.mailbox.uid_validity) else {
            return Err(Outcome::bad("No mailbox selected"));
        };
        let metas = self.metadata(run.mailbox_id, uid_validity, uids).await?;
        if metas.len() < uids.len() {
            // In this session's view, gone from the store (expunged by another
            // session, not yet announced): no data for them, and the command says
            // why (RFC 5530), rather than a silent OK.
            run.expunge_issued = true;
        }
        // Bodies a FETCH_BATCH at a time: memory stays bounded for `1:* BODY[]`.
        for batch in metas.chunks(FETCH_BATCH) {
            let bodies = if run.needs_body {
                let ids: Vec<_> = batch.iter().map(|(_, m)| (m.message_id, m.internal_date)).collect();
                match self.shared.reads.bodies.bodies(&ids).await {
                    Ok(b) => b,
                    Err(e) => return Err(store_error(e)),
                }
            } else {
                Vec::new()
            };
            let mut bodies = bodies.into_iter();
            for (uid, cached) in batch {
                let uid = *uid;
                let body = bodies.next().flatten().map(|b| b.body);
                if run.needs_body && body.is_none() {
                    run.expunge_issued = true;
                    continue;
                }
                let Some(sel) = self.selected.as_ref() else { break };
                let Ok(pos) = sel.uids.binary_search(&uid) else { continue };
                let flags = sel.flag_set_at(pos);
                let message = Message {
                    uid,
                    modseq: self.modseq_item(uid, run.modseq),
                    email_id: run.email_id.then_some(cached.message_id),
                    thread_id: run.thread_id,
                    flags: &flags,
                    recent: self.is_recent(uid),
                    internal_date: &cached.internal_date,
                    meta: &cached.meta,
                    body: body.as_ref(),
                };
                let seen = run.seen_changed.binary_search(&uid).is_ok();
                run.unknown_cte |=
                    fetch_line(&mut self.out, pos as u32 + 1, run.items, run.binary, &message, seen);
                if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
                    return Err(Outcome::no("[UNAVAILABLE] Connection lost"));
                }
            }
        }
        Ok(())
    }

    /// The metadata of `uids` (ascending) that still exist, in UID order: from the
    /// cache, and one store read for those it lacks.
    async fn metadata(
        &self,
        mailbox_id: i64,
        uid_validity: u32,
        uids: &[u32],
    ) -> Result<Vec<(u32, Arc<CachedMeta>)>, Outcome> {
        let reads = &self.shared.reads;
        let cached = reads.metas.get_many(mailbox_id, uid_validity, uids);
        let missing: Vec<u32> =
            uids.iter().zip(&cached).filter(|(_, c)| c.is_none()).map(|(&u, _)| u).collect();
        reads.meta_hits.inc_by((uids.len() - missing.len()) as u64);
        reads.meta_misses.inc_by(missing.len() as u64);
        let mut found: Vec<(u32, Arc<CachedMeta>)> =
            uids.iter().zip(cached).filter_map(|(&u, c)| c.map(|c| (u, c))).collect();
        if missing.is_empty() {
            return Ok(found);
        }
        let rows = self
            .app
            .store
            .messages_by_uid(mailbox_id, &UidSet::from_uids(&missing))
            .await
            .map_err(store_error)?;
        let read: Vec<(u32, Arc<CachedMeta>)> = rows
            .into_iter()
            .map(|row| {
                let meta = CachedMeta {
                    message_id: row.message_id,
                    internal_date: row.internal_date,
                    meta: row.meta,
                };
                (row.uid, Arc::new(meta))
            })
            .collect();
        reads.metas.put_many(mailbox_id, uid_validity, &read);
        found.extend(read);
        found.sort_unstable_by_key(|(u, _)| *u);
        Ok(found)
    }

    /// FLAGS, UID, MODSEQ and THREADID: from the session's map, no query.
    async fn fetch_from_flag_map(&mut self, run: &FetchRun<'_, '_>, uids: &[u32]) -> Result<(), Outcome> {
        use MessageDataItemName as I;
        // FLAGS and UID only: from the flag map, no query.
        for chunk in uids.chunks(1024) {
            let Some(sel) = self.selected.as_ref() else { break };
            let mut lines = String::new();
            for &u in chunk {
                // A message expunged elsewhere and not yet announced is still
                // answered, from what this session knows of it (RFC 2180 §4.1.1):
                // its UID never changes and its flags are the last it saw.
                let Ok(pos) = sel.uids.binary_search(&u) else { continue };
                let _ = write!(lines, "* {} FETCH (", pos + 1);
                for (n, item) in run.items.iter().enumerate() {
                    if n > 0 {
                        lines.push(' ');
                    }
                    match item {
                        I::Uid => {
                            let _ = write!(lines, "UID {u}");
                        }
                        I::Flags => {
                            let flags =
                                encode::flag_list_recent(&sel.flag_set_at(pos), sel.recent.contains(u));
                            let _ = write!(lines, "FLAGS {flags}");
                        }
                        _ => {}
                    }
                }
                if run.modseq {
                    let sep = if run.items.is_empty() { "" } else { " " };
                    let _ = write!(lines, "{sep}MODSEQ ({})", sel.modseqs[pos]);
                }
                if run.thread_id {
                    let sep = if run.items.is_empty() && !run.modseq { "" } else { " " };
                    let _ = write!(lines, "{sep}THREADID NIL");
                }
                lines.push_str(")\r\n");
            }
            self.out.extend_from_slice(lines.as_bytes());
            if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
                return Err(Outcome::no("[UNAVAILABLE] Connection lost"));
            }
        }
        Ok(())
    }

    /// The MODSEQ a FETCH line carries: when asked for, from the session's map.
    fn modseq_item(&self, uid: u32, asked: bool) -> Option<u64> {
        if !asked {
            return None;
        }
        self.selected.as_ref().and_then(|s| s.modseq_of(uid))
    }

    /// `\Recent` for this session.
    fn is_recent(&self, uid: u32) -> bool {
        self.selected.as_ref().is_some_and(|s| s.recent.contains(uid))
    }

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

/// What the functions writing one FETCH's lines share.
struct FetchRun<'a, 'i> {
    mailbox_id: i64,
    items: &'a [MessageDataItemName<'i>],
    /// Which items are BINARY ones, one entry per item.
    binary: &'a [Option<BinaryItem>],
    needs_body: bool,
    /// MODSEQ goes in every line.
    modseq: bool,
    /// EMAILID and THREADID (RFC 8474 §5.3) go in every line.
    email_id: bool,
    thread_id: bool,
    /// Messages whose \Seen this FETCH set: FLAGS go in their lines.
    seen_changed: Vec<u32>,
    /// The session is up to date (else the first link query tells whether it is).
    synced: bool,
    /// A message's body was gone by the time it was read (see `cmd_fetch`).
    expunge_issued: bool,
    /// A BINARY section had an encoding that could not be removed.
    unknown_cte: bool,
}

/// Where a FETCH reads its data from, cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FetchSource {
    /// FLAGS and UID only: the session's flag map, no query.
    FlagMap,
    /// Whole messages and top-level sections (`BODY[]`, `BODY[HEADER]`,
    /// `RFC822*`), sizes and dates: the links and the bodies, batched and cached.
    Bodies,
    /// ENVELOPE, BODYSTRUCTURE and sections inside MIME parts: the stored
    /// metadata (and the bodies when a section is asked for).
    Metadata,
}

/// What a FETCH reads, decided from its items alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FetchPlan {
    source: FetchSource,
    /// Message bytes are part of the answer.
    needs_body: bool,
    /// A body section without PEEK on a read-write mailbox: \Seen is set first.
    sets_seen: bool,
}

impl FetchPlan {
    /// `email_id`: EMAILID is asked for; the flag map does not hold the stored
    /// message's id, the links and the metadata do.
    fn of(items: &[MessageDataItemName<'_>], read_only: bool, email_id: bool) -> FetchPlan {
        use MessageDataItemName as I;
        let needs_meta = email_id || items.iter().any(|i| !matches!(i, I::Flags | I::Uid));
        let needs_body = items
            .iter()
            .any(|i| matches!(i, I::BodyExt { .. } | I::Rfc822 | I::Rfc822Header | I::Rfc822Text));
        // INTERNALDATE's zone is in the metadata (the bodies path has sizes only).
        let needs_parts = items.iter().any(|i| match i {
            I::Envelope | I::Body | I::BodyStructure | I::InternalDate => true,
            I::BodyExt { section: Some(section), .. } => section_in_part(section),
            _ => false,
        });
        let sets_seen = !read_only
            && items.iter().any(|i| matches!(i, I::BodyExt { peek: false, .. } | I::Rfc822 | I::Rfc822Text));
        let source = if needs_body && !needs_parts {
            FetchSource::Bodies
        } else if needs_meta {
            FetchSource::Metadata
        } else {
            FetchSource::FlagMap
        };
        FetchPlan { source, needs_body, sets_seen }
    }
}

/// One message as a FETCH response sees it.
struct Message<'a> {
    uid: u32,
    /// MODSEQ, when asked for (CONDSTORE).
    modseq: Option<u64>,
    /// The stored message's id, when EMAILID is asked for.
    email_id: Option<i64>,
    /// THREADID is asked for.
    thread_id: bool,
    flags: &'a FlagSet,
    /// `\Recent` for this session.
    recent: bool,
    internal_date: &'a chrono::DateTime<chrono::Utc>,
    meta: &'a MessageMeta,
    /// Shared, so that large sections are written from it without a copy.
    body: Option<&'a bytes::Bytes>,
}

/// Appends `* seq FETCH (...)` for the requested items. `seen_set`: \Seen was
/// just set by this FETCH, so FLAGS are reported even when not asked for.
/// Returns whether a BINARY section could not be decoded: then nothing is
/// written for the message (the command fails, RFC 3516 §4.2).
fn fetch_line(
    out: &mut Output,
    seq: u32,
    items: &[MessageDataItemName<'_>],
    binary: &[Option<BinaryItem>],
    m: &Message<'_>,
    seen_set: bool,
) -> bool {
    use MessageDataItemName as I;
    // BINARY sections first, decoded once: one that cannot be stops the line
    // before anything of it is written. A FETCH without them (`binary` empty)
    // skips this, with no allocation.
    let raw: &[u8] = m.body.map(|b| &b[..]).unwrap_or_default();
    let mut decoded: Vec<Option<(String, Cow<'_, [u8]>)>> = Vec::new();
    for (item, kind) in items.iter().zip(binary) {
        let section = match (item, kind) {
            (I::BodyExt { section, .. }, Some(_)) => section,
            _ => {
                decoded.push(None);
                continue;
            }
        };
        let (spec, data) = section_bytes(raw, m.meta, section.as_ref());
        let data = match section {
            Some(Section::Part(p)) => decode_cte(data, &part_encoding(raw, m.meta, &path_of(p))),
            // Headers, MIME headers, TEXT and the whole message carry no
            // encoding of their own: sent as BODY sends them.
            _ => Some(data),
        };
        match data {
            Some(data) => decoded.push(Some((spec, data))),
            None => return true,
        }
    }
    let _ = write!(out, "* {seq} FETCH (");
    let mut flags_sent = false;
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(b' ');
        }
        match item {
            I::Uid => {
                let _ = write!(out, "UID {}", m.uid);
            }
            I::Flags => {
                flags_sent = true;
                let _ = write!(out, "FLAGS {}", encode::flag_list_recent(m.flags, m.recent));
            }
            I::InternalDate => {
                let date = m.meta.internal_in_zone(m.internal_date);
                let _ = write!(out, "INTERNALDATE {}", encode::internal_date(&date));
            }
            I::Rfc822Size => {
                let _ = write!(out, "RFC822.SIZE {}", m.meta.size);
            }
            I::Envelope => {
                let _ = write!(out, "ENVELOPE {}", m.meta.envelope);
            }
            I::Body => {
                let _ = write!(out, "BODY {}", m.meta.body);
            }
            I::BodyStructure => {
                let _ = write!(out, "BODYSTRUCTURE {}", m.meta.body_structure);
            }
            I::BodyExt { partial, .. } if decoded.get(n).is_some_and(Option::is_some) => {
                let Some((spec, decoded)) = decoded[n].take() else { continue };
                if binary.get(n).copied().flatten() == Some(BinaryItem::Size) {
                    let _ = write!(out, "BINARY.SIZE[{spec}] {}", decoded.len());
                    continue;
                }
                let (origin, data) = match partial {
                    Some((offset, len)) => {
                        let start = (*offset as usize).min(decoded.len());
                        let end = start.saturating_add(len.get() as usize).min(decoded.len());
                        (format!("<{offset}>"), slice_cow(decoded, start, end))
                    }
                    None => (String::new(), decoded),
                };
                let _ = write!(out, "BINARY[{spec}]{origin} ");
                write_literal(out, m.body, data);
            }
            I::Rfc822 | I::Rfc822Header | I::Rfc822Text | I::BodyExt { .. } => {
                let empty = bytes::Bytes::new();
                let shared = m.body.unwrap_or(&empty);
                let raw: &[u8] = shared;
                let (label, data) = match item {
                    I::Rfc822 => ("RFC822".to_string(), Cow::Borrowed(raw)),
                    I::Rfc822Header => ("RFC822.HEADER".to_string(), Cow::Borrowed(header(raw, m.meta))),
                    I::Rfc822Text => ("RFC822.TEXT".to_string(), Cow::Borrowed(text(raw, m.meta))),
                    I::BodyExt { section, partial, .. } => {
                        let (spec, data) = section_bytes(raw, m.meta, section.as_ref());
                        match partial {
                            Some((offset, len)) => {
                                let start = (*offset as usize).min(data.len());
                                let end = start.saturating_add(len.get() as usize).min(data.len());
                                (format!("BODY[{spec}]<{offset}>"), slice_cow(data, start, end))
                            }
                            None => (format!("BODY[{spec}]"), data),
                        }
                    }
                    _ => continue,
                };
                let _ = write!(out, "{label} ");
                write_literal(out, Some(shared), data);
            }
        }
    }
    if !flags_sent && seen_set {
        let _ = write!(out, " FLAGS {}", encode::flag_list_recent(m.flags, m.recent));
    }
    let mut first = items.is_empty() && !flags_sent && !seen_set;
    let mut sep = |out: &mut Output| {
        if !std::mem::take(&mut first) {
            out.push(b' ');
        }
    };
    if let Some(modseq) = m.modseq {
        sep(out);
        let _ = write!(out, "MODSEQ ({modseq})");
    }
    if let Some(id) = m.email_id {
        sep(out);
        let _ = write!(out, "EMAILID ({})", encode::email_id(id));
    }
    if m.thread_id {
        // No thread ids here: NIL, as RFC 8474 §5.2 asks of such a server.
        sep(out);
        out.extend_from_slice(b"THREADID NIL");
    }
    out.extend_from_slice(b")\r\n");
    false
}

fn slice_cow(data: Cow<'_, [u8]>, start: usize, end: usize) -> Cow<'_, [u8]> {
    match data {
        Cow::Borrowed(d) => Cow::Borrowed(&d[start..end]),
        Cow::Owned(d) => Cow::Owned(d[start..end].to_vec()),
    }
}

/// `{n}` and the octets; data borrowed from the shared body is written without a
/// copy. Octets holding NUL go as a `literal8` (`~{n}`, RFC 3516 §4.3): a plain
/// literal may not carry NUL (RFC 3501 §4.3), and only mail appended as binary
/// content or a decoded BINARY section can hold one.
fn write_literal(out: &mut Output, shared: Option<&bytes::Bytes>, data: Cow<'_, [u8]>) {
    let tilde = if memchr::memchr(0, &data).is_some() { "~" } else { "" };
    let _ = write!(out, "{tilde}{{{}}}\r\n", data.len());
    match (data, shared) {
        (Cow::Borrowed(d), Some(shared)) => out.put_slice_of(shared, d),
        (d, _) => out.extend_from_slice(&d),
    }
}

/// The Content-Transfer-Encoding of the part at `path`, lower-cased, without
/// comments or parameters; empty when the part has none (7bit).
fn part_encoding(raw: &[u8], meta: &MessageMeta, path: &[u32]) -> String {
    let header = match meta.parts.iter().find(|p| p.path == path) {
        Some(p) => raw.get(p.header_start as usize..p.body_start as usize).unwrap_or_default(),
        // The body of a message described without parts is part 1, under the
        // message's own header.
        None if path == [1] && meta.parts.is_empty() => header(raw, meta),
        None => &[],
    };
    let field = header_fields(header, &[b"Content-Transfer-Encoding"], false);
    let value = field.splitn(2, |&b| b == b':').nth(1).unwrap_or_default();
    let value = value.split(|&b| b == b'(' || b == b';').next().unwrap_or_default();
    String::from_utf8_lossy(value).trim().to_ascii_lowercase()
}

/// A section's octets with `encoding` removed: `None` when the encoding is
/// unknown or the data is not valid in it.
fn decode_cte<'a>(data: Cow<'a, [u8]>, encoding: &str) -> Option<Cow<'a, [u8]>> {
    match encoding {
        "" | "7bit" | "8bit" | "binary" => Some(data),
        "base64" => mail_parser::decoders::base64::base64_decode(&data).map(Cow::Owned),
        "quoted-printable" => {
            mail_parser::decoders::quoted_printable::quoted_printable_decode(&data).map(Cow::Owned)
        }
        _ => None,
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

fn header<'a>(raw: &'a [u8], meta: &MessageMeta) -> &'a [u8] {
    &raw[..(meta.header_size as usize).min(raw.len())]
}

fn text<'a>(raw: &'a [u8], meta: &MessageMeta) -> &'a [u8] {
    &raw[(meta.header_size as usize).min(raw.len())..]
}

/// Whether the section lies inside a MIME part (its offsets are in the metadata).
fn section_in_part(section: &Section<'_>) -> bool {
    match section {
        Section::Part(_) | Section::Mime(_) => true,
        Section::Header(p)
        | Section::Text(p)
        | Section::HeaderFields(p, _)
        | Section::HeaderFieldsNot(p, _) => p.is_some(),
    }
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
