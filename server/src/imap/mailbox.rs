//! Mailbox commands: SELECT, EXAMINE, CREATE, DELETE, RENAME, SUBSCRIBE,
//! UNSUBSCRIBE, LIST, LSUB, STATUS, CLOSE, UNSELECT.
//!
//! Tenant isolation: a name is only ever looked up together with the logged-in
//! account's id, so no spelling (`../bob/INBOX`, `%`, `*`, `#users`) can reach
//! another account. Names are additionally validated so that the store never
//! holds names that break the hierarchy (empty levels, `.`/`..` levels,
//! wildcards).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use imap_codec::imap_types::mailbox::{ListMailbox, Mailbox as WireMailbox};

use super::selected::Selected;
use super::session::{Outcome, Session, store_error};
use crate::cache::MailboxEvent;
use crate::proto::imap::parse::{ListExtended, Qresync, StatusItem};
use crate::proto::imap::{encode, utf7};
use crate::store::StoreError;
use crate::view::shared_snapshot::SharedSnapshots;
use mailcluster_model::{Flags, MailboxIndex, MailboxStatus, SpecialUse};

/// Hierarchy separator, in the store and on the wire.
pub const SEP: char = mailcluster_model::MAILBOX_SEPARATOR;

/// A wire mailbox name → validated UTF-8 store name. `utf8`: the client enabled
/// UTF8=ACCEPT, so names come as UTF-8 rather than modified UTF-7.
pub fn mailbox_name(m: &WireMailbox<'_>, utf8: bool) -> Result<String, Outcome> {
    match m {
        WireMailbox::Inbox => Ok("INBOX".into()),
        WireMailbox::Other(o) => name_from_bytes(o.as_ref(), utf8),
    }
}

pub fn name_from_bytes(raw: &[u8], utf8: bool) -> Result<String, Outcome> {
    let invalid = || Outcome::no("[CANNOT] Invalid mailbox name");
    let s = std::str::from_utf8(raw).map_err(|_| invalid())?;
    // RFC 9755 §3: once UTF8=ACCEPT is enabled a name is UTF-8 as written, so an
    // `&` stands for itself; before, non-ASCII must arrive as modified UTF-7.
    let name = if utf8 { s.to_owned() } else { utf7::decode(s).ok_or_else(invalid)? };
    mailcluster_model::mailbox_name(&name).ok_or_else(invalid)
}

/// Decoded LIST pattern (wildcards kept). A pattern is not a mailbox name: an `&`
/// that does not start a valid modified-UTF-7 run (`&`, `a&b`) stands for itself
/// and the pattern is matched as written — never an error (RFC 3501 §6.3.8
/// allows any list-char in a pattern). Under UTF8=ACCEPT the pattern is UTF-8.
fn pattern_text(raw: &[u8], utf8: bool) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    if utf8 {
        return Some(text.to_owned());
    }
    Some(utf7::decode(text).unwrap_or_else(|| text.to_owned()))
}

/// RFC 3501 §6.3.8 wildcards: `*` matches anything, `%` anything but the separator.
/// One pass over the pattern keeping every name prefix it can match, so the cost
/// is at most pattern × name characters whatever the wildcards (trying each
/// split of the name per wildcard, as a recursive matcher does, is exponential
/// in their number, and the pattern is the client's).
pub fn matches(pattern: &[char], name: &[char]) -> bool {
    // reach[j]: the pattern read so far matches name[..j].
    let mut reach = vec![false; name.len() + 1];
    reach[0] = true;
    let mut next = vec![false; name.len() + 1];
    for &p in pattern {
        match p {
            '*' => {
                let mut any = false;
                for (n, r) in next.iter_mut().zip(&reach) {
                    any |= *r;
                    *n = any;
                }
            }
            '%' => {
                next[0] = reach[0];
                for j in 1..=name.len() {
                    next[j] = reach[j] || (next[j - 1] && name[j - 1] != SEP);
                }
            }
            c => {
                next[0] = false;
                for j in 1..=name.len() {
                    next[j] = reach[j - 1] && name[j - 1] == c;
                }
            }
        }
        std::mem::swap(&mut reach, &mut next);
        if !reach.contains(&true) {
            return false;
        }
    }
    reach[name.len()]
}

