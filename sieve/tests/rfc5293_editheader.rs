//! RFC 5293, editheader: `addheader` and `deleteheader`, seen by later tests,
//! and never on the trace or the auto-reply guard.

mod common;

use common::*;

fn edited(source: &str, msg: &[u8]) -> String {
    let out = try_run(source, msg).unwrap();
    String::from_utf8(out.edited_message.expect("an edited message")).unwrap()
}

#[test]
fn section_4_addheader_at_the_top_or_with_last_at_the_bottom() {
    let m = message(&["Subject: hi", "X-Old: 1"], "body\r\n");
    let s = r#"require "editheader"; addheader "X-Top" "top"; addheader :last "X-Bottom" "bottom";"#;
    assert_eq!(edited(s, &m), "X-Top: top\r\nSubject: hi\r\nX-Old: 1\r\nX-Bottom: bottom\r\n\r\nbody\r\n");
}

#[test]
fn section_4_non_ascii_values_are_encoded_and_line_breaks_removed() {
    let m = message(&["Subject: hi"], "");
    let out = edited("require \"editheader\"; addheader \"X-Note\" \"café\r\nBcc: x@example.com\";", &m);
    assert!(out.starts_with("X-Note: =?utf-8?b?"), "{out}");
    assert!(!out.contains("\r\nBcc:"), "{out}");
    // And later tests read it decoded.
    let s = r#"require ["editheader", "fileinto"]; addheader "X-Note" "café"; if header :is "x-note" "café" { fileinto "yes"; }"#;
    assert_eq!(actions(s, &m), vec![fileinto("yes")]);
}

#[test]
fn section_5_deleteheader_by_name_index_and_value() {
    let m = message(&["X-A: one", "Subject: s", "X-A: two", "X-A: three"], "b");
    assert_eq!(edited("require \"editheader\"; deleteheader \"x-a\";", &m), "Subject: s\r\n\r\nb");
    assert_eq!(
        edited("require \"editheader\"; deleteheader :index 2 \"X-A\";", &m),
        "X-A: one\r\nSubject: s\r\nX-A: three\r\n\r\nb"
    );
    assert_eq!(
        edited("require \"editheader\"; deleteheader :index 1 :last \"X-A\";", &m),
        "X-A: one\r\nSubject: s\r\nX-A: two\r\n\r\nb"
    );
    assert_eq!(
        edited("require \"editheader\"; deleteheader :matches \"X-A\" \"t*\";", &m),
        "X-A: one\r\nSubject: s\r\n\r\nb"
    );
    let s = r#"require ["editheader", "fileinto"]; deleteheader "subject"; if not exists "subject" { fileinto "gone"; }"#;
    assert_eq!(actions(s, &m), vec![fileinto("gone")]);
    // Nothing deleted, nothing edited.
    assert_eq!(try_run("require \"editheader\"; deleteheader \"x-none\";", &m).unwrap().edited_message, None);
}

#[test]
fn section_6_received_and_auto_submitted_are_never_edited() {
    let m = message(
        &["Received: from a by b; Tue, 1 Apr 1997 09:07:00 -0800", "Auto-Submitted: auto-replied"],
        "",
    );
    let s = r#"require "editheader";
        deleteheader "received"; deleteheader "Auto-Submitted";
        addheader "Received" "forged"; addheader "auto-submitted" "no";"#;
    assert_eq!(try_run(s, &m).unwrap().edited_message, None);
}

#[test]
fn invalid_names_are_errors() {
    compile_error("require \"editheader\"; addheader \"X Bad\" \"v\";");
    compile_error("require \"editheader\"; deleteheader \"a:b\";");
    compile_error("addheader \"X-A\" \"v\";");
    let r = try_run(
        "require [\"editheader\", \"variables\"]; set \"n\" \"bad name\"; addheader \"${n}\" \"v\";",
        &simple_message(),
    );
    assert!(matches!(r, Err(mailcluster_sieve::RuntimeError::InvalidHeader(_))), "{r:?}");
}
