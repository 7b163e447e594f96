//! THREAD (RFC 5256 §2): the messages a search matches, as threads by
//! ORDEREDSUBJECT (same base subject) or REFERENCES (the Message-ID, References
//! and In-Reply-To chain, then subjects), in the RFC's response syntax.

use std::collections::HashMap;

use super::session::{Outcome, Session, store_error};
use std::sync::Arc;

use super::sort_cache::SortKeys;
use crate::proto::imap::parse::ThreadAlgorithm;

/// Bodies read at once for their References / In-Reply-To headers.
const HEADER_BATCH: usize = 256;

/// What threading needs of one message.
#[derive(Debug, Clone, Default)]
pub struct ThreadMessage {
    /// The number the response shows (sequence number, or UID for UID THREAD).
    pub number: u32,
    /// Sent date (Date: in UTC, else arrival), microseconds.
    pub date: i64,
    pub subject: String,
    /// The subject had Re:/Fwd:/(fwd) taken away.
    pub reply: bool,
    pub message_id: Option<String>,
    /// References, else the In-Reply-To message id (RFC 5256 §2.2 step 1A).
    pub parents: Vec<String>,
}

/// A thread: a message (or, for a group without one, none) and its replies.
#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    pub message: Option<usize>,
    pub children: Vec<Thread>,
}

impl Session {
    /// `rows`: what the search matched ([`Session::matching_rows`]).
    pub(crate) async fn cmd_thread(
        &mut self,
        algorithm: ThreadAlgorithm,
        rows: Vec<Arc<SortKeys>>,
        uid: bool,
    ) -> Outcome {
        // References and In-Reply-To are not in the stored summary: read the headers.
        let mut parents: HashMap<i64, Vec<String>> = HashMap::new();
        if algorithm == ThreadAlgorithm::References {
            let ids: Vec<i64> = rows.iter().map(|r| r.message_id).collect();
            for chunk in ids.chunks(HEADER_BATCH) {
                let bodies = match self.app.store.message_bodies(chunk).await {
                    Ok(b) => b,
                    Err(e) => return store_error(e),
                };
                for b in bodies {
                    let header = &b.body[..(b.header_size as usize).min(b.body.len())];
                    parents.insert(b.message_id, parent_ids(header));
                }
            }
        }
        let Some(sel) = self.selected.as_ref() else { return Outcome::bad("No mailbox selected") };
        let messages: Vec<ThreadMessage> = rows
            .iter()
            .filter_map(|k: &Arc<SortKeys>| {
                let number = if uid { sel.seq_of(k.uid).map(|_| k.uid) } else { sel.seq_of(k.uid) }?;
                let message_id = Some(k.message_id_header.to_string()).filter(|m| !m.is_empty());
                let parents = parents.remove(&k.message_id).unwrap_or_default();
                Some(ThreadMessage {
                    number,
                    date: k.sent,
                    subject: k.subject.to_string(),
                    reply: k.reply,
                    message_id,
                    parents,
                })
            })
            .collect();
        let threads = match algorithm {
            ThreadAlgorithm::OrderedSubject => ordered_subject(&messages),
            ThreadAlgorithm::References => references(&messages),
        };
        // `thread-data = "THREAD" [SP 1*thread-list]` (§4): nothing after it when
        // nothing matched.
        let rendered = render(&threads, &messages);
        self.push(&if rendered.is_empty() { "* THREAD".to_string() } else { format!("* THREAD {rendered}") });
        Outcome::ok(if uid { "UID THREAD completed" } else { "THREAD completed" })
    }
}

