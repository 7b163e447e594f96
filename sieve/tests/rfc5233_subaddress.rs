//! RFC 5233, subaddress: `:user` and `:detail` with "+" as the separator.

mod common;

use common::*;

fn env(test: &str, to: &str) -> bool {
    let s =
        format!("require [\"envelope\", \"subaddress\", \"fileinto\"]; if {test} {{ fileinto \"yes\"; }}");
    run_with(&s, &simple_message(), &context(FROM, to, &[]), &mut TestHost::default()).unwrap().actions
        == vec![fileinto("yes")]
}

#[test]
fn section_6_example_routes_on_user_and_detail() {
    let s = r#"require ["envelope", "subaddress", "fileinto"];
        if envelope :user "to" "postmaster" { fileinto "inbox.postmaster"; stop; }
        if envelope :detail :is "to" "mta-filters" { fileinto "inbox.ietf-mta-filters"; stop; }"#;
    let route =
        |to: &str| run_with(s, &simple_message(), &context(FROM, to, &[]), &mut TestHost::default()).unwrap();
    assert_eq!(route("postmaster+any@example.com").actions, vec![fileinto("inbox.postmaster")]);
    assert_eq!(route("ken+mta-filters@example.com").actions, vec![fileinto("inbox.ietf-mta-filters")]);
    assert_eq!(route("ken@example.com").actions, vec![keep()]);
}

#[test]
fn section_4_user_without_separator_is_the_local_part_and_there_is_no_detail() {
    assert!(env("envelope :user \"to\" \"ken\"", "ken@example.com"));
    assert!(!env("envelope :detail \"to\" \"\"", "ken@example.com"));
    assert!(!env("envelope :detail :matches \"to\" \"*\"", "ken@example.com"));
    assert!(env("envelope :detail \"to\" \"\"", "ken+@example.com"));
    assert!(env("envelope :user \"to\" \"ken\"", "ken+a+b@example.com"));
    assert!(env("envelope :detail \"to\" \"a+b\"", "ken+a+b@example.com"));
}

#[test]
fn subaddress_parts_in_the_address_test() {
    let m = message(&["To: Ken <ken+sieve@example.com>"], "");
    assert!(holds(", \"subaddress\"", "address :detail \"to\" \"sieve\"", &m));
    assert!(holds(", \"subaddress\"", "address :user \"to\" \"ken\"", &m));
    compile_error("if address :user \"to\" \"ken\" { keep; }");
}