fn name_matches(pattern: &str, name: &str) -> bool {
    let n: Vec<char> = name.chars().collect();
    let p: Vec<char> = pattern.chars().collect();
    if matches(&p, &n) {
        return true;
    }
    // INBOX is case-insensitive (and so are its children's first level).
    if name == "INBOX" || name.starts_with("INBOX/") {
        let upper: Vec<char> = uppercase_inbox_prefix(pattern).chars().collect();
        return matches(&upper, &n);
    }
    false
}

fn uppercase_inbox_prefix(pattern: &str) -> String {
    match pattern.get(..5) {
        Some(p) if p.eq_ignore_ascii_case("INBOX") => format!("INBOX{}", &pattern[5..]),
        _ => pattern.to_string(),
    }
}

impl Session {
    fn account_id(&self) -> i64 {
        self.account().map(|a| a.id).unwrap_or_default()
    }

    /// Tells other sessions (any pod) that a mailbox changed.
    pub(crate) async fn notify(&self, mailbox_id: i64, modseq: u64) {
        let event = MailboxEvent { account_id: self.account_id(), mailbox_id, modseq };
        if let Err(e) = self.app.cache.publish(event).await {
            // Sessions on other pods fall back to polling; nothing is lost.
            tracing::debug!(error = %e, "imap: change notification failed");
        }
    }