/// The message ids of References, or else the first of In-Reply-To, from a header
/// block (folded lines joined).
pub fn parent_ids(header: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(header);
    let (mut references, mut in_reply_to) = (None, None);
    let mut field = String::new();
    for line in text.split('\n').map(|l| l.trim_end_matches('\r')).chain([""]) {
        if line.starts_with([' ', '\t']) {
            field.push(' ');
            field.push_str(line.trim());
            continue;
        }
        if let Some((name, value)) = field.split_once(':') {
            if name.trim().eq_ignore_ascii_case("References") {
                references = Some(value.to_string());
            } else if name.trim().eq_ignore_ascii_case("In-Reply-To") {
                in_reply_to = Some(value.to_string());
            }
        }
        field = line.to_string();
    }
    let ids = |v: &str| -> Vec<String> {
        v.split('<').skip(1).filter_map(|p| p.split_once('>')).map(|(id, _)| id.trim().to_string()).collect()
    };
    match references.as_deref().map(ids).filter(|r| !r.is_empty()) {
        Some(r) => r,
        None => in_reply_to.as_deref().map(ids).and_then(|v| v.into_iter().next()).into_iter().collect(),
    }
}

/// ORDEREDSUBJECT (§2.1 + §4): messages grouped by base subject; in a group the
/// earliest is the parent of all the others; threads by the date of their first.
pub fn ordered_subject(messages: &[ThreadMessage]) -> Vec<Thread> {
    let mut order: Vec<usize> = (0..messages.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&messages[a], &messages[b]);
        x.subject.to_ascii_uppercase().cmp(&y.subject.to_ascii_uppercase()).then(by_date(x, y))
    });
    let mut threads: Vec<Thread> = Vec::new();
    let mut last_subject: Option<String> = None;
    for i in order {
        let key = messages[i].subject.to_ascii_uppercase();
        let leaf = Thread { message: Some(i), children: Vec::new() };
        match threads.last_mut() {
            Some(t) if last_subject.as_ref() == Some(&key) => t.children.push(leaf),
            _ => threads.push(leaf),
        }
        last_subject = Some(key);
    }
    threads.sort_by(|a, b| by_date(&messages[first(a)], &messages[first(b)]));
    threads
}

/// REFERENCES (§2.2 steps 1-6).
pub fn references(messages: &[ThreadMessage]) -> Vec<Thread> {
    let mut set = Containers::default();
    for (i, m) in messages.iter().enumerate() {
        // 1A: the reference chain, each linked to the one before unless already
        // parented or a loop would form.
        let mut previous: Option<usize> = None;
        for id in &m.parents {
            let c = set.get(id);
            if let Some(p) = previous
                && set.parent[c].is_none()
                && !set.would_loop(p, c)
            {
                set.link(p, c);
            }
            previous = Some(c);
        }
        // 1B: the message's own container (a duplicate or missing id gets one of
        // its own), its parent the last reference.
        let own = match &m.message_id {
            Some(id) => {
                let c = set.get(id);
                if set.message[c].is_none() { c } else { set.fresh() }
            }
            None => set.fresh(),
        };
        set.message[own] = Some(i);
        if let Some(old) = set.parent[own] {
            set.children[old].retain(|&c| c != own);
            set.parent[own] = None;
        }
        if let Some(p) = previous
            && !set.would_loop(p, own)
        {
            set.link(p, own);
        }
    }
    // 2-3: the roots, with empty containers pruned.
    let roots: Vec<usize> = (0..set.parent.len()).filter(|&c| set.parent[c].is_none()).collect();
    let roots = set.prune(roots, true);
    let mut threads: Vec<Thread> = roots.into_iter().map(|c| set.tree(c)).collect();
    // 6 (children first: a root without a message sorts by its first child).
    for t in &mut threads {
        sort_children(t, messages);
    }
    // 4
    threads.sort_by(|a, b| by_date(&messages[first(a)], &messages[first(b)]));
    // 5: threads whose (first) messages share a base subject are merged.
    let threads = group_by_subject(threads, messages);
    let mut threads = threads;
    for t in &mut threads {
        sort_children(t, messages);
    }
    threads
}

