//! RFC 5228, the base language: the cases follow the RFC's sections and
//! examples.

mod common;

use common::*;
use mailcluster_sieve::{Action, EXTENSIONS, Limits, Script};

/// §9 (the example filter), run against mail it sorts four ways.
const EXAMPLE: &str = r#"
# Example Sieve Filter
require ["fileinto"];
if header :is "Sender" "owner-ietf-mta-filters@imc.org"
        {
        fileinto "filter";  # move to "filter" mailbox
        }
elsif address :DOMAIN :is ["From", "To"] "example.com"
        {
        keep;               # keep in "In" mailbox
        }
elsif anyof (NOT address :all :contains
               ["To", "Cc", "Bcc"] "me@example.com",
             header :matches "subject"
               ["*make*money*fast*", "*university*dipl*mas*"])
        {
        fileinto "spam";   # move to "spam" mailbox
        }
else
        {
        fileinto "personal";
        }
"#;

#[test]
fn section_9_example_sorts_each_kind_of_mail() {
    let list = message(&["Sender: owner-ietf-mta-filters@imc.org", "To: me@example.net"], "");
    assert_eq!(actions(EXAMPLE, &list), vec![fileinto("filter")]);
    let company = message(&["From: boss@example.com", "To: me@example.net"], "");
    assert_eq!(actions(EXAMPLE, &company), vec![keep()]);
    let not_to_me = message(&["From: x@example.net", "To: other@example.net"], "");
    assert_eq!(actions(EXAMPLE, &not_to_me), vec![fileinto("spam")]);
    let spam = message(
        &["From: x@example.net", "To: l@example.net", "Cc: me@example.com", "Subject: Make MONEY very fast"],
        "",
    );
    assert_eq!(actions(EXAMPLE, &spam), vec![fileinto("spam")]);
    let personal = message(&["From: x@example.net", "Cc: me@example.com", "Subject: lunch"], "");
    assert_eq!(actions(EXAMPLE, &personal), vec![fileinto("personal")]);
}

#[test]
fn section_2_10_2_implicit_keep_when_nothing_is_done() {
    assert_eq!(actions("", &simple_message()), vec![keep()]);
    assert_eq!(actions("# only a comment\n/* and a\nbracketed one */", &simple_message()), vec![keep()]);
}

#[test]
fn section_4_1_fileinto_cancels_the_implicit_keep_and_keep_restores_it() {
    let s = "require \"fileinto\"; fileinto \"a\"; keep;";
    assert_eq!(actions(s, &simple_message()), vec![fileinto("a"), keep()]);
}

#[test]
fn section_2_10_3_duplicate_actions_are_done_once() {
    let s = "require \"fileinto\"; fileinto \"a\"; fileinto \"a\"; keep; keep; redirect \"x@example.com\"; redirect \"X@example.com\";";
    assert_eq!(
        actions(s, &simple_message()),
        vec![fileinto("a"), keep(), Action::Redirect { address: "x@example.com".into(), copy: false }]
    );
}

#[test]
fn section_4_2_redirect_and_its_invalid_address() {
    assert_eq!(
        actions("redirect \"bart@example.com\";", &simple_message()),
        vec![Action::Redirect { address: "bart@example.com".into(), copy: false }]
    );
    let e = compile_error("\n\nredirect \"not an address\";");
    assert_eq!(e.line, 3);
}

#[test]
fn section_4_4_discard_drops_the_implicit_keep() {
    assert_eq!(actions("discard;", &simple_message()), vec![Action::Discard]);
    // Discard next to a delivery says nothing more than the delivery.
    assert_eq!(actions("discard; keep;", &simple_message()), vec![keep()]);
}

#[test]
fn section_3_3_stop_ends_the_script() {
    let s = "require \"fileinto\"; if true { fileinto \"a\"; stop; } fileinto \"b\";";
    assert_eq!(actions(s, &simple_message()), vec![fileinto("a")]);
}

#[test]
fn section_3_1_if_elsif_else_takes_the_first_true_branch() {
    let s = r#"require "fileinto";
        if false { fileinto "1"; } elsif true { fileinto "2"; } elsif true { fileinto "3"; } else { fileinto "4"; }"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("2")]);
    let s = r#"require "fileinto"; if false { fileinto "1"; } else { fileinto "4"; }"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("4")]);
}

