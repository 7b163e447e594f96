//! Sieve mail filters (RFC 5228 and the extensions in [`EXTENSIONS`]): a
//! compiler from a user's script to a [`Script`], and an interpreter that
//! decides, for one message and one recipient, what the script says to do with
//! it ([`run`] → [`Outcome`]).
//!
//! Our own rather than `sieve-rs`, the maintained Rust interpreter, because that
//! one is AGPL-3.0-only and this project is Apache-2.0 with permissive
//! dependencies only.
//!
//! Scripts are uploaded by users, so the source is hostile input: every
//! dimension is bounded by [`Limits`] (size, nesting, evaluation steps, actions,
//! variables, includes, header edits). The compiler never recurses deeper than
//! `max_nesting`, and `:matches` runs in time linear in the value for each
//! wildcard segment (no backtracking). Nothing here does I/O: the world is asked
//! through [`Host`] and [`Context`], and the actions are only described.

mod ast;
mod compile;
mod date;
mod lexer;
mod matching;
mod message;
mod parse;
mod run;

use std::fmt;
use std::sync::Arc;

pub use run::run;

/// The bounds every compile and run is held to. All of them are enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The largest script accepted, in bytes.
    pub max_script_bytes: usize,
    /// How deep blocks and tests may nest, together; deeper is a compile error.
    pub max_nesting: usize,
    /// Evaluation steps per run (commands, tests, string comparisons; long
    /// comparisons count one step per KiB examined).
    pub max_instructions: u64,
    /// Distinct actions one run may take.
    pub max_actions: usize,
    /// Redirects one run may take.
    pub max_redirects: usize,
    /// The longest variable value, in bytes; longer values are truncated
    /// (RFC 5229 §6 allows it).
    pub max_variable_bytes: usize,
    /// Distinct variables one script may set.
    pub max_variables: usize,
    /// How deep `include` may nest (RFC 6609).
    pub max_include_depth: usize,
    /// `addheader` and `deleteheader` commands one run may carry out.
    pub max_header_edits: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_script_bytes: 64 * 1024,
            max_nesting: 32,
            max_instructions: 200_000,
            max_actions: 32,
            max_redirects: 4,
            max_variable_bytes: 4096,
            max_variables: 128,
            max_include_depth: 4,
            max_header_edits: 32,
        }
    }
}

/// The extensions `require` accepts, in the order ManageSieve announces them
/// (its SIEVE capability).
pub const EXTENSIONS: &[&str] = &[
    "fileinto",
    "reject",
    "ereject",
    "envelope",
    "encoded-character",
    "vacation",
    "vacation-seconds",
    "subaddress",
    "comparator-i;ascii-numeric",
    "relational",
    "imap4flags",
    "copy",
    "include",
    "variables",
    "body",
    "duplicate",
    "mailbox",
    "date",
    "index",
    "editheader",
    "spamtest",
    "spamtestplus",
    "virustest",
    "ihave",
];

/// A compiled script: parsed and checked once, shared (in an `Arc`) by every
/// delivery that runs it.
#[derive(Debug)]
pub struct Script {
    pub(crate) commands: Vec<ast::Cmd>,
    pub(crate) includes: Vec<Include>,
}

impl Script {
    /// Compiles `source`; any syntax or semantic problem, or a limit exceeded,
    /// is a [`CompileError`] naming the line.
    pub fn compile(source: &[u8], limits: &Limits) -> Result<Script, CompileError> {
        compile::compile(source, limits)
    }

    /// The scripts this one includes (RFC 6609), in the order they appear.
    pub fn includes(&self) -> Vec<Include> {
        self.includes.clone()
    }
}

/// One `include` command of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Include {
    pub name: String,
    /// `:global` (the site's scripts) rather than `:personal` (the account's).
    pub global: bool,
    pub optional: bool,
    pub once: bool,
}