    pub(crate) async fn cmd_select(
        &mut self,
        mailbox: &WireMailbox<'_>,
        read_only: bool,
        qresync: Option<&Qresync>,
    ) -> Outcome {
        // Selecting deselects first, even when the new SELECT fails (RFC 3501 §6.3.1);
        // a QRESYNC client is told where the old mailbox's responses end (RFC 7162
        // §3.2.11).
        if self.selected.take().is_some() {
            self.push("* OK [CLOSED] Previous mailbox closed");
        }
        let name = match mailbox_name(mailbox, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        let store = self.app.store.clone();
        let mb = match store.mailbox_get(self.account_id(), &name).await {
            Ok(Some(mb)) => mb,
            Ok(None) => return Outcome::no("[NONEXISTENT] No such mailbox"),
            Err(e) => return store_error(e),
        };
        // A cached message list (any age) plus what changed since, or a full read.
        let (mailbox_id, uid_validity, uid_next) = (mb.id, mb.uid_validity, mb.uid_next);
        let reads = &self.shared.reads;
        let cfg = &self.app.config.imap;
        let shared =
            SharedSnapshots::of(&self.app.view, cfg.shared_index_min_messages, cfg.shared_index_ttl_secs)
                .await;
        let mut from_shared = false;
        let cached = match reads.index_cache.get(mailbox_id, uid_validity) {
            Some(local) => {
                reads.select_hits.inc();
                Some((*local).clone())
            }
            None => {
                let index = shared.get::<MailboxIndex>(mailbox_id, uid_validity).await;
                from_shared = index.is_some();
                if from_shared { &reads.select_shared } else { &reads.select_misses }.inc();
                index
            }
        };
        let cached_modseq = cached.as_ref().map(|i| i.highest_modseq);
        let index = match cached {
            Some(index) => index,
            None => match store.mailbox_index(mailbox_id).await {
                Ok(i) => i,
                Err(e) => return store_error(e),
            },
        };
        let recent_floor = mb.recent_floor;
        let mut sel = Selected::new(mb, read_only, index);
        if cached_modseq.is_some() {
            match store.changes_since(mailbox_id, sel.modseq).await {
                Ok(changes) => sel.apply_silently(&changes),
                Err(e) => return store_error(e),
            }
        }
        sel.uid_next = sel.uid_next.max(uid_next);
        reads.uid_marks.note(mailbox_id, uid_validity, sel.uid_next);
        // \Recent: SELECT takes the messages no session has been given yet (one
        // atomic claim, so exactly one session in the cluster gets each); EXAMINE
        // only looks, leaving them to the next SELECT (RFC 3501 §6.3.2).
        let max = sel.max_uid();
        if max > recent_floor && !self.rev2 {
            let from = if read_only {
                recent_floor
            } else {
                match store.recent_claim(mailbox_id, max).await {
                    Ok(floor) => floor,
                    Err(e) => return store_error(e),
                }
            };
            sel.recent.add(from + 1, max);
        }
        // A read from the store, or a copy brought up to date, is shared (again):
        // a shared copy left to lag costs every pod that reads it the rows changed
        // since, in PostgreSQL, the part more pods do not scale (bench/RESULTS.md,
        // POP3, where the same choice was measured).
        let changed = cached_modseq.is_none_or(|m| sel.modseq > m);
        if changed || from_shared {
            let snapshot = Arc::new(sel.snapshot());
            if changed {
                shared.put(mailbox_id, uid_validity, &snapshot);
            }
            self.shared.reads.index_cache.put(mailbox_id, uid_validity, snapshot);
        }
        for line in sel.flags_lines() {
            self.push(&line);
        }
        self.push(&format!("* {} EXISTS", sel.uids.len()));
        if !self.rev2 {
            self.push(&sel.recent_line());
        }
        // IMAP4rev2 dropped the UNSEEN code (RFC 9051 §7.1): a client asks STATUS
        // or SEARCH for what it needs.
        if let Some(pos) = sel.flags.iter().position(|f| !f.contains(Flags::SEEN)).filter(|_| !self.rev2) {
            let seq = pos + 1;
            self.push(&format!("* OK [UNSEEN {seq}] First unseen message"));
        }
        self.push(&format!("* OK [UIDVALIDITY {}] UIDs valid", sel.mailbox.uid_validity));
        // OBJECTID (RFC 8474 §4.2).
        self.push(&format!("* OK [MAILBOXID ({})] Ok", encode::mailbox_id(sel.mailbox.id)));
        self.push(&format!("* OK [UIDNEXT {}] Predicted next UID", sel.uid_next));
        self.push(&format!("* OK [HIGHESTMODSEQ {}] Highest", sel.modseq.max(1)));
        // QRESYNC (RFC 7162 §3.2.5): what changed since the client's modseq, for a
        // client whose UIDVALIDITY still holds; otherwise it resynchronises fully.
        if let Some(q) = qresync.filter(|q| q.uid_validity == sel.mailbox.uid_validity) {
            let changes = match store.changes_since(mailbox_id, q.modseq).await {
                Ok(c) => c,
                Err(e) => return store_error(e),
            };
            let vanished = sel.vanished_in(&changes, q.known_uids.as_ref());
            if !vanished.is_empty() {
                self.push(&format!("* VANISHED (EARLIER) {}", encode::uid_ranges(&vanished)));
            }
            for (pos, (&uid, &modseq)) in sel.uids.iter().zip(&sel.modseqs).enumerate() {
                if modseq > q.modseq {
                    let flags = encode::flag_list_recent(&sel.flag_set_at(pos), sel.recent.contains(uid));
                    self.push(&format!("* {} FETCH (UID {uid} FLAGS {flags} MODSEQ ({modseq}))", pos + 1));
                }
            }
        }
        self.selected = Some(sel);
        if read_only {
            Outcome::ok("[READ-ONLY] EXAMINE completed")
        } else {
            Outcome::ok("[READ-WRITE] SELECT completed")
        }
    }

    pub(crate) async fn cmd_close(&mut self, expunge: bool) -> Outcome {
        let Some(sel) = self.selected.take() else { return Outcome::bad("No mailbox selected") };
        if expunge && !sel.read_only {
            // CLOSE expunges silently (RFC 3501 §6.4.2): no untagged EXPUNGE.
            match self.app.store.expunge(sel.mailbox.id, None).await {
                Ok(removed) if !removed.uids.is_empty() => self.notify(sel.mailbox.id, removed.modseq).await,
                Ok(_) => {}
                Err(e) => return store_error(e),
            }
        }
        Outcome::ok(if expunge { "CLOSE completed" } else { "UNSELECT completed" })
    }

    /// Creates the missing ancestors of `name` (RFC 3501 §6.3.3 "SHOULD create").
    async fn create_parents(&self, name: &str) -> Result<(), StoreError> {
        let account = self.account_id();
        let mut prefix = String::new();
        let levels: Vec<&str> = name.split(SEP).collect();
        for level in &levels[..levels.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push(SEP);
            }
            prefix.push_str(level);
            if prefix == "INBOX" {
                continue;
            }
            match self.app.store.mailbox_create(account, &prefix, None).await {
                Ok(_) | Err(StoreError::AlreadyExists(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// CREATE, with the special use asked for by CREATE-SPECIAL-USE (RFC 6154
    /// §3) in `uses`: one of the attributes a mailbox here can carry, else NO
    /// [USEATTR] and nothing created.
    pub(crate) async fn cmd_create(&mut self, mailbox: &WireMailbox<'_>, uses: &[String]) -> Outcome {
        let name = match mailbox_name(mailbox, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        let special_use = match uses {
            [] => None,
            [one] => match SpecialUse::ALL.into_iter().find(|u| u.attribute().eq_ignore_ascii_case(one)) {
                Some(u) => Some(u),
                None => return Outcome::no(format!("[USEATTR] {one} is not a special use supported here")),
            },
            _ => return Outcome::no("[USEATTR] A mailbox has one special use here"),
        };
        if name == "INBOX" {
            return Outcome::no("[ALREADYEXISTS] INBOX always exists");
        }
        if let Err(e) = self.create_parents(&name).await {
            return store_error(e);
        }
        match self.app.store.mailbox_create(self.account_id(), &name, special_use).await {
            // OBJECTID (RFC 8474 §4.1).
            Ok(mb) => Outcome::ok(format!("[MAILBOXID ({})] CREATE completed", encode::mailbox_id(mb.id))),
            Err(e) => store_error(e),
        }
    }

    pub(crate) async fn cmd_delete(&mut self, mailbox: &WireMailbox<'_>) -> Outcome {
        let name = match mailbox_name(mailbox, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        if name == "INBOX" {
            return Outcome::no("[CANNOT] INBOX cannot be deleted");
        }
        if self.selected.as_ref().is_some_and(|s| s.mailbox.name == name) {
            self.selected = None;
        }
        match self.app.store.mailbox_delete(self.account_id(), &name).await {
            Ok(()) => Outcome::ok("DELETE completed"),
            Err(e) => store_error(e),
        }
    }

    pub(crate) async fn cmd_rename(&mut self, from: &WireMailbox<'_>, to: &WireMailbox<'_>) -> Outcome {
        let (from, to) = match (mailbox_name(from, self.utf8), mailbox_name(to, self.utf8)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(o), _) | (_, Err(o)) => return o,
        };
        if to == "INBOX" {
            return Outcome::no("[ALREADYEXISTS] INBOX always exists");
        }
        if to.starts_with(&format!("{from}{SEP}")) {
            return Outcome::no("[CANNOT] Cannot move a mailbox into itself");
        }
        if let Err(e) = self.create_parents(&to).await {
            return store_error(e);
        }
        match self.app.store.mailbox_rename(self.account_id(), &from, &to).await {
            Ok(()) => Outcome::ok("RENAME completed"),
            Err(e) => store_error(e),
        }
    }

    pub(crate) async fn cmd_subscribe(&mut self, mailbox: &WireMailbox<'_>, subscribe: bool) -> Outcome {
        let name = match mailbox_name(mailbox, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        if subscribe {
            // Subscribing to a name that does not exist is allowed by RFC 3501 but
            // confuses clients more than it helps; refuse like most servers do.
            match self.app.store.mailbox_get(self.account_id(), &name).await {
                Ok(Some(_)) => {}
                Ok(None) => return Outcome::no("[NONEXISTENT] No such mailbox"),
                Err(e) => return store_error(e),
            }
        }
        match self.app.store.mailbox_subscribe(self.account_id(), &name, subscribe).await {
            Ok(()) => Outcome::ok(if subscribe { "SUBSCRIBE completed" } else { "UNSUBSCRIBE completed" }),
            Err(e) => store_error(e),
        }
    }

    pub(crate) async fn cmd_list(
        &mut self,
        reference: &WireMailbox<'_>,
        pattern: &ListMailbox<'_>,
        lsub: bool,
    ) -> Outcome {
        let verb = if lsub { "LSUB" } else { "LIST" };
        let pattern_raw: &[u8] = match pattern {
            ListMailbox::Token(t) => t.as_ref(),
            ListMailbox::String(s) => s.as_ref(),
        };
        let reference = match reference {
            WireMailbox::Inbox => "INBOX".to_string(),
            WireMailbox::Other(o) => match pattern_text(o.as_ref(), self.utf8) {
                Some(r) => r,
                None => return Outcome::no("[CANNOT] Invalid reference"),
            },
        };
        let Some(pattern) = pattern_text(pattern_raw, self.utf8) else {
            return Outcome::no("[CANNOT] Invalid pattern");
        };
        if pattern.is_empty() {
            // The hierarchy delimiter query (RFC 3501 §6.3.8).
            self.push(&format!("* {verb} (\\Noselect) \"/\" \"\""));
            return Outcome::ok(format!("{verb} completed"));
        }
        let full = full_pattern(&reference, &pattern);
        let account = self.account_id();
        let all = match self.mailbox_tree().await {
            Ok(all) => all,
            Err(e) => return store_error(e),
        };
        let has_children = |name: &str| has_children(&all, name);
        let subscribed: BTreeSet<String> = if lsub {
            match self.app.store.subscriptions(account).await {
                Ok(s) => s.into_iter().collect(),
                Err(e) => return store_error(e),
            }
        } else {
            BTreeSet::new()
        };
        let mut lines = Vec::new();
        if lsub {
            // A subscribed mailbox's unsubscribed ancestor that the pattern matches
            // where the mailbox itself does not (`%` one level up) is listed as
            // \Noselect (RFC 3501 §6.3.9), so a client can walk the tree.
            let mut listed: BTreeSet<&str> = BTreeSet::new();
            for name in &subscribed {
                if name_matches(&full, name) {
                    listed.insert(name);
                    let attrs =
                        if all.get(name).is_some_and(|(id, _)| id.is_some()) { "" } else { "\\Noselect" };
                    lines.push(format!("* LSUB ({attrs}) \"/\" {}", encode::mailbox(name, self.utf8)));
                }
            }
            let hidden: Vec<&String> = subscribed.iter().filter(|n| !listed.contains(n.as_str())).collect();
            for name in hidden {
                let mut parent = name.as_str();
                while let Some((p, _)) = parent.rsplit_once(SEP) {
                    parent = p;
                    if !subscribed.contains(p) && name_matches(&full, p) && listed.insert(p) {
                        lines.push(format!("* LSUB (\\Noselect) \"/\" {}", encode::mailbox(p, self.utf8)));
                    }
                }
            }
        } else {
            for (name, (id, special)) in &all {
                if !name_matches(&full, name) {
                    continue;
                }
                let mut attrs: Vec<&str> = Vec::new();
                if id.is_none() {
                    attrs.push("\\Noselect");
                }
                attrs.push(if has_children(name) { "\\HasChildren" } else { "\\HasNoChildren" });
                if let Some(s) = special {
                    attrs.push(s);
                }
                lines.push(format!(
                    "* LIST ({}) \"/\" {}",
                    attrs.join(" "),
                    encode::mailbox(name, self.utf8)
                ));
            }
        }
        for l in lines {
            self.push(&l);
        }
        Outcome::ok(format!("{verb} completed"))
    }

    /// Every mailbox of the account with its special-use attribute, and the
    /// missing ancestors of nested names (`exists` false), by name.
    async fn mailbox_tree(&self) -> Result<MailboxTree, StoreError> {
        let mut all = MailboxTree::new();
        for mb in self.app.store.mailbox_list(self.account_id()).await? {
            all.insert(mb.name, (Some(mb.id), mb.special_use.map(|u| u.attribute())));
        }
        let existing: Vec<String> = all.keys().cloned().collect();
        for name in &existing {
            // Missing ancestors are listed as \Noselect so `%` walks the hierarchy.
            let mut parent = name.as_str();
            while let Some((p, _)) = parent.rsplit_once(SEP) {
                all.entry(p.to_string()).or_insert((None, None));
                parent = p;
            }
        }
        Ok(all)
    }

    /// LIST with RFC 5258 selection and return options, several patterns, and
    /// LIST-STATUS (RFC 5819).
    pub(crate) async fn cmd_list_extended(&mut self, list: &ListExtended) -> Outcome {
        let Some(reference) = pattern_text(&list.reference, self.utf8) else {
            return Outcome::no("[CANNOT] Invalid reference");
        };
        let mut patterns = Vec::new();
        for p in &list.patterns {
            match pattern_text(p, self.utf8) {
                Some(p) => patterns.push(full_pattern(&reference, &p)),
                None => return Outcome::no("[CANNOT] Invalid pattern"),
            }
        }
        let all = match self.mailbox_tree().await {
            Ok(all) => all,
            Err(e) => return store_error(e),
        };
        let subscribed: BTreeSet<String> = if list.subscribed || list.return_subscribed {
            match self.app.store.subscriptions(self.account_id()).await {
                Ok(s) => s.into_iter().collect(),
                Err(e) => return store_error(e),
            }
        } else {
            BTreeSet::new()
        };
        let matches = |name: &str| patterns.iter().any(|p| name_matches(p, name));
        // Candidates: with SUBSCRIBED, the subscribed names (existing or not); else
        // the mailboxes and their ancestors.
        let mut names: BTreeSet<String> = if list.subscribed {
            subscribed.iter().filter(|n| matches(n)).cloned().collect()
        } else {
            all.keys().filter(|n| matches(n)).cloned().collect()
        };
        // RECURSIVEMATCH: a matching name with a subscribed descendant is listed with
        // CHILDINFO, even when itself not subscribed (RFC 5258 §3.5). A descendant
        // that matches the patterns is listed itself, so it adds nothing to its
        // parents (as Dovecot answers: no CHILDINFO that repeats a listed name).
        let mut childinfo: BTreeSet<String> = BTreeSet::new();
        if list.recursive {
            for sub in subscribed.iter().filter(|s| !matches(s)) {
                let mut parent = sub.as_str();
                while let Some((p, _)) = parent.rsplit_once(SEP) {
                    if matches(p) {
                        childinfo.insert(p.to_string());
                        names.insert(p.to_string());
                    }
                    parent = p;
                }
            }
        }
        let mut lines = Vec::new();
        for name in &names {
            let (id, special) = all.get(name).copied().unwrap_or((None, None));
            if list.special_use && special.is_none() {
                continue;
            }
            let is_subscribed = subscribed.contains(name);
            if list.subscribed && !is_subscribed && !childinfo.contains(name) {
                continue;
            }
            let mut attrs: Vec<&str> = Vec::new();
            match (id, all.contains_key(name)) {
                (Some(_), _) => {}
                (None, true) => attrs.push("\\Noselect"),
                (None, false) => attrs.push("\\NonExistent"),
            }
            if all.contains_key(name) {
                attrs.push(if has_children(&all, name) { "\\HasChildren" } else { "\\HasNoChildren" });
            }
            if is_subscribed && (list.subscribed || list.return_subscribed) {
                attrs.push("\\Subscribed");
            }
            if let Some(s) = special {
                attrs.push(s);
            }
            let mut line = format!("* LIST ({}) \"/\" {}", attrs.join(" "), encode::mailbox(name, self.utf8));
            if childinfo.contains(name) {
                line.push_str(" (\"CHILDINFO\" (\"SUBSCRIBED\"))");
            }
            lines.push(line);
            if let (Some(items), Some(id)) = (&list.return_status, id) {
                match self.status_line(name, id, None, items).await {
                    Ok(status) => lines.push(status),
                    Err(e) => return store_error(e),
                }
            }
        }
        for l in lines {
            self.push(&l);
        }
        Outcome::ok("LIST completed")
    }

    pub(crate) async fn cmd_status(&mut self, mailbox: &WireMailbox<'_>, items: &[StatusItem]) -> Outcome {
        let name = match mailbox_name(mailbox, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        let (mb, status) = match self.app.store.mailbox_get_with_status(self.account_id(), &name).await {
            Ok(Some(found)) => found,
            Ok(None) => return Outcome::no("[NONEXISTENT] No such mailbox"),
            Err(e) => return store_error(e),
        };
        // A CONDSTORE-enabling command (RFC 7162 §3.1).
        if items.contains(&StatusItem::HighestModseq) {
            self.enable_condstore();
        }
        match self.status_line(&mb.name, mb.id, Some(status), items).await {
            Ok(line) => {
                self.push(&line);
                Outcome::ok("STATUS completed")
            }
            Err(e) => store_error(e),
        }
    }

    /// `* STATUS name (items)` of one mailbox (STATUS, and LIST-STATUS), its
    /// counters read unless the caller has them.
    async fn status_line(
        &self,
        name: &str,
        mailbox_id: i64,
        status: Option<MailboxStatus>,
        items: &[StatusItem],
    ) -> Result<String, StoreError> {
        let st = match status {
            Some(st) => st,
            None => self.app.store.mailbox_status(mailbox_id).await?,
        };
        self.shared.reads.uid_marks.note(mailbox_id, st.uid_validity, st.uid_next);
        let mut parts = Vec::new();
        for item in items {
            parts.push(match item {
                StatusItem::Messages => format!("MESSAGES {}", st.messages),
                StatusItem::Recent => format!("RECENT {}", self.app.store.recent_count(mailbox_id).await?),
                StatusItem::UidNext => format!("UIDNEXT {}", st.uid_next),
                StatusItem::UidValidity => format!("UIDVALIDITY {}", st.uid_validity),
                StatusItem::Unseen => format!("UNSEEN {}", st.unseen),
                StatusItem::Size => format!("SIZE {}", self.app.store.mailbox_size(mailbox_id).await?),
                StatusItem::HighestModseq => format!("HIGHESTMODSEQ {}", st.highest_modseq.max(1)),
                StatusItem::Deleted => {
                    format!("DELETED {}", self.app.store.mailbox_deleted(mailbox_id).await?.0)
                }
                StatusItem::DeletedStorage => {
                    format!("DELETED-STORAGE {}", self.app.store.mailbox_deleted(mailbox_id).await?.1)
                }
                StatusItem::AppendLimit => format!("APPENDLIMIT {}", self.app.config.imap.max_literal_bytes),
                StatusItem::MailboxId => format!("MAILBOXID ({})", encode::mailbox_id(mailbox_id)),
            });
        }
        Ok(format!("* STATUS {} ({})", encode::mailbox(name, self.utf8), parts.join(" ")))
    }
}

/// Mailbox name → (id when it exists, special-use attribute).
type MailboxTree = BTreeMap<String, (Option<i64>, Option<&'static str>)>;

fn has_children(all: &MailboxTree, name: &str) -> bool {
    let prefix = format!("{name}{SEP}");
    all.range(prefix.clone()..).next().is_some_and(|(n, _)| n.starts_with(&prefix))
}

/// The reference and the pattern as one name pattern (RFC 3501 §6.3.8).
fn full_pattern(reference: &str, pattern: &str) -> String {
    if reference.is_empty() || reference.ends_with(SEP) || pattern.starts_with(SEP) {
        format!("{reference}{pattern}")
    } else {
        format!("{reference}{SEP}{pattern}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(name_matches("*", "a/b/c"));
        assert!(name_matches("%", "Sent"));
        assert!(!name_matches("%", "a/b"));
        assert!(name_matches("a/%", "a/b"));
        assert!(!name_matches("a/%", "a/b/c"));
        assert!(name_matches("a*c", "a/b/c"));
        assert!(name_matches("inbox", "INBOX"));
        assert!(name_matches("Inbox/%", "INBOX/x"));
        assert!(!name_matches("Sent", "Sent Items"));
        assert!(name_matches("%/%", "a/b") && !name_matches("%/%", "a/b/c") && !name_matches("%/%", "ab"));
        assert!(name_matches("*/c", "a/b/c") && !name_matches("%/c", "a/b/c"));
        assert!(name_matches("a%%b*", "axb/y") && !name_matches("a%b", "a/b"));
        assert!(name_matches("", "") && !name_matches("", "a") && name_matches("*", ""));
        assert!(name_matches("Entw*e", "Entwürfe") && name_matches("Entw%rfe", "Entwürfe"));
    }

    /// A pattern of many wildcards that does not match must not cost time
    /// exponential in its length: a client sends any pattern it likes, and LIST
    /// runs it against every mailbox name.
    #[test]
    fn wildcards_cost_at_most_pattern_times_name() {
        let name = "Work/Projects/2026/Quarterly reports/Drafts and more drafts";
        let pattern = format!("{}x", "*%".repeat(2000));
        assert!(!name_matches(&pattern, name));
        let pattern = format!("{}s", "*a".repeat(40));
        assert!(!name_matches(&pattern, name));
        assert!(name_matches(&format!("{}s", "%*".repeat(2000)), name));
    }

    #[test]
    fn names_cannot_escape_the_account() {
        for bad in ["../bob", "a/../b", "", "/", "a//b", "/abs", "x*", "y%", "./a", "a\u{1}b"] {
            assert!(name_from_bytes(bad.as_bytes(), false).is_err(), "{bad:?}");
        }
        assert_eq!(name_from_bytes(b"inbox", false).ok().as_deref(), Some("INBOX"));
        assert_eq!(name_from_bytes(b"Work/", false).ok().as_deref(), Some("Work"));
        assert_eq!(name_from_bytes(b"Entw&APw-rfe", false).ok().as_deref(), Some("Entwürfe"));
    }
}
