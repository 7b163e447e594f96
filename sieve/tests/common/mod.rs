//! What the tests of every RFC share: a context, a host with scripts and
//! mailboxes and a duplicate store, and short ways to compile and run.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, FixedOffset};
use mailcluster_sieve::{
    Action, CompileError, Context, Envelope, Host, Limits, Outcome, RuntimeError, Script, run,
};

pub const FROM: &str = "sender@example.org";
pub const TO: &str = "ken+sieve@example.com";

/// A plain message with the given header lines (CRLF added) and body.
pub fn message(headers: &[&str], body: &str) -> Vec<u8> {
    let mut m = String::new();
    for h in headers {
        m.push_str(h);
        m.push_str("\r\n");
    }
    m.push_str("\r\n");
    m.push_str(body);
    m.into_bytes()
}

pub fn simple_message() -> Vec<u8> {
    message(
        &[
            "Date: Tue, 1 Apr 1997 09:06:31 -0800 (PST)",
            "From: coyote@desert.example.org",
            "To: roadrunner@acme.example.com",
            "Subject: I have a present for you",
            "Message-ID: <1234@desert.example.org>",
        ],
        "Look, I'm sorry about the whole anvil thing, and I really\r\ndidn't mean to try and drop it on you from the top of the\r\ncliff.\r\n",
    )
}

#[derive(Default)]
pub struct TestHost {
    pub scripts: HashMap<(String, bool), Arc<Script>>,
    pub mailboxes: HashSet<String>,
    pub seen: HashMap<String, u64>,
    pub duplicate_calls: Vec<(String, u64, bool)>,
    pub include_calls: usize,
}

impl TestHost {
    pub fn with_script(mut self, name: &str, global: bool, source: &str) -> Self {
        let script =
            Script::compile(source.as_bytes(), &Limits::default()).expect("included script compiles");
        self.scripts.insert((name.to_string(), global), Arc::new(script));
        self
    }
}

impl Host for TestHost {
    fn mailbox_exists(&mut self, name: &str) -> bool {
        self.mailboxes.contains(name)
    }
    fn duplicate(&mut self, tracking_key: &str, period_secs: u64, last: bool) -> bool {
        self.duplicate_calls.push((tracking_key.to_string(), period_secs, last));
        self.seen.insert(tracking_key.to_string(), period_secs).is_some()
    }
    fn include(&mut self, name: &str, global: bool) -> Option<Arc<Script>> {
        self.include_calls += 1;
        self.scripts.get(&(name.to_string(), global)).cloned()
    }
}

pub fn now() -> DateTime<FixedOffset> {
    DateTime::parse_from_rfc3339("2026-12-07T18:30:05+01:00").unwrap()
}

pub fn context<'a>(from: &'a str, to: &'a str, own: &'a [String]) -> Context<'a> {
    Context {
        envelope: Envelope { from, to, auth: None },
        now: now(),
        spam: None,
        spam_percent: None,
        virus: None,
        user_addresses: own,
    }
}

pub fn compile(source: &str) -> Script {
    match Script::compile(source.as_bytes(), &Limits::default()) {
        Ok(s) => s,
        Err(e) => panic!("{e} (column {}) in:\n{source}", e.column),
    }
}

pub fn compile_error(source: &str) -> CompileError {
    match Script::compile(source.as_bytes(), &Limits::default()) {
        Ok(_) => panic!("compiled but should not have:\n{source}"),
        Err(e) => e,
    }
}

pub fn run_with(
    source: &str,
    msg: &[u8],
    ctx: &Context,
    host: &mut TestHost,
) -> Result<Outcome, RuntimeError> {
    run(&compile(source), msg, ctx, host, &Limits::default())
}

pub fn try_run(source: &str, msg: &[u8]) -> Result<Outcome, RuntimeError> {
    run_with(source, msg, &context(FROM, TO, &[]), &mut TestHost::default())
}

/// The actions of a run that must succeed.
pub fn actions(source: &str, msg: &[u8]) -> Vec<Action> {
    try_run(source, msg).unwrap_or_else(|e| panic!("{e} in:\n{source}")).actions
}

pub fn keep() -> Action {
    Action::Keep { flags: vec![] }
}

pub fn fileinto(mailbox: &str) -> Action {
    Action::FileInto { mailbox: mailbox.into(), flags: vec![], create: false }
}

/// Whether `test` (a Sieve test) is true for `msg`: the script files into
/// "yes" when it is.
pub fn holds(requires: &str, test: &str, msg: &[u8]) -> bool {
    let source = format!("require [\"fileinto\"{requires}];\nif {test} {{ fileinto \"yes\"; }}\n");
    actions(&source, msg).contains(&fileinto("yes"))
}