/// Why a script does not compile, and where (1-based line and column).
#[derive(Debug, Clone, PartialEq)]
pub struct CompileError {
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for CompileError {}

/// The SMTP envelope of the delivery being filtered.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    /// The reverse path; "" is the null reverse path.
    pub from: &'a str,
    /// This recipient as given in RCPT TO.
    pub to: &'a str,
    /// The authenticated sender, if the message was submitted with AUTH.
    pub auth: Option<&'a str>,
}

/// What a run knows about the delivery besides the message.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    pub envelope: Envelope<'a>,
    /// The time of delivery: `currentdate`, and the zone `date` converts to.
    pub now: chrono::DateTime<chrono::FixedOffset>,
    /// `spamtest` (RFC 5235): 0 = not tested, 1 = clean .. 10 = spam.
    pub spam: Option<u8>,
    /// `spamtest :percent` (spamtestplus), 0..=100.
    pub spam_percent: Option<u8>,
    /// `virustest`: 0 = not tested, 1 = clean .. 5 = infected.
    pub virus: Option<u8>,
    /// The account's own addresses (vacation's implicit `:addresses`).
    pub user_addresses: &'a [String],
}

/// Questions a running script asks the world, answered synchronously.
pub trait Host {
    /// `mailboxexists` (RFC 5490): whether the account has this mailbox.
    fn mailbox_exists(&mut self, name: &str) -> bool;
    /// `duplicate` (RFC 7352): whether `tracking_key` was seen within
    /// `period_secs`; also records it (with `last`, the period restarts from
    /// this message).
    fn duplicate(&mut self, tracking_key: &str, period_secs: u64, last: bool) -> bool;
    /// `include` (RFC 6609): the named script of the account (`global` false)
    /// or of the site, compiled; `None` when there is none.
    fn include(&mut self, name: &str, global: bool) -> Option<Arc<Script>>;
}

/// What the script decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Final and de-duplicated (RFC 5228 §2.10.3, §4); the implicit keep, when
    /// it stands, is an explicit `Keep` here.
    pub actions: Vec<Action>,
    /// The message after `addheader`/`deleteheader`; `None` when unchanged.
    pub edited_message: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Keep {
        flags: Vec<String>,
    },
    FileInto {
        mailbox: String,
        flags: Vec<String>,
        create: bool,
    },
    Redirect {
        address: String,
        copy: bool,
    },
    /// `reject`; `extended` for `ereject` (RFC 5429).
    Reject {
        reason: String,
        extended: bool,
    },
    Discard,
    Vacation(Vacation),
}

/// A vacation auto-reply the script asks for (RFC 5230). Whether to send it
/// (mailing lists, bulk mail, the sender seen within the period, the message
/// not addressed to the account) is the caller's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Vacation {
    pub reason: String,
    pub subject: Option<String>,
    pub from: Option<String>,
    /// The script's `:addresses` and the account's own addresses.
    pub addresses: Vec<String>,
    pub mime: bool,
    /// `:handle`, or one derived from the reason, subject, from and mime
    /// (RFC 5230 §4.2) when absent.
    pub handle: String,
    /// `:days` (clamped to 1..=90 days) or `:seconds` (at least 1); 7 days by
    /// default.
    pub period_secs: u64,
}

/// Why a run stopped without an outcome; the caller then files the message
/// into INBOX (RFC 5228 §2.10.6).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuntimeError {
    #[error("the script ran for too many steps")]
    TooManyInstructions,
    #[error("the script took too many actions")]
    TooManyActions,
    #[error("the script redirected too many times")]
    TooManyRedirects,
    #[error("the script edited the header too many times")]
    TooManyHeaderEdits,
    #[error("conflicting actions: {0}")]
    Conflict(String),
    #[error("include: {0}")]
    Include(String),
    #[error("invalid address to redirect to: {0}")]
    InvalidAddress(String),
    #[error("invalid mailbox name: {0}")]
    InvalidMailbox(String),
    #[error("invalid header field name: {0}")]
    InvalidHeader(String),
    /// The script's own `error` command (RFC 5463 §5).
    #[error("the script failed: {0}")]
    Script(String),
}