#[test]
fn section_5_tests_on_the_rfc_message() {
    let m = simple_message();
    assert!(holds("", "header :contains \"from\" \"coyote\"", &m));
    assert!(holds("", "header :is \"Subject\" \"I have a present for you\"", &m));
    assert!(!holds("", "header :is \"Subject\" \"I have a present\"", &m));
    assert!(holds("", "header :matches \"subject\" \"*present*\"", &m));
    assert!(holds("", "address :is :all \"from\" \"coyote@desert.example.org\"", &m));
    assert!(holds("", "address :is :localpart \"from\" \"coyote\"", &m));
    assert!(holds("", "address :is :domain \"to\" \"ACME.example.com\"", &m));
    assert!(holds("", "exists [\"From\", \"Date\"]", &m));
    assert!(!holds("", "exists [\"From\", \"X-Nothing\"]", &m));
    assert!(holds("", "not exists \"X-Nothing\"", &m));
    assert!(holds("", "size :under 1K", &m));
    assert!(!holds("", "size :over 1K", &m));
    assert!(holds("", "allof (true, not false)", &m));
    assert!(!holds("", "allof (true, false)", &m));
    assert!(holds("", "anyof (false, true)", &m));
    assert!(!holds("", "anyof (false, false)", &m));
}

#[test]
fn section_5_7_empty_key_matches_only_an_existing_header() {
    let m = message(&["X-Caffeine: "], "");
    assert!(holds("", "header :is \"X-Caffeine\" \"\"", &m));
    assert!(holds("", "header :contains \"X-Caffeine\" \"\"", &m));
    assert!(!holds("", "header :contains \"X-Decaf\" \"\"", &m));
}

#[test]
fn section_5_9_size_is_strict_and_counts_with_k_m_g() {
    let m = message(&["Subject: x"], &"a".repeat(2000));
    let size = m.len();
    assert!(holds("", &format!("size :over {}", size - 1), &m));
    assert!(!holds("", &format!("size :over {size}"), &m));
    assert!(!holds("", &format!("size :under {size}"), &m));
    assert!(holds("", "size :under 1M", &m));
    assert!(holds("", "size :under 1G", &m));
    assert!(!holds("", "size :under 1k", &m));
}

#[test]
fn section_5_4_envelope_with_address_parts_and_the_null_path() {
    let m = simple_message();
    let s = |test: &str| format!("require [\"envelope\", \"fileinto\"]; if {test} {{ fileinto \"yes\"; }}");
    let run = |test: &str, from: &str| {
        run_with(&s(test), &m, &context(from, TO, &[]), &mut TestHost::default()).unwrap().actions
            == vec![fileinto("yes")]
    };
    assert!(run("envelope :all :is \"from\" \"tim@example.com\"", "tim@example.com"));
    assert!(run("envelope :domain :is \"from\" \"example.com\"", "tim@example.com"));
    assert!(run("envelope :localpart :is \"to\" \"ken+sieve\"", FROM));
    assert!(run("envelope :is \"from\" \"\"", ""));
    assert!(run("envelope :domain :is \"from\" \"\"", ""));
    assert!(!run("envelope :is \"from\" \"\"", "tim@example.com"));
    // Without require "envelope" the test does not exist.
    let e = compile_error("if envelope :is \"from\" \"x\" { keep; }");
    assert!(e.message.contains("envelope"), "{e}");
}

#[test]
fn section_2_7_1_match_types() {
    let m = message(&["Subject: Hello World?"], "");
    assert!(holds("", "header :contains \"subject\" \"lo wo\"", &m));
    assert!(holds("", "header :matches \"subject\" \"hello*\"", &m));
    assert!(holds("", "header :matches \"subject\" \"h?llo world\\\\?\"", &m));
    assert!(!holds("", "header :matches \"subject\" \"hello world\\\\*\"", &m));
    assert!(holds("", "header :matches \"subject\" \"*\"", &m));
    assert!(holds("", "header :matches \"subject\" \"*o*o*\"", &m));
    assert!(!holds("", "header :matches \"subject\" \"*o*o*o*\"", &m));
    assert!(holds("", "header :matches \"subject\" \"???????????*\"", &m));
    assert!(!holds("", "header :matches \"subject\" \"?????????????\"", &m));
}

