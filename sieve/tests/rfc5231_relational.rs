//! RFC 5231, relational tests: `:count` and `:value` with the six relations.

mod common;

use common::*;

const REQ: &str = ", \"relational\", \"comparator-i;ascii-numeric\"";

#[test]
fn section_5_value_against_a_priority_header() {
    let m = message(&["X-Priority: 2", "Subject: b"], "");
    let t = |rel: &str, key: &str| {
        holds(
            REQ,
            &format!("header :value \"{rel}\" :comparator \"i;ascii-numeric\" \"x-priority\" \"{key}\""),
            &m,
        )
    };
    assert!(t("lt", "3") && !t("lt", "2") && !t("lt", "1"));
    assert!(t("le", "2") && !t("le", "1"));
    assert!(t("gt", "1") && !t("gt", "2"));
    assert!(t("ge", "2") && !t("ge", "3"));
    assert!(t("eq", "2") && t("eq", "02") && !t("eq", "3"));
    assert!(t("ne", "3") && !t("ne", "2"));
}

#[test]
fn section_5_count_addresses_across_fields() {
    let m = message(&["To: a@example.com, b@example.com", "Cc: c@example.com"], "");
    let count = |rel: &str, n: &str| {
        holds(
            REQ,
            &format!("address :count \"{rel}\" :comparator \"i;ascii-numeric\" [\"to\", \"cc\"] \"{n}\""),
            &m,
        )
    };
    assert!(count("eq", "3"));
    assert!(count("ge", "3") && !count("gt", "3"));
    assert!(count("lt", "4") && !count("lt", "3"));
    assert!(!count("ne", "3"));
    // Fields count for header tests; a missing field counts zero.
    assert!(holds(REQ, "header :count \"eq\" :comparator \"i;ascii-numeric\" \"x-none\" \"0\"", &m));
    assert!(holds(REQ, "header :count \"eq\" :comparator \"i;ascii-numeric\" [\"to\", \"cc\"] \"2\"", &m));
}

#[test]
fn section_4_value_with_the_default_comparator_is_lexical() {
    let m = message(&["Subject: banana"], "");
    assert!(holds(REQ, "header :value \"gt\" \"subject\" \"apple\"", &m));
    assert!(holds(REQ, "header :value \"lt\" \"subject\" \"CHERRY\"", &m));
    // "10" sorts before "9" as text, after it as a number.
    let m = message(&["X-N: 10"], "");
    assert!(holds(REQ, "header :value \"lt\" \"x-n\" \"9\"", &m));
    assert!(holds(REQ, "header :value \"gt\" :comparator \"i;ascii-numeric\" \"x-n\" \"9\"", &m));
}

#[test]
fn relations_are_checked_and_need_the_require() {
    let e = compile_error("require \"relational\"; if header :value \"bigger\" \"x\" \"1\" { keep; }");
    assert!(e.message.contains("relation"), "{e}");
    let e = compile_error("if header :count \"eq\" \"x\" \"1\" { keep; }");
    assert!(e.message.contains("relational"), "{e}");
}
