//! The selected mailbox: the session's sequence-number ↔ UID map and how it is
//! kept in step with the store (RFC 3501 §5.5, §7.4.1).
//!
//! The map is exactly what the client has been told: a message enters it when we
//! send EXISTS and leaves when we send EXPUNGE. Other sessions' changes are
//! learnt from `store.changes_since(modseq)`:
//! - new UIDs are appended and announced with EXISTS (always allowed);
//! - flag changes of known UIDs are announced with untagged FETCH;
//! - expunged UIDs are announced with EXPUNGE only when the command allows it —
//!   never while answering FETCH, STORE or SEARCH, whose sequence numbers the client
//!   must be able to trust. Until then they wait in `pending_expunge` and keep their
//!   sequence number.

use std::collections::{BTreeSet, HashMap};

use super::session::Session;
use crate::proto::imap::encode;
use crate::proto::imap::parse::SeqSet;
use crate::store::StoreResult;
use mailcluster_model::{FlagRow, FlagSet, Flags, Mailbox, MailboxChanges, MailboxIndex};

pub struct Selected {
    pub mailbox: Mailbox,
    pub read_only: bool,
    /// UIDs in sequence order: `uids[seq - 1]`.
    pub uids: Vec<u32>,
    /// System flags of each message, parallel to `uids`, as of `modseq` (kept by
    /// `sync` and by this session's own STOREs): flag searches and FLAGS fetches
    /// are answered from here after one "anything changed?" round trip.
    pub flags: Vec<Flags>,
    /// Keywords of the messages that have any.
    pub message_keywords: HashMap<u32, Vec<String>>,
    /// Each message's modseq, parallel to `uids` (CONDSTORE, RFC 7162).
    pub modseqs: Vec<u64>,
    /// Highest modseq whose changes this session has seen.
    pub modseq: u64,
    /// Keywords announced with FLAGS so far.
    pub keywords: BTreeSet<String>,
    /// Expunged elsewhere, not yet announced.
    pub pending_expunge: Vec<u32>,
    /// UIDNEXT as announced at SELECT.
    pub uid_next: u32,
    /// (uid, modseq) of flag changes this session made and already answered, so
    /// the next sync does not announce them a second time (`STORE .SILENT`).
    pub own_changes: Vec<(u32, u64)>,
    /// The messages that are `\Recent` for this session (RFC 3501 §2.3.2).
    pub recent: RecentSet,
    /// The search result saved as `$` (SEARCHRES, RFC 5182), UIDs ascending; empty
    /// at SELECT. Expunged messages drop out of it where it is used.
    pub saved: Vec<u32>,
}

/// UIDs that are `\Recent` for one session, as ascending inclusive ranges: what it
/// took at SELECT and with each batch of new messages since. Small however large the
/// mailbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentSet(Vec<(u32, u32)>);

impl RecentSet {
    /// Adds `lo..=hi` (nothing when empty). Ranges come in ascending order.
    pub fn add(&mut self, lo: u32, hi: u32) {
        if lo > hi {
            return;
        }
        match self.0.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => self.0.push((lo, hi)),
        }
    }

    pub fn contains(&self, uid: u32) -> bool {
        let i = self.0.partition_point(|&(_, hi)| hi < uid);
        self.0.get(i).is_some_and(|&(lo, _)| lo <= uid)
    }

    /// How many of `uids` (ascending) are recent.
    pub fn count_in(&self, uids: &[u32]) -> usize {
        self.0
            .iter()
            .map(|&(lo, hi)| uids.partition_point(|&u| u <= hi) - uids.partition_point(|&u| u < lo))
            .sum()
    }
}

impl Selected {
    /// The state right after SELECT/EXAMINE: every keyword in use is announced.
    pub fn new(mailbox: Mailbox, read_only: bool, index: MailboxIndex) -> Selected {
        let keywords: BTreeSet<String> = index.keywords.iter().flat_map(|(_, k)| k.iter().cloned()).collect();
        let mut modseqs = index.modseqs;
        modseqs.resize(index.uids.len(), 0);
        Selected {
            modseqs,
            read_only,
            uid_next: index.uid_next.max(index.uids.last().map_or(1, |u| u + 1)),
            modseq: index.highest_modseq,
            uids: index.uids,
            flags: index.flags,
            message_keywords: index.keywords.into_iter().collect(),
            keywords,
            pending_expunge: Vec::new(),
            own_changes: Vec::new(),
            recent: RecentSet::default(),
            saved: Vec::new(),
            mailbox,
        }
    }

