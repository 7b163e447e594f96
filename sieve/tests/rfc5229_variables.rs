//! RFC 5229, variables: `set` and its modifiers, `${name}`, match variables
//! and the `string` test.

mod common;

use common::*;
use mailcluster_sieve::Action;

fn reason(source: &str, msg: &[u8]) -> String {
    match actions(source, msg).as_slice() {
        [Action::Reject { reason, .. }] => reason.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn section_3_names_are_case_insensitive_and_expand_in_multi_line_strings() {
    let s = "require [\"variables\", \"reject\"];\n\
        set \"honorific\"  \"Mr\";\nset \"first_name\" \"Wile\";\nset \"last_name\"  \"Coyote\";\n\
        set \"vacation\" text:\nDear ${HONORIFIC} ${last_name},\nI'm out, please leave a message after the meep.\n.\n;\n\
        reject \"${vacation}\";";
    assert_eq!(
        reason(s, &simple_message()),
        "Dear Mr Coyote,\nI'm out, please leave a message after the meep.\n"
    );
}

#[test]
fn section_3_unknown_variables_are_empty_and_non_references_stay() {
    let s = r#"require ["variables", "reject"]; reject "[${nothing}] ${ x} ${1a} $${b} ${unterminated";"#;
    assert_eq!(reason(s, &simple_message()), "[] ${ x} ${1a} $ ${unterminated");
    // Without the require, a reference is plain text.
    let s = r#"require "reject"; reject "${a}";"#;
    assert_eq!(reason(s, &simple_message()), "${a}");
}

#[test]
fn section_3_2_match_variables_from_the_list_id_example() {
    let s = r#"require ["fileinto", "variables"];
        if header :matches "List-ID" "*<*@*" { fileinto "INBOX.lists.${2}"; stop; }"#;
    let m = message(&["List-ID: Coyote fans <coyote-list@example.com>"], "");
    assert_eq!(actions(s, &m), vec![fileinto("INBOX.lists.coyote-list")]);
}

#[test]
fn section_3_2_wildcards_match_as_little_as_possible_and_question_marks_count() {
    let s = r#"require ["variables", "reject"];
        if header :matches "Subject" "*.*?x*" { reject "${0}|${1}|${2}|${3}|${4}|${5}"; }"#;
    let m = message(&["Subject: a.b.cx.dx"], "");
    assert_eq!(reason(s, &m), "a.b.cx.dx|a|b.|c|.dx|");
}

#[test]
fn section_3_2_a_failed_match_keeps_the_old_match_variables() {
    let s = r#"require ["variables", "reject"];
        if header :matches "Subject" "I have *" { }
        if header :matches "Subject" "nothing *" { }
        reject "${1}";"#;
    assert_eq!(reason(s, &simple_message()), "a present for you");
}

#[test]
fn match_variables_come_from_the_original_case() {
    let s = r#"require ["variables", "reject"]; if header :matches "Subject" "i HAVE *" { reject "${1}"; }"#;
    assert_eq!(reason(s, &simple_message()), "a present for you");
}

#[test]
fn section_4_1_modifiers_and_their_precedence() {
    let cases = [
        ("", "juMBlEd lETteRS"),
        (":length", "15"),
        (":lower", "jumbled letters"),
        (":upperfirst", "JuMBlEd lETteRS"),
        (":upperfirst :lower", "Jumbled letters"),
        (":lower :upperfirst", "Jumbled letters"),
        (":lowerfirst :upper", "jUMBLED LETTERS"),
        (":length :upper", "15"),
    ];
    for (mods, want) in cases {
        let s = format!(
            "require [\"variables\", \"reject\"]; set \"a\" \"juMBlEd lETteRS\"; set {mods} \"b\" \"${{a}}\"; reject \"${{b}}\";"
        );
        assert_eq!(reason(&s, &simple_message()), want, "{mods}");
    }
    let s = r#"require ["variables", "reject"]; set :quotewildcard "b" "Rock*?\\"; reject "${b}";"#;
    assert_eq!(reason(s, &simple_message()), "Rock\\*\\?\\\\");
    let e = compile_error(r#"require "variables"; set :lower :upper "b" "x";"#);
    assert!(e.message.contains("conflicting"), "{e}");
}

#[test]
fn quotewildcard_makes_a_value_match_itself_literally() {
    let s = r#"require ["variables", "fileinto"];
        set :quotewildcard "q" "a*b?";
        if string :matches "a*b?" "${q}" { fileinto "yes"; }
        if string :matches "axxbz" "${q}" { fileinto "no"; }"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("yes")]);
}

#[test]
fn section_5_string_test_and_counting_non_empty_strings() {
    let s = r#"require ["variables", "fileinto", "relational", "comparator-i;ascii-numeric"];
        set "state" "pending";
        if string :is "${state}" "pending" { fileinto "a"; }
        if string :count "eq" :comparator "i;ascii-numeric" ["${state}", "", "${none}", "x"] "2" { fileinto "b"; }
        if string :contains ["x", "${state}"] "ZZZ" { fileinto "c"; }"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("a"), fileinto("b")]);
}

#[test]
fn section_3_variable_names_are_checked_when_compiling() {
    for bad in ["1a", "a-b", "", "a b"] {
        compile_error(&format!("require \"variables\"; set \"{bad}\" \"x\";"));
    }
    let e = compile_error("set \"a\" \"x\";");
    assert!(e.message.contains("variables"), "{e}");
    let e = compile_error("require \"variables\"; if string \"a\" { keep; }");
    assert!(e.message.contains("key list"), "{e}");
}

#[test]
fn variables_feed_actions() {
    let s = r#"require ["variables", "fileinto"];
        if address :matches :localpart "from" "*" { set "who" "${1}"; }
        fileinto "people/${who}";"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("people/coyote")]);
    let s = r#"require ["variables"]; set "to" "not an address"; redirect "${to}";"#;
    assert!(matches!(try_run(s, &simple_message()), Err(mailcluster_sieve::RuntimeError::InvalidAddress(_))));
}
