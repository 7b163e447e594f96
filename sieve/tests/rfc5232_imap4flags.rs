//! RFC 5232, imap4flags: the internal flag variable, named flag variables,
//! `:flags` on keep and fileinto, and `hasflag`.

mod common;

use common::*;
use mailcluster_sieve::Action;

#[test]
fn section_3_flag_commands_change_the_internal_variable_which_the_implicit_keep_uses() {
    let s = r#"require "imap4flags";
        setflag "\\Seen";
        addflag ["\\Flagged", "$Work \\seen"];
        removeflag "\\flagged";"#;
    assert_eq!(
        actions(s, &simple_message()),
        vec![Action::Keep { flags: vec!["\\Seen".into(), "$Work".into()] }]
    );
}

#[test]
fn section_5_flags_argument_overrides_the_internal_variable() {
    let s = r#"require ["imap4flags", "fileinto"];
        setflag "\\Seen";
        fileinto :flags "\\Deleted" "Trash";
        fileinto "Archive";
        keep :flags ["a", "A", "b"];"#;
    assert_eq!(
        actions(s, &simple_message()),
        vec![
            Action::FileInto { mailbox: "Trash".into(), flags: vec!["\\Deleted".into()], create: false },
            Action::FileInto { mailbox: "Archive".into(), flags: vec!["\\Seen".into()], create: false },
            Action::Keep { flags: vec!["a".into(), "b".into()] },
        ]
    );
}

#[test]
fn section_4_hasflag_with_the_internal_and_named_variables() {
    let s = r#"require ["imap4flags", "variables", "fileinto", "relational", "comparator-i;ascii-numeric"];
        addflag "\\Seen \\Answered";
        addflag "mine" ["$Label1", "$Label2"];
        if hasflag :is "\\seen" { fileinto "1"; }
        if hasflag :is "\\Deleted" { fileinto "no"; }
        if hasflag :contains "mine" "label" { fileinto "2"; }
        if hasflag :count "eq" :comparator "i;ascii-numeric" "2" { fileinto "3"; }
        if hasflag "mine" "$label1 $other" { fileinto "4"; }
        if string :is "${mine}" "$Label1 $Label2" { fileinto "5"; }"#;
    let want = ["1", "2", "3", "4", "5"].map(|b| Action::FileInto {
        mailbox: b.into(),
        flags: vec!["\\Seen".into(), "\\Answered".into()],
        create: false,
    });
    assert_eq!(actions(s, &simple_message()), want.to_vec());
}

#[test]
fn flags_need_the_require() {
    compile_error("setflag \"\\\\Seen\";");
    compile_error("keep :flags \"x\";");
    compile_error("require \"imap4flags\"; setflag \"var\" \"x\";");
}
