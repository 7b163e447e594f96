//! RFC 5490, mailbox: `fileinto :create` and `mailboxexists` (through the
//! host).

mod common;

use common::*;
use mailcluster_sieve::Action;

#[test]
fn section_3_1_fileinto_create() {
    assert_eq!(
        actions("require [\"fileinto\", \"mailbox\"]; fileinto :create \"New\";", &simple_message()),
        vec![Action::FileInto { mailbox: "New".into(), flags: vec![], create: true }]
    );
    compile_error("require \"fileinto\"; fileinto :create \"New\";");
}

#[test]
fn section_3_2_mailboxexists_is_true_when_all_exist() {
    let s = r#"require ["fileinto", "mailbox"];
        if mailboxexists ["Lists", "Work"] { fileinto "both"; }
        if mailboxexists "Lists" { fileinto "Lists"; }"#;
    let mut host = TestHost::default();
    host.mailboxes.insert("Lists".into());
    let out = run_with(s, &simple_message(), &context(FROM, TO, &[]), &mut host).unwrap();
    assert_eq!(out.actions, vec![fileinto("Lists")]);
    host.mailboxes.insert("Work".into());
    let out = run_with(s, &simple_message(), &context(FROM, TO, &[]), &mut host).unwrap();
    assert_eq!(out.actions, vec![fileinto("both"), fileinto("Lists")]);
}