    /// `* n RECENT`: how many messages in the view are recent for this session.
    pub fn recent_line(&self) -> String {
        format!("* {} RECENT", self.recent.count_in(&self.uids))
    }

    /// Brings a map built from an older snapshot up to date without telling the
    /// client anything (SELECT: the client has no view of the mailbox yet).
    pub fn apply_silently(&mut self, changes: &MailboxChanges) {
        for uid in self.expunged_in(changes) {
            self.remove(uid);
        }
        for row in &changes.changed {
            self.learn_keywords(row.flags.keywords.iter());
            if self.seq_of(row.uid).is_some() {
                self.set_flags(row);
            } else if row.uid > self.max_uid() {
                self.append(row);
            } else {
                // UIDs are allocated in commit order, so an unknown UID below the
                // highest is not expected; kept in order should it happen.
                let pos = self.uids.partition_point(|&u| u < row.uid);
                self.uids.insert(pos, row.uid);
                self.flags.insert(pos, Flags::NONE);
                self.modseqs.insert(pos, row.modseq);
                self.set_flags(row);
            }
        }
        self.modseq = self.modseq.max(changes.highest_modseq);
        self.uid_next = self.uid_next.max(self.max_uid() + 1);
    }

    /// The known UIDs `changes` says were expunged: its tombstones, or, when they
    /// were pruned past the asked modseq, whatever known UID is not present any more.
    pub fn expunged_in(&self, changes: &MailboxChanges) -> Vec<u32> {
        match &changes.present {
            None => changes.expunged.clone(),
            Some(present) => {
                self.uids.iter().copied().filter(|u| present.binary_search(u).is_err()).collect()
            }
        }
    }

