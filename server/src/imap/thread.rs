//! THREAD (RFC 5256 §2): the messages a search matches, as threads by
//! ORDEREDSUBJECT (same base subject) or REFERENCES (the Message-ID, References
//! and In-Reply-To chain, then subjects), in the RFC's response syntax.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::session::{Outcome, Session, store_error};
use std::sync::Arc;

use crate::proto::imap::parse::ThreadAlgorithm;
use crate::view::sort_cache::SortKeys;

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

/// Threads as a forest: nodes by index, each a message (or, for a group
/// without one, none) and its replies in order. A conversation can be as deep as
/// its messages make it, so everything that walks a forest does so with a stack
/// or a loop of its own, never by recursion.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Forest {
    nodes: Vec<Node>,
    /// The threads, in order.
    pub roots: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq)]
struct Node {
    message: Option<usize>,
    children: Vec<usize>,
}

impl Forest {
    /// The message of node `n` (an index into the threaded messages), none for a
    /// group that lacks its first message.
    pub fn message(&self, n: usize) -> Option<usize> {
        self.nodes[n].message
    }

    /// The replies of node `n`, in order.
    pub fn children(&self, n: usize) -> &[usize] {
        &self.nodes[n].children
    }

    fn add(&mut self, message: Option<usize>, children: Vec<usize>) -> usize {
        self.nodes.push(Node { message, children });
        self.nodes.len() - 1
    }

    /// The message a thread sorts by: its own, or (none) its first child's.
    fn first(&self, mut n: usize) -> usize {
        loop {
            let node = &self.nodes[n];
            match (node.message, node.children.first()) {
                (Some(m), _) => return m,
                (None, Some(&c)) => n = c,
                (None, None) => return 0,
            }
        }
    }

    /// Every node under `roots` in post-order (children before their parent).
    fn post_order(&self) -> Vec<usize> {
        let mut order = Vec::with_capacity(self.nodes.len());
        let mut stack: Vec<(usize, bool)> = self.roots.iter().rev().map(|&r| (r, false)).collect();
        while let Some((n, expanded)) = stack.pop() {
            if expanded {
                order.push(n);
                continue;
            }
            stack.push((n, true));
            stack.extend(self.nodes[n].children.iter().rev().map(|&c| (c, false)));
        }
        order
    }

    /// Step 6: every node's children by date, deepest first so that a node
    /// without a message sorts by its earliest reply.
    fn sort_children(&mut self, messages: &[ThreadMessage]) {
        for n in self.post_order() {
            let mut children = std::mem::take(&mut self.nodes[n].children);
            children.sort_by(|&a, &b| by_date(&messages[self.first(a)], &messages[self.first(b)]));
            self.nodes[n].children = children;
        }
    }
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

/// References kept of one message: its first (the start of its thread) and its
/// last ones (its nearest ancestors), the ones RFC 5322 §3.6.4 asks a writer to
/// keep when it trims the field. The rest say nothing the kept ones do not, and
/// a message can list any number of ids (one with 20,000 made a chain of as many
/// containers, each a level deeper).
pub const MAX_REFERENCES: usize = 64;

/// How far up its parent links the loop check of REFERENCES step 1 climbs. A
/// link that would put a message deeper than this is not made: the message
/// starts a thread of its own (and rejoins its conversation by subject, step 5).
/// So a check costs at most this many steps however long the conversations.
pub const MAX_THREAD_DEPTH: usize = 1_000;

/// The message ids of References, or else the first of In-Reply-To, from a header
/// block (folded lines joined): at most [`MAX_REFERENCES`], the first and the last.
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
    fn ids(v: &str) -> impl Iterator<Item = &str> {
        v.split('<').skip(1).filter_map(|p| p.split_once('>')).map(|(id, _)| id.trim())
    }
    let references = references.as_deref().map(|v| {
        let mut ids = ids(v);
        let first = ids.next();
        let mut last = std::collections::VecDeque::with_capacity(MAX_REFERENCES);
        for id in ids {
            if last.len() == MAX_REFERENCES - 1 {
                last.pop_front();
            }
            last.push_back(id);
        }
        first.into_iter().chain(last).map(str::to_string).collect::<Vec<_>>()
    });
    match references.filter(|r| !r.is_empty()) {
        Some(r) => r,
        None => in_reply_to.as_deref().and_then(|v| ids(v).next()).map(str::to_string).into_iter().collect(),
    }
}

