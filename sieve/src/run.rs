//! The interpreter: runs a compiled script against one message and recipient
//! and collects the actions it takes (RFC 5228 §2.10, §4), without carrying
//! any of them out.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::ast::*;
use crate::compile::{is_field_name, valid_address};
use crate::matching::{Budget, compare, relate};
use crate::message::{self, BodyPart, Field, Message, truncate};
use crate::{Action, Context, Host, Limits, Outcome, RuntimeError, Script, Vacation};

/// `duplicate` without `:seconds` (RFC 7352 §3.3 leaves it to us), and the
/// longest period it may ask for.
const DUPLICATE_DEFAULT_SECS: u64 = 7 * 86_400;
const MAX_PERIOD_SECS: u64 = 90 * 86_400;
/// Header fields a script may neither add nor delete: the trace and the
/// auto-reply loop guard (RFC 5293 §6).
const PROTECTED_FIELDS: &[&str] = &["received", "auto-submitted"];
/// How many match variables are kept: `${0}` to `${9}` (RFC 5229 §3.2).
const MATCH_VARIABLES: usize = 10;

/// Runs `script` for one delivery. An error means the caller files the
/// message into INBOX (RFC 5228 §2.10.6).
pub fn run(
    script: &Script,
    message: &[u8],
    ctx: &Context,
    host: &mut dyn Host,
    limits: &Limits,
) -> Result<Outcome, RuntimeError> {
    let mut r = Runner {
        ctx,
        host,
        limits,
        msg: Message::new(message),
        budget: Budget { used: 0, max: limits.max_instructions },
        actions: Vec::new(),
        implicit_keep: true,
        flags: Vec::new(),
        globals: HashMap::new(),
        matched: Vec::new(),
        including: Vec::new(),
        included: HashSet::new(),
        edits: 0,
        redirects: 0,
        max_string: limits.max_script_bytes.max(limits.max_variable_bytes),
        raw_body: None,
        text_parts: None,
    };
    let mut frame = Frame::default();
    r.block(&script.commands, &mut frame)?;
    r.finish()
}

#[derive(Debug, PartialEq)]
enum Flow {
    Next,
    Stop,
    Return,
}

/// One script's own variables (each included script has its own).
#[derive(Default)]
struct Frame {
    locals: HashMap<String, String>,
}

struct Runner<'a, 'm> {
    ctx: &'a Context<'a>,
    host: &'a mut dyn Host,
    limits: &'a Limits,
    msg: Message<'m>,
    budget: Budget,
    actions: Vec<Action>,
    implicit_keep: bool,
    /// The imap4flags internal variable (RFC 5232 §3).
    flags: Vec<String>,
    globals: HashMap<String, String>,
    matched: Vec<String>,
    /// The scripts being included, outermost first (for loops and depth).
    including: Vec<(String, bool)>,
    /// Scripts included so far (for `:once`).
    included: HashSet<(String, bool)>,
    edits: usize,
    redirects: usize,
    /// The longest string an expansion may produce.
    max_string: usize,
    /// The body as `body` tests see it, made on first use.
    raw_body: Option<String>,
    text_parts: Option<Vec<BodyPart>>,
}

impl Runner<'_, '_> {
    fn block(&mut self, commands: &[Cmd], frame: &mut Frame) -> Result<Flow, RuntimeError> {
        for cmd in commands {
            self.budget.charge(1)?;
            let flow = self.command(cmd, frame)?;
            if flow != Flow::Next {
                return Ok(flow);
            }
        }
        Ok(Flow::Next)
    }

    /// The commands that nest (`if`, `include`) here, the others apart: the
    /// frames of this recursion stay small, so the deepest script the limits
    /// allow runs on a small thread stack.
    fn command(&mut self, cmd: &Cmd, frame: &mut Frame) -> Result<Flow, RuntimeError> {
        match cmd {
            Cmd::If { branches, otherwise } => {
                for (test, block) in branches {
                    if self.test(test, frame)? {
                        return self.block(block, frame);
                    }
                }
                match otherwise {
                    Some(block) => self.block(block, frame),
                    None => Ok(Flow::Next),
                }
            }
            Cmd::Include { name, global, once, optional } => self.include(name, *global, *once, *optional),
            _ => self.simple_command(cmd, frame),
        }
    }