    /// The UIDs `changes` says were expunged, within `within` (a UID set from the
    /// client; `*` is the highest UID handed out) or all of them, as ascending
    /// inclusive ranges (VANISHED (EARLIER), RFC 7162 §3.2.5.1, §3.2.6). When the
    /// tombstones were pruned past the asked modseq, every UID below UIDNEXT that
    /// is not present any more is reported: never too few, which would leave a
    /// deleted message in the client's cache. A UID still in the session's view
    /// (expunged elsewhere, not yet announced) is left for its own VANISHED.
    pub fn vanished_in(&self, changes: &MailboxChanges, within: Option<&SeqSet>) -> Vec<(u32, u32)> {
        let max = self.uid_next.saturating_sub(1).max(self.max_uid());
        let mut bounds: Vec<(u32, u32)> = match within {
            Some(set) => {
                set.ranges(max).map(|(lo, hi)| (lo.max(1), hi.min(max))).filter(|(lo, hi)| lo <= hi).collect()
            }
            None if max > 0 => vec![(1, max)],
            None => Vec::new(),
        };
        bounds.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(bounds.len());
        for (lo, hi) in bounds {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let mut out: Vec<(u32, u32)> = Vec::new();
        let mut push = |lo: u32, hi: u32| match out.last_mut() {
            Some(last) if lo == last.1.saturating_add(1) => last.1 = hi,
            _ => out.push((lo, hi)),
        };
        match &changes.present {
            None => {
                for &uid in &changes.expunged {
                    let i = merged.partition_point(|&(_, hi)| hi < uid);
                    if merged.get(i).is_some_and(|&(lo, _)| lo <= uid) && self.seq_of(uid).is_none() {
                        push(uid, uid);
                    }
                }
            }
            Some(present) => {
                let mut present = present.clone();
                present.extend_from_slice(&self.uids);
                present.sort_unstable();
                present.dedup();
                for (lo, hi) in merged {
                    let mut next = lo;
                    let start = present.partition_point(|&u| u < lo);
                    for &uid in present[start..].iter().take_while(|&&u| u <= hi) {
                        if uid > next {
                            push(next, uid - 1);
                        }
                        next = uid.saturating_add(1);
                    }
                    if next <= hi && next >= lo {
                        push(next, hi);
                    }
                }
            }
        }
        out
    }

    /// The map as a [`MailboxIndex`] (for the SELECT cache).
    pub fn snapshot(&self) -> MailboxIndex {
        let mut keywords: Vec<(u32, Vec<String>)> =
            self.message_keywords.iter().map(|(&u, k)| (u, k.clone())).collect();
        keywords.sort_unstable_by_key(|k| k.0);
        MailboxIndex {
            highest_modseq: self.modseq,
            uid_next: self.uid_next,
            uids: self.uids.clone(),
            flags: self.flags.clone(),
            modseqs: self.modseqs.clone(),
            keywords,
        }
    }

    /// Keywords of the message (empty when it has none).
    pub fn keywords_of(&self, uid: u32) -> &[String] {
        self.message_keywords.get(&uid).map_or(&[], Vec::as_slice)
    }

    /// The full flag set of the message at `pos` (0-based).
    pub fn flag_set_at(&self, pos: usize) -> FlagSet {
        FlagSet { system: self.flags[pos], keywords: self.keywords_of(self.uids[pos]).to_vec() }
    }

    /// Records the current flags and modseq of a known message.
    pub fn set_flags(&mut self, row: &FlagRow) {
        let Ok(pos) = self.uids.binary_search(&row.uid) else { return };
        self.flags[pos] = row.flags.system;
        self.modseqs[pos] = row.modseq;
        if row.flags.keywords.is_empty() {
            self.message_keywords.remove(&row.uid);
        } else {
            self.message_keywords.insert(row.uid, row.flags.keywords.clone());
        }
    }

    /// Appends a message with a UID above every known one.
    fn append(&mut self, row: &FlagRow) {
        debug_assert!(row.uid > self.max_uid());
        self.uids.push(row.uid);
        self.flags.push(Flags::NONE);
        self.modseqs.push(row.modseq);
        self.set_flags(row);
    }

    /// The modseq of a known message.
    pub fn modseq_of(&self, uid: u32) -> Option<u64> {
        self.uids.binary_search(&uid).ok().map(|pos| self.modseqs[pos])
    }

    /// Removes a message from the map; its sequence number before removal.
    pub fn remove(&mut self, uid: u32) -> Option<u32> {
        let pos = self.uids.binary_search(&uid).ok()?;
        self.uids.remove(pos);
        self.flags.remove(pos);
        self.modseqs.remove(pos);
        self.message_keywords.remove(&uid);
        self.pending_expunge.retain(|&u| u != uid);
        Some(pos as u32 + 1)
    }

    pub fn seq_of(&self, uid: u32) -> Option<u32> {
        self.uids.binary_search(&uid).ok().map(|i| i as u32 + 1)
    }

    pub fn max_uid(&self) -> u32 {
        self.uids.last().copied().unwrap_or(0)
    }

    /// The UIDs a sequence or UID set names, ascending and known to the client.
    /// Sequence numbers beyond what the client knows are an error (`None`).
    pub fn resolve(&self, set: &SeqSet, uid: bool) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        if uid {
            // `*` is the largest UID in the mailbox; on an empty mailbox there is none.
            let Some(&max) = self.uids.last() else { return Some(out) };
            for (lo, hi) in set.ranges(max) {
                let start = self.uids.partition_point(|&u| u < lo);
                let end = self.uids.partition_point(|&u| u <= hi);
                out.extend_from_slice(&self.uids[start..end]);
            }
        } else {
            let n = self.uids.len() as u32;
            if n == 0 {
                // "*" or "1:*" on an empty mailbox match nothing; concrete numbers fail.
                return set.0.iter().all(|&(a, b)| a == SeqSet::STAR || b == SeqSet::STAR).then_some(out);
            }
            for (lo, hi) in set.ranges(n) {
                if lo == 0 || hi > n {
                    return None;
                }
                out.extend_from_slice(&self.uids[lo as usize - 1..hi as usize]);
            }
        }
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// Records keywords seen in `flags`; true when one is new (FLAGS must be re-sent).
    pub fn learn_keywords<'a>(&mut self, keywords: impl Iterator<Item = &'a String>) -> bool {
        let mut new = false;
        for k in keywords {
            if !self.keywords.contains(k) {
                self.keywords.insert(k.clone());
                new = true;
            }
        }
        new
    }

    /// Removes the messages expunged elsewhere and returns their EXPUNGE lines,
    /// highest first so each announced number is still valid when sent; or, for a
    /// QRESYNC session (`vanished`), one `VANISHED` line of their UIDs.
    pub fn take_pending_expunges(&mut self, vanished: bool) -> Vec<String> {
        let mut pending = std::mem::take(&mut self.pending_expunge);
        if vanished {
            pending.retain(|&uid| self.remove(uid).is_some());
            pending.sort_unstable();
            if pending.is_empty() {
                return Vec::new();
            }
            return vec![format!("* VANISHED {}", encode::sequence_set(&pending))];
        }
        pending.sort_unstable_by(|a, b| b.cmp(a));
        pending.into_iter().filter_map(|uid| self.remove(uid)).map(|seq| format!("* {seq} EXPUNGE")).collect()
    }

