//! STORE, COPY, MOVE, EXPUNGE and UID EXPUNGE (their UID variants included).

use imap_codec::imap_types::flag::{Flag, StoreResponse, StoreType};
use imap_codec::imap_types::mailbox::Mailbox as WireMailbox;
use imap_codec::imap_types::sequence::SequenceSet;

use super::mailbox::mailbox_name;
use super::session::{Outcome, Session, store_error};
use crate::proto::imap::encode;
use crate::proto::imap::parse::SeqSet;
use mailcluster_model::{Expunged, FlagOp, FlagSet, Flags, UidSet};

/// Client flags → store flags; `None` for flags a client may not set.
pub fn flag_set(flags: &[Flag<'_>]) -> Option<FlagSet> {
    let mut set = FlagSet::default();
    for f in flags {
        let system = match f {
            Flag::Seen => Flags::SEEN,
            Flag::Answered => Flags::ANSWERED,
            Flag::Flagged => Flags::FLAGGED,
            Flag::Deleted => Flags::DELETED,
            Flag::Draft => Flags::DRAFT,
            Flag::Keyword(k) => {
                set.keywords.push(k.as_ref().to_string());
                continue;
            }
            // \Recent and unknown backslash flags cannot be stored.
            Flag::Extension(_) => return None,
        };
        set.system = set.system.union(system);
    }
    set.keywords.sort();
    set.keywords.dedup();
    Some(set)
}

impl Session {
    pub(crate) async fn cmd_store(
        &mut self,
        set: &SequenceSet,
        kind: StoreType,
        response: StoreResponse,
        flags: &[Flag<'_>],
        uid: bool,
        unchanged_since: Option<u64>,
    ) -> Outcome {
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        if sel.read_only {
            return Outcome::no("[READ-ONLY] Mailbox is read-only");
        }
        let done = if uid { "UID STORE completed" } else { "STORE completed" };
        let Some(uids) = sel.resolve(&SeqSet::from_codec(set), uid) else {
            return Outcome::bad("Invalid sequence number");
        };
        let Some(flags) = flag_set(flags) else { return Outcome::bad("Invalid flag") };
        let mailbox_id = sel.mailbox.id;
        let op = match kind {
            StoreType::Add => FlagOp::Add,
            StoreType::Remove => FlagOp::Remove,
            StoreType::Replace => FlagOp::Replace,
        };
        // UIDs (ascending) a conditional STORE left alone: `[MODIFIED …]`.
        let mut modified: Vec<u32> = Vec::new();
        if !uids.is_empty() {
            let set = UidSet::from_uids(&uids);
            let stored = match unchanged_since {
                None => self.app.store.store_flags(mailbox_id, &set, op, &flags).await,
                Some(n) => {
                    self.app.store.store_flags_unchanged_since(mailbox_id, &set, op, &flags, n).await.map(
                        |c| {
                            modified = c.modified;
                            c.changed
                        },
                    )
                }
            };
            let rows = match stored {
                Ok(r) => r,
                Err(e) => return store_error(e),
            };
            let modseq = rows.iter().map(|r| r.modseq).max();
            if let Some(modseq) = modseq {
                self.notify(mailbox_id, modseq).await;
            }
            // The store's modseq right after the session's own: nothing else changed
            // the mailbox in between, so these rows are the whole change and the
            // session is up to date without reading the changes back.
            let caught_up = match (modseq, self.selected.as_mut()) {
                (Some(m), Some(sel)) if sel.modseq.checked_add(1) == Some(m) => {
                    sel.modseq = m;
                    true
                }
                _ => false,
            };
            for row in &rows {
                self.announce_keywords(&row.flags);
                let Some(sel) = self.selected.as_mut() else { break };
                sel.set_flags(row);
                if !caught_up {
                    // Our own change comes back from changes_since; it was answered here.
                    sel.own_changes.push((row.uid, row.modseq));
                }
                // With CONDSTORE on, even .SILENT tells the new modseq (RFC 7162
                // §3.1.3); the client needs it for its next UNCHANGEDSINCE.
                let modseq_item =
                    if self.condstore { format!(" MODSEQ ({})", row.modseq) } else { String::new() };
                if response == StoreResponse::Silent && !self.condstore {
                    continue;
                }
                let Some(seq) = sel.seq_of(row.uid) else { continue };
                let uid_item = if uid { format!(" UID {}", row.uid) } else { String::new() };
                let line = if response == StoreResponse::Silent {
                    format!("* {seq} FETCH (MODSEQ ({}){uid_item})", row.modseq)
                } else {
                    let flags = encode::flag_list_recent(&row.flags, sel.recent.contains(row.uid));
                    format!("* {seq} FETCH (FLAGS {flags}{uid_item}{modseq_item})")
                };
                self.push(&line);
            }
            if caught_up {
                // What `sync` does when nothing changed.
                if uid {
                    self.push_pending_expunges();
                }
                return self.store_outcome(&modified, uid, done);
            }
        }
        if let Err(e) = self.sync(uid).await {
            return store_error(e);
        }
        self.store_outcome(&modified, uid, done)
    }

    /// The tagged answer of STORE: `[MODIFIED set]` (RFC 7162 §3.1.3) names the
    /// messages a conditional STORE left alone, as UIDs for UID STORE and as
    /// sequence numbers otherwise.
    fn store_outcome(&self, modified: &[u32], uid: bool, done: &str) -> Outcome {
        if modified.is_empty() {
            return Outcome::ok(done);
        }
        let names: Vec<u32> = if uid {
            modified.to_vec()
        } else {
            let Some(sel) = self.selected.as_ref() else { return Outcome::ok(done) };
            let mut seqs: Vec<u32> = modified.iter().filter_map(|&u| sel.seq_of(u)).collect();
            seqs.sort_unstable();
            seqs
        };
        Outcome::ok(format!("[MODIFIED {}] Conditional STORE failed", encode::sequence_set(&names)))
    }

    pub(crate) async fn cmd_copy(
        &mut self,
        set: &SequenceSet,
        dest: &WireMailbox<'_>,
        uid: bool,
        moving: bool,
    ) -> Outcome {
        let verb = match (uid, moving) {
            (false, false) => "COPY",
            (true, false) => "UID COPY",
            (false, true) => "MOVE",
            (true, true) => "UID MOVE",
        };
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        if moving && sel.read_only {
            return Outcome::no("[READ-ONLY] Mailbox is read-only");
        }
        let Some(uids) = sel.resolve(&SeqSet::from_codec(set), uid) else {
            return Outcome::bad("Invalid sequence number");
        };
        let src = sel.mailbox.id;
        let src_mailbox = sel.mailbox.clone();
        let name = match mailbox_name(dest, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        let account = self.account().map(|a| a.id).unwrap_or_default();
        let dest = match self.app.store.mailbox_get(account, &name).await {
            Ok(Some(mb)) => mb,
            Ok(None) => return Outcome::no("[TRYCREATE] No such mailbox"),
            Err(e) => return store_error(e),
        };
        if uids.is_empty() {
            return Outcome::ok(format!("{verb} completed (no messages)"));
        }
        let uid_set = UidSet::from_uids(&uids);
        // A copy adds to the account's usage (a MOVE within the account does not).
        if !moving && let Some(refusal) = self.copy_quota_refusal(src, &uid_set).await {
            return refusal;
        }
        let pairs = if moving {
            self.app.store.move_messages(src, &uid_set, dest.id).await
        } else {
            self.app.store.copy(src, &uid_set, dest.id).await
        };
        let pairs = match pairs {
            Ok(p) => p,
            Err(e) => return store_error(e),
        };
        self.notify(dest.id, 0).await;
        let src_uids: Vec<u32> = pairs.iter().map(|p| p.0).collect();
        let dst_uids: Vec<u32> = pairs.iter().map(|p| p.1).collect();
        // Filed into or out of Junk: the user's judgement teaches the content
        // filter (queued, never awaited).
        self.app.filter.learn(&src_mailbox, &dest, &dst_uids);
        let code = format!(
            "[COPYUID {} {} {}]",
            dest.uid_validity,
            encode::sequence_set(&src_uids),
            encode::sequence_set(&dst_uids)
        );
        if !moving {
            return Outcome::ok(format!("{code} {verb} completed"));
        }
        // MOVE (RFC 6851): COPYUID goes in an untagged OK, then the EXPUNGEs.
        self.push(&format!("* OK {code} Moved"));
        let mut sorted = src_uids;
        sorted.sort_unstable();
        self.announce_expunged(&sorted);
        self.notify(src, 0).await;
        if let Err(e) = self.sync(true).await {
            return store_error(e);
        }
        Outcome::ok(format!("{verb} completed"))
    }

    /// Removes UIDs from the map, sending EXPUNGE for each (ascending UIDs: each
    /// number is computed after the previous removal, as the client will), or one
    /// VANISHED once QRESYNC is enabled (RFC 7162 §3.2.10).
    fn announce_expunged(&mut self, uids: &[u32]) {
        let mut lines = Vec::with_capacity(uids.len());
        let vanished = self.qresync;
        if let Some(sel) = self.selected.as_mut() {
            let mut gone = Vec::new();
            for &uid in uids {
                if let Some(seq) = sel.remove(uid) {
                    gone.push(uid);
                    if !vanished {
                        lines.push(format!("* {seq} EXPUNGE"));
                    }
                }
            }
            if vanished && !gone.is_empty() {
                lines.push(format!("* VANISHED {}", encode::sequence_set(&gone)));
            }
        }
        for l in lines {
            self.push(&l);
        }
    }

    pub(crate) async fn cmd_expunge(&mut self, uid_set: Option<SeqSet>) -> Outcome {
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        if sel.read_only {
            return Outcome::no("[READ-ONLY] Mailbox is read-only");
        }
        let mailbox_id = sel.mailbox.id;
        let store = self.app.store.clone();
        let removed = match &uid_set {
            None => store.expunge(mailbox_id, None).await,
            Some(set) => {
                // UID EXPUNGE removes only the named messages that are \Deleted.
                let Some(named) = sel.resolve(set, true) else { return Outcome::bad("Invalid UID set") };
                let deleted = match store.uids_by_flags(mailbox_id, Flags::DELETED, Flags::NONE).await {
                    Ok(d) => d,
                    Err(e) => return store_error(e),
                };
                let both: Vec<u32> = named.into_iter().filter(|u| deleted.binary_search(u).is_ok()).collect();
                if both.is_empty() {
                    Ok(Expunged::default())
                } else {
                    store.expunge(mailbox_id, Some(&UidSet::from_uids(&both))).await
                }
            }
        };
        let Expunged { uids: mut removed, modseq } = match removed {
            Ok(r) => r,
            Err(e) => return store_error(e),
        };
        removed.sort_unstable();
        self.announce_expunged(&removed);
        // The store's modseq right after the session's own: the removal was the
        // whole change, and the session is up to date without reading it back.
        let caught_up = match self.selected.as_mut() {
            Some(sel) if !removed.is_empty() && sel.modseq.checked_add(1) == Some(modseq) => {
                sel.modseq = modseq;
                true
            }
            _ => false,
        };
        if caught_up {
            // What `sync` does when nothing else changed.
            self.push_pending_expunges();
        } else if let Err(e) = self.sync(true).await {
            return store_error(e);
        }
        if !removed.is_empty() {
            self.notify(mailbox_id, modseq).await;
        }
        Outcome::ok(if uid_set.is_some() { "UID EXPUNGE completed" } else { "EXPUNGE completed" })
    }
}
