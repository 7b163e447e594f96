//! RFC 5230 (vacation) and RFC 6131 (vacation-seconds): what the script asks
//! for; whether to answer is the caller's decision.

mod common;

use common::*;
use mailcluster_sieve::{Action, RuntimeError, Vacation};

fn vacation(source: &str, own: &[String]) -> (Vacation, Vec<Action>) {
    let out = run_with(source, &simple_message(), &context(FROM, TO, own), &mut TestHost::default()).unwrap();
    let v = out.actions.iter().find_map(|a| if let Action::Vacation(v) = a { Some(v.clone()) } else { None });
    (v.expect("a vacation action"), out.actions)
}

#[test]
fn section_4_example_with_days_and_addresses_keeps_the_message_too() {
    let own = vec!["ken@example.com".to_string()];
    let (v, all) = vacation(
        r#"require "vacation";
        vacation :days 23 :addresses ["tjs@example.edu", "ts4z@landru.example.edu"] "I'm away until October 19.";"#,
        &own,
    );
    assert_eq!(v.reason, "I'm away until October 19.");
    assert_eq!(v.period_secs, 23 * 86_400);
    assert_eq!(v.addresses, vec!["tjs@example.edu", "ts4z@landru.example.edu", "ken@example.com"]);
    assert_eq!((v.subject, v.from, v.mime), (None, None, false));
    // §4.7: vacation does not cancel the implicit keep.
    assert!(all.contains(&keep()));
}

#[test]
fn section_4_subject_from_mime_and_handle() {
    let (v, _) = vacation(
        r#"require "vacation";
        vacation :subject "Gone fishin'" :from "ken@example.com" :mime :handle "fish" text:
Content-Type: text/plain

Gone.
.
;"#,
        &[],
    );
    assert_eq!(v.subject.as_deref(), Some("Gone fishin'"));
    assert_eq!(v.from.as_deref(), Some("ken@example.com"));
    assert!(v.mime);
    assert_eq!(v.handle, "fish");
    assert_eq!(v.period_secs, 7 * 86_400);
}

#[test]
fn section_4_2_default_handle_follows_the_content() {
    let handle = |reason: &str, subject: &str| {
        vacation(&format!("require \"vacation\"; vacation :subject \"{subject}\" \"{reason}\";"), &[])
            .0
            .handle
    };
    assert_eq!(handle("away", "s"), handle("away", "s"));
    assert_ne!(handle("away", "s"), handle("back soon", "s"));
    assert_ne!(handle("away", "s"), handle("away", "t"));
    assert!(!handle("away", "s").is_empty());
}

#[test]
fn section_4_1_days_are_clamped_and_rfc_6131_seconds() {
    let period = |args: &str| {
        vacation(&format!("require [\"vacation\", \"vacation-seconds\"]; vacation {args} \"away\";"), &[])
            .0
            .period_secs
    };
    assert_eq!(period(":days 0"), 86_400);
    assert_eq!(period(":days 1000"), 90 * 86_400);
    assert_eq!(period(":seconds 0"), 1);
    assert_eq!(period(":seconds 300"), 300);
    let e = compile_error("require \"vacation\"; vacation :seconds 5 \"x\";");
    assert!(e.message.contains("vacation-seconds"), "{e}");
    compile_error("require [\"vacation\", \"vacation-seconds\"]; vacation :days 1 :seconds 5 \"x\";");
}

#[test]
fn more_than_one_vacation_is_an_error() {
    let r = try_run("require \"vacation\"; vacation \"a\"; vacation \"b\";", &simple_message());
    assert!(matches!(r, Err(RuntimeError::Conflict(_))), "{r:?}");
}

#[test]
fn vacation_needs_its_require() {
    let e = compile_error("vacation \"away\";");
    assert!(e.message.contains("vacation"), "{e}");
}
