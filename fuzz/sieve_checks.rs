//! The property of the `sieve` fuzz target, kept apart from `checks.rs`
//! because it needs only the sieve crate: `sieve/tests/fuzz_property.rs` runs
//! it (bounded, seeded) with the ordinary tests, the cargo-fuzz target without
//! bounds.
//!
//! Arbitrary bytes are compiled as a script; whatever compiles is run on a
//! fixed message and on the input itself taken as a message, with the default
//! limits and with tiny ones. Neither may panic, and every outcome keeps the
//! promises of `Limits` and RFC 5429.

use std::sync::Arc;

use mailcluster_sieve::{Action, Context, Envelope, Host, Limits, Outcome, Script, run};

const MESSAGE: &[u8] = b"Date: Tue, 1 Apr 1997 09:06:31 -0800\r\n\
From: Coyote <coyote@desert.example.org>\r\n\
To: roadrunner+beep@acme.example.com, b@example.net\r\n\
Subject: =?utf-8?q?caf=C3=A9?= and a present\r\n\
Message-ID: <1234@desert.example.org>\r\n\
Received: from a by b; Mon, 31 Mar 1997 23:00:00 -0800\r\n\
Content-Type: multipart/mixed; boundary=x\r\n\
\r\n\
--x\r\nContent-Type: text/plain\r\n\r\nhello anvil\r\n--x\r\nContent-Type: text/html\r\n\r\n<p>hi</p>\r\n--x--\r\n";

/// Answers every include with the script under test (so loops and depth are
/// exercised) and remembers nothing.
struct SelfHost(Option<Arc<Script>>, usize);

impl Host for SelfHost {
    fn mailbox_exists(&mut self, name: &str) -> bool {
        name.len().is_multiple_of(2)
    }
    fn duplicate(&mut self, tracking_key: &str, _period_secs: u64, _last: bool) -> bool {
        tracking_key.len().is_multiple_of(2)
    }
    fn include(&mut self, _name: &str, _global: bool) -> Option<Arc<Script>> {
        self.1 += 1;
        self.0.clone()
    }
}

fn check(outcome: &Outcome, limits: &Limits) {
    let a = &outcome.actions;
    // The implicit keep may come on top of max_actions explicit ones.
    assert!(a.len() <= limits.max_actions + 1, "{} actions", a.len());
    let count = |f: fn(&Action) -> bool| a.iter().filter(|x| f(x)).count();
    assert!(count(|x| matches!(x, Action::Redirect { .. })) <= limits.max_redirects);
    assert!(count(|x| matches!(x, Action::Keep { .. })) <= 1);
    assert!(count(|x| matches!(x, Action::Vacation(_))) <= 1);
    if count(|x| matches!(x, Action::Reject { .. })) > 0 {
        assert_eq!(count(|x| !matches!(x, Action::Reject { .. } | Action::Discard)), 0, "reject with {a:?}");
    }
    assert!(!a.is_empty(), "no action at all: at least the implicit keep or a discard");
    let longest = limits.max_script_bytes.max(limits.max_variable_bytes);
    for x in a {
        let strings: Vec<&str> = match x {
            Action::Keep { flags } => flags.iter().map(String::as_str).collect(),
            Action::FileInto { mailbox, flags, .. } => {
                std::iter::once(mailbox.as_str()).chain(flags.iter().map(String::as_str)).collect()
            }
            Action::Redirect { address, .. } => vec![address.as_str()],
            Action::Reject { reason, .. } => vec![reason.as_str()],
            Action::Discard => vec![],
            Action::Vacation(v) => vec![v.reason.as_str(), &v.handle],
        };
        for s in strings {
            assert!(s.len() <= longest, "a {}-byte string", s.len());
        }
        if let Action::Redirect { address, .. } = x {
            assert!(!address.contains(['\r', '\n', ',', ' ']), "{address:?}");
        }
    }
    if let Some(m) = &outcome.edited_message {
        assert!(m.len() <= MESSAGE.len().max(1 << 20) + limits.max_header_edits * (4 * longest + 100));
    }
}

pub fn sieve(data: &[u8]) {
    let tiny = Limits {
        max_script_bytes: 64 * 1024,
        max_nesting: 6,
        max_instructions: 300,
        max_actions: 3,
        max_redirects: 1,
        max_variable_bytes: 16,
        max_variables: 4,
        max_include_depth: 2,
        max_header_edits: 2,
    };
    let own = ["roadrunner@acme.example.com".to_string()];
    let now = chrono::DateTime::parse_from_rfc3339("2026-12-07T18:30:05+01:00").expect("a fixed time");
    let ctx = Context {
        envelope: Envelope {
            from: "coyote@desert.example.org",
            to: "roadrunner+beep@acme.example.com",
            auth: None,
        },
        now,
        spam: Some(5),
        spam_percent: Some(50),
        virus: Some(1),
        user_addresses: &own,
    };
    for limits in [Limits::default(), tiny] {
        let Ok(script) = Script::compile(data, &limits) else { continue };
        let again = Script::compile(data, &limits).expect("compiles the same way twice");
        assert_eq!(script.includes(), again.includes());
        let script = Arc::new(script);
        for message in [MESSAGE, data] {
            let mut host = SelfHost(Some(script.clone()), 0);
            if let Ok(outcome) = run(&script, message, &ctx, &mut host, &limits) {
                check(&outcome, &limits);
            }
            // Each include of a script deeper than the limit is refused
            // before the host is asked again.
            assert!(host.1 <= limits.max_instructions as usize);
        }
    }
}
