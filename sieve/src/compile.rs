//! From the generic tree to checked, typed commands: which commands and tests
//! exist, their arguments, which extension each needs (and whether it was
//! required), constant values checked once here rather than per message.

use std::collections::HashSet;

use crate::ast::*;
use crate::lexer::Pos;
use crate::parse::{self, Arg};
use crate::{CompileError, EXTENSIONS, Include, Limits, Script};

pub(crate) fn compile(source: &[u8], limits: &Limits) -> Result<Script, CompileError> {
    let start = Pos { line: 1, column: 1 };
    if source.len() > limits.max_script_bytes {
        return Err(start.error(format!("the script is larger than {} bytes", limits.max_script_bytes)));
    }
    let src = std::str::from_utf8(source).map_err(|e| {
        let before = &source[..e.valid_up_to()];
        let line = 1 + before.iter().filter(|&&c| c == b'\n').count() as u32;
        let column = 1 + before.iter().rev().take_while(|&&c| c != b'\n').count() as u32;
        CompileError { line, column, message: "the script is not UTF-8".into() }
    })?;
    let tree = parse::parse(src, limits.max_nesting)?;
    let mut c = Compiler {
        extensions: HashSet::new(),
        globals: HashSet::new(),
        variables: HashSet::new(),
        includes: Vec::new(),
        limits,
    };
    let commands = c.block(&tree, true)?;
    Ok(Script { commands, includes: c.includes })
}

struct Compiler<'l> {
    extensions: HashSet<&'static str>,
    /// Variables declared `global` so far (RFC 6609 §3.5).
    globals: HashSet<String>,
    /// Variables the script sets, to hold it to `max_variables`.
    variables: HashSet<Var>,
    includes: Vec<Include>,
    limits: &'l Limits,
}

/// The arguments of one command or test, consumed front to back: tagged
/// arguments first, then positional ones (RFC 5228 §2.6).
struct Args<'a> {
    args: &'a [Arg],
    next: usize,
    name: &'a str,
    pos: Pos,
}

impl<'a> Args<'a> {
    fn new(name: &'a str, pos: Pos, args: &'a [Arg]) -> Self {
        Args { args, next: 0, name, pos }
    }

    fn tag(&mut self) -> Option<(&'a str, Pos)> {
        match self.args.get(self.next) {
            Some(Arg::Tag(t, p)) => {
                self.next += 1;
                Some((t.as_str(), *p))
            }
            _ => None,
        }
    }

    fn here(&self) -> Pos {
        self.args.get(self.next).map_or(self.pos, Arg::pos)
    }

    fn missing(&self, what: &str) -> CompileError {
        self.here().error(format!("{} expects {what}", self.name))
    }

    fn string(&mut self, what: &str) -> Result<(&'a str, Pos), CompileError> {
        match self.args.get(self.next) {
            Some(Arg::String(s, p)) => {
                self.next += 1;
                Ok((s.as_str(), *p))
            }
            _ => Err(self.missing(what)),
        }
    }

    fn list(&mut self, what: &str) -> Result<Vec<(&'a str, Pos)>, CompileError> {
        match self.args.get(self.next) {
            Some(Arg::String(s, p)) => {
                self.next += 1;
                Ok(vec![(s.as_str(), *p)])
            }
            Some(Arg::List(l, _)) => {
                self.next += 1;
                Ok(l.iter().map(|(s, p)| (s.as_str(), *p)).collect())
            }
            _ => Err(self.missing(what)),
        }
    }

    fn number(&mut self, what: &str) -> Result<u64, CompileError> {
        match self.args.get(self.next) {
            Some(Arg::Number(n, _)) => {
                self.next += 1;
                Ok(*n)
            }
            _ => Err(self.missing(what)),
        }
    }

    fn remaining(&self) -> usize {
        self.args.len() - self.next
    }

    fn done(&self) -> Result<(), CompileError> {
        match self.args.get(self.next) {
            None => Ok(()),
            Some(Arg::Tag(t, p)) => Err(p.error(format!("{} has no tag :{t} here", self.name))),
            Some(a) => Err(a.pos().error(format!("too many arguments to {}", self.name))),
        }
    }
}

/// The match type, comparator, address part and index tags shared by tests.
#[derive(Default)]
struct MatchTags {
    kind: Option<MatchKind>,
    comparator: Option<Comparator>,
    part: Option<AddressPart>,
    index: Option<u64>,
    last: bool,
}

fn once<T>(slot: &mut Option<T>, value: T, pos: Pos, what: &str) -> Result<(), CompileError> {
    if slot.is_some() {
        return Err(pos.error(format!("more than one {what}")));
    }
    *slot = Some(value);
    Ok(())
}