    pub fn flags_lines(&self) -> [String; 2] {
        let kws: String = self.keywords.iter().map(|k| format!(" {k}")).collect();
        [
            format!("* FLAGS ({}{kws})", encode::SYSTEM_FLAGS),
            if self.read_only {
                "* OK [PERMANENTFLAGS ()] Read-only mailbox".to_string()
            } else {
                format!("* OK [PERMANENTFLAGS ({}{kws} \\*)] Flags permitted", encode::SYSTEM_FLAGS)
            },
        ]
    }
}

impl Session {
    /// Brings the selected mailbox up to date and queues the untagged responses.
    /// `allow_expunge` is false while answering FETCH, STORE and SEARCH.
    pub(crate) async fn sync(&mut self, allow_expunge: bool) -> StoreResult<()> {
        // A mailbox whose UIDs are being handed out again shows nothing more:
        // the session ends before its next reply (`uidvalidity_renewed`).
        if self.uidvalidity_renewed() {
            return Ok(());
        }
        let Some(sel) = self.selected.as_ref() else { return Ok(()) };
        let (mailbox_id, since) = (sel.mailbox.id, sel.modseq);
        // The batched probe first: most commands find nothing changed. (A mailbox
        // that is gone falls through to `changes_since`, which says so.)
        if self.shared.reads.probe.highest_modseq(mailbox_id).await? == Some(since) {
            if allow_expunge {
                self.push_pending_expunges();
            }
            return Ok(());
        }
        self.sync_changes(allow_expunge).await
    }

    /// Whether the selected mailbox got a new UIDVALIDITY since it was selected
    /// (the database went back in time: `view::uid_marks`): the session's UIDs
    /// may now name other messages, and RFC 3501 has no way to change the
    /// UIDVALIDITY of a selection, so the session must end.
    pub(crate) fn uidvalidity_renewed(&self) -> bool {
        self.selected
            .as_ref()
            .is_some_and(|s| self.shared.reads.uid_marks.is_renewed(s.mailbox.id, s.mailbox.uid_validity))
    }

    /// What a sync that found nothing new still does where expunges may be
    /// announced: the ones held back while sequence numbers had to stay.
    pub(crate) fn push_pending_expunges(&mut self) {
        let vanished = self.qresync;
        let Some(sel) = self.selected.as_mut() else { return };
        for line in sel.take_pending_expunges(vanished) {
            self.push(&line);
        }
    }

    /// [`Session::sync`] without the probe, for callers that already know the
    /// mailbox changed.
    pub(crate) async fn sync_changes(&mut self, allow_expunge: bool) -> StoreResult<()> {
        let Some(sel) = self.selected.as_ref() else { return Ok(()) };
        let (mailbox_id, since) = (sel.mailbox.id, sel.modseq);
        let changes = self.app.store.changes_since(mailbox_id, since).await?;
        let mut lines: Vec<String> = Vec::new();
        let Some(sel) = self.selected.as_mut() else { return Ok(()) };
        sel.modseq = sel.modseq.max(changes.highest_modseq);

        for uid in sel.expunged_in(&changes) {
            if sel.seq_of(uid).is_some() && !sel.pending_expunge.contains(&uid) {
                sel.pending_expunge.push(uid);
            }
        }
        if allow_expunge {
            lines.extend(sel.take_pending_expunges(self.qresync));
        }

        let max = sel.max_uid();
        let mut new_rows: Vec<&FlagRow> = Vec::new();
        let mut flag_updates: Vec<&FlagRow> = Vec::new();
        let mut new_keyword = false;
        let mut own = std::mem::take(&mut sel.own_changes);
        own.sort_unstable();
        for row in &changes.changed {
            new_keyword |= sel.learn_keywords(row.flags.keywords.iter());
            if row.uid > max {
                new_rows.push(row);
                continue;
            }
            sel.set_flags(row);
            if own.binary_search(&(row.uid, row.modseq)).is_err() && sel.seq_of(row.uid).is_some() {
                flag_updates.push(row);
            }
        }
        if new_keyword {
            lines.extend(sel.flags_lines());
        }
        for row in flag_updates {
            if let Some(seq) = sel.seq_of(row.uid) {
                // With CONDSTORE on, unsolicited FETCH carries MODSEQ (RFC 7162 §3.1.4).
                let modseq = if self.condstore { format!(" MODSEQ ({})", row.modseq) } else { String::new() };
                lines.push(format!(
                    "* {seq} FETCH (UID {} FLAGS {}{modseq})",
                    row.uid,
                    encode::flag_list_recent(&row.flags, sel.recent.contains(row.uid))
                ));
            }
        }
        // `changed` is ordered by UID, so the new rows come in UID order.
        lines.extend(self.add_new_messages(mailbox_id, &new_rows, false).await);
        if let Some(sel) = self.selected.as_ref() {
            let next = sel.uid_next.max(sel.max_uid().saturating_add(1));
            self.shared.reads.uid_marks.note(mailbox_id, sel.mailbox.uid_validity, next);
        }
        for l in lines {
            self.push(&l);
        }
        Ok(())
    }