fn group_by_subject(threads: Vec<Thread>, messages: &[ThreadMessage]) -> Vec<Thread> {
    let subject_of = |t: &Thread| {
        let m = &messages[first(t)];
        (m.subject.to_ascii_uppercase(), t.message.is_some() && m.reply)
    };
    // 5A-B: the thread that represents each subject: a dummy over a message, a
    // non-reply over a reply.
    let mut table: HashMap<String, usize> = HashMap::new();
    for (i, t) in threads.iter().enumerate() {
        let (subject, reply) = subject_of(t);
        if subject.is_empty() {
            continue;
        }
        match table.get(&subject) {
            None => {
                table.insert(subject, i);
            }
            Some(&j) => {
                let current = &threads[j];
                let current_reply = subject_of(current).1;
                if (current.message.is_some() && t.message.is_none()) || (current_reply && !reply) {
                    table.insert(subject, i);
                }
            }
        }
    }
    // 5C: merge the others into it.
    let mut slots: Vec<Option<Thread>> = threads.into_iter().map(Some).collect();
    for i in 0..slots.len() {
        let Some(t) = slots[i].as_ref() else { continue };
        let (subject, reply) = subject_of(t);
        let Some(&j) = table.get(&subject) else { continue };
        if i == j || subject.is_empty() {
            continue;
        }
        let Some(this) = slots[i].take() else { continue };
        let Some(target) = slots[j].take() else {
            slots[i] = Some(this);
            continue;
        };
        let target_reply = subject_of(&target).1;
        let merged = match (target.message.is_none(), this.message.is_none()) {
            (true, true) => {
                let mut t = target;
                t.children.extend(this.children);
                t
            }
            (true, false) => {
                let mut t = target;
                t.children.push(this);
                t
            }
            (false, true) => {
                let mut t = this;
                t.children.push(target);
                t
            }
            (false, false) if !target_reply && reply => {
                let mut t = target;
                t.children.push(this);
                t
            }
            (false, false) => Thread { message: None, children: vec![target, this] },
        };
        slots[j] = Some(merged);
    }
    slots.into_iter().flatten().collect()
}

/// Containers of REFERENCES step 1, by index.
#[derive(Default)]
struct Containers {
    ids: HashMap<String, usize>,
    message: Vec<Option<usize>>,
    parent: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
}

impl Containers {
    fn fresh(&mut self) -> usize {
        self.message.push(None);
        self.parent.push(None);
        self.children.push(Vec::new());
        self.message.len() - 1
    }

    fn get(&mut self, id: &str) -> usize {
        if let Some(&c) = self.ids.get(id) {
            return c;
        }
        let c = self.fresh();
        self.ids.insert(id.to_string(), c);
        c
    }

    /// Making `child` a child of `parent` would close a loop.
    fn would_loop(&self, parent: usize, child: usize) -> bool {
        let mut at = Some(parent);
        while let Some(c) = at {
            if c == child {
                return true;
            }
            at = self.parent[c];
        }
        false
    }

    fn link(&mut self, parent: usize, child: usize) {
        self.parent[child] = Some(parent);
        self.children[parent].push(child);
    }

    /// Step 3: empty containers go; their children move up a level, except to the
    /// root level where only a single child moves up.
    fn prune(&mut self, list: Vec<usize>, root: bool) -> Vec<usize> {
        let mut out = Vec::new();
        for c in list {
            let kids = std::mem::take(&mut self.children[c]);
            let kids = self.prune(kids, false);
            if self.message[c].is_some() {
                self.children[c] = kids;
                out.push(c);
            } else if kids.is_empty() {
                continue;
            } else if !root || kids.len() == 1 {
                out.extend(kids);
            } else {
                self.children[c] = kids;
                out.push(c);
            }
        }
        out
    }

    fn tree(&self, c: usize) -> Thread {
        Thread {
            message: self.message[c],
            children: self.children[c].iter().map(|&k| self.tree(k)).collect(),
        }
    }
}

/// Step 6: children by date, recursively.
fn sort_children(t: &mut Thread, messages: &[ThreadMessage]) {
    for c in &mut t.children {
        sort_children(c, messages);
    }
    t.children.sort_by(|a, b| by_date(&messages[first(a)], &messages[first(b)]));
}

/// The message a thread sorts by: its own, or (no message) its first child's.
fn first(t: &Thread) -> usize {
    match t.message {
        Some(m) => m,
        None => t.children.first().map_or(0, first),
    }
}

/// By sent date, ties in mailbox order.
fn by_date(a: &ThreadMessage, b: &ThreadMessage) -> std::cmp::Ordering {
    a.date.cmp(&b.date).then(a.number.cmp(&b.number))
}

