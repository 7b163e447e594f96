//! APPEND, with LITERAL+ and MULTIAPPEND (RFC 3502: all messages or none).

use super::mailbox::name_from_bytes;
use super::quota::over_quota;
use super::session::{Outcome, Session, store_error};
use crate::accept::{self, append::Filed, append::Refused};
use crate::proto::imap::encode;
use crate::proto::imap::parse::AppendMessage;
use crate::store::StoreResult;
use crate::store::common::normalize_flagset;
use mailcluster_model::FlagRow;

impl Session {
    pub(crate) async fn cmd_append(
        &mut self,
        mailbox: &[u8],
        mut messages: Vec<AppendMessage<'_>>,
    ) -> Outcome {
        if self.utf8 {
            for m in &mut messages {
                m.data = unwrap_utf8_in_literal(m.data);
            }
        }
        let name = match name_from_bytes(mailbox, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        let account = self.account().map(|a| a.id).unwrap_or_default();
        let (mb, quota) = match self.app.store.mailbox_with_quota(account, &name).await {
            Ok(Some(found)) => found,
            // TRYCREATE tells the client to CREATE and retry (RFC 3501 §6.3.11).
            Ok(None) => return Outcome::no("[TRYCREATE] No such mailbox"),
            Err(e) => return store_error(e),
        };
        // The flags as stored, should the session add the messages to its view.
        let mut stored_flags = Vec::with_capacity(messages.len());
        for m in &messages {
            match normalize_flagset(&m.flags) {
                Ok(f) => stored_flags.push(f),
                Err(e) => return store_error(e),
            }
        }
        let filed = messages
            .into_iter()
            .map(|m| Filed { raw: shared_or_copied(&self.command, m.data), flags: m.flags, date: m.date })
            .collect();
        let delivered = match accept::append::append(&self.app, mb.id, &quota, filed).await {
            Ok(d) => d,
            Err(Refused::OverQuota) => return over_quota(),
            Err(Refused::Store(e)) => return store_error(e),
        };
        // One row per message, in APPEND order (its UIDs ascend in that order).
        let rows: Vec<FlagRow> = delivered
            .iter()
            .zip(stored_flags)
            .filter_map(|(to, flags)| {
                let to = to.iter().find(|d| d.mailbox_id == mb.id)?;
                Some(FlagRow { uid: to.uid, flags, modseq: to.modseq })
            })
            .collect();
        let uids: Vec<u32> = rows.iter().map(|r| r.uid).collect();
        let modseq = rows.iter().map(|r| r.modseq).max().unwrap_or(0);
        // Group commit may have stored other deliveries to this mailbox in the same
        // change: then the session must read them.
        let alone = delivered
            .iter()
            .flatten()
            .filter(|d| d.mailbox_id == mb.id)
            .all(|d| d.added as usize == rows.len());
        if let Err(e) = self.take_own_append(mb.id, &rows, modseq, alone).await {
            return store_error(e);
        }
        // After the session's own \Recent claim, so that a session woken by the
        // notice finds the messages taken.
        self.notify(mb.id, modseq).await;
        Outcome::ok(format!(
            "[APPENDUID {} {}] APPEND completed",
            mb.uid_validity,
            encode::sequence_set(&uids)
        ))
    }

    /// Brings the selected mailbox, when it is the one appended to, up to date
    /// after the session's own APPEND. The delivery's modseq right after the view's
    /// means nothing else changed the mailbox in between; `alone`, that the change
    /// holds no other delivery's messages: then the new messages are the whole
    /// change, known without reading it back (as for STORE).
    async fn take_own_append(
        &mut self,
        mailbox_id: i64,
        rows: &[FlagRow],
        modseq: u64,
        alone: bool,
    ) -> StoreResult<()> {
        let Some(sel) = self.selected.as_mut().filter(|s| s.mailbox.id == mailbox_id) else { return Ok(()) };
        if rows.is_empty() || !alone || sel.modseq.checked_add(1) != Some(modseq) {
            return self.sync_changes(true).await;
        }
        sel.modseq = modseq;
        let mut new_keyword = false;
        for row in rows {
            new_keyword |= sel.learn_keywords(row.flags.keywords.iter());
        }
        let flags_lines = new_keyword.then(|| sel.flags_lines());
        // What `sync` does when nothing else changed.
        self.push_pending_expunges();
        for line in flags_lines.into_iter().flatten() {
            self.push(&line);
        }
        let rows: Vec<&FlagRow> = rows.iter().collect();
        for line in self.add_new_messages(mailbox_id, &rows, true).await {
            self.push(&line);
        }
        Ok(())
    }
}

/// Python's imaplib (3.11–3.13) in UTF8=ACCEPT mode puts the `UTF8 (…)` wrapper of
/// RFC 9755 §4 inside the literal instead of around it. No message starts with
/// `UTF8 (` (a header field name ends at a colon, and a body needs a header
/// before it), so such a literal is the client's message in that wrapper, and
/// storing the wrapper would hand every reader a message without a header.
/// `data` as a slice of `command` when it lies within it (the message is not
/// held twice); a copy when the command was rewritten before parsing.
fn shared_or_copied(command: &bytes::Bytes, data: &[u8]) -> bytes::Bytes {
    let start = (data.as_ptr() as usize).wrapping_sub(command.as_ptr() as usize);
    match start.checked_add(data.len()) {
        Some(end) if start <= command.len() && end <= command.len() => command.slice(start..end),
        _ => bytes::Bytes::copy_from_slice(data),
    }
}

fn unwrap_utf8_in_literal(data: &[u8]) -> &[u8] {
    match data.strip_prefix(b"UTF8 (").and_then(|d| d.strip_suffix(b")")) {
        Some(message) => message,
        None => data,
    }
}
