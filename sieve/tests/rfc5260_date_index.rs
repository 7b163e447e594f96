//! RFC 5260: `date` and `currentdate` with zones and every date part, and the
//! `index` extension's `:index`/`:last`.

mod common;

use common::*;

const REQ: &str = ", \"date\", \"relational\", \"index\"";

#[test]
fn section_4_2_every_date_part_in_the_original_zone() {
    // The RFC 5228 message: Date: Tue, 1 Apr 1997 09:06:31 -0800.
    let m = simple_message();
    let parts = [
        ("year", "1997"),
        ("month", "04"),
        ("day", "01"),
        ("date", "1997-04-01"),
        ("julian", "50539"),
        ("hour", "09"),
        ("minute", "06"),
        ("second", "31"),
        ("time", "09:06:31"),
        ("iso8601", "1997-04-01T09:06:31-08:00"),
        ("std11", "Tue, 01 Apr 1997 09:06:31 -0800"),
        ("zone", "-0800"),
        ("weekday", "2"),
    ];
    for (part, want) in parts {
        assert!(holds(REQ, &format!("date :originalzone :is \"date\" \"{part}\" \"{want}\""), &m), "{part}");
    }
}

#[test]
fn section_4_1_zone_conversion() {
    let m = simple_message();
    assert!(holds(REQ, "date :zone \"+0000\" :is \"date\" \"time\" \"17:06:31\"", &m));
    assert!(holds(REQ, "date :zone \"+0800\" :is \"date\" \"date\" \"1997-04-02\"", &m));
    // Without a zone, the date is in the zone of the delivery (+0100 here).
    assert!(holds(REQ, "date :is \"date\" \"hour\" \"18\"", &m));
    assert!(holds(REQ, "date :is \"date\" \"zone\" \"+0100\"", &m));
    compile_error("require \"date\"; if date :zone \"0100\" \"date\" \"hour\" \"1\" { keep; }");
    compile_error("require \"date\"; if date :is \"date\" \"fortnight\" \"1\" { keep; }");
}

#[test]
fn section_4_example_boss_mail_during_office_hours() {
    let s = r#"require ["date", "relational", "fileinto"];
        if allof(header :is "from" "boss@example.com",
                 date :value "ge" :originalzone "date" "hour" "09",
                 date :value "lt" :originalzone "date" "hour" "17")
        { fileinto "urgent"; }"#;
    let at = |date: &str| actions(s, &message(&["From: boss@example.com", &format!("Date: {date}")], ""));
    assert_eq!(at("Mon, 7 Dec 2026 10:00:00 +0900"), vec![fileinto("urgent")]);
    assert_eq!(at("Mon, 7 Dec 2026 17:00:00 +0900"), vec![keep()]);
    assert_eq!(at("Mon, 7 Dec 2026 08:59:59 +0900"), vec![keep()]);
}

#[test]
fn section_4_a_missing_or_broken_date_is_false() {
    let m = message(&["Date: sometime last week"], "");
    assert!(!holds(REQ, "date :matches \"date\" \"year\" \"*\"", &m));
    assert!(!holds(REQ, "date :matches \"x-date\" \"year\" \"*\"", &simple_message()));
}

#[test]
fn section_5_currentdate_uses_the_delivery_time() {
    // now() is 2026-12-07T18:30:05+01:00, a Monday.
    let m = simple_message();
    assert!(holds(REQ, "currentdate :is \"date\" \"2026-12-07\"", &m));
    assert!(holds(REQ, "currentdate :is \"weekday\" \"1\"", &m));
    assert!(holds(REQ, "currentdate :zone \"+0000\" :is \"time\" \"17:30:05\"", &m));
    assert!(holds(REQ, "currentdate :value \"ge\" \"date\" \"2026-01-01\"", &m));
    assert!(holds(REQ, "currentdate :is \"iso8601\" \"2026-12-07T18:30:05+01:00\"", &m));
}

#[test]
fn section_6_index_and_last_pick_one_field() {
    let m = message(
        &[
            "Received: from c by d; Tue, 1 Apr 1997 09:07:00 -0800",
            "Received: from b by c; Tue, 1 Apr 1997 09:06:50 -0800",
            "Received: from a by b; Mon, 31 Mar 1997 23:00:00 -0800",
            "X-Tag: one",
            "X-Tag: two",
        ],
        "",
    );
    assert!(holds(REQ, "header :index 2 :is \"x-tag\" \"two\"", &m));
    assert!(holds(REQ, "header :index 1 :last :is \"x-tag\" \"two\"", &m));
    assert!(!holds(REQ, "header :index 1 :is \"x-tag\" \"two\"", &m));
    assert!(!holds(REQ, "header :index 3 :matches \"x-tag\" \"*\"", &m));
    // The first hop's date (the bottom Received field).
    assert!(holds(REQ, "date :originalzone :index 1 :last :is \"received\" \"date\" \"1997-03-31\"", &m));
    assert!(holds(REQ, "date :originalzone :is \"received\" \"time\" \"09:07:00\"", &m));
    let e = compile_error("require \"index\"; if header :last :is \"x\" \"y\" { keep; }");
    assert!(e.message.contains(":last needs :index"), "{e}");
    compile_error("if header :index 1 :is \"x\" \"y\" { keep; }");
}
