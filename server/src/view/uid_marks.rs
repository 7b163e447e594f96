//! The highest UIDNEXT this process has seen of each mailbox, so that a
//! database that goes back in time (a restore, or a promoted replica that lost
//! commits) cannot hand out a UID a client already knows for another message.
//!
//! When the database's epoch changes (`watch_epoch`), every mailbox whose UIDNEXT
//! in the store is below the one seen here gets a new UIDVALIDITY
//! (`Mailboxes::mailbox_renew_uid_validity`): clients then forget the UIDs they had
//! and read the mailbox again (RFC 3501 §2.3.1.1). Sessions that have such a
//! mailbox selected are ended with `* BYE`: within a selection a UIDVALIDITY
//! cannot change.
//!
//! What is seen: SELECT, EXAMINE, STATUS and the new messages a selected session
//! learns of. Marks are kept in the process, two generations of at most
//! [`MAX_MARKS`] mailboxes: one that was not seen for two generations is
//! forgotten (a pod that restarts forgets all; its sessions started again too).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Mailboxes in one generation of marks.
const MAX_MARKS: usize = 100_000;

#[derive(Default)]
pub struct UidMarks {
    inner: Mutex<Marks>,
    /// Whether any mailbox was renewed: sessions look no further when not.
    any_renewed: AtomicBool,
}

#[derive(Default)]
struct Marks {
    /// Mailbox → (UIDVALIDITY, highest UIDNEXT seen under it).
    current: HashMap<i64, (u32, u32)>,
    previous: HashMap<i64, (u32, u32)>,
    /// Mailbox → the UIDVALIDITY it had when this process renewed it or found
    /// it renewed: sessions selected under it must end.
    renewed: HashMap<i64, u32>,
}

impl UidMarks {
    /// Records that `mailbox_id` had `uid_next` under `uid_validity`.
    pub fn note(&self, mailbox_id: i64, uid_validity: u32, uid_next: u32) {
        let mut marks = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let earlier = marks.current.get(&mailbox_id).or_else(|| marks.previous.get(&mailbox_id)).copied();
        let uid_next = match earlier {
            Some((validity, seen)) if validity == uid_validity => seen.max(uid_next),
            _ => uid_next,
        };
        if marks.current.len() >= MAX_MARKS && !marks.current.contains_key(&mailbox_id) {
            marks.previous = std::mem::take(&mut marks.current);
        }
        marks.current.insert(mailbox_id, (uid_validity, uid_next));
    }

    /// Every mark: (mailbox, UIDVALIDITY, highest UIDNEXT seen).
    pub fn all(&self) -> Vec<(i64, u32, u32)> {
        let marks = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: HashMap<i64, (u32, u32)> = marks.previous.clone();
        all.extend(marks.current.iter().map(|(k, v)| (*k, *v)));
        all.into_iter().map(|(id, (validity, next))| (id, validity, next)).collect()
    }

    /// `mailbox_id` no longer has `old_validity`: its mark goes, and sessions
    /// that selected it under that value end.
    pub fn renewed(&self, mailbox_id: i64, old_validity: u32) {
        let mut marks = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        marks.current.remove(&mailbox_id);
        marks.previous.remove(&mailbox_id);
        if marks.renewed.len() >= MAX_MARKS {
            marks.renewed.clear();
        }
        marks.renewed.insert(mailbox_id, old_validity);
        self.any_renewed.store(true, Ordering::Release);
    }

    /// Whether a selection of `mailbox_id` under `uid_validity` is void.
    pub fn is_renewed(&self, mailbox_id: i64, uid_validity: u32) -> bool {
        if !self.any_renewed.load(Ordering::Acquire) {
            return false;
        }
        let marks = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        marks.renewed.get(&mailbox_id) == Some(&uid_validity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_keep_the_highest_uidnext_per_uidvalidity() {
        let marks = UidMarks::default();
        marks.note(1, 100, 5);
        marks.note(1, 100, 3);
        marks.note(2, 7, 9);
        let mut all = marks.all();
        all.sort_unstable();
        assert_eq!(all, vec![(1, 100, 5), (2, 7, 9)]);
        marks.note(1, 101, 2);
        assert!(marks.all().contains(&(1, 101, 2)), "a new UIDVALIDITY starts over");
        assert!(!marks.is_renewed(1, 101));
        marks.renewed(1, 101);
        assert!(marks.is_renewed(1, 101));
        assert!(!marks.is_renewed(1, 102));
        assert!(!marks.all().iter().any(|m| m.0 == 1));
    }
}