impl Compiler<'_> {
    fn has(&self, extension: &str) -> bool {
        self.extensions.contains(extension)
    }

    fn need(&self, extension: &str, pos: Pos, what: &str) -> Result<(), CompileError> {
        if self.has(extension) {
            Ok(())
        } else {
            Err(pos.error(format!("{what} needs require \"{extension}\"")))
        }
    }

    fn block(&mut self, commands: &[parse::Command], top: bool) -> Result<Vec<Cmd>, CompileError> {
        let mut out = Vec::new();
        let mut requires_allowed = top;
        let mut i = 0;
        while i < commands.len() {
            let cmd = &commands[i];
            i += 1;
            if cmd.name == "require" {
                if !requires_allowed {
                    return Err(cmd.pos.error("require must come before any other command"));
                }
                self.require(cmd)?;
                continue;
            }
            requires_allowed = false;
            match cmd.name.as_str() {
                "if" => {
                    let mut branches = vec![self.branch(cmd)?];
                    let mut otherwise = None;
                    while let Some(next) = commands.get(i) {
                        match next.name.as_str() {
                            "elsif" => branches.push(self.branch(next)?),
                            "else" => {
                                Args::new("else", next.pos, &next.args).done()?;
                                if !next.tests.is_empty() {
                                    return Err(next.pos.error("else takes no test"));
                                }
                                otherwise = Some(self.body(next)?);
                                i += 1;
                                break;
                            }
                            _ => break,
                        }
                        i += 1;
                    }
                    out.push(Cmd::If { branches, otherwise });
                }
                "elsif" | "else" => return Err(cmd.pos.error(format!("{} without if", cmd.name))),
                _ => {
                    if cmd.block.is_some() {
                        return Err(cmd.pos.error(format!("{} takes no block", cmd.name)));
                    }
                    if !cmd.tests.is_empty() {
                        return Err(cmd.pos.error(format!("{} takes no test", cmd.name)));
                    }
                    if let Some(c) = self.command(cmd)? {
                        out.push(c);
                    }
                }
            }
        }
        Ok(out)
    }

    fn require(&mut self, cmd: &parse::Command) -> Result<(), CompileError> {
        let mut args = Args::new("require", cmd.pos, &cmd.args);
        for (name, pos) in args.list("a list of extensions")? {
            match known_extension(name) {
                Some(e) => {
                    self.extensions.insert(e);
                }
                None => return Err(pos.error(format!("unsupported extension \"{name}\""))),
            }
        }
        args.done()?;
        if !cmd.tests.is_empty() || cmd.block.is_some() {
            return Err(cmd.pos.error("require takes only a list of extensions"));
        }
        Ok(())
    }

    /// The test and block of an `if` or `elsif`.
    fn branch(&mut self, cmd: &parse::Command) -> Result<(Test, Vec<Cmd>), CompileError> {
        Args::new(&cmd.name, cmd.pos, &cmd.args).done()?;
        if cmd.list || cmd.tests.len() != 1 {
            return Err(cmd.pos.error(format!("{} needs one test", cmd.name)));
        }
        let test = &cmd.tests[0];
        if test.name != "ihave" {
            return Ok((self.test(test)?, self.body(cmd)?));
        }
        // RFC 5463 §4: the block of an ihave test is compiled with the
        // extensions it names when they are all supported, and not at all
        // (it may use anything) when they are not.
        match self.ihave(test)? {
            None if cmd.block.is_some() => Ok((Test::False, Vec::new())),
            None => Err(cmd.pos.error(format!("{} needs a block", cmd.name))),
            Some(extensions) => {
                let added: Vec<&'static str> =
                    extensions.into_iter().filter(|e| self.extensions.insert(e)).collect();
                let body = self.body(cmd);
                for e in added {
                    self.extensions.remove(e);
                }
                Ok((Test::True, body?))
            }
        }
    }

    /// The extensions an `ihave` test names when all are supported.
    fn ihave(&self, t: &parse::Test) -> Result<Option<Vec<&'static str>>, CompileError> {
        self.need("ihave", t.pos, "ihave")?;
        if !t.tests.is_empty() {
            return Err(t.pos.error("ihave takes no test"));
        }
        let mut args = Args::new("ihave", t.pos, &t.args);
        let names = args.list("a list of extensions")?;
        args.done()?;
        Ok(names.into_iter().map(|(name, _)| known_extension(name)).collect())
    }

    fn body(&mut self, cmd: &parse::Command) -> Result<Vec<Cmd>, CompileError> {
        match &cmd.block {
            Some(block) => self.block(block, false),
            None => Err(cmd.pos.error(format!("{} needs a block", cmd.name))),
        }
    }

    /// A string argument: encoded characters (RFC 5228 §2.4.2.4) decoded, and
    /// variable references (RFC 5229 §3) found, when those are required.
    fn value(&self, s: &str, pos: Pos) -> Result<Value, CompileError> {
        let decoded;
        let s = if self.has("encoded-character") && s.contains("${") {
            decoded = decode_encoded(s, pos)?;
            decoded.as_str()
        } else {
            s
        };
        if !self.has("variables") || !s.contains("${") {
            return Ok(Value::Const(s.to_string()));
        }
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = s;
        while let Some(at) = rest.find("${") {
            text.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let reference = after.find('}').and_then(|end| self.reference(&after[..end]).map(|r| (r, end)));
            match reference {
                Some((part, end)) => {
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(part);
                    rest = &after[end + 1..];
                }
                None => {
                    text.push('$');
                    rest = &rest[at + 1..];
                }
            }
        }
        text.push_str(rest);
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Value::Expand(parts))
    }

    /// What `${inside}` refers to, or `None` when it is not a reference and
    /// stays as text.
    fn reference(&self, inside: &str) -> Option<Part> {
        if !inside.is_empty() && inside.bytes().all(|c| c.is_ascii_digit()) {
            return Some(Part::Match(inside.parse().unwrap_or(usize::MAX)));
        }
        self.variable(inside).map(Part::Var)
    }

    /// A variable name (RFC 5229 §3 identifier, with the `global.` namespace
    /// of RFC 6609 §3.5), resolved to where it lives.
    fn variable(&self, name: &str) -> Option<Var> {
        let lower = name.to_ascii_lowercase();
        if let Some(global) = lower.strip_prefix("global.") {
            return (self.has("include") && is_identifier(global)).then(|| Var::Global(global.to_string()));
        }
        if !is_identifier(&lower) {
            return None;
        }
        Some(if self.globals.contains(&lower) { Var::Global(lower) } else { Var::Local(lower) })
    }

    fn values(&self, list: Vec<(&str, Pos)>) -> Result<Vec<Value>, CompileError> {
        list.into_iter().map(|(s, p)| self.value(s, p)).collect()
    }

    fn set_variable(&mut self, name: &str, pos: Pos) -> Result<Var, CompileError> {
        let var =
            self.variable(name).ok_or_else(|| pos.error(format!("invalid variable name \"{name}\"")))?;
        if self.variables.insert(var.clone()) && self.variables.len() > self.limits.max_variables {
            return Err(pos.error(format!("more than {} variables", self.limits.max_variables)));
        }
        Ok(var)
    }

    fn header_names(&self, list: Vec<(&str, Pos)>) -> Result<Vec<Value>, CompileError> {
        for (name, pos) in &list {
            if !name.contains("${") && !is_field_name(name) {
                return Err(pos.error(format!("invalid header name \"{name}\"")));
            }
        }
        self.values(list)
    }

    /// Consumes one tag of the shared kinds if `tag` is one; `Ok(false)` for
    /// any other tag.
    fn match_tag(
        &self,
        tags: &mut MatchTags,
        tag: &str,
        pos: Pos,
        args: &mut Args<'_>,
        address: bool,
        index: bool,
    ) -> Result<bool, CompileError> {
        let kind = match tag {
            "is" => Some(MatchKind::Is),
            "contains" => Some(MatchKind::Contains),
            "matches" => Some(MatchKind::Matches),
            "count" | "value" => {
                self.need("relational", pos, &format!(":{tag}"))?;
                let (rel, at) = args.string("a relation")?;
                let rel = match rel.to_ascii_lowercase().as_str() {
                    "gt" => Relation::Gt,
                    "ge" => Relation::Ge,
                    "lt" => Relation::Lt,
                    "le" => Relation::Le,
                    "eq" => Relation::Eq,
                    "ne" => Relation::Ne,
                    _ => return Err(at.error(format!("unknown relation \"{rel}\""))),
                };
                Some(if tag == "count" { MatchKind::Count(rel) } else { MatchKind::Value(rel) })
            }
            _ => None,
        };
        if let Some(kind) = kind {
            once(&mut tags.kind, kind, pos, "match type")?;
            return Ok(true);
        }
        match tag {
            "comparator" => {
                let (name, at) = args.string("a comparator name")?;
                let comparator = match name.to_ascii_lowercase().as_str() {
                    "i;octet" => Comparator::Octet,
                    "i;ascii-casemap" => Comparator::Casemap,
                    "i;ascii-numeric" => {
                        self.need("comparator-i;ascii-numeric", at, "i;ascii-numeric")?;
                        Comparator::Numeric
                    }
                    _ => return Err(at.error(format!("unknown comparator \"{name}\""))),
                };
                once(&mut tags.comparator, comparator, pos, "comparator")?;
            }
            "all" | "localpart" | "domain" | "user" | "detail" if address => {
                let part = match tag {
                    "all" => AddressPart::All,
                    "localpart" => AddressPart::Local,
                    "domain" => AddressPart::Domain,
                    "user" => AddressPart::User,
                    _ => AddressPart::Detail,
                };
                if matches!(part, AddressPart::User | AddressPart::Detail) {
                    self.need("subaddress", pos, &format!(":{tag}"))?;
                }
                once(&mut tags.part, part, pos, "address part")?;
            }
            "index" if index => {
                self.need("index", pos, ":index")?;
                let n = args.number("a field number")?;
                if n == 0 {
                    return Err(pos.error(":index counts from 1"));
                }
                once(&mut tags.index, n, pos, ":index")?;
            }
            "last" if index => {
                self.need("index", pos, ":last")?;
                tags.last = true;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn finish(&self, tags: &MatchTags, pos: Pos) -> Result<(Match, Option<Index>), CompileError> {
        let m = Match {
            kind: tags.kind.unwrap_or(MatchKind::Is),
            comparator: tags.comparator.unwrap_or(Comparator::Casemap),
        };
        if m.comparator == Comparator::Numeric && matches!(m.kind, MatchKind::Contains | MatchKind::Matches) {
            // RFC 4790 §9.1: i;ascii-numeric offers equality and ordering only.
            return Err(pos.error("i;ascii-numeric cannot do :contains or :matches"));
        }
        if tags.last && tags.index.is_none() {
            return Err(pos.error(":last needs :index"));
        }
        Ok((m, tags.index.map(|n| Index { n, last: tags.last })))
    }

    fn test(&mut self, t: &parse::Test) -> Result<Test, CompileError> {
        let mut args = Args::new(&t.name, t.pos, &t.args);
        let no_subtests = |t: &parse::Test| {
            if t.tests.is_empty() { Ok(()) } else { Err(t.pos.error(format!("{} takes no test", t.name))) }
        };
        let test = match t.name.as_str() {
            "true" | "false" => {
                no_subtests(t)?;
                if t.name == "true" { Test::True } else { Test::False }
            }
            "not" => {
                if t.list || t.tests.len() != 1 {
                    return Err(t.pos.error("not needs one test"));
                }
                Test::Not(Box::new(self.test(&t.tests[0])?))
            }
            "allof" | "anyof" => {
                if !t.list {
                    return Err(t.pos.error(format!("{} needs a list of tests in parentheses", t.name)));
                }
                let tests = t.tests.iter().map(|s| self.test(s)).collect::<Result<Vec<_>, _>>()?;
                if t.name == "allof" { Test::AllOf(tests) } else { Test::AnyOf(tests) }
            }
            "ihave" => {
                return Ok(match self.ihave(t)? {
                    Some(_) => Test::True,
                    None => Test::False,
                });
            }
            name => {
                no_subtests(t)?;
                self.simple_test(name, t.pos, &mut args)?
            }
        };
        args.done()?;
        Ok(test)
    }

    fn simple_test(&mut self, name: &str, pos: Pos, args: &mut Args<'_>) -> Result<Test, CompileError> {
        let mut tags = MatchTags::default();
        let (address, index) = match name {
            "header" => (false, true),
            "address" => (true, true),
            "envelope" => {
                self.need("envelope", pos, "envelope")?;
                (true, false)
            }
            "body" => {
                self.need("body", pos, "body")?;
                (false, false)
            }
            "string" => {
                self.need("variables", pos, "string")?;
                (false, false)
            }
            "hasflag" => {
                self.need("imap4flags", pos, "hasflag")?;
                (false, false)
            }
            "date" => {
                self.need("date", pos, "date")?;
                (false, true)
            }
            "currentdate" => {
                self.need("date", pos, "currentdate")?;
                (false, false)
            }
            "spamtest" => {
                self.need("spamtest", pos, "spamtest")?;
                (false, false)
            }
            "virustest" => {
                self.need("virustest", pos, "virustest")?;
                (false, false)
            }
            "exists" => return Ok(Test::Exists(self.header_names(args.list("header names")?)?)),
            "size" => {
                let over = match args.tag() {
                    Some(("over", _)) => true,
                    Some(("under", _)) => false,
                    _ => return Err(args.missing(":over or :under")),
                };
                return Ok(Test::Size { over, limit: args.number("a size")? });
            }
            "mailboxexists" => {
                self.need("mailbox", pos, "mailboxexists")?;
                return Ok(Test::MailboxExists(self.values(args.list("mailbox names")?)?));
            }
            "duplicate" => return self.duplicate(pos, args),
            _ => return Err(pos.error(format!("unknown test \"{name}\""))),
        };
        let mut transform = None;
        let mut zone = None;
        let mut percent = false;
        while let Some((tag, at)) = args.tag() {
            if self.match_tag(&mut tags, tag, at, args, address, index)? {
                continue;
            }
            match (name, tag) {
                ("body", "raw") => once(&mut transform, BodyTransform::Raw, at, "body transform")?,
                ("body", "text") => once(&mut transform, BodyTransform::Text, at, "body transform")?,
                ("body", "content") => {
                    let types = self.values(args.list("content types")?)?;
                    once(&mut transform, BodyTransform::Content(types), at, "body transform")?
                }
                ("date" | "currentdate", "zone") => {
                    let (z, zat) = args.string("a zone")?;
                    let offset = parse_zone(z).ok_or_else(|| zat.error(format!("invalid zone \"{z}\"")))?;
                    once(&mut zone, Zone::Fixed(offset), at, "zone")?
                }
                ("date", "originalzone") => once(&mut zone, Zone::Original, at, "zone")?,
                ("spamtest", "percent") => {
                    self.need("spamtestplus", at, ":percent")?;
                    percent = true;
                }
                _ => return Err(at.error(format!("{name} has no tag :{tag}"))),
            }
        }
        let (m, index) = self.finish(&tags, pos)?;
        let part = tags.part.unwrap_or(AddressPart::All);
        Ok(match name {
            "header" => {
                let names = self.header_names(args.list("header names")?)?;
                Test::Header { m, names, keys: self.keys(args)?, index }
            }
            "address" => {
                let names = self.header_names(args.list("header names")?)?;
                Test::Address { m, part, names, keys: self.keys(args)?, index }
            }
            "envelope" => {
                let list = args.list("envelope parts")?;
                for (part, p) in &list {
                    if !part.contains("${")
                        && !matches!(part.to_ascii_lowercase().as_str(), "from" | "to" | "auth")
                    {
                        return Err(p.error(format!("unknown envelope part \"{part}\"")));
                    }
                }
                Test::Envelope { m, part, names: self.values(list)?, keys: self.keys(args)? }
            }
            "body" => {
                Test::Body { m, transform: transform.unwrap_or(BodyTransform::Text), keys: self.keys(args)? }
            }
            "string" => {
                let sources = self.values(args.list("source strings")?)?;
                Test::String { m, sources, keys: self.keys(args)? }
            }
            "hasflag" => {
                let mut vars = Vec::new();
                if args.remaining() > 1 {
                    self.need("variables", pos, "a flag variable")?;
                    for (v, p) in args.list("variable names")? {
                        vars.push(
                            self.variable(v)
                                .ok_or_else(|| p.error(format!("invalid variable name \"{v}\"")))?,
                        );
                    }
                }
                Test::HasFlag { m, vars, keys: self.keys(args)? }
            }
            "date" => {
                let (header, hp) = args.string("a header name")?;
                let header = self.header_names(vec![(header, hp)])?.remove(0);
                let part = date_part(args)?;
                Test::Date {
                    m,
                    zone: zone.unwrap_or(Zone::Local),
                    index,
                    header,
                    part,
                    keys: self.keys(args)?,
                }
            }
            "currentdate" => {
                let part = date_part(args)?;
                Test::CurrentDate { m, zone: zone.unwrap_or(Zone::Local), part, keys: self.keys(args)? }
            }
            "spamtest" => {
                let (key, p) = args.string("a value")?;
                Test::Spam { percent, m, key: self.value(key, p)? }
            }
            _ => {
                let (key, p) = args.string("a value")?;
                Test::Virus { m, key: self.value(key, p)? }
            }
        })
    }

    fn keys(&self, args: &mut Args<'_>) -> Result<Vec<Value>, CompileError> {
        self.values(args.list("a key list")?)
    }

    fn duplicate(&mut self, pos: Pos, args: &mut Args<'_>) -> Result<Test, CompileError> {
        self.need("duplicate", pos, "duplicate")?;
        let (mut handle, mut key, mut seconds, mut last) = (None, None, None, false);
        while let Some((tag, at)) = args.tag() {
            match tag {
                "handle" => {
                    let (h, p) = args.string("a handle")?;
                    once(&mut handle, self.value(h, p)?, at, ":handle")?
                }
                "header" => {
                    let (h, p) = args.string("a header name")?;
                    let name = self.header_names(vec![(h, p)])?.remove(0);
                    once(&mut key, DuplicateKey::Header(name), at, ":header or :uniqueid")?
                }
                "uniqueid" => {
                    let (u, p) = args.string("a value")?;
                    once(&mut key, DuplicateKey::UniqueId(self.value(u, p)?), at, ":header or :uniqueid")?
                }
                "seconds" => once(&mut seconds, args.number("seconds")?, at, ":seconds")?,
                "last" => last = true,
                _ => return Err(at.error(format!("duplicate has no tag :{tag}"))),
            }
        }
        Ok(Test::Duplicate { handle, key: key.unwrap_or(DuplicateKey::MessageId), seconds, last })
    }

    /// A command other than `if` and `require`; `None` for declarations that
    /// do nothing at run time (`global`).
    fn command(&mut self, cmd: &parse::Command) -> Result<Option<Cmd>, CompileError> {
        let pos = cmd.pos;
        let mut args = Args::new(&cmd.name, pos, &cmd.args);
        let out = match cmd.name.as_str() {
            "stop" => Cmd::Stop,
            "discard" => Cmd::Discard,
            "keep" => {
                let mut flags = None;
                while let Some((tag, at)) = args.tag() {
                    match tag {
                        "flags" => {
                            self.need("imap4flags", at, ":flags")?;
                            once(&mut flags, self.values(args.list("flags")?)?, at, ":flags")?
                        }
                        _ => return Err(at.error(format!("keep has no tag :{tag}"))),
                    }
                }
                Cmd::Keep { flags }
            }
            "redirect" => {
                let mut copy = false;
                while let Some((tag, at)) = args.tag() {
                    match tag {
                        "copy" => {
                            self.need("copy", at, ":copy")?;
                            copy = true;
                        }
                        _ => return Err(at.error(format!("redirect has no tag :{tag}"))),
                    }
                }
                let (address, at) = args.string("an address")?;
                let address = self.value(address, at)?;
                if let Value::Const(a) = &address
                    && !valid_address(a)
                {
                    // RFC 5228 §4.2: a syntactically invalid address is an error.
                    return Err(at.error(format!("invalid address \"{a}\"")));
                }
                Cmd::Redirect { address, copy }
            }
            "fileinto" => {
                self.need("fileinto", pos, "fileinto")?;
                let (mut copy, mut create, mut flags) = (false, false, None);
                while let Some((tag, at)) = args.tag() {
                    match tag {
                        "copy" => {
                            self.need("copy", at, ":copy")?;
                            copy = true;
                        }
                        "create" => {
                            self.need("mailbox", at, ":create")?;
                            create = true;
                        }
                        "flags" => {
                            self.need("imap4flags", at, ":flags")?;
                            once(&mut flags, self.values(args.list("flags")?)?, at, ":flags")?
                        }
                        _ => return Err(at.error(format!("fileinto has no tag :{tag}"))),
                    }
                }
                let (mailbox, at) = args.string("a mailbox name")?;
                if mailbox.is_empty() {
                    return Err(at.error("empty mailbox name"));
                }
                Cmd::FileInto { mailbox: self.value(mailbox, at)?, flags, copy, create }
            }
            "reject" | "ereject" => {
                let extended = cmd.name == "ereject";
                self.need(if extended { "ereject" } else { "reject" }, pos, &cmd.name)?;
                let (reason, at) = args.string("a reason")?;
                Cmd::Reject { reason: self.value(reason, at)?, extended }
            }
            "setflag" | "addflag" | "removeflag" => {
                self.need("imap4flags", pos, &cmd.name)?;
                let op = match cmd.name.as_str() {
                    "setflag" => FlagOp::Set,
                    "addflag" => FlagOp::Add,
                    _ => FlagOp::Remove,
                };
                let var = if args.remaining() > 1 {
                    self.need("variables", pos, "a flag variable")?;
                    let (name, at) = args.string("a variable name")?;
                    Some(self.set_variable(name, at)?)
                } else {
                    None
                };
                Cmd::Flags { op, var, flags: self.values(args.list("flags")?)? }
            }
            "set" => {
                self.need("variables", pos, "set")?;
                let mut modifiers: Vec<Modifier> = Vec::new();
                while let Some((tag, at)) = args.tag() {
                    let m = match tag {
                        "lower" => Modifier::Lower,
                        "upper" => Modifier::Upper,
                        "lowerfirst" => Modifier::LowerFirst,
                        "upperfirst" => Modifier::UpperFirst,
                        "quotewildcard" => Modifier::QuoteWildcard,
                        "length" => Modifier::Length,
                        _ => return Err(at.error(format!("set has no tag :{tag}"))),
                    };
                    // RFC 5229 §4.1: two modifiers of one precedence are an error.
                    if modifiers.iter().any(|o| o.precedence() == m.precedence()) {
                        return Err(at.error(format!("conflicting modifier :{tag}")));
                    }
                    modifiers.push(m);
                }
                modifiers.sort_by_key(|m| std::cmp::Reverse(m.precedence()));
                let (name, at) = args.string("a variable name")?;
                let var = self.set_variable(name, at)?;
                let (value, at) = args.string("a value")?;
                Cmd::Set { var, modifiers, value: self.value(value, at)? }
            }
            "vacation" => Cmd::Vacation(Box::new(self.vacation(pos, &mut args)?)),
            "include" => {
                self.need("include", pos, "include")?;
                let (mut global, mut location, mut once_, mut optional) = (false, false, false, false);
                while let Some((tag, at)) = args.tag() {
                    match tag {
                        "personal" | "global" if location => return Err(at.error("more than one location")),
                        "personal" => location = true,
                        "global" => (global, location) = (true, true),
                        "once" => once_ = true,
                        "optional" => optional = true,
                        _ => return Err(at.error(format!("include has no tag :{tag}"))),
                    }
                }
                let (name, at) = args.string("a script name")?;
                // RFC 6609 §3.2: the name is a constant, and a plain name.
                if name.is_empty() || name.contains(['/', '\0']) || name.contains("${") {
                    return Err(at.error(format!("invalid script name \"{name}\"")));
                }
                let include = Include { name: name.to_string(), global, optional, once: once_ };
                if !self.includes.contains(&include) {
                    self.includes.push(include);
                }
                Cmd::Include { name: name.to_string(), global, once: once_, optional }
            }
            "error" => {
                self.need("ihave", pos, "error")?;
                let (message, at) = args.string("a message")?;
                Cmd::Error(self.value(message, at)?)
            }
            "return" => {
                self.need("include", pos, "return")?;
                Cmd::Return
            }
            "global" => {
                self.need("include", pos, "global")?;
                self.need("variables", pos, "global")?;
                for (name, at) in args.list("variable names")? {
                    let lower = name.to_ascii_lowercase();
                    if !is_identifier(&lower) {
                        return Err(at.error(format!("invalid variable name \"{name}\"")));
                    }
                    if self.variables.contains(&Var::Local(lower.clone())) {
                        return Err(at.error(format!("\"{name}\" is used as a local variable before global")));
                    }
                    self.globals.insert(lower);
                }
                args.done()?;
                return Ok(None);
            }
            "addheader" => {
                self.need("editheader", pos, "addheader")?;
                let mut last = false;
                while let Some((tag, at)) = args.tag() {
                    match tag {
                        "last" => last = true,
                        _ => return Err(at.error(format!("addheader has no tag :{tag}"))),
                    }
                }
                let (name, at) = args.string("a header name")?;
                let name = self.header_names(vec![(name, at)])?.remove(0);
                let (value, at) = args.string("a value")?;
                Cmd::AddHeader { last, name, value: self.value(value, at)? }
            }
            "deleteheader" => {
                self.need("editheader", pos, "deleteheader")?;
                let mut tags = MatchTags::default();
                while let Some((tag, at)) = args.tag() {
                    // RFC 5293 §5: deleteheader has :index and :last of its
                    // own, without the "index" extension.
                    match tag {
                        "index" => {
                            let n = args.number("a field number")?;
                            if n == 0 {
                                return Err(at.error(":index counts from 1"));
                            }
                            once(&mut tags.index, n, at, ":index")?
                        }
                        "last" => tags.last = true,
                        _ if self.match_tag(&mut tags, tag, at, &mut args, false, false)? => {}
                        _ => return Err(at.error(format!("deleteheader has no tag :{tag}"))),
                    }
                }
                let (m, index) = self.finish(&tags, pos)?;
                let (name, at) = args.string("a header name")?;
                let name = self.header_names(vec![(name, at)])?.remove(0);
                let patterns = if args.remaining() > 0 { self.keys(&mut args)? } else { Vec::new() };
                Cmd::DeleteHeader { index, m, name, patterns }
            }
            name => return Err(pos.error(format!("unknown command \"{name}\""))),
        };
        args.done()?;
        Ok(Some(out))
    }

    fn vacation(&mut self, pos: Pos, args: &mut Args<'_>) -> Result<VacationCmd, CompileError> {
        self.need("vacation", pos, "vacation")?;
        let mut v = VacationCmd {
            days: None,
            seconds: None,
            subject: None,
            from: None,
            addresses: Vec::new(),
            mime: false,
            handle: None,
            reason: Value::Const(String::new()),
        };
        while let Some((tag, at)) = args.tag() {
            match tag {
                "days" | "seconds" if v.days.is_some() || v.seconds.is_some() => {
                    return Err(at.error("more than one of :days and :seconds"));
                }
                "days" => v.days = Some(args.number("a number of days")?),
                "seconds" => {
                    self.need("vacation-seconds", at, ":seconds")?;
                    v.seconds = Some(args.number("a number of seconds")?)
                }
                "subject" => {
                    let (s, p) = args.string("a subject")?;
                    once(&mut v.subject, self.value(s, p)?, at, ":subject")?
                }
                "from" => {
                    let (s, p) = args.string("an address")?;
                    once(&mut v.from, self.value(s, p)?, at, ":from")?
                }
                "addresses" => v.addresses = self.values(args.list("addresses")?)?,
                "mime" => v.mime = true,
                "handle" => {
                    let (s, p) = args.string("a handle")?;
                    once(&mut v.handle, self.value(s, p)?, at, ":handle")?
                }
                _ => return Err(at.error(format!("vacation has no tag :{tag}"))),
            }
        }
        let (reason, at) = args.string("a reason")?;
        v.reason = self.value(reason, at)?;
        Ok(v)
    }
}

fn known_extension(name: &str) -> Option<&'static str> {
    EXTENSIONS
        .iter()
        .chain(&["comparator-i;octet", "comparator-i;ascii-casemap"])
        .find(|e| **e == name)
        .copied()
}

fn date_part(args: &mut Args<'_>) -> Result<DatePart, CompileError> {
    let (name, at) = args.string("a date part")?;
    Ok(match name.to_ascii_lowercase().as_str() {
        "year" => DatePart::Year,
        "month" => DatePart::Month,
        "day" => DatePart::Day,
        "date" => DatePart::Date,
        "julian" => DatePart::Julian,
        "hour" => DatePart::Hour,
        "minute" => DatePart::Minute,
        "second" => DatePart::Second,
        "time" => DatePart::Time,
        "iso8601" => DatePart::Iso8601,
        "std11" => DatePart::Std11,
        "zone" => DatePart::Zone,
        "weekday" => DatePart::Weekday,
        _ => return Err(at.error(format!("unknown date part \"{name}\""))),
    })
}

/// `+hhmm` / `-hhmm` (RFC 5260 §4.1) as seconds east of UTC.
pub(crate) fn parse_zone(z: &str) -> Option<i32> {
    let b = z.as_bytes();
    if b.len() != 5 || !matches!(b[0], b'+' | b'-') || !b[1..].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let hours: i32 = z[1..3].parse().ok()?;
    let minutes: i32 = z[3..5].parse().ok()?;
    if hours > 23 || minutes > 59 {
        return None;
    }
    let secs = hours * 3600 + minutes * 60;
    Some(if b[0] == b'-' { -secs } else { secs })
}

fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// RFC 5322 §3.6.8 field-name: printable ASCII but the colon.
pub(crate) fn is_field_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| (33..=126).contains(&c) && c != b':')
}