#[test]
fn question_mark_matches_one_character_not_one_byte() {
    let m = message(&["Subject: =?utf-8?q?caf=C3=A9?="], "");
    assert!(holds("", "header :matches \"subject\" \"caf?\"", &m));
    assert!(holds("", "header :matches \"subject\" \"*?\"", &m));
    assert!(!holds("", "header :matches \"subject\" \"caf??\"", &m));
}

#[test]
fn section_2_7_3_comparators() {
    let m = message(&["Subject: MAKE MONEY FAST", "X-Count: 0042"], "");
    assert!(holds("", "header :contains :comparator \"i;octet\" \"Subject\" \"MAKE MONEY\"", &m));
    assert!(!holds("", "header :contains :comparator \"i;octet\" \"Subject\" \"make money\"", &m));
    assert!(holds("", "header :contains \"Subject\" \"make money\"", &m));
    assert!(holds("", "header :is :comparator \"i;ascii-casemap\" \"Subject\" \"make money fast\"", &m));
    let numeric = ", \"comparator-i;ascii-numeric\"";
    assert!(holds(numeric, "header :is :comparator \"i;ascii-numeric\" \"X-Count\" \"42\"", &m));
    assert!(!holds(numeric, "header :is :comparator \"i;ascii-numeric\" \"X-Count\" \"420\"", &m));
    // Strings that do not start with a digit are all equal (positive infinity).
    assert!(holds(numeric, "header :is :comparator \"i;ascii-numeric\" \"Subject\" \"none\"", &m));
    let e = compile_error("if header :is :comparator \"i;ascii-numeric\" \"x\" \"1\" { keep; }");
    assert!(e.message.contains("comparator-i;ascii-numeric"), "{e}");
    let e = compile_error(
        "require \"comparator-i;ascii-numeric\"; if header :contains :comparator \"i;ascii-numeric\" \"x\" \"1\" { keep; }",
    );
    assert!(e.message.contains("i;ascii-numeric"), "{e}");
    compile_error("if header :is :comparator \"i;nonsense\" \"x\" \"1\" { keep; }");
}

#[test]
fn section_2_4_2_strings_escapes_and_multi_line_dot_stuffing() {
    let s = "require \"reject\";\nreject text:\n..first line\nsecond \"line\" \\ here\n.\n;";
    assert_eq!(
        actions(s, &simple_message()),
        vec![Action::Reject { reason: ".first line\nsecond \"line\" \\ here\n".into(), extended: false }]
    );
    let s = "require \"reject\"; reject text: # comment after text:\r\nline\r\n.\r\n;";
    assert_eq!(
        actions(s, &simple_message()),
        vec![Action::Reject { reason: "line\r\n".into(), extended: false }]
    );
    // An undefined escape keeps the character, the backslash goes.
    let s = "require \"reject\"; reject \"a\\bc\\\"d\\\\\";";
    assert_eq!(
        actions(s, &simple_message()),
        vec![Action::Reject { reason: "abc\"d\\".into(), extended: false }]
    );
}