    #[inline(never)]
    fn simple_command(&mut self, cmd: &Cmd, frame: &mut Frame) -> Result<Flow, RuntimeError> {
        match cmd {
            Cmd::If { .. } | Cmd::Include { .. } => unreachable!("nesting commands are run by command()"),
            Cmd::Stop => return Ok(Flow::Stop),
            Cmd::Return => return Ok(Flow::Return),
            Cmd::Keep { flags } => {
                let flags = self.flag_list(flags.as_deref(), frame)?;
                self.implicit_keep = false;
                self.add(Action::Keep { flags })?;
            }
            Cmd::Discard => {
                self.implicit_keep = false;
                self.add(Action::Discard)?;
            }
            Cmd::Redirect { address, copy } => {
                let address = self.expand(address, frame)?.into_owned();
                if !valid_address(&address) {
                    return Err(RuntimeError::InvalidAddress(address));
                }
                if !*copy {
                    self.implicit_keep = false;
                }
                let seen = self.actions.iter().any(|a| {
                    matches!(a, Action::Redirect { address: other, .. } if other.eq_ignore_ascii_case(&address))
                });
                if !seen {
                    self.redirects += 1;
                    if self.redirects > self.limits.max_redirects {
                        return Err(RuntimeError::TooManyRedirects);
                    }
                    self.add(Action::Redirect { address, copy: *copy })?;
                }
            }
            Cmd::FileInto { mailbox, flags, copy, create } => {
                let mailbox = self.expand(mailbox, frame)?.into_owned();
                if mailbox.is_empty() || mailbox.contains(['\0', '\r', '\n']) {
                    return Err(RuntimeError::InvalidMailbox(mailbox));
                }
                let flags = self.flag_list(flags.as_deref(), frame)?;
                if !*copy {
                    self.implicit_keep = false;
                }
                self.add(Action::FileInto { mailbox, flags, create: *create })?;
            }
            Cmd::Reject { reason, extended } => {
                let reason = self.expand(reason, frame)?.into_owned();
                self.implicit_keep = false;
                self.add(Action::Reject { reason, extended: *extended })?;
            }
            Cmd::Flags { op, var, flags } => {
                let given = self.flag_list(Some(flags), frame)?;
                let mut current = match var {
                    Some(v) => split_flags(self.get(v, frame)),
                    None => std::mem::take(&mut self.flags),
                };
                match op {
                    FlagOp::Set => current = given,
                    FlagOp::Add => merge_flags(&mut current, given),
                    FlagOp::Remove => current.retain(|f| !given.iter().any(|g| g.eq_ignore_ascii_case(f))),
                }
                match var {
                    Some(v) => {
                        let joined = truncate(current.join(" "), self.limits.max_variable_bytes);
                        self.put(v, joined, frame)
                    }
                    None => self.flags = current,
                }
            }
            Cmd::Set { var, modifiers, value } => {
                let mut value = self.expand(value, frame)?.into_owned();
                for m in modifiers {
                    value = modify(*m, value);
                }
                let value = truncate(value, self.limits.max_variable_bytes);
                self.put(var, value, frame);
            }
            Cmd::Vacation(v) => {
                let vacation = self.vacation(v, frame)?;
                if self.actions.iter().any(|a| matches!(a, Action::Vacation(_))) {
                    return Err(RuntimeError::Conflict("more than one vacation".into()));
                }
                self.add(Action::Vacation(vacation))?;
            }
            Cmd::Error(message) => {
                return Err(RuntimeError::Script(self.expand(message, frame)?.into_owned()));
            }
            Cmd::AddHeader { last, name, value } => {
                self.edit()?;
                let name = self.expand(name, frame)?.into_owned();
                if !is_field_name(&name) {
                    return Err(RuntimeError::InvalidHeader(name));
                }
                if protected(&name) {
                    return Ok(Flow::Next);
                }
                let value = header_value(&self.expand(value, frame)?);
                let field = Field { name, value: value.into_bytes(), original: None };
                if *last {
                    self.msg.fields.push(field);
                } else {
                    self.msg.fields.insert(0, field);
                }
                self.msg.edited = true;
            }
            Cmd::DeleteHeader { index, m, name, patterns } => {
                self.edit()?;
                let name = self.expand(name, frame)?.into_owned();
                if !is_field_name(&name) {
                    return Err(RuntimeError::InvalidHeader(name));
                }
                if protected(&name) {
                    return Ok(Flow::Next);
                }
                let positions: Vec<usize> = self
                    .msg
                    .fields
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.name.eq_ignore_ascii_case(&name))
                    .map(|(i, _)| i)
                    .collect();
                let positions = pick(positions, *index);
                let keys = self.expand_all(patterns, frame)?;
                let mut doomed = Vec::new();
                for i in positions {
                    let value = message::decoded(&self.msg.fields[i].value);
                    let mut hit = keys.is_empty();
                    for key in &keys {
                        if hit {
                            break;
                        }
                        hit = compare(m, &value, key, &mut self.budget, None)?;
                    }
                    if hit {
                        doomed.push(i);
                    }
                }
                for i in doomed.into_iter().rev() {
                    self.msg.fields.remove(i);
                    self.msg.edited = true;
                }
            }
        }
        Ok(Flow::Next)
    }

    fn edit(&mut self) -> Result<(), RuntimeError> {
        self.edits += 1;
        if self.edits > self.limits.max_header_edits { Err(RuntimeError::TooManyHeaderEdits) } else { Ok(()) }
    }

    /// Records an action unless the same one is already there (RFC 5228
    /// §2.10.3: keeping or filing a message twice, or sending it twice to one
    /// address, is done once).
    fn add(&mut self, action: Action) -> Result<(), RuntimeError> {
        let same = |a: &Action| match (a, &action) {
            (Action::Keep { .. }, Action::Keep { .. }) | (Action::Discard, Action::Discard) => true,
            (Action::FileInto { mailbox: x, .. }, Action::FileInto { mailbox: y, .. }) => x == y,
            (Action::Reject { .. }, Action::Reject { .. }) => true,
            _ => false,
        };
        if let Some(existing) = self.actions.iter_mut().find(|a| same(a)) {
            // The later keep or fileinto's flags win, as its :flags say.
            if matches!(existing, Action::Keep { .. } | Action::FileInto { .. }) {
                *existing = action;
            }
            return Ok(());
        }
        if self.actions.len() >= self.limits.max_actions {
            return Err(RuntimeError::TooManyActions);
        }
        self.actions.push(action);
        Ok(())
    }

    fn finish(mut self) -> Result<Outcome, RuntimeError> {
        if self.implicit_keep && !self.actions.iter().any(|a| matches!(a, Action::Keep { .. })) {
            let flags = std::mem::take(&mut self.flags);
            self.actions.push(Action::Keep { flags });
        }
        let delivers =
            |a: &Action| matches!(a, Action::Keep { .. } | Action::FileInto { .. } | Action::Redirect { .. });
        if self.actions.iter().any(|a| matches!(a, Action::Reject { .. })) {
            // RFC 5429 §2.1: reject and ereject refuse the message, which
            // nothing else may then deliver or answer.
            if let Some(other) = self.actions.iter().find(|a| delivers(a) || matches!(a, Action::Vacation(_)))
            {
                return Err(RuntimeError::Conflict(format!("reject with {}", action_name(other))));
            }
        }
        if self.actions.iter().any(delivers) {
            self.actions.retain(|a| !matches!(a, Action::Discard));
        }
        // RFC 5228 §2.10.3: keep is filing into INBOX, which happens once;
        // the flags of both apply.
        let inbox = self.actions.iter().position(
            |a| matches!(a, Action::FileInto { mailbox, .. } if mailbox.eq_ignore_ascii_case("INBOX")),
        );
        if let Some(inbox) = inbox
            && self.actions.iter().any(|a| matches!(a, Action::Keep { .. }))
            && let Action::FileInto { flags: more, .. } = self.actions.remove(inbox)
            && let Some(Action::Keep { flags }) =
                self.actions.iter_mut().find(|a| matches!(a, Action::Keep { .. }))
        {
            merge_flags(flags, more);
        }
        let edited_message = self.msg.edited.then(|| self.msg.rebuild());
        Ok(Outcome { actions: self.actions, edited_message })
    }

    fn include(
        &mut self,
        name: &str,
        global: bool,
        once: bool,
        optional: bool,
    ) -> Result<Flow, RuntimeError> {
        let key = (name.to_string(), global);
        if once && self.included.contains(&key) {
            return Ok(Flow::Next);
        }
        if self.including.contains(&key) {
            return Err(RuntimeError::Include(format!("\"{name}\" includes itself")));
        }
        if self.including.len() >= self.limits.max_include_depth {
            return Err(RuntimeError::Include(format!(
                "nested more than {} deep",
                self.limits.max_include_depth
            )));
        }
        let script: Arc<Script> = match self.host.include(name, global) {
            Some(s) => s,
            None if optional => return Ok(Flow::Next),
            None => return Err(RuntimeError::Include(format!("no script \"{name}\""))),
        };
        self.included.insert(key.clone());
        self.including.push(key);
        let mut frame = Frame::default();
        let flow = self.block(&script.commands, &mut frame);
        self.including.pop();
        Ok(match flow? {
            Flow::Stop => Flow::Stop,
            Flow::Next | Flow::Return => Flow::Next,
        })
    }

    fn vacation(&mut self, v: &VacationCmd, frame: &Frame) -> Result<Vacation, RuntimeError> {
        let reason = self.expand(&v.reason, frame)?.into_owned();
        let subject = v.subject.as_ref().map(|s| self.expand(s, frame).map(Cow::into_owned)).transpose()?;
        let from = v.from.as_ref().map(|s| self.expand(s, frame).map(Cow::into_owned)).transpose()?;
        let mut addresses: Vec<String> = Vec::new();
        let own = self.ctx.user_addresses.iter().map(|a| Cow::Borrowed(a.as_str()));
        for a in self.expand_all(&v.addresses, frame)?.into_iter().chain(own) {
            if !addresses.iter().any(|x| x.eq_ignore_ascii_case(&a)) {
                addresses.push(a.into_owned());
            }
        }
        let handle = match &v.handle {
            Some(h) => self.expand(h, frame)?.into_owned(),
            None => {
                // RFC 5230 §4.2: without :handle, responses with the same
                // reason, subject, from and mime share one.
                let mut hash = Sha256::new();
                for part in [reason.as_str(), subject.as_deref().unwrap_or(""), from.as_deref().unwrap_or("")]
                {
                    hash.update(part.as_bytes());
                    hash.update([0]);
                }
                hash.update([u8::from(v.mime)]);
                hash.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
            }
        };
        let period_secs = match (v.seconds, v.days) {
            (Some(s), _) => s.clamp(1, MAX_PERIOD_SECS),
            (None, days) => days.unwrap_or(7).clamp(1, 90) * 86_400,
        };
        Ok(Vacation { reason, subject, from, addresses, mime: v.mime, handle, period_secs })
    }

    fn get<'s>(&'s self, var: &Var, frame: &'s Frame) -> &'s str {
        match var {
            Var::Local(n) => frame.locals.get(n),
            Var::Global(n) => self.globals.get(n),
        }
        .map_or("", String::as_str)
    }

    fn put(&mut self, var: &Var, value: String, frame: &mut Frame) {
        match var {
            Var::Local(n) => frame.locals.insert(n.clone(), value),
            Var::Global(n) => self.globals.insert(n.clone(), value),
        };
    }

    /// The string with its variable references replaced (RFC 5229 §3), no
    /// longer than `max_string`; one step per KiB produced.
    fn expand<'v>(&mut self, value: &'v Value, frame: &Frame) -> Result<Cow<'v, str>, RuntimeError> {
        let parts = match value {
            Value::Const(s) => return Ok(Cow::Borrowed(s)),
            Value::Expand(parts) => parts,
        };
        let mut out = String::new();
        for part in parts {
            let piece = match part {
                Part::Text(t) => t.as_str(),
                Part::Var(v) => self.get(v, frame),
                Part::Match(n) => self.matched.get(*n).map_or("", String::as_str),
            };
            let room = self.max_string - out.len();
            if piece.len() > room {
                out.push_str(&truncate(piece.to_string(), room));
                break;
            }
            out.push_str(piece);
        }
        self.budget.charge(1 + out.len() as u64 / 1024)?;
        Ok(Cow::Owned(out))
    }

    fn expand_all<'v>(
        &mut self,
        values: &'v [Value],
        frame: &Frame,
    ) -> Result<Vec<Cow<'v, str>>, RuntimeError> {
        values.iter().map(|v| self.expand(v, frame)).collect()
    }

    /// The flags given (expanded, split at spaces, each once), or the internal
    /// variable's when none are (RFC 5232 §5).
    fn flag_list(&mut self, given: Option<&[Value]>, frame: &Frame) -> Result<Vec<String>, RuntimeError> {
        let Some(given) = given else { return Ok(self.flags.clone()) };
        let mut out = Vec::new();
        for v in self.expand_all(given, frame)? {
            merge_flags(&mut out, split_flags(&v));
        }
        Ok(out)
    }

    /// Whether any of `values` matches any of `keys` under `m`; `:count`
    /// compares how many values there are. A `:matches` success sets the
    /// match variables.
    fn any_match(
        &mut self,
        m: &Match,
        values: &[String],
        keys: &[Value],
        frame: &Frame,
    ) -> Result<bool, RuntimeError> {
        let keys = self.expand_all(keys, frame)?;
        if let MatchKind::Count(rel) = m.kind {
            let count = values.len().to_string();
            self.budget.charge(keys.len() as u64)?;
            return Ok(keys.iter().any(|k| relate(m.comparator, rel, &count, k)));
        }
        let capture = m.kind == MatchKind::Matches;
        let mut captures = Vec::new();
        for value in values {
            for key in &keys {
                if compare(m, value, key, &mut self.budget, capture.then_some(&mut captures))? {
                    if capture {
                        captures.truncate(MATCH_VARIABLES);
                        let max = self.limits.max_variable_bytes;
                        self.matched = captures.into_iter().map(|c| truncate(c, max)).collect();
                    }
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The fields named by `names`, narrowed by `:index`.
    fn fields(
        &mut self,
        names: &[Value],
        index: Option<Index>,
        frame: &Frame,
    ) -> Result<Vec<Field>, RuntimeError> {
        let mut out = Vec::new();
        for name in self.expand_all(names, frame)? {
            let found = pick(self.msg.named(&name).collect(), index);
            // Finding the fields scans the whole header; reading them (the
            // caller decodes or parses each) is linear in their size.
            let bytes: usize = found.iter().map(|f: &&Field| f.value.len()).sum();
            self.budget.charge(1 + self.msg.fields.len() as u64 / 256 + bytes as u64 / 1024)?;
            out.extend(found.into_iter().cloned());
        }
        Ok(out)
    }

    /// The tests that nest here, the others apart (as for commands).
    fn test(&mut self, test: &Test, frame: &Frame) -> Result<bool, RuntimeError> {
        self.budget.charge(1)?;
        match test {
            Test::True => Ok(true),
            Test::False => Ok(false),
            Test::Not(t) => Ok(!self.test(t, frame)?),
            Test::AllOf(tests) => {
                for t in tests {
                    if !self.test(t, frame)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Test::AnyOf(tests) => {
                for t in tests {
                    if self.test(t, frame)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            _ => self.leaf_test(test, frame),
        }
    }

    #[inline(never)]
    fn leaf_test(&mut self, test: &Test, frame: &Frame) -> Result<bool, RuntimeError> {
        Ok(match test {
            Test::True | Test::False | Test::Not(_) | Test::AllOf(_) | Test::AnyOf(_) => {
                unreachable!("nesting tests are run by test()")
            }
            Test::Header { m, names, keys, index } => {
                let values: Vec<String> =
                    self.fields(names, *index, frame)?.iter().map(|f| message::decoded(&f.value)).collect();
                self.any_match(m, &values, keys, frame)?
            }
            Test::Address { m, part, names, keys, index } => {
                let mut values = Vec::new();
                for f in self.fields(names, *index, frame)? {
                    values.extend(message::addresses(&f.value).iter().filter_map(|a| address_part(a, *part)));
                }
                self.any_match(m, &values, keys, frame)?
            }
            Test::Envelope { m, part, names, keys } => {
                let mut values = Vec::new();
                for name in self.expand_all(names, frame)? {
                    let env = &self.ctx.envelope;
                    let address = match name.to_ascii_lowercase().as_str() {
                        "from" => Some(env.from),
                        "to" => Some(env.to),
                        "auth" => env.auth,
                        _ => None,
                    };
                    match address {
                        // RFC 5228 §5.4: the null reverse path is the empty
                        // string, whatever the address part.
                        Some("" | "<>") => values.push(String::new()),
                        Some(a) => values.extend(address_part(a, *part)),
                        None => {}
                    }
                }
                self.any_match(m, &values, keys, frame)?
            }
            Test::Exists(names) => {
                for name in self.expand_all(names, frame)? {
                    self.budget.charge(1 + self.msg.fields.len() as u64 / 256)?;
                    if self.msg.named(&name).next().is_none() {
                        return Ok(false);
                    }
                }
                true
            }
            Test::Size { over, limit } => {
                let size = self.msg.raw.len() as u64;
                if *over { size > *limit } else { size < *limit }
            }
            Test::Body { m, transform, keys } => {
                let values = match transform {
                    BodyTransform::Raw => {
                        if self.raw_body.is_none() {
                            self.budget.charge(1 + self.msg.raw.len() as u64 / 1024)?;
                            self.raw_body = Some(self.msg.raw_body());
                        }
                        vec![self.raw_body.clone().unwrap_or_default()]
                    }
                    BodyTransform::Text => self.body_parts(|p| p.ctype == "text")?,
                    BodyTransform::Content(types) => {
                        let types: Vec<String> =
                            self.expand_all(types, frame)?.iter().map(|t| t.to_ascii_lowercase()).collect();
                        self.body_parts(|p| {
                            types.iter().any(|want| content_type_is(want, &p.ctype, &p.subtype))
                        })?
                    }
                };
                self.budget.charge(1 + values.iter().map(|v| v.len() as u64).sum::<u64>() / 1024)?;
                self.any_match(m, &values, keys, frame)?
            }
            Test::String { m, sources, keys } => {
                let mut values: Vec<String> =
                    self.expand_all(sources, frame)?.into_iter().map(Cow::into_owned).collect();
                if matches!(m.kind, MatchKind::Count(_)) {
                    // RFC 5229 §5: empty strings are not counted.
                    values.retain(|v| !v.is_empty());
                }
                self.any_match(m, &values, keys, frame)?
            }
            Test::HasFlag { m, vars, keys } => {
                let mut flags = Vec::new();
                if vars.is_empty() {
                    flags = self.flags.clone();
                } else {
                    for v in vars {
                        merge_flags(&mut flags, split_flags(self.get(v, frame)));
                    }
                }
                // RFC 5232 §4: each key may itself hold several flags.
                let mut split_keys = Vec::new();
                for key in self.expand_all(keys, frame)? {
                    split_keys.extend(split_flags(&key).into_iter().map(Value::Const));
                }
                self.any_match(m, &flags, &split_keys, frame)?
            }
            Test::MailboxExists(names) => {
                for name in self.expand_all(names, frame)? {
                    if !self.host.mailbox_exists(&name) {
                        return Ok(false);
                    }
                }
                true
            }
            Test::Date { m, zone, index, header, part, keys } => {
                let fields = self.fields(std::slice::from_ref(header), *index, frame)?;
                let Some(date) = fields.first().and_then(|f| message::date(&f.value)) else {
                    return Ok(false);
                };
                let value =
                    crate::date::part(&crate::date::in_zone(date, *zone, *self.ctx.now.offset()), *part);
                self.any_match(m, &[value], keys, frame)?
            }
            Test::CurrentDate { m, zone, part, keys } => {
                let now = crate::date::in_zone(self.ctx.now, *zone, *self.ctx.now.offset());
                let value = crate::date::part(&now, *part);
                self.any_match(m, &[value], keys, frame)?
            }
            Test::Duplicate { handle, key, seconds, last } => {
                let handle = match handle {
                    Some(h) => self.expand(h, frame)?.into_owned(),
                    None => String::new(),
                };
                let (what, value) = match key {
                    DuplicateKey::UniqueId(v) => {
                        (":uniqueid".to_string(), Some(self.expand(v, frame)?.into_owned()))
                    }
                    DuplicateKey::MessageId => ("message-id".to_string(), self.first_value("message-id")),
                    DuplicateKey::Header(name) => {
                        let name = self.expand(name, frame)?.to_ascii_lowercase();
                        let value = self.first_value(&name);
                        (name, value)
                    }
                };
                // RFC 7352 §3.1: no value to track, no duplicate.
                let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(false) };
                let tracking_key = format!("{handle}\0{what}\0{value}");
                let period = seconds.unwrap_or(DUPLICATE_DEFAULT_SECS).min(MAX_PERIOD_SECS);
                self.host.duplicate(&tracking_key, period, *last)
            }
            Test::Spam { percent, m, key } => {
                let value = if *percent { self.ctx.spam_percent } else { self.ctx.spam }.unwrap_or(0);
                self.any_match(m, &[value.to_string()], std::slice::from_ref(key), frame)?
            }
            Test::Virus { m, key } => {
                let value = self.ctx.virus.unwrap_or(0);
                self.any_match(m, &[value.to_string()], std::slice::from_ref(key), frame)?
            }
        })
    }

    /// The text of the body parts `wanted` accepts; the message is parsed on
    /// the first call of a run, and that parse charged by the message's size.
    fn body_parts(&mut self, wanted: impl Fn(&BodyPart) -> bool) -> Result<Vec<String>, RuntimeError> {
        if self.text_parts.is_none() {
            self.budget.charge(1 + self.msg.raw.len() as u64 / 1024)?;
            self.text_parts = Some(self.msg.text_parts());
        }
        let parts = self.text_parts.as_deref().unwrap_or_default();
        Ok(parts.iter().filter(|p| wanted(p)).map(|p| p.text.clone()).collect())
    }

    fn first_value(&self, name: &str) -> Option<String> {
        self.msg.named(name).next().map(|f| message::decoded(&f.value).trim().to_string())
    }
}

fn action_name(a: &Action) -> &'static str {
    match a {
        Action::Keep { .. } => "keep",
        Action::FileInto { .. } => "fileinto",
        Action::Redirect { .. } => "redirect",
        Action::Reject { .. } => "reject",
        Action::Discard => "discard",
        Action::Vacation(_) => "vacation",
    }
}

/// The n-th of `items` from the top, or from the bottom with `:last`; all of
/// them without `:index`.
fn pick<T>(items: Vec<T>, index: Option<Index>) -> Vec<T> {
    let Some(Index { n, last }) = index else { return items };
    let len = items.len() as u64;
    if n == 0 || n > len {
        return Vec::new();
    }
    let at = if last { len - n } else { n - 1 } as usize;
    items.into_iter().nth(at).into_iter().collect()
}

fn address_part(address: &str, part: AddressPart) -> Option<String> {
    let (local, domain) = message::split_address(address);
    let detail_split = || local.split_once('+');
    Some(match part {
        AddressPart::All => match domain {
            Some(d) => format!("{local}@{d}"),
            None => local.to_string(),
        },
        AddressPart::Local => local.to_string(),
        AddressPart::Domain => domain?.to_string(),
        // RFC 5233 §4: without a separator, the user is the whole local
        // part and there is no detail to match.
        AddressPart::User => detail_split().map_or(local, |(u, _)| u).to_string(),
        AddressPart::Detail => detail_split()?.1.to_string(),
    })
}

/// RFC 5173 §5.2: "text" names every text subtype, "text/plain" one; the
/// empty string names every type.
fn content_type_is(want: &str, ctype: &str, subtype: &str) -> bool {
    match want.split_once('/') {
        Some((t, s)) => t == ctype && s == subtype,
        None => want.is_empty() || want == ctype,
    }
}

fn split_flags(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    merge_flags(&mut out, s.split_ascii_whitespace().map(str::to_string).collect());
    out
}

/// Adds the flags of `more` not already in `flags` (case-insensitively).
fn merge_flags(flags: &mut Vec<String>, more: Vec<String>) {
    for f in more {
        if !flags.iter().any(|g| g.eq_ignore_ascii_case(&f)) {
            flags.push(f);
        }
    }
}

fn protected(name: &str) -> bool {
    PROTECTED_FIELDS.iter().any(|p| p.eq_ignore_ascii_case(name))
}

/// A value for an added field: no line breaks of its own, non-ASCII text as an
/// RFC 2047 encoded word (RFC 5293 §4).
fn header_value(value: &str) -> String {
    let flat: String = value.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
    if flat.is_ascii() {
        return format!(" {flat}");
    }
    use base64::Engine;
    format!(" =?utf-8?b?{}?=", base64::engine::general_purpose::STANDARD.encode(flat.as_bytes()))
}

fn modify(m: Modifier, value: String) -> String {
    let first = |value: &str, upper: bool| {
        let mut chars = value.chars();
        match chars.next() {
            Some(c) if upper => c.to_uppercase().chain(chars).collect(),
            Some(c) => c.to_lowercase().chain(chars).collect(),
            None => String::new(),
        }
    };
    match m {
        Modifier::Lower => value.to_lowercase(),
        Modifier::Upper => value.to_uppercase(),
        Modifier::LowerFirst => first(&value, false),
        Modifier::UpperFirst => first(&value, true),
        Modifier::QuoteWildcard => {
            let mut out = String::with_capacity(value.len());
            for c in value.chars() {
                if matches!(c, '*' | '?' | '\\') {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        }
        Modifier::Length => value.chars().count().to_string(),
    }
}