/// A plain `local@domain` with nothing that could smuggle a second recipient
/// or a command into the SMTP conversation.
pub(crate) fn valid_address(a: &str) -> bool {
    let Some((local, domain)) = a.rsplit_once('@') else { return false };
    !local.is_empty()
        && !domain.is_empty()
        && a.len() <= 320
        && !a.bytes().any(|c| c <= b' ' || matches!(c, b'<' | b'>' | b',' | b'(' | b')' | b'\\' | 127))
        && !domain.contains('@')
}

/// RFC 5228 §2.4.2.4: `${hex: 41 42}` and `${unicode: 263a}` become the
/// characters they name; anything that does not parse as one stays as written.
fn decode_encoded(s: &str, pos: Pos) -> Result<String, CompileError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let decoded = match after.find('}') {
            Some(end) => decode_one(&after[..end], pos)?.map(|d| (d, end)),
            None => None,
        };
        match decoded {
            Some((d, end)) => {
                out.push_str(&d);
                rest = &after[end + 1..];
            }
            None => {
                out.push('$');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn decode_one(inside: &str, pos: Pos) -> Result<Option<String>, CompileError> {
    let Some((kind, list)) = inside.split_once(':') else { return Ok(None) };
    let kind = kind.to_ascii_lowercase();
    let words: Vec<&str> = list.split([' ', '\t', '\r', '\n']).filter(|w| !w.is_empty()).collect();
    if words.is_empty() {
        return Ok(None);
    }
    let hex = |w: &&str, max: usize| w.len() <= max && w.bytes().all(|c| c.is_ascii_hexdigit());
    match kind.as_str() {
        "hex" => {
            if !words.iter().all(|w| hex(w, 2)) {
                return Ok(None);
            }
            let bytes: Vec<u8> = words.iter().map(|w| u8::from_str_radix(w, 16).unwrap_or(0)).collect();
            String::from_utf8(bytes).map(Some).map_err(|_| pos.error("encoded characters are not UTF-8"))
        }
        "unicode" => {
            if !words.iter().all(|w| hex(w, 6)) {
                return Ok(None);
            }
            let mut out = String::new();
            for w in words {
                let code = u32::from_str_radix(w, 16).unwrap_or(u32::MAX);
                out.push(
                    char::from_u32(code)
                        .ok_or_else(|| pos.error(format!("invalid unicode character {w}")))?,
                );
            }
            Ok(Some(out))
        }
        _ => Ok(None),
    }
}