    /// Adds messages above every known UID (`rows` in UID order) to the view and
    /// returns the EXISTS and RECENT lines that announce them. A read-write session
    /// takes them as \Recent unless another session took them first; a read-only
    /// one cannot take them and, unable to tell, treats them as recent (RFC 3501
    /// §2.3.2 "SHOULD"). `own`: the session stored them itself a moment ago, so the
    /// claim goes straight to raising the floor.
    pub(crate) async fn add_new_messages(
        &mut self,
        mailbox_id: i64,
        rows: &[&FlagRow],
        own: bool,
    ) -> Vec<String> {
        let Some(sel) = self.selected.as_mut() else { return Vec::new() };
        if rows.is_empty() {
            return Vec::new();
        }
        let max = sel.max_uid();
        for row in rows {
            if row.uid > sel.max_uid() {
                sel.append(row);
            }
        }
        let new_max = sel.max_uid();
        if self.rev2 {
            return vec![format!("* {} EXISTS", sel.uids.len())];
        }
        let from = if sel.read_only {
            max
        } else {
            let claim = if own {
                self.app.store.recent_claim_own(mailbox_id, new_max).await
            } else {
                self.app.store.recent_claim(mailbox_id, new_max).await
            };
            match claim {
                Ok(floor) => floor.max(max),
                Err(e) => {
                    tracing::warn!(error = %e, "imap: cannot claim \\Recent; announcing as recent");
                    max
                }
            }
        };
        let Some(sel) = self.selected.as_mut() else { return Vec::new() };
        sel.recent.add(from + 1, new_max);
        vec![format!("* {} EXISTS", sel.uids.len()), sel.recent_line()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(uids: &[u32]) -> Selected {
        let mailbox = Mailbox {
            id: 1,
            account_id: 1,
            name: "INBOX".into(),
            uid_validity: 1,
            uid_next: 100,
            highest_modseq: 1,
            special_use: None,
            recent_floor: 0,
        };
        let index = MailboxIndex {
            highest_modseq: 1,
            uid_next: 100,
            uids: uids.to_vec(),
            flags: vec![Flags::NONE; uids.len()],
            modseqs: vec![1; uids.len()],
            keywords: Vec::new(),
        };
        Selected::new(mailbox, false, index)
    }

    #[test]
    fn resolve_sequence_and_uid_sets() {
        let s = sel(&[3, 7, 9, 20]);
        assert_eq!(s.resolve(&SeqSet(vec![(2, 3)]), false), Some(vec![7, 9]));
        assert_eq!(s.resolve(&SeqSet(vec![(SeqSet::STAR, 3)]), false), Some(vec![9, 20]));
        assert_eq!(s.resolve(&SeqSet(vec![(5, 5)]), false), None);
        assert_eq!(s.resolve(&SeqSet(vec![(8, SeqSet::STAR)]), true), Some(vec![9, 20]));
        assert_eq!(s.resolve(&SeqSet(vec![(1, 4), (21, 30)]), true), Some(vec![3]));
        // "UID 25:*" still names the last message when 25 > max (RFC 3501 §6.4.8).
        assert_eq!(s.resolve(&SeqSet(vec![(25, SeqSet::STAR)]), true), Some(vec![20]));
        let empty = sel(&[]);
        assert_eq!(empty.resolve(&SeqSet(vec![(1, SeqSet::STAR)]), false), Some(vec![]));
        assert_eq!(empty.resolve(&SeqSet(vec![(1, 1)]), false), None);
    }
}