/// `(1 2 (3)(4 5))(6)`: a message followed by its only reply continues the line;
/// several replies are nested lists.
pub fn render(threads: &[Thread], messages: &[ThreadMessage]) -> String {
    fn members(t: &Thread, messages: &[ThreadMessage], out: &mut String) {
        if let Some(m) = t.message {
            out.push_str(&messages[m].number.to_string());
        }
        match t.children.as_slice() {
            [] => {}
            [only] => {
                if t.message.is_some() {
                    out.push(' ');
                }
                members(only, messages, out);
            }
            several => {
                if t.message.is_some() {
                    out.push(' ');
                }
                for c in several {
                    out.push('(');
                    members(c, messages, out);
                    out.push(')');
                }
            }
        }
    }
    let mut out = String::new();
    for t in threads {
        out.push('(');
        members(t, messages, &mut out);
        out.push(')');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imap::sort::base_subject_of;

    fn msg(number: u32, date: i64, subject: &str, id: &str, parents: &[&str]) -> ThreadMessage {
        let (subject, reply) = base_subject_of(subject);
        ThreadMessage {
            number,
            date,
            subject,
            reply,
            message_id: (!id.is_empty()).then(|| id.to_string()),
            parents: parents.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn parent_ids_prefer_references_and_unfold() {
        let h = b"Subject: x\r\nReferences: <a@x>\r\n <b@x>\r\n\t<c@x>\r\nIn-Reply-To: <c@x>\r\n\r\n";
        assert_eq!(parent_ids(h), ["a@x", "b@x", "c@x"]);
        let h = b"In-Reply-To: <c@x> (comment) <d@x>\r\n\r\n";
        assert_eq!(parent_ids(h), ["c@x"]);
        assert!(parent_ids(b"Subject: none\r\n\r\n").is_empty());
    }

    #[test]
    fn ordered_subject_groups_and_nests() {
        let m = [
            msg(1, 10, "Hello", "1", &[]),
            msg(2, 30, "Re: hello", "2", &[]),
            msg(3, 20, "Other", "3", &[]),
            msg(4, 40, "Fwd: Hello", "4", &[]),
            msg(5, 5, "third", "5", &[]),
            msg(6, 50, "Re: other", "6", &[]),
        ];
        assert_eq!(render(&ordered_subject(&m), &m), "(5)(1 (2)(4))(3 6)");
    }

    #[test]
    fn references_follow_the_chain_and_prune_missing_parents() {
        let m = [
            msg(1, 10, "topic", "a", &[]),
            msg(2, 20, "Re: topic", "b", &["a"]),
            msg(3, 30, "Re: topic", "c", &["a", "b"]),
            msg(4, 25, "Re: topic", "d", &["a"]),
            // Its parent "x" is not in the mailbox: a root of its own (one child
            // of an empty root moves up).
            msg(5, 5, "unrelated", "e", &["x"]),
            // A reply to two messages we do not have, the second one referencing
            // the first: still one thread.
            msg(6, 60, "Re: lost", "f", &["gone1", "gone2"]),
            msg(7, 70, "Re: lost", "g", &["gone1"]),
        ];
        // 6 and 7 share the empty root gone1 (two children stay under it).
        assert_eq!(render(&references(&m), &m), "(5)(1 (2 3)(4))((6)(7))");
    }

    #[test]
    fn references_merge_threads_by_subject_and_survive_loops() {
        let m = [
            msg(1, 10, "Plans", "a", &[]),
            msg(2, 20, "Re: Plans", "b", &["zzz"]),
            msg(3, 30, "loop", "c", &["d"]),
            msg(4, 40, "loop", "d", &["c"]),
            msg(5, 50, "dup", "a", &[]),
        ];
        let out = render(&references(&m), &m);
        // 2's parent is unknown, but the subject joins it to 1, the original.
        assert!(out.starts_with("(1 2)"), "{out}");
        // Every message appears exactly once.
        let mut numbers: Vec<u32> = out
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        numbers.sort_unstable();
        assert_eq!(numbers, [1, 2, 3, 4, 5], "{out}");
    }
}
