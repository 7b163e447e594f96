//! RFC 7352, duplicate: the tracking key and period handed to the host, which
//! remembers them.

mod common;

use common::*;

const S: &str = "require [\"duplicate\", \"fileinto\"]; if duplicate { fileinto \"dup\"; }";

#[test]
fn section_3_the_second_delivery_of_a_message_id_is_a_duplicate() {
    let mut host = TestHost::default();
    let ctx = context(FROM, TO, &[]);
    assert_eq!(run_with(S, &simple_message(), &ctx, &mut host).unwrap().actions, vec![keep()]);
    assert_eq!(run_with(S, &simple_message(), &ctx, &mut host).unwrap().actions, vec![fileinto("dup")]);
    let (key, period, last) = &host.duplicate_calls[0];
    assert!(key.contains("<1234@desert.example.org>"), "{key}");
    assert_eq!((*period, *last), (7 * 86_400, false));
}

#[test]
fn section_3_1_no_message_id_is_never_a_duplicate() {
    let mut host = TestHost::default();
    let m = message(&["Subject: no id"], "");
    let ctx = context(FROM, TO, &[]);
    run_with(S, &m, &ctx, &mut host).unwrap();
    assert_eq!(run_with(S, &m, &ctx, &mut host).unwrap().actions, vec![keep()]);
    assert!(host.duplicate_calls.is_empty());
}

#[test]
fn section_3_2_handle_header_uniqueid_seconds_and_last() {
    let s = r#"require ["duplicate", "variables"];
        if duplicate :handle "h1" :header "subject" :seconds 60 :last { }
        if duplicate :handle "h2" :uniqueid "${0}" { }
        if header :matches "from" "*" { }
        if duplicate :uniqueid "${0}" { }"#;
    let mut host = TestHost::default();
    run_with(s, &simple_message(), &context(FROM, TO, &[]), &mut host).unwrap();
    let calls = &host.duplicate_calls;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].0.starts_with("h1") && calls[0].0.ends_with("I have a present for you"), "{calls:?}");
    assert_eq!((calls[0].1, calls[0].2), (60, true));
    assert!(calls[1].0.ends_with("coyote@desert.example.org"), "{calls:?}");
    // Different handles keep separate records.
    let mut host = TestHost::default();
    let s = r#"require ["duplicate", "fileinto"];
        if duplicate :handle "a" { fileinto "a"; }
        if duplicate :handle "b" { fileinto "b"; }"#;
    assert_eq!(
        run_with(s, &simple_message(), &context(FROM, TO, &[]), &mut host).unwrap().actions,
        vec![keep()]
    );
    compile_error("require \"duplicate\"; if duplicate :header \"x\" :uniqueid \"y\" { keep; }");
}