/// ORDEREDSUBJECT (§2.1 + §4): messages grouped by base subject; in a group the
/// earliest is the parent of all the others; threads by the date of their first.
pub fn ordered_subject(messages: &[ThreadMessage]) -> Forest {
    let keys: Vec<String> = messages.iter().map(|m| m.subject.to_ascii_uppercase()).collect();
    let mut order: Vec<usize> = (0..messages.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]).then(by_date(&messages[a], &messages[b])));
    let mut forest = Forest::default();
    let mut last: Option<(usize, usize)> = None;
    for i in order {
        let leaf = forest.add(Some(i), Vec::new());
        match last {
            Some((root, key)) if keys[key] == keys[i] => forest.nodes[root].children.push(leaf),
            _ => {
                forest.roots.push(leaf);
                last = Some((leaf, i));
            }
        }
    }
    let mut roots = std::mem::take(&mut forest.roots);
    roots.sort_by(|&a, &b| by_date(&messages[forest.first(a)], &messages[forest.first(b)]));
    forest.roots = roots;
    forest
}

/// REFERENCES (§2.2 steps 1-6).
pub fn references(messages: &[ThreadMessage]) -> Forest {
    let mut set = Containers::default();
    for (i, m) in messages.iter().enumerate() {
        // 1A: the reference chain, each linked to the one before unless already
        // parented or a loop would form.
        let mut previous: Option<usize> = None;
        for id in m.parents.iter().take(MAX_REFERENCES) {
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
        // its own), its parent the last reference. The link it had is dropped
        // here and its entry in the old parent's list when the forest is built:
        // a list can be long, and rewriting it for every such message adds up.
        let own = match &m.message_id {
            Some(id) => {
                let c = set.get(id);
                if set.message[c].is_none() { c } else { set.fresh() }
            }
            None => set.fresh(),
        };
        set.message[own] = Some(i);
        set.parent[own] = None;
        if let Some(p) = previous
            && !set.would_loop(p, own)
        {
            set.link(p, own);
        }
    }
    // 2-3: the roots, with empty containers pruned.
    let mut forest = set.pruned();
    // 6 (children first: a root without a message sorts by its first child).
    forest.sort_children(messages);
    // 4
    let mut roots = std::mem::take(&mut forest.roots);
    roots.sort_by(|&a, &b| by_date(&messages[forest.first(a)], &messages[forest.first(b)]));
    forest.roots = roots;
    // 5: threads whose (first) messages share a base subject are merged.
    group_by_subject(&mut forest, messages);
    forest.sort_children(messages);
    forest
}

fn group_by_subject(forest: &mut Forest, messages: &[ThreadMessage]) {
    let subject_of = |forest: &Forest, t: usize| {
        let m = &messages[forest.first(t)];
        (m.subject.to_ascii_uppercase(), forest.nodes[t].message.is_some() && m.reply)
    };
    let threads = std::mem::take(&mut forest.roots);
    // 5A-B: the thread that represents each subject: a dummy over a message, a
    // non-reply over a reply.
    let mut table: HashMap<String, usize> = HashMap::new();
    for (i, &t) in threads.iter().enumerate() {
        let (subject, reply) = subject_of(forest, t);
        if subject.is_empty() {
            continue;
        }
        match table.get(&subject) {
            None => {
                table.insert(subject, i);
            }
            Some(&j) => {
                let current = threads[j];
                let current_reply = subject_of(forest, current).1;
                if (forest.nodes[current].message.is_some() && forest.nodes[t].message.is_none())
                    || (current_reply && !reply)
                {
                    table.insert(subject, i);
                }
            }
        }
    }
    // 5C: merge the others into it.
    let mut slots: Vec<Option<usize>> = threads.into_iter().map(Some).collect();
    for i in 0..slots.len() {
        let Some(this) = slots[i] else { continue };
        let (subject, reply) = subject_of(forest, this);
        let Some(&j) = table.get(&subject) else { continue };
        if i == j || subject.is_empty() {
            continue;
        }
        let Some(target) = slots[j] else { continue };
        slots[i] = None;
        let target_reply = subject_of(forest, target).1;
        let merged = match (forest.nodes[target].message.is_none(), forest.nodes[this].message.is_none()) {
            (true, true) => {
                let moved = std::mem::take(&mut forest.nodes[this].children);
                forest.nodes[target].children.extend(moved);
                target
            }
            (true, false) => {
                forest.nodes[target].children.push(this);
                target
            }
            (false, true) => {
                forest.nodes[this].children.push(target);
                this
            }
            (false, false) if !target_reply && reply => {
                forest.nodes[target].children.push(this);
                target
            }
            (false, false) => forest.add(None, vec![target, this]),
        };
        slots[j] = Some(merged);
    }
    forest.roots = slots.into_iter().flatten().collect();
}

/// Containers of REFERENCES step 1, by index.
#[derive(Default)]
struct Containers {
    ids: HashMap<String, usize>,
    message: Vec<Option<usize>>,
    parent: Vec<Option<usize>>,
    /// Every link made, including ones dropped since (their child's `parent`
    /// names another container, or none).
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

    /// Making `child` a child of `parent` would close a loop, or put `child`
    /// deeper than [`MAX_THREAD_DEPTH`].
    fn would_loop(&self, parent: usize, child: usize) -> bool {
        let mut at = Some(parent);
        for _ in 0..MAX_THREAD_DEPTH {
            match at {
                None => return false,
                Some(c) if c == child => return true,
                Some(c) => at = self.parent[c],
            }
        }
        true
    }

    fn link(&mut self, parent: usize, child: usize) {
        self.parent[child] = Some(parent);
        self.children[parent].push(child);
    }

    /// Steps 2 and 3 as a forest: the containers without a parent, and under
    /// each its children where empty containers go; their children move up a
    /// level, except to the root level where only a single child moves up.
    fn pruned(mut self) -> Forest {
        // The links still standing, each once (a child dropped and linked to the
        // same parent again is listed twice).
        let mut placed = vec![false; self.parent.len()];
        for p in 0..self.children.len() {
            let parent = &self.parent;
            self.children[p].retain(|&c| parent[c] == Some(p) && !std::mem::replace(&mut placed[c], true));
        }
        let nodes = self
            .message
            .iter()
            .zip(self.children)
            .map(|(&message, children)| Node { message, children })
            .collect();
        let roots = (0..self.parent.len()).filter(|&c| self.parent[c].is_none()).collect();
        let mut forest = Forest { nodes, roots };
        // What each container stands for in its parent's list once pruned:
        // itself, nothing, or its own (pruned) children.
        let mut replacement: Vec<Vec<usize>> = vec![Vec::new(); forest.nodes.len()];
        for c in forest.post_order() {
            let kids: Vec<usize> = std::mem::take(&mut forest.nodes[c].children)
                .into_iter()
                .flat_map(|k| std::mem::take(&mut replacement[k]))
                .collect();
            let root = self.parent[c].is_none();
            replacement[c] = if forest.nodes[c].message.is_some() || (root && kids.len() > 1) {
                forest.nodes[c].children = kids;
                vec![c]
            } else {
                kids
            };
        }
        let roots = std::mem::take(&mut forest.roots);
        forest.roots = roots.into_iter().flat_map(|r| std::mem::take(&mut replacement[r])).collect();
        forest
    }
}

/// By sent date, ties in mailbox order.
fn by_date(a: &ThreadMessage, b: &ThreadMessage) -> std::cmp::Ordering {
    a.date.cmp(&b.date).then(a.number.cmp(&b.number))
}

/// `(1 2 (3)(4 5))(6)`: a message followed by its only reply continues the line;
/// several replies are nested lists.
pub fn render(forest: &Forest, messages: &[ThreadMessage]) -> String {
    enum Step {
        Node(usize),
        Text(&'static str),
    }
    let nested = |n: usize| [Step::Text(")"), Step::Node(n), Step::Text("(")];
    let mut out = String::new();
    let mut stack: Vec<Step> = forest.roots.iter().rev().flat_map(|&r| nested(r)).collect();
    while let Some(step) = stack.pop() {
        let n = match step {
            Step::Text(t) => {
                out.push_str(t);
                continue;
            }
            Step::Node(n) => &forest.nodes[n],
        };
        if let Some(m) = n.message {
            let _ = write!(out, "{}", messages[m].number);
            if !n.children.is_empty() {
                out.push(' ');
            }
        }
        match n.children.as_slice() {
            [] => {}
            [only] => stack.push(Step::Node(*only)),
            several => stack.extend(several.iter().rev().flat_map(|&c| nested(c))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mailcluster_model::sort_keys::base_subject_of;

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
    fn parent_ids_keep_the_first_and_the_last_references() {
        let mut h = String::from("Subject: x\r\nReferences:");
        for i in 0..20_000 {
            h.push_str(&format!("\r\n <{i}@x>"));
        }
        h.push_str("\r\n\r\n");
        let ids = parent_ids(h.as_bytes());
        assert_eq!(ids.len(), MAX_REFERENCES);
        assert_eq!(ids[0], "0@x");
        assert_eq!(ids[1], format!("{}@x", 20_000 - (MAX_REFERENCES - 1)));
        assert_eq!(ids[MAX_REFERENCES - 1], "19999@x");
    }

    /// Every message number of a rendered list, in order.
    fn numbers(out: &str) -> Vec<u32> {
        out.split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect()
    }

    #[test]
    fn a_conversation_100000_replies_deep_is_one_thread() {
        let n = 100_000u32;
        let m: Vec<ThreadMessage> = (0..n)
            .map(|i| {
                let parents: Vec<String> =
                    if i == 0 { vec![] } else { vec!["0".into(), (i - 1).to_string()] };
                ThreadMessage {
                    number: i + 1,
                    date: i64::from(i),
                    subject: "TALK".into(),
                    reply: i > 0,
                    message_id: Some(i.to_string()),
                    parents,
                }
            })
            .collect();
        let forest = references(&m);
        assert_eq!(forest.roots.len(), 1);
        let out = render(&forest, &m);
        assert_eq!(numbers(&out), (1..=n).collect::<Vec<_>>());
        assert!(out.starts_with("(1 ") && out.contains(" 3 4 5 6 7 8 9 10 "), "{}", &out[..100]);
        let out = render(&ordered_subject(&m), &m);
        assert_eq!(numbers(&out), (1..=n).collect::<Vec<_>>());
    }

    #[test]
    fn a_message_arriving_after_its_reply_leaves_the_parent_it_was_given() {
        // 1 names x as 2's parent; 2 itself says it has none (RFC 5256 §2.2 1B).
        let m = [msg(1, 10, "s", "a", &["x", "b"]), msg(2, 5, "s", "b", &[])];
        assert_eq!(render(&references(&m), &m), "(2 1)");
        // Linked twice to the same parent: listed once.
        let m = [msg(1, 10, "s", "a", &["p", "b"]), msg(2, 20, "s", "b", &["p"]), msg(3, 5, "s", "p", &[])];
        assert_eq!(render(&references(&m), &m), "(3 2 1)");
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