#[test]
fn section_2_4_2_4_encoded_characters() {
    let s = r#"require ["encoded-character", "reject"]; reject "${hex: 40 41}${unicode:263a} ${unknown:1} ${hex:zz} ${hex:}";"#;
    assert_eq!(
        actions(s, &simple_message()),
        vec![Action::Reject { reason: "@A\u{263a} ${unknown:1} ${hex:zz} ${hex:}".into(), extended: false }]
    );
    // Without the require, the text stays as written.
    let s = r#"require "reject"; reject "${hex:40}";"#;
    assert_eq!(
        actions(s, &simple_message()),
        vec![Action::Reject { reason: "${hex:40}".into(), extended: false }]
    );
    // A value outside Unicode, or bytes that are not UTF-8, are errors.
    compile_error(r#"require ["encoded-character", "reject"]; reject "${unicode:d800}";"#);
    compile_error(r#"require ["encoded-character", "reject"]; reject "${hex:ff}";"#);
}

#[test]
fn header_values_are_decoded_from_rfc_2047_before_matching() {
    let m = message(
        &["Subject: =?ISO-8859-1?Q?Caf=E9_au_lait?=", "From: =?utf-8?b?SsO8cmdlbg==?= <j@example.org>"],
        "",
    );
    assert!(holds("", "header :is \"subject\" \"Café au lait\"", &m));
    assert!(holds("", "header :contains \"from\" \"Jürgen\"", &m));
    assert!(holds("", "address :is \"from\" \"j@example.org\"", &m));
}

#[test]
fn folded_headers_are_unfolded() {
    let m = message(&["Subject: a long", "\tsubject line"], "");
    assert!(holds("", "header :is \"subject\" \"a long subject line\"", &m));
}

#[test]
fn section_5_1_address_lists_and_groups() {
    let m = message(&["To: A <a@example.com>, \"B, the second\" <b@example.net>, team: c@example.org;"], "");
    assert!(holds("", "address :is :domain \"to\" \"example.net\"", &m));
    assert!(holds("", "address :is :localpart \"to\" \"c\"", &m));
    assert!(!holds("", "address :contains \"to\" \"second\"", &m));
}

#[test]
fn section_2_10_5_compile_errors_name_the_line() {
    let cases = [
        ("keep;\nfrobnicate;", 2, "unknown command"),
        ("if frobnicate { keep; }", 1, "unknown test"),
        ("require \"x-unknown\";", 1, "unsupported extension"),
        ("\n\nfileinto \"x\";", 3, "fileinto"),
        ("keep;\nrequire \"fileinto\";", 2, "require"),
        ("if true keep;", 1, "test"),
        ("keep", 1, "end"),
        ("if header :is \"subject\" { keep; }", 1, "key list"),
        ("if header :frob \"subject\" \"x\" { keep; }", 1, "frob"),
        ("if header :is :contains \"subject\" \"x\" { keep; }", 1, "match type"),
        ("stop \"now\";", 1, "too many arguments"),
        ("if true { keep; }\nelse { keep; }\nelse { keep; }", 3, "else without if"),
        ("if not (true, false) { keep; }", 1, "not"),
        ("if allof true { keep; }", 1, "parentheses"),
        ("redirect \"a@b\"", 1, "end"),
        ("keep; \"str\";", 1, "command"),
        ("if header :is \"bad name\" \"x\" { keep; }", 1, "header name"),
        ("if size 10 { keep; }", 1, ":over"),
        ("keep; /* never closed", 1, "comment"),
        ("reject \"x\";", 1, "reject"),
        ("if true { keep; ", 1, "block"),
        ("discard :copy;", 1, "copy"),
        ("x = 1;", 1, "unexpected"),
        ("require \"reject\"; reject 99999999999999999999999;", 1, "large"),
    ];
    for (source, line, word) in cases {
        let e = compile_error(source);
        assert_eq!(e.line, line, "{source:?}: {e}");
        assert!(e.message.contains(word), "{source:?}: {e}");
        assert!(e.to_string().starts_with(&format!("line {line}: ")));
    }
}

#[test]
fn non_utf8_script_is_a_compile_error_at_its_line() {
    let e = Script::compile(b"keep;\n# \xff\n", &Limits::default()).unwrap_err();
    assert_eq!(e.line, 2);
}

#[test]
fn every_listed_extension_can_be_required() {
    let all = EXTENSIONS.iter().map(|e| format!("\"{e}\"")).collect::<Vec<_>>().join(", ");
    compile(&format!("require [{all}];"));
    compile("require [\"comparator-i;octet\", \"comparator-i;ascii-casemap\"];");
}

#[test]
fn script_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<Script>();
}

#[test]
fn section_2_10_3_keep_and_fileinto_inbox_deliver_once_with_both_flags() {
    let s = r#"require ["fileinto", "imap4flags"]; fileinto :flags "a" "INBOX"; keep :flags "b";"#;
    assert_eq!(actions(s, &simple_message()), vec![Action::Keep { flags: vec!["b".into(), "a".into()] }]);
    let s = r#"require "fileinto"; fileinto "inbox";"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("inbox")]);
}

#[test]
fn comparator_names_are_case_insensitive() {
    let m = message(&["Subject: ABC"], "");
    assert!(!holds("", "header :is :comparator \"I;OCTET\" \"subject\" \"abc\"", &m));
}
