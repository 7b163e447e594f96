//! RFC 3501 transcripts per command family, over an in-memory stream: client lines
//! in, server lines out.

mod common;
#[path = "smtp_support/faulty.rs"]
#[allow(dead_code)]
mod faulty;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use mailcluster_model::{FlagSet, Flags, NewDelivery};
use mailcluster_server::delivery::DeliveryOptions;
use mailcluster_server::store::Store;

fn tagged(lines: &[String]) -> &str {
    lines.last().map(String::as_str).unwrap_or_default()
}

fn has(lines: &[String], needle: &str) -> bool {
    lines.iter().any(|l| l.contains(needle))
}

/// The MAILBOXID a successful CREATE's tagged OK carries (RFC 8474 §4.1).
fn created(lines: &[String], tag: &str) -> String {
    let line = tagged(lines);
    let rest = line.strip_prefix(&format!("{tag} OK [MAILBOXID (")).unwrap_or_else(|| panic!("{lines:?}"));
    let (id, text) = rest.split_once(")] ").unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(text, "CREATE completed");
    assert!(
        (1..=255).contains(&id.len())
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "objectid syntax: {id}"
    );
    id.to_string()
}

#[tokio::test]
async fn plaintext_login_is_disabled_without_tls() {
    let (app, _dir) = embedded_app(|c| c.tls.allow_plaintext_auth = false).await;
    account(&app, "bob@example.org", "pw").await;
    let (mut c, _tx) = connect(&app);
    let greeting = c.line().await;
    assert!(greeting.contains("LOGINDISABLED"), "{greeting}");
    assert!(!greeting.contains("AUTH=PLAIN"), "{greeting}");
    let r = c.cmd("a", "LOGIN bob@example.org pw").await;
    assert!(tagged(&r).starts_with("a NO [PRIVACYREQUIRED]"), "{r:?}");
    let r = c.cmd("b", "AUTHENTICATE PLAIN AGJvYkBleGFtcGxlLm9yZwBwdw==").await;
    assert!(tagged(&r).starts_with("b NO [PRIVACYREQUIRED]"), "{r:?}");
    let r = c.cmd("c", "SELECT INBOX").await;
    assert!(tagged(&r).starts_with("c BAD"), "{r:?}");
    let r = c.cmd("d", "LOGOUT").await;
    assert_eq!(r, vec!["* BYE Logging out".to_string(), "d OK LOGOUT completed".to_string()]);
    assert!(c.closed().await);
}

#[tokio::test]
async fn capability_login_and_authenticate() {
    let (app, _dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    account(&app, "bob@example.org", "secret").await;
    let (mut c, _tx) = connect(&app);
    c.line().await;
    let r = c.cmd("a1", "CAPABILITY").await;
    assert!(
        r[0].starts_with("* CAPABILITY IMAP4rev1 ") && r[0].contains("AUTH=PLAIN") && r[0].contains("IDLE"),
        "{r:?}"
    );
    assert_eq!(tagged(&r), "a1 OK CAPABILITY completed");
    let r = c.cmd("a2", "LOGIN bob@example.org wrong").await;
    assert_eq!(tagged(&r), "a2 NO [AUTHENTICATIONFAILED] Invalid credentials");
    // AUTHENTICATE PLAIN with a continuation ("\0bob@example.org\0secret").
    c.send("a3 AUTHENTICATE PLAIN\r\n").await;
    assert_eq!(c.line().await, "+ ");
    c.send("AGJvYkBleGFtcGxlLm9yZwBzZWNyZXQ=\r\n").await;
    let r = c.until_tag("a3").await;
    assert!(tagged(&r).starts_with("a3 OK [CAPABILITY IMAP4rev1"), "{r:?}");
    assert!(!tagged(&r).contains("AUTH=PLAIN"), "{r:?}");
    let r = c.cmd("a4", "LOGIN bob@example.org secret").await;
    assert!(tagged(&r).starts_with("a4 BAD"), "{r:?}");

    // SASL-IR on a second connection.
    let (mut c2, _tx2) = connect(&app);
    c2.line().await;
    let r = c2.cmd("b1", "AUTHENTICATE PLAIN AGJvYkBleGFtcGxlLm9yZwBzZWNyZXQ=").await;
    assert!(tagged(&r).starts_with("b1 OK"), "{r:?}");
    let r = c2.cmd("b2", "NOOP").await;
    assert_eq!(r, vec!["b2 OK NOOP completed".to_string()]);
    let r = c2.cmd("b3", "ID (\"name\" \"test\")").await;
    assert_eq!(r[0], "* ID (\"name\" \"Mailcluster\")");
    let r = c2.cmd("b4", "NAMESPACE").await;
    assert_eq!(r[0], "* NAMESPACE ((\"\" \"/\")) NIL NIL");
    let r = c2.cmd("b5", "FROB").await;
    assert!(tagged(&r).starts_with("b5 BAD"), "{r:?}");
}

#[tokio::test]
async fn mailbox_commands() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("m1", "LIST \"\" \"\"").await;
    assert_eq!(r[0], "* LIST (\\Noselect) \"/\" \"\"");
    let r = c.cmd("m2", "CREATE Work/Projects/Entw&APw-rfe").await;
    created(&r, "m2");
    let r = c.cmd("m3", "LIST \"\" *").await;
    assert!(has(&r, "* LIST (\\HasNoChildren) \"/\" \"INBOX\""), "{r:?}");
    assert!(has(&r, "* LIST (\\HasNoChildren \\Sent) \"/\" \"Sent\""), "{r:?}");
    assert!(has(&r, "* LIST (\\HasChildren) \"/\" \"Work\""), "{r:?}");
    assert!(has(&r, "* LIST (\\HasNoChildren) \"/\" \"Work/Projects/Entw&APw-rfe\""), "{r:?}");
    let r = c.cmd("m4", "LIST \"\" %").await;
    assert!(!has(&r, "Work/Projects"), "{r:?}");
    let r = c.cmd("m5", "LIST Work/ %").await;
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r[0].ends_with("\"Work/Projects\""), "{r:?}");
    let r = c.cmd("m6", "CREATE INBOX").await;
    assert!(tagged(&r).starts_with("m6 NO [ALREADYEXISTS]"), "{r:?}");
    let r = c.cmd("m7", "RENAME Work Job").await;
    assert_eq!(tagged(&r), "m7 OK RENAME completed");
    let r = c.cmd("m8", "LIST \"\" Job*").await;
    assert_eq!(r.len(), 4, "{r:?}");
    let r = c.cmd("m9", "SUBSCRIBE Job").await;
    assert_eq!(tagged(&r), "m9 OK SUBSCRIBE completed");
    let r = c.cmd("m10", "LSUB \"\" Jo*").await;
    assert_eq!(r, ["* LSUB () \"/\" \"Job\"", "m10 OK LSUB completed"]);
    let r = c.cmd("m11", "DELETE Job/Projects/Entw&APw-rfe").await;
    assert_eq!(tagged(&r), "m11 OK DELETE completed");
    let r = c.cmd("m12", "DELETE INBOX").await;
    assert!(tagged(&r).starts_with("m12 NO"), "{r:?}");
    let r = c.cmd("m13", "STATUS INBOX (MESSAGES UNSEEN UIDNEXT UIDVALIDITY RECENT)").await;
    assert!(r[0].starts_with("* STATUS \"INBOX\" (MESSAGES 0 UNSEEN 0 UIDNEXT 1 UIDVALIDITY "), "{r:?}");
    let r = c.cmd("m14", "SELECT Nope").await;
    assert!(tagged(&r).starts_with("m14 NO [NONEXISTENT]"), "{r:?}");
    let r = c.cmd("m15", "ENABLE X-UNKNOWN").await;
    assert_eq!(r[0], "* ENABLED");
    // Many wildcards that match nothing: answered at once (a matcher that tries
    // every split per wildcard never finishes on this one).
    let r = c.cmd("m16", &format!("LIST \"\" \"{}x\"", "*%".repeat(1000))).await;
    assert_eq!(r, ["m16 OK LIST completed"]);
    let r = c.cmd("m17", &format!("LSUB \"\" \"{}x\"", "%*".repeat(1000))).await;
    assert_eq!(r, ["m17 OK LSUB completed"]);
}

/// UTF8=ACCEPT (RFC 9755): once enabled, mailbox names are UTF-8 both ways (an
/// `&` is itself), APPEND takes `UTF8 (literal8)`, and a SEARCH charset other
/// than UTF-8 is refused as a contradiction. A session that did not enable it
/// keeps seeing the same mailbox in modified UTF-7.
#[tokio::test]
async fn utf8_accept() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("u0", "CAPABILITY").await;
    assert!(r[0].contains(" UTF8=ACCEPT"), "{r:?}");
    let r = c.cmd("u1", "ENABLE UTF8=ACCEPT").await;
    assert_eq!(r, ["* ENABLED UTF8=ACCEPT", "u1 OK ENABLE completed"]);
    let r = c.cmd("u2", "ENABLE UTF8=ACCEPT").await;
    assert_eq!(r[0], "* ENABLED", "only what this command newly enabled is listed");
    let r = c.cmd("u3", "CREATE \"Gr\u{fc}\u{df}e/A&B \\\"q\\\"\"").await;
    created(&r, "u3");
    let r = c.cmd("u4", "LIST \"\" \"Gr\u{fc}*\"").await;
    assert_eq!(
        r,
        [
            "* LIST (\\HasChildren) \"/\" \"Gr\u{fc}\u{df}e\"",
            "* LIST (\\HasNoChildren) \"/\" \"Gr\u{fc}\u{df}e/A&B \\\"q\\\"\"",
            "u4 OK LIST completed",
        ]
    );
    // The message: a UTF-8 header (RFC 6532), as a literal8 in the UTF8 item.
    let msg = "Subject: Gr\u{fc}\u{df}e aus K\u{f6}ln\r\nFrom: j\u{f6}rg@example.org\r\n\r\nHallo\r\n";
    let r = c
        .cmd(
            "u5",
            &format!("APPEND \"Gr\u{fc}\u{df}e/A&B \\\"q\\\"\" (\\Seen) UTF8 (~{{{}+}}\r\n{msg})", msg.len()),
        )
        .await;
    assert!(tagged(&r).starts_with("u5 OK [APPENDUID "), "{r:?}");
    let r = c.cmd("u6", "STATUS \"Gr\u{fc}\u{df}e/A&B \\\"q\\\"\" (MESSAGES)").await;
    assert_eq!(r[0], "* STATUS \"Gr\u{fc}\u{df}e/A&B \\\"q\\\"\" (MESSAGES 1)");
    let r = c.cmd("u7", "SELECT \"Gr\u{fc}\u{df}e/A&B \\\"q\\\"\"").await;
    assert!(tagged(&r).starts_with("u7 OK [READ-WRITE]"), "{r:?}");
    let r = c.cmd("u8", "SEARCH SUBJECT \"k\u{f6}ln\"").await;
    assert_eq!(r, ["* SEARCH 1", "u8 OK SEARCH completed"]);
    let r = c.cmd("u9", "SEARCH CHARSET UTF-8 FROM \"j\u{f6}rg\"").await;
    assert_eq!(r, ["* SEARCH 1", "u9 OK SEARCH completed"]);
    let r = c.cmd("u10", "SEARCH CHARSET ISO-8859-1 ALL").await;
    assert!(tagged(&r).starts_with("u10 BAD"), "{r:?}");
    let r = c.cmd("u11", "FETCH 1 (RFC822.SIZE BODY.PEEK[HEADER.FIELDS (SUBJECT)])").await;
    assert!(
        r[0].starts_with(&format!("* 1 FETCH (RFC822.SIZE {} BODY[HEADER.FIELDS (SUBJECT)] {{", msg.len())),
        "{r:?}"
    );
    assert_eq!(r[1], "Subject: Gr\u{fc}\u{df}e aus K\u{f6}ln");

    // Another session, without UTF8=ACCEPT: the same names in modified UTF-7,
    // and the UTF-7 spelling selects the same mailbox.
    let (mut d, _tx2) = login(&app, "bob@example.org", "pw").await;
    let r = d.cmd("v1", "LIST \"\" Gr*").await;
    assert_eq!(r[1], "* LIST (\\HasNoChildren) \"/\" \"Gr&APwA3w-e/A&-B \\\"q\\\"\"", "{r:?}");
    let r = d.cmd("v2", "STATUS \"Gr&APwA3w-e/A&-B \\\"q\\\"\" (MESSAGES)").await;
    assert_eq!(r[0], "* STATUS \"Gr&APwA3w-e/A&-B \\\"q\\\"\" (MESSAGES 1)");
    // A raw UTF-8 name from a client without the extension is taken as the
    // common servers take it, and told back in modified UTF-7.
    let r = d.cmd("v3", "CREATE \"K\u{f6}ln\"").await;
    created(&r, "v3");
    let r = d.cmd("v3b", "LIST \"\" K*").await;
    assert_eq!(r[0], "* LIST (\\HasNoChildren) \"/\" \"K&APY-ln\"", "{r:?}");
    // With it, an `&` is not modified UTF-7: `&APw-` names a mailbox of its own.
    let r = c.cmd("u12", "CREATE \"Gr&APwA3w-e\"").await;
    created(&r, "u12");
    let r = c.cmd("u13", "LIST \"\" \"Gr*\"").await;
    assert!(has(&r, "\"Gr&APwA3w-e\""), "{r:?}");
    let r = d.cmd("v4", "LIST \"\" \"Gr&-*\"").await;
    assert_eq!(r[0], "* LIST (\\HasNoChildren) \"/\" \"Gr&-APwA3w-e\"", "{r:?}");
}

/// CREATE-SPECIAL-USE (RFC 6154 §3): the attribute is kept and listed; one the
/// server cannot give (unknown, or a second one) is NO [USEATTR] and creates
/// nothing; an unknown CREATE parameter is BAD.
#[tokio::test]
async fn create_special_use() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("c0", "CAPABILITY").await;
    assert!(r[0].contains(" CREATE-SPECIAL-USE "), "{r:?}");
    let r = c.cmd("c1", "CREATE \"Old mail/2025\" (USE (\\Archive))").await;
    created(&r, "c1");
    let r = c.cmd("c2", "CREATE Both (USE (\\Sent \\Drafts))").await;
    assert!(tagged(&r).starts_with("c2 NO [USEATTR]"), "{r:?}");
    let r = c.cmd("c3", "CREATE Important (use (\\Important))").await;
    assert!(tagged(&r).starts_with("c3 NO [USEATTR]"), "{r:?}");
    let r = c.cmd("c4", "CREATE Odd (COLOR (red))").await;
    assert!(tagged(&r).starts_with("c4 BAD"), "{r:?}");
    let r = c.cmd("c5", "CREATE Plain (USE ())").await;
    created(&r, "c5");
    let r = c.cmd("c6", "LIST \"\" * RETURN (SPECIAL-USE)").await;
    assert!(has(&r, "* LIST (\\HasNoChildren \\Archive) \"/\" \"Old mail/2025\""), "{r:?}");
    assert!(has(&r, "* LIST (\\HasNoChildren) \"/\" \"Plain\""), "{r:?}");
    assert!(!has(&r, "Both") && !has(&r, "Important") && !has(&r, "Odd"), "nothing else created: {r:?}");
}

/// IMAP4rev2 (RFC 9051) once enabled: no RECENT response and no \\Recent flag
/// (and so no claim on them: an IMAP4rev1 session still gets them), no UNSEEN
/// code, SEARCH answered with ESEARCH, UTF-8 mailbox names.
#[tokio::test]
async fn imap4rev2_when_enabled() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    deliver(&app, &bob, "INBOX", &sample("one", "first body"), FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &sample("two", "second body"), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("r0", "CAPABILITY").await;
    assert!(r[0].starts_with("* CAPABILITY IMAP4rev1 IMAP4rev2 "), "{r:?}");
    let r = c.cmd("r1", "ENABLE IMAP4rev2").await;
    assert_eq!(r, ["* ENABLED IMAP4rev2", "r1 OK ENABLE completed"]);
    let r = c.cmd("r2", "SELECT INBOX").await;
    assert!(has(&r, "* 2 EXISTS") && tagged(&r).starts_with("r2 OK [READ-WRITE]"), "{r:?}");
    assert!(!has(&r, "RECENT") && !has(&r, "[UNSEEN"), "{r:?}");
    let r = c.cmd("r3", "SEARCH ALL").await;
    assert_eq!(r, ["* ESEARCH (TAG \"r3\") ALL 1:2", "r3 OK SEARCH completed"]);
    let r = c.cmd("r4", "UID SEARCH SEEN").await;
    assert_eq!(r, ["* ESEARCH (TAG \"r4\") UID", "r4 OK UID SEARCH completed"]);
    let r = c.cmd("r5", "FETCH 1:2 FLAGS").await;
    assert_eq!(r[..2], ["* 1 FETCH (FLAGS ())", "* 2 FETCH (FLAGS ())"]);
    deliver(&app, &bob, "INBOX", &sample("three", "third body"), FlagSet::default()).await;
    let r = c.cmd("r6", "NOOP").await;
    assert!(has(&r, "* 3 EXISTS") && !has(&r, "RECENT"), "{r:?}");
    let r = c.cmd("r7", "CREATE \"Gr\u{fc}\u{df}e\"").await;
    created(&r, "r7");
    let r = c.cmd("r8", "LIST \"\" \"Gr*\"").await;
    assert_eq!(r[0], "* LIST (\\HasNoChildren) \"/\" \"Gr\u{fc}\u{df}e\"");

    // An IMAP4rev1 session gets the three as \Recent: none was claimed.
    let (mut d, _tx2) = login(&app, "bob@example.org", "pw").await;
    let r = d.cmd("s1", "SELECT INBOX").await;
    assert!(has(&r, "* 3 RECENT") && has(&r, "[UNSEEN 1]"), "{r:?}");
    let r = d.cmd("s2", "SEARCH ALL").await;
    assert_eq!(r[0], "* SEARCH 1 2 3");
}

#[tokio::test]
async fn select_fetch_store_search_expunge() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let seen = FlagSet { system: Flags::SEEN, keywords: vec![] };
    deliver(&app, &bob, "INBOX", &sample("one", "first body"), seen.clone()).await;
    deliver(&app, &bob, "INBOX", &sample("two", "second body"), FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &sample("three", "third body"), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;

    let r = c.cmd("s1", "SELECT INBOX").await;
    assert!(has(&r, "* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft)"), "{r:?}");
    // The first session to select gets the delivered messages as \Recent (§2.3.2).
    assert!(has(&r, "* 3 EXISTS") && has(&r, "* 3 RECENT") && has(&r, "* OK [UNSEEN 2]"), "{r:?}");
    assert!(has(&r, "[UIDVALIDITY ") && has(&r, "* OK [UIDNEXT 4]"), "{r:?}");
    assert!(tagged(&r).starts_with("s1 OK [READ-WRITE]"), "{r:?}");

    let r = c.cmd("f1", "FETCH 1:* (FLAGS)").await;
    assert_eq!(r[0], "* 1 FETCH (FLAGS (\\Seen \\Recent))");
    assert_eq!(r[1], "* 2 FETCH (FLAGS (\\Recent))");
    let r = c.cmd("f2", "UID FETCH 2 (RFC822.SIZE ENVELOPE)").await;
    assert!(r[0].starts_with("* 2 FETCH (UID 2 RFC822.SIZE "), "{r:?}");
    assert!(
        r[0].contains(
            "ENVELOPE (\"Tue, 1 Jul 2003 10:52:37 +0200\" \"two\" ((\"Alice\" NIL \"alice\" \"example.com\"))"
        ),
        "{r:?}"
    );
    // PEEK leaves \Seen alone; BODY[TEXT] sets it and reports the new FLAGS.
    let r = c.cmd("f3", "FETCH 2 (BODY.PEEK[HEADER.FIELDS (SUBJECT)])").await;
    assert_eq!(r[0], "* 2 FETCH (BODY[HEADER.FIELDS (SUBJECT)] {16}");
    assert_eq!(r[1], "Subject: two");
    let r = c.cmd("f4", "FETCH 2 (FLAGS)").await;
    assert_eq!(r[0], "* 2 FETCH (FLAGS (\\Recent))");
    let r = c.cmd("f5", "FETCH 2 BODY[TEXT]<0.6>").await;
    assert_eq!(r[0], "* 2 FETCH (BODY[TEXT]<0> {6}");
    assert!(r[1].starts_with("second FLAGS (\\Seen \\Recent))"), "{r:?}");
    let r = c.cmd("f6", "FETCH 3 (BODYSTRUCTURE INTERNALDATE)").await;
    assert!(
        r[0].contains("BODYSTRUCTURE (\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 12 1 NIL NIL NIL NIL)"),
        "{r:?}"
    );
    assert!(r[0].contains("INTERNALDATE \""), "{r:?}");

    let r = c.cmd("st1", "STORE 1:2 +FLAGS (\\Deleted $Work)").await;
    assert!(has(&r, "* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft $Work)"), "{r:?}");
    assert!(has(&r, "* 1 FETCH (FLAGS (\\Seen \\Deleted \\Recent $Work))"), "{r:?}");
    let r = c.cmd("st2", "UID STORE 3 +FLAGS.SILENT (\\Flagged)").await;
    assert_eq!(r, vec!["st2 OK UID STORE completed".to_string()]);
    let r = c.cmd("se1", "SEARCH UNSEEN").await;
    assert_eq!(r[0], "* SEARCH 3");
    let r = c.cmd("se2", "UID SEARCH OR FLAGGED SUBJECT one").await;
    assert_eq!(r[0], "* SEARCH 1 3");
    let r = c.cmd("se3", "SEARCH CHARSET UTF-8 BODY \"SECOND\" NOT DELETED").await;
    assert_eq!(r[0], "* SEARCH");
    let r = c.cmd("se4", "SEARCH TEXT second LARGER 10 SINCE 1-Jan-2000 SENTBEFORE 1-Jan-2004 2:3").await;
    assert_eq!(r[0], "* SEARCH 2");
    let r = c.cmd("se5", "SEARCH KEYWORD $Work HEADER Message-ID two@").await;
    assert_eq!(r[0], "* SEARCH 2");
    let r = c.cmd("se6", "SEARCH CHARSET KOI8-R ALL").await;
    assert!(tagged(&r).starts_with("se6 NO [BADCHARSET"), "{r:?}");
    let r = c.cmd("f7", "FETCH 9 FLAGS").await;
    assert!(tagged(&r).starts_with("f7 BAD"), "{r:?}");

    let r = c.cmd("e1", "EXPUNGE").await;
    assert_eq!(
        r,
        vec!["* 1 EXPUNGE".to_string(), "* 1 EXPUNGE".to_string(), "e1 OK EXPUNGE completed".to_string()]
    );
    let r = c.cmd("f8", "FETCH 1 UID").await;
    assert_eq!(r[0], "* 1 FETCH (UID 3)");
    let r = c.cmd("c1", "CLOSE").await;
    assert_eq!(r, vec!["c1 OK CLOSE completed".to_string()]);
    let r = c.cmd("f9", "FETCH 1 UID").await;
    assert!(tagged(&r).starts_with("f9 BAD"), "{r:?}");
    let r = c.cmd("x1", "EXAMINE INBOX").await;
    assert!(tagged(&r).starts_with("x1 OK [READ-ONLY]"), "{r:?}");
    let r = c.cmd("x2", "STORE 1 +FLAGS (\\Seen)").await;
    assert!(tagged(&r).starts_with("x2 NO [READ-ONLY]"), "{r:?}");
}

#[tokio::test]
async fn body_sections_of_a_multipart_message() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let inner = "From: Inner <inner@example.com>\r\nSubject: Inner\r\n\r\ninner text\r\n";
    let raw = format!(
        "From: a@example.com\r\nSubject: fwd\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=out\r\n\r\n--out\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--out\r\nContent-Type: message/rfc822\r\n\r\n{inner}\r\n--out--\r\n"
    );
    deliver(&app, &bob, "INBOX", raw.as_bytes(), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    let r = c.cmd("a", "FETCH 1 (BODY.PEEK[1])").await;
    assert_eq!(r[0], "* 1 FETCH (BODY[1] {12}");
    assert_eq!(r[1], "see attached)");
    let r = c.cmd("b", "FETCH 1 (BODY.PEEK[1.MIME])").await;
    assert_eq!(r[0], "* 1 FETCH (BODY[1.MIME] {28}");
    let r = c.cmd("c", "FETCH 1 (BODY.PEEK[2.HEADER])").await;
    assert_eq!(r[0], format!("* 1 FETCH (BODY[2.HEADER] {{{}}}", inner.find("\r\n\r\n").expect("hdr") + 4));
    let r = c.cmd("d", "FETCH 1 (BODY.PEEK[2.TEXT])").await;
    assert_eq!(r[0], "* 1 FETCH (BODY[2.TEXT] {12}");
    let r = c.cmd("e", "FETCH 1 (BODY.PEEK[2.1])").await;
    assert_eq!(r[0], "* 1 FETCH (BODY[2.1] {12}");
    let r = c.cmd("f", "FETCH 1 (BODY.PEEK[7])").await;
    assert_eq!(r[0], "* 1 FETCH (BODY[7] {0}");
    let r = c.cmd("g", "FETCH 1 (BODY)").await;
    assert!(r[0].contains("\"MESSAGE\" \"RFC822\"") && r[0].ends_with(" \"MIXED\"))"), "{r:?}");
}

#[tokio::test]
async fn append_literals_and_limits() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let msg = String::from_utf8(sample("appended", "hello")).expect("utf8");
    // Synchronising literal: wait for the continuation.
    c.send(&format!("p1 APPEND INBOX (\\Seen) {{{}}}\r\n", msg.len())).await;
    assert_eq!(c.line().await, "+ Ready for literal data");
    c.send(&format!("{msg}\r\n")).await;
    let r = c.until_tag("p1").await;
    assert!(tagged(&r).starts_with("p1 OK [APPENDUID "), "{r:?}");
    assert!(tagged(&r).contains(" 1] APPEND completed"), "{r:?}");
    // LITERAL+ and MULTIAPPEND in one go.
    let r = c
        .cmd(
            "p2",
            &format!(
                "APPEND Sent {{{}+}}\r\n{msg} (\\Draft) \"01-Jan-2020 10:00:00 +0100\" {{{}+}}\r\n{msg}",
                msg.len(),
                msg.len()
            ),
        )
        .await;
    assert!(tagged(&r).contains(" 1:2] APPEND completed"), "{r:?}");
    let r = c.cmd("p3", "APPEND Nope {1+}\r\nx").await;
    assert!(tagged(&r).starts_with("p3 NO [TRYCREATE]"), "{r:?}");
    let r = c.cmd("p4", "STATUS Sent (MESSAGES)").await;
    assert_eq!(r[0], "* STATUS \"Sent\" (MESSAGES 2)");
    // The internal date comes back as APPEND gave it, zone included; with the
    // body too (RFC 3501 §6.3.11, §7.4.2).
    c.cmd("p4s", "SELECT Sent").await;
    let r = c.cmd("p4f", "FETCH 2 (INTERNALDATE)").await;
    assert_eq!(r[0], "* 2 FETCH (INTERNALDATE \"01-Jan-2020 10:00:00 +0100\")");
    let r = c.cmd("p4b", "FETCH 2 (INTERNALDATE BODY.PEEK[HEADER])").await;
    assert!(
        r[0].starts_with("* 2 FETCH (INTERNALDATE \"01-Jan-2020 10:00:00 +0100\" BODY[HEADER] {"),
        "{r:?}"
    );
    // BEFORE/ON/SINCE take the day in that zone: 00:30 +0200 on the 25th is the
    // 24th in UTC, and is "on" the 25th.
    let r = c
        .cmd("p4a", &format!("APPEND Sent \"25-Mar-2007 00:30:00 +0200\" {{{}+}}\r\n{msg}", msg.len()))
        .await;
    assert!(tagged(&r).starts_with("p4a OK"), "{r:?}");
    for (tag, key, expect) in [
        ("p4o", "ON 25-Mar-2007", "* SEARCH 3"),
        ("p4e", "BEFORE 25-Mar-2007", "* SEARCH"),
        ("p4i", "SINCE 25-Mar-2007", "* SEARCH 1 2 3"),
    ] {
        let r = c.cmd(tag, &format!("SEARCH {key}")).await;
        assert!(r.iter().any(|l| l == expect), "{key}: {r:?}");
    }
    // WITHIN (RFC 5032): by internal date, to the second; nested like any key.
    for (tag, key, expect) in [
        ("w1", "YOUNGER 3600", "* SEARCH 1"),
        ("w2", "OLDER 3600", "* SEARCH 2 3"),
        ("w3", "NOT YOUNGER 3600 SINCE 1-Jan-2010", "* SEARCH 2"),
        ("w4", "RETURN (COUNT) OR YOUNGER 60 OLDER 600000000", "* ESEARCH (TAG \"w4\") COUNT 2"),
    ] {
        let r = c.cmd(tag, &format!("SEARCH {key}")).await;
        assert!(r.iter().any(|l| l == expect), "{key}: {r:?}");
        assert!(!r.iter().any(|l| l.contains("MODSEQ")), "no MODSEQ without a MODSEQ key: {r:?}");
    }
    let r = c.cmd("w5", "SEARCH YOUNGER 0").await;
    assert!(tagged(&r).starts_with("w5 BAD"), "{r:?}");
    c.cmd("p4u", "UNSELECT").await;
    // Over the limit, synchronising: refused before the data, no "+".
    c.send("p5 APPEND INBOX {2000000}\r\n").await;
    assert_eq!(c.line().await, "p5 NO [TOOBIG] Literal of 2000000 octets exceeds the limit");
    let r = c.cmd("p6", "NOOP").await;
    assert_eq!(tagged(&r), "p6 OK NOOP completed");
    // Over the limit, non-synchronising: BAD and the connection closes.
    c.send("p7 APPEND INBOX {2000000+}\r\n").await;
    assert_eq!(c.line().await, "p7 BAD [TOOBIG] Literal of 2000000 octets exceeds the limit");
    assert_eq!(c.line().await, "* BYE Closing connection");
    assert!(c.closed().await);
}

/// OBJECTID (RFC 8474): MAILBOXID on CREATE, SELECT/EXAMINE, STATUS and
/// LIST-STATUS, kept by RENAME and never given to another mailbox; EMAILID kept
/// by COPY and MOVE and searchable; THREADID NIL and matching nothing.
#[tokio::test]
async fn object_ids() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    deliver(&app, &bob, "INBOX", &sample("one", "first body"), FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &sample("two", "second body"), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("o0", "CAPABILITY").await;
    assert!(r[0].split(' ').any(|w| w == "OBJECTID"), "{r:?}");

    // Mailboxes.
    let r = c.cmd("o1", "CREATE Projects").await;
    let projects = created(&r, "o1");
    let r = c.cmd("o2", "CREATE Later").await;
    let later = created(&r, "o2");
    assert_ne!(projects, later);
    let r = c.cmd("o3", "STATUS Projects (MESSAGES MAILBOXID)").await;
    assert_eq!(r[0], format!("* STATUS \"Projects\" (MESSAGES 0 MAILBOXID ({projects}))"));
    let r = c.cmd("o4", "EXAMINE Projects").await;
    assert!(has(&r, &format!("* OK [MAILBOXID ({projects})]")), "{r:?}");
    let r = c.cmd("o5", "RENAME Projects Done").await;
    assert_eq!(tagged(&r), "o5 OK RENAME completed");
    let r = c.cmd("o6", "LIST \"\" \"Done\" RETURN (STATUS (MAILBOXID UIDNEXT))").await;
    assert!(has(&r, &format!("* STATUS \"Done\" (MAILBOXID ({projects}) UIDNEXT 1)")), "{r:?}");
    c.cmd("o7", "DELETE Done").await;
    let r = c.cmd("o8", "CREATE Projects").await;
    let again = created(&r, "o8");
    assert!(again != projects && again != later, "a MAILBOXID is never reused: {again}");
    let r = c.cmd("o9", "STATUS INBOX (MAILBOXID)").await;
    let inbox = r[0].strip_prefix("* STATUS \"INBOX\" (MAILBOXID (").and_then(|x| x.strip_suffix("))"));
    let inbox = inbox.unwrap_or_else(|| panic!("{r:?}")).to_string();
    let r = c.cmd("o10", "SELECT INBOX").await;
    assert!(has(&r, &format!("* OK [MAILBOXID ({inbox})]")), "{r:?}");
    assert!(![&projects, &later, &again].contains(&&inbox));

    // Messages.
    let r = c.cmd("e1", "FETCH 1:2 (FLAGS EMAILID THREADID)").await;
    let email_id = |line: &str| -> String {
        let at = line.find("EMAILID (").unwrap_or_else(|| panic!("{line}")) + "EMAILID (".len();
        line[at..at + line[at..].find(')').unwrap()].to_string()
    };
    assert!(r[0].starts_with("* 1 FETCH (FLAGS (\\Recent) ") && r[0].ends_with(" THREADID NIL)"), "{r:?}");
    let (first, second) = (email_id(&r[0]), email_id(&r[1]));
    assert_ne!(first, second);
    assert!(![&inbox, &projects].contains(&&first), "mailbox and message ids do not collide");
    let r = c.cmd("e2", "FETCH 2 EMAILID").await;
    assert_eq!(r[0], format!("* 2 FETCH (EMAILID ({second}))"));
    let r = c.cmd("e3", "UID FETCH 1 (EMAILID)").await;
    assert_eq!(r[0], format!("* 1 FETCH (UID 1 EMAILID ({first}))"));
    let r = c.cmd("e4", "FETCH 1 (THREADID)").await;
    assert_eq!(r[0], "* 1 FETCH (THREADID NIL)");
    let r = c.cmd("e5", "FETCH 2 (RFC822.SIZE EMAILID BODY.PEEK[HEADER.FIELDS (Subject)])").await;
    assert!(
        r[0].starts_with("* 2 FETCH (RFC822.SIZE ") && has(&r, &format!(" EMAILID ({second}))")),
        "{r:?}"
    );

    // A copy and a moved message keep the EMAILID (§5.1).
    c.cmd("e6", "COPY 1 Later").await;
    c.cmd("e7", "MOVE 2 Later").await;
    let r = c.cmd("e8", "SELECT Later").await;
    assert!(has(&r, &format!("* OK [MAILBOXID ({later})]")), "{r:?}");
    let r = c.cmd("e9", "UID FETCH 1:* EMAILID").await;
    assert_eq!(
        r[..2],
        [format!("* 1 FETCH (UID 1 EMAILID ({first}))"), format!("* 2 FETCH (UID 2 EMAILID ({second}))")]
    );

    // SEARCH (§6).
    let r = c.cmd("s1", &format!("SEARCH EMAILID {second}")).await;
    assert_eq!(r[0], "* SEARCH 2");
    let r = c.cmd("s2", &format!("UID SEARCH OR EMAILID {first} EMAILID {second}")).await;
    assert_eq!(r[0], "* SEARCH 1 2");
    let r = c.cmd("s3", &format!("SEARCH NOT EMAILID {first}")).await;
    assert_eq!(r[0], "* SEARCH 2");
    let r = c.cmd("s4", &format!("SEARCH THREADID T{}", &first[1..])).await;
    assert_eq!(r[0], "* SEARCH");
    let r = c.cmd("s5", &format!("SEARCH EMAILID {}", first.to_lowercase())).await;
    assert_eq!(r[0], "* SEARCH", "object ids are case sensitive");
    let r = c.cmd("s6", "SEARCH SUBJECT EMAILID").await;
    assert_eq!(r[0], "* SEARCH", "an argument named like the key is not the key");
    let r = c.cmd("s7", "SEARCH EMAILID M1.2").await;
    assert!(tagged(&r).starts_with("s7 BAD"), "{r:?}");
    let r = c.cmd("s8", "SEARCH EMAILID").await;
    assert!(tagged(&r).starts_with("s8 BAD"), "{r:?}");
}

/// Lines without a tag or command, a bare LF among them, get `* BAD` and the
/// session goes on (a bare LF used to end it: its cursor ran past the line).
#[tokio::test]
async fn untagged_and_empty_lines_get_bad() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    for line in ["\n", "\r\n", " \r\n", "\t\n", "*\n"] {
        c.send(line).await;
        assert_eq!(c.line().await, "* BAD Missing or invalid tag", "{line:?}");
    }
    c.send("a\n").await;
    assert_eq!(c.line().await, "a BAD Missing command");
    let r = c.cmd("n", "NOOP").await;
    assert_eq!(r, ["n OK NOOP completed"]);
}

/// 4294967295 is a number like any other (the largest UID a client may name),
/// not `*`: `n:*` takes the last message even past it (RFC 9051 §6.4.9),
/// `n:4294967295` does not.
#[tokio::test]
async fn the_largest_number_is_not_star() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for i in 0..3 {
        deliver(&app, &bob, "INBOX", &sample(&format!("m{i}"), "x"), FlagSet::default()).await;
    }
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    let r = c.cmd("u1", "UID SEARCH UID 4294967295").await;
    assert_eq!(r[0], "* SEARCH");
    let r = c.cmd("u2", "UID SEARCH UID 2:4294967295").await;
    assert_eq!(r[0], "* SEARCH 2 3");
    let r = c.cmd("u3", "UID FETCH 4:4294967295 UID").await;
    assert_eq!(r, ["u3 OK UID FETCH completed"]);
    let r = c.cmd("u4", "UID FETCH 4:* UID").await;
    assert_eq!(r, ["* 3 FETCH (UID 3)", "u4 OK UID FETCH completed"]);
    let r = c.cmd("u5", "UID STORE 4294967295 +FLAGS (\\Seen)").await;
    assert_eq!(r, ["u5 OK UID STORE completed"]);
    let r = c.cmd("u6", "FETCH 4294967295 FLAGS").await;
    assert!(tagged(&r).starts_with("u6 BAD"), "{r:?}");
    let r = c.cmd("u7", "SEARCH 3:4294967295").await;
    assert_eq!(r[0], "* SEARCH 3");
}

#[tokio::test]
async fn copy_move_and_uid_expunge() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for i in 0..4 {
        deliver(&app, &bob, "INBOX", &sample(&format!("m{i}"), "x"), FlagSet::default()).await;
    }
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    let r = c.cmd("c1", "COPY 1:2 Archive").await;
    assert!(tagged(&r).starts_with("c1 OK [COPYUID "), "{r:?}");
    assert!(tagged(&r).contains(" 1:2 1:2] COPY completed"), "{r:?}");
    let r = c.cmd("c2", "COPY 1 Nope").await;
    assert!(tagged(&r).starts_with("c2 NO [TRYCREATE]"), "{r:?}");
    let r = c.cmd("m1", "UID MOVE 2:3 Trash").await;
    assert!(r[0].starts_with("* OK [COPYUID ") && r[0].contains(" 2:3 1:2]"), "{r:?}");
    assert_eq!(
        &r[1..],
        &["* 2 EXPUNGE".to_string(), "* 2 EXPUNGE".to_string(), "m1 OK UID MOVE completed".to_string()]
    );
    c.cmd("st", "UID STORE 1,4 +FLAGS.SILENT (\\Deleted)").await;
    let r = c.cmd("x1", "UID EXPUNGE 4").await;
    assert_eq!(r, vec!["* 2 EXPUNGE".to_string(), "x1 OK UID EXPUNGE completed".to_string()]);
    let r = c.cmd("f", "FETCH 1:* (UID FLAGS)").await;
    assert_eq!(r[0], "* 1 FETCH (UID 1 FLAGS (\\Deleted \\Recent))");
    assert_eq!(r.len(), 2, "{r:?}");
}

#[tokio::test]
async fn other_sessions_changes_respect_sequence_rules() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for i in 0..3 {
        deliver(&app, &bob, "INBOX", &sample(&format!("m{i}"), "x"), FlagSet::default()).await;
    }
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    a.cmd("s", "SELECT INBOX").await;
    b.cmd("s", "SELECT INBOX").await;
    b.cmd("d", "STORE 1 +FLAGS (\\Deleted)").await;
    let r = b.cmd("e", "EXPUNGE").await;
    assert_eq!(r[0], "* 1 EXPUNGE");
    deliver(&app, &bob, "INBOX", &sample("new", "x"), FlagSet::default()).await;

    // FETCH must not announce the expunge; new mail may be announced.
    let r = a.cmd("f", "FETCH 1:* (UID)").await;
    assert!(!has(&r, "EXPUNGE"), "{r:?}");
    assert!(has(&r, "* 4 EXISTS"), "{r:?}");
    assert!(has(&r, "* 2 FETCH (UID 2)"), "{r:?}");
    // The expunged message itself is still answered from what this session
    // knows (RFC 2180 §4.1.1), not skipped under a plain OK.
    assert!(has(&r, "* 1 FETCH (UID 1)"), "{r:?}");
    let r = a.cmd("f1", "FETCH 1 (UID FLAGS)").await;
    assert_eq!(r, ["* 1 FETCH (UID 1 FLAGS (\\Recent))", "f1 OK FETCH completed"], "{r:?}");
    // What it cannot serve any more, it says so (RFC 5530).
    let r = a.cmd("f3", "FETCH 1 (ENVELOPE)").await;
    assert!(
        has(&r, "* 1 FETCH (ENVELOPE") || tagged(&r).starts_with("f3 NO [EXPUNGEISSUED]"),
        "served or refused, never a silent OK: {r:?}"
    );
    // Sequence numbers still count the expunged message until NOOP.
    let r = a.cmd("se", "SEARCH ALL").await;
    assert!(!has(&r, "EXPUNGE"), "{r:?}");
    let r = a.cmd("n", "NOOP").await;
    assert_eq!(r[0], "* 1 EXPUNGE");
    let r = a.cmd("f2", "FETCH 1:* (UID)").await;
    assert_eq!(r[..3], ["* 1 FETCH (UID 2)", "* 2 FETCH (UID 3)", "* 3 FETCH (UID 4)"].map(String::from));
    // Flag changes by another session arrive as untagged FETCH.
    b.cmd("st", "UID STORE 3 +FLAGS (\\Flagged)").await;
    let r = a.cmd("n2", "NOOP").await;
    assert!(has(&r, "* 2 FETCH (UID 3 FLAGS (\\Flagged \\Recent))"), "{r:?}");
}

#[tokio::test]
async fn idle_wakes_on_changes_from_another_session() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    a.cmd("s", "SELECT INBOX").await;
    a.send("i1 IDLE\r\n").await;
    assert_eq!(a.line().await, "+ idling");
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    let msg = String::from_utf8(sample("pushed", "x")).expect("utf8");
    let started = std::time::Instant::now();
    let r = b.cmd("p", &format!("APPEND INBOX {{{}+}}\r\n{msg}", msg.len())).await;
    assert!(tagged(&r).starts_with("p OK"), "{r:?}");
    assert_eq!(a.line().await, "* 1 EXISTS");
    assert_eq!(a.line().await, "* 1 RECENT");
    assert!(started.elapsed() < std::time::Duration::from_millis(500), "{:?}", started.elapsed());
    a.send("DONE\r\n").await;
    assert_eq!(a.line().await, "i1 OK IDLE terminated");
    let _ = bob;
}

#[tokio::test]
async fn shutdown_says_bye() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, tx) = login(&app, "bob@example.org", "pw").await;
    tx.send(true).expect("signal");
    assert_eq!(c.line().await, "* BYE Server shutting down");
    assert!(c.closed().await);
}

#[tokio::test]
async fn tenant_isolation() {
    let (app, _dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    let alice = account(&app, "alice@example.com", "pw").await;
    account(&app, "bob@example.org", "pw").await;
    deliver(&app, &alice, "INBOX", &sample("secret", "alice only"), FlagSet::default()).await;
    app.store.mailbox_create(alice.id, "Private", None).await.expect("create");
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("l", "LIST \"\" *").await;
    assert!(!has(&r, "Private"), "{r:?}");
    for (i, name) in [
        "../alice@example.com/INBOX",
        "Private",
        "#users/alice/INBOX",
        "*",
        "%",
        "/INBOX",
        "INBOX/../Private",
    ]
    .iter()
    .enumerate()
    {
        let r = c.cmd(&format!("s{i}"), &format!("SELECT \"{name}\"")).await;
        assert!(tagged(&r).contains(" NO "), "{name}: {r:?}");
        let r = c.cmd(&format!("t{i}"), &format!("STATUS \"{name}\" (MESSAGES)")).await;
        assert!(tagged(&r).contains(" NO "), "{name}: {r:?}");
    }
    let r = c.cmd("l2", "LIST \"../\" *").await;
    assert!(!has(&r, "Private"), "{r:?}");
    let r = c.cmd("s", "SELECT INBOX").await;
    assert!(has(&r, "* 0 EXISTS"), "{r:?}");
    let r = c.cmd("f", "UID FETCH 1:* (UID)").await;
    assert_eq!(r.len(), 1, "{r:?}");
    let r = c.cmd("c", "CREATE ../escape").await;
    assert!(tagged(&r).contains(" NO "), "{r:?}");
}

#[tokio::test]
async fn idle_falls_back_to_polling_when_notifications_end() {
    let cache = common::mem::MemCache { broken_notifications: true, ..Default::default() };
    let (store, _dir) = sqlite_store().await;
    let app = app_configured(store, std::sync::Arc::new(cache), |c| {
        c.tls.allow_plaintext_auth = true;
        c.imap.idle_poll_secs = 1;
    });
    let bob = account(&app, "bob@example.org", "pw").await;
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    a.cmd("s", "SELECT INBOX").await;
    a.send("i IDLE\r\n").await;
    assert_eq!(a.line().await, "+ idling");
    // Straight into the store: no notification is published at all.
    deliver(&app, &bob, "INBOX", &sample("polled", "x"), FlagSet::default()).await;
    let started = std::time::Instant::now();
    assert_eq!(a.line().await, "* 1 EXISTS");
    assert_eq!(a.line().await, "* 1 RECENT");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
    a.send("DONE\r\n").await;
    assert_eq!(a.line().await, "i OK IDLE terminated");
}

#[tokio::test]
async fn autologout_before_authentication() {
    let (store, _dir) = sqlite_store().await;
    let app = app_configured(store, std::sync::Arc::new(common::mem::MemCache::default()), |c| {
        c.imap.preauth_timeout_secs = 1
    });
    let (mut c, _tx) = connect(&app);
    c.line().await;
    assert_eq!(c.line().await, "* BYE Autologout; idle for too long");
    assert!(c.closed().await);
}

#[tokio::test]
async fn connections_per_user_are_limited() {
    let (store, _dir) = sqlite_store().await;
    let app = app_configured(store, std::sync::Arc::new(common::mem::MemCache::default()), |c| {
        c.tls.allow_plaintext_auth = true;
        c.imap.max_connections_per_user = 2;
    });
    account(&app, "bob@example.org", "pw").await;
    let (_a, _ta) = login(&app, "bob@example.org", "pw").await;
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    let (mut c, _tc) = connect(&app);
    c.line().await;
    let r = c.cmd("x", "LOGIN bob@example.org pw").await;
    assert_eq!(tagged(&r), "x NO [LIMIT] Too many connections for this account");
    // A slot is freed when a session ends.
    b.cmd("o", "LOGOUT").await;
    assert!(b.closed().await);
    let r = c.cmd("y", "LOGIN bob@example.org pw").await;
    assert!(tagged(&r).starts_with("y OK"), "{r:?}");
}

#[tokio::test]
async fn metrics_count_imap_commands_and_idle_sessions() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let uid = deliver(&app, &bob, "INBOX", b"Subject: hi\r\n\r\nhello\r\n", FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s0", "SELECT INBOX").await;
    c.cmd("s", "SELECT INBOX").await;
    c.cmd("f", "UID FETCH 1:* FLAGS").await;
    // The second body FETCH finds the body in the process's cache.
    for tag in ["b1", "b2"] {
        let r = c.cmd(tag, &format!("UID FETCH {uid} BODY.PEEK[]")).await;
        assert!(r.iter().any(|l| l.contains("hello")), "{r:?}");
    }
    c.cmd("b", "FROB").await;
    c.send("i IDLE\r\n").await;
    c.line().await;
    let text = {
        use prometheus::Encoder as _;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new().encode(&app.metrics.registry.gather(), &mut buf).expect("encode");
        String::from_utf8(buf).expect("utf8")
    };
    assert!(
        text.contains("mail_commands_total{command=\"UID FETCH\",protocol=\"imap\",result=\"ok\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("mail_commands_total{command=\"LOGIN\",protocol=\"imap\",result=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("mail_commands_total{command=\"UNKNOWN\",protocol=\"imap\",result=\"bad\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("mail_command_duration_seconds_count{command=\"SELECT\",protocol=\"imap\"} 2"),
        "{text}"
    );
    assert!(text.contains("mail_imap_idle_sessions 1"), "{text}");
    // The second SELECT reads the message list from the cache; every command
    // after SELECT asked whether the mailbox changed.
    assert!(text.contains("mail_imap_select_cache_total{result=\"hit\"} 1"), "{text}");
    assert!(text.contains("mail_imap_select_cache_total{result=\"miss\"} 1"), "{text}");
    assert!(text.contains("mail_imap_change_checks_total{kind=\"question\"}"), "{text}");
    assert!(text.contains("mail_imap_body_cache_total{result=\"hit\"} 1"), "{text}");
    assert!(text.contains("mail_imap_body_cache_total{result=\"miss\"} 1"), "{text}");
    assert!(text.contains("mail_imap_body_cache_bytes 22"), "{text}");
    assert!(text.contains("mail_imap_fetch_reads_total{kind=\"question\",read=\"link\"} 2"), "{text}");
    c.send("DONE\r\n").await;
    c.line().await;
}

/// RFC 3501 §6.4.4, read closely: HEADER with an empty string matches every
/// message that has the field; SENT* compare the Date: header's day in the zone it
/// is written in; LIST patterns may hold any list-char, `&` included.
#[tokio::test]
async fn search_header_presence_sent_dates_and_list_patterns() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let late = b"From: Alice <alice@example.com>\r\nSubject: late\r\nDate: Mon, 30 Nov 2026 23:30:00 -0800\r\n\r\nlate evening in California\r\n";
    let early = b"From: bob@example.org\r\nTo: Team: x@example.com, y@example.com;\r\nDate: Tue, 01 Dec 2026 00:30:00 +0100\r\n\r\nno subject field at all\r\n";
    deliver(&app, &bob, "INBOX", late, FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", early, FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;

    let r = c.cmd("h1", "SEARCH HEADER SUBJECT \"\"").await;
    assert_eq!(r[0], "* SEARCH 1", "only the message with a Subject field: {r:?}");
    let r = c.cmd("h2", "SEARCH NOT HEADER SUBJECT \"\"").await;
    assert_eq!(r[0], "* SEARCH 2", "{r:?}");
    let r = c.cmd("h3", "SEARCH HEADER FROM \"\"").await;
    assert_eq!(r[0], "* SEARCH 1 2", "{r:?}");
    let r = c.cmd("h4", "SEARCH FROM Alice").await;
    assert_eq!(r[0], "* SEARCH 1", "display names are part of the field: {r:?}");
    // A group's name is part of the envelope's address list, as are its members.
    for (tag, key) in [("h5", "TO team"), ("h6", "TO y@example.com")] {
        let r = c.cmd(tag, &format!("SEARCH {key}")).await;
        assert_eq!(r[0], "* SEARCH 2", "{key}: {r:?}");
    }

    // 23:30 -0800 on the 30th is 07:30 UTC on the 1st; 00:30 +0100 on the 1st is
    // 23:30 UTC on the 30th. The header's own day counts.
    let r = c.cmd("d1", "SEARCH SENTON 30-Nov-2026").await;
    assert_eq!(r[0], "* SEARCH 1", "{r:?}");
    let r = c.cmd("d2", "SEARCH SENTON 1-Dec-2026").await;
    assert_eq!(r[0], "* SEARCH 2", "{r:?}");
    let r = c.cmd("d3", "SEARCH SENTBEFORE 1-Dec-2026").await;
    assert_eq!(r[0], "* SEARCH 1", "{r:?}");
    let r = c.cmd("d4", "SEARCH SENTSINCE 1-Dec-2026").await;
    assert_eq!(r[0], "* SEARCH 2", "{r:?}");

    for (tag, pattern) in [("l1", "&"), ("l2", "\"a&b\""), ("l3", "INBOX.&"), ("l4", "#")] {
        let r = c.cmd(tag, &format!("LIST \"\" {pattern}")).await;
        assert!(tagged(&r).starts_with(&format!("{tag} OK")), "LIST {pattern}: {r:?}");
    }
    let r = c.cmd("l5", "LSUB \"\" &").await;
    assert!(tagged(&r).starts_with("l5 OK"), "{r:?}");
}

/// RFC 6851 §3.3 and RFC 3501 §6.4.7: MOVE and COPY into the selected mailbox are
/// legal. MOVE gives the messages new UIDs (COPYUID), expunges the old ones and
/// announces the new ones; COPY adds them beside the originals.
#[tokio::test]
async fn move_and_copy_into_the_selected_mailbox() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    deliver(&app, &bob, "INBOX", &sample("one", "first"), FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &sample("two", "second"), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("s", "SELECT INBOX").await;
    let validity = r
        .iter()
        .find_map(|l| l.strip_prefix("* OK [UIDVALIDITY "))
        .unwrap()
        .split(']')
        .next()
        .unwrap()
        .to_string();

    let r = c.cmd("m", "MOVE 1 INBOX").await;
    assert!(has(&r, &format!("* OK [COPYUID {validity} 1 3]")), "{r:?}");
    assert!(has(&r, "* 1 EXPUNGE"), "{r:?}");
    assert!(tagged(&r).starts_with("m OK"), "{r:?}");
    let r = c.cmd("n", "NOOP").await;
    let r2 = c.cmd("f", "FETCH 1:* (UID)").await;
    assert_eq!(
        r2[..2],
        ["* 1 FETCH (UID 2)".to_string(), "* 2 FETCH (UID 3)".to_string()],
        "after {r:?}: {r2:?}"
    );

    let r = c.cmd("c", "UID COPY 2 INBOX").await;
    assert!(tagged(&r).starts_with(&format!("c OK [COPYUID {validity} 2 4]")), "{r:?}");
    let r = c.cmd("n2", "NOOP").await;
    assert!(has(&r, "* 3 EXISTS"), "{r:?}");
}

/// RFC 3501 §6.3.9: "foo/bar" subscribed and "foo" not — LSUB "" % returns foo
/// with \Noselect, not foo/bar; LSUB "" * returns foo/bar itself.
#[tokio::test]
async fn lsub_lists_an_unsubscribed_parent_as_noselect() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    for cmd in ["CREATE foo/bar", "SUBSCRIBE foo/bar", "UNSUBSCRIBE foo"] {
        let r = c.cmd("p", cmd).await;
        assert!(tagged(&r).starts_with("p OK") || cmd.starts_with("UNSUBSCRIBE"), "{cmd}: {r:?}");
    }
    // A new account is subscribed to its INBOX and special-use mailboxes: only
    // the foo hierarchy is looked at here.
    let r = c.cmd("l1", "LSUB \"\" f%").await;
    assert_eq!(r, ["* LSUB (\\Noselect) \"/\" \"foo\"", "l1 OK LSUB completed"], "{r:?}");
    let r = c.cmd("l2", "LSUB \"\" f*").await;
    assert_eq!(r, ["* LSUB () \"/\" \"foo/bar\"", "l2 OK LSUB completed"], "{r:?}");
}

/// \Recent (RFC 3501 §2.3.2, §6.3.1-2, §6.3.10, §6.4.4, §7.3.2): a new message is
/// recent for the first session that selects the mailbox (or learns of the message
/// while selected) and for no other; EXAMINE and STATUS only look; RECENT, NEW and
/// OLD search by it; a client cannot set it.
#[tokio::test]
async fn recent_belongs_to_exactly_one_session() {
    // The embedded store (SQLite), plain-text logins for the in-memory connections.
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let seen = FlagSet { system: Flags::SEEN, keywords: vec![] };
    deliver(&app, &bob, "INBOX", &sample("one", "x"), seen).await;
    deliver(&app, &bob, "INBOX", &sample("two", "x"), FlagSet::default()).await;
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    let (mut c, _tc) = login(&app, "bob@example.org", "pw").await;

    let r = c.cmd("st0", "STATUS INBOX (MESSAGES RECENT)").await;
    assert_eq!(r[0], "* STATUS \"INBOX\" (MESSAGES 2 RECENT 2)");

    // EXAMINE shows the recent messages without taking them.
    let r = a.cmd("e", "EXAMINE INBOX").await;
    assert!(has(&r, "* 2 EXISTS") && has(&r, "* 2 RECENT"), "{r:?}");
    let r = a.cmd("ef", "FETCH 1:* (FLAGS)").await;
    assert_eq!(
        r[..2],
        ["* 1 FETCH (FLAGS (\\Seen \\Recent))", "* 2 FETCH (FLAGS (\\Recent))"].map(String::from)
    );
    let r = c.cmd("st1", "STATUS INBOX (RECENT)").await;
    assert_eq!(r[0], "* STATUS \"INBOX\" (RECENT 2)", "EXAMINE took nothing");

    // The first SELECT takes them.
    let r = b.cmd("s", "SELECT INBOX").await;
    assert!(has(&r, "* 2 RECENT"), "{r:?}");
    let r = b.cmd("sr", "SEARCH RECENT").await;
    assert_eq!(r[0], "* SEARCH 1 2");
    let r = b.cmd("sn", "SEARCH NEW").await;
    assert_eq!(r[0], "* SEARCH 2", "NEW is RECENT UNSEEN");
    let r = b.cmd("so", "SEARCH OLD").await;
    assert_eq!(r[0], "* SEARCH");
    let r = c.cmd("st2", "STATUS INBOX (RECENT)").await;
    assert_eq!(r[0], "* STATUS \"INBOX\" (RECENT 0)");

    // A later SELECT gets none of them.
    let r = c.cmd("s", "SELECT INBOX").await;
    assert!(has(&r, "* 2 EXISTS") && has(&r, "* 0 RECENT"), "{r:?}");
    let r = c.cmd("f", "FETCH 1:* (FLAGS)").await;
    assert_eq!(r[..2], ["* 1 FETCH (FLAGS (\\Seen))", "* 2 FETCH (FLAGS ())"].map(String::from));
    let r = c.cmd("so", "SEARCH OLD").await;
    assert_eq!(r[0], "* SEARCH 1 2");
    // \Recent cannot be altered by a client (§2.3.2): refused, nothing changed.
    let r = c.cmd("x", "STORE 2 +FLAGS (\\Recent \\Flagged)").await;
    assert!(tagged(&r).starts_with("x BAD"), "{r:?}");
    let r = c.cmd("f2", "FETCH 2 (FLAGS)").await;
    assert_eq!(r[0], "* 2 FETCH (FLAGS ())");

    // New mail: recent for the one read-write session that learns of it first.
    deliver(&app, &bob, "INBOX", &sample("three", "x"), FlagSet::default()).await;
    let r = c.cmd("n", "NOOP").await;
    assert_eq!(r[..2], ["* 3 EXISTS", "* 1 RECENT"].map(String::from), "{r:?}");
    let r = c.cmd("f3", "FETCH 3 (FLAGS)").await;
    assert_eq!(r[0], "* 3 FETCH (FLAGS (\\Recent))");
    let r = b.cmd("n", "NOOP").await;
    assert_eq!(r[..2], ["* 3 EXISTS", "* 2 RECENT"].map(String::from), "b keeps its two: {r:?}");
    let r = b.cmd("f3", "FETCH 3 (FLAGS)").await;
    assert_eq!(r[0], "* 3 FETCH (FLAGS ())");
    // The read-only session cannot tell and treats it as recent (§2.3.2 SHOULD).
    let r = a.cmd("n", "NOOP").await;
    assert_eq!(r[..2], ["* 3 EXISTS", "* 3 RECENT"].map(String::from), "{r:?}");
}

/// ESEARCH (RFC 4731, its §3 examples in shape): RETURN (MIN MAX COUNT ALL), the
/// empty list meaning ALL, no MIN/MAX/ALL for no match, UID results for UID
/// SEARCH, ranges in ALL, options the server does not know refused.
#[tokio::test]
async fn esearch_returns_what_was_asked() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let flagged = FlagSet { system: Flags::FLAGGED, keywords: vec![] };
    for i in 1..=8 {
        let flags = if [2, 3, 4, 7].contains(&i) { flagged.clone() } else { FlagSet::default() };
        deliver(&app, &bob, "INBOX", &sample(&format!("m{i}"), "x"), flags).await;
    }
    let (mut c, _t) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("cap", "CAPABILITY").await;
    assert!(r[0].contains(" ESEARCH"), "{r:?}");
    c.cmd("s", "SELECT INBOX").await;
    // Expunge UID 1 so sequence numbers and UIDs differ by one.
    c.cmd("d", "STORE 1 +FLAGS.SILENT (\\Deleted)").await;
    c.cmd("x", "EXPUNGE").await;

    let r = c.cmd("A282", "SEARCH RETURN (MIN COUNT) FLAGGED").await;
    assert_eq!(r, ["* ESEARCH (TAG \"A282\") MIN 1 COUNT 4", "A282 OK SEARCH completed"].map(String::from));
    let r = c.cmd("A283", "SEARCH RETURN () FLAGGED").await;
    assert_eq!(r[0], "* ESEARCH (TAG \"A283\") ALL 1:3,6");
    let r = c.cmd("A284", "SEARCH RETURN (MIN COUNT) KEYWORD $Nothing").await;
    assert_eq!(r[0], "* ESEARCH (TAG \"A284\") COUNT 0");
    let r = c.cmd("A285", "UID SEARCH RETURN (MIN MAX) 1:5000").await;
    assert_eq!(
        r,
        ["* ESEARCH (TAG \"A285\") UID MIN 2 MAX 8", "A285 OK UID SEARCH completed"].map(String::from)
    );
    let r = c.cmd("A286", "UID SEARCH RETURN (ALL COUNT MAX) UNFLAGGED").await;
    assert_eq!(r[0], "* ESEARCH (TAG \"A286\") UID MAX 8 COUNT 3 ALL 5:6,8");
    let r = c.cmd("A287", "SEARCH RETURN (MAX) CHARSET UTF-8 SUBJECT m3").await;
    assert_eq!(r[0], "* ESEARCH (TAG \"A287\") MAX 2");
    // A plain SEARCH still answers the RFC 3501 way.
    let r = c.cmd("p", "SEARCH FLAGGED").await;
    assert_eq!(r[0], "* SEARCH 1 2 3 6");
    for (tag, bad) in [("b1", "SEARCH RETURN (BOGUS) ALL"), ("b3", "SEARCH RETURN MIN ALL")] {
        let r = c.cmd(tag, bad).await;
        assert!(r.last().unwrap().starts_with(&format!("{tag} BAD")), "{bad}: {r:?}");
    }
}

/// SORT (RFC 5256 §3): by each key the RFC defines, REVERSE per key, ties in
/// mailbox order, base subjects without Re:/Fwd:/[blob], DATE in UTC with the
/// arrival time for a message without a Date:, UID SORT answering UIDs, and the
/// search criteria and charset as SEARCH has them.
#[tokio::test]
async fn sort_orders_by_the_rfc_keys() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let message = |from: &str, subject: &str, date: Option<&str>, body: &str| {
        let date = date.map(|d| format!("Date: {d}\r\n")).unwrap_or_default();
        format!("From: {from}\r\nTo: bob@example.org\r\nSubject: {subject}\r\n{date}\r\n{body}\r\n")
            .into_bytes()
    };
    // UID 1 is expunged below, so sequence numbers are UIDs - 1.
    let m = [
        message("zed@example.com", "gone", Some("Mon, 1 Jan 2024 00:00:00 +0000"), "x"),
        message("Carol <carol@example.com>", "Re: [list] beta", Some("Wed, 3 Jan 2024 10:00:00 +0000"), "xx"),
        message("alice@example.com", "alpha", Some("Wed, 3 Jan 2024 09:00:00 -0200"), "xxxxxxxx"),
        message(
            "\"Doe, Bob\" <bob@example.net>",
            "Fwd: Alpha (fwd)",
            Some("Tue, 2 Jan 2024 12:00:00 +0000"),
            "xxxx",
        ),
        message("alice@example.com", "gamma", None, "xxx"),
    ];
    for raw in &m {
        deliver(&app, &bob, "INBOX", raw, FlagSet::default()).await;
    }
    let (mut c, _t) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("cap", "CAPABILITY").await;
    assert!(r[0].contains(" SORT"), "{r:?}");
    c.cmd("s", "SELECT INBOX").await;
    c.cmd("d", "UID STORE 1 +FLAGS.SILENT (\\Deleted)").await;
    c.cmd("x", "EXPUNGE").await;

    async fn sort<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        c: &mut Client<S>,
        tag: &str,
        args: &str,
    ) -> String {
        let r = c.cmd(tag, &format!("SORT {args}")).await;
        assert_eq!(r.last().map(String::as_str), Some(format!("{tag} OK SORT completed").as_str()), "{r:?}");
        r[0].clone()
    }
    // Subjects: beta, alpha, Alpha, gamma → alpha ties with Alpha (mailbox order).
    assert_eq!(sort(&mut c, "a", "(SUBJECT) UTF-8 ALL").await, "* SORT 2 3 1 4");
    assert_eq!(sort(&mut c, "b", "(REVERSE SUBJECT) UTF-8 ALL").await, "* SORT 4 1 2 3");
    // Dates in UTC: 3 Jan 10:00, 3 Jan 11:00, 2 Jan 12:00, and the arrival time
    // (now) for the message without a Date:.
    assert_eq!(sort(&mut c, "c", "(DATE) UTF-8 ALL").await, "* SORT 3 1 2 4");
    assert_eq!(sort(&mut c, "e", "(FROM REVERSE SIZE) UTF-8 ALL").await, "* SORT 2 4 3 1");
    assert_eq!(sort(&mut c, "f", "(ARRIVAL) US-ASCII ALL").await, "* SORT 1 2 3 4");
    assert_eq!(sort(&mut c, "g", "(SIZE) UTF-8 FROM alice").await, "* SORT 4 2");
    assert_eq!(sort(&mut c, "h", "(TO SUBJECT) UTF-8 ALL").await, "* SORT 2 3 1 4");
    // SORT=DISPLAY (RFC 5957): the display name, else the address; "Doe, Bob"
    // after Carol, where FROM puts bob before carol.
    assert_eq!(sort(&mut c, "i", "(DISPLAYFROM) UTF-8 ALL").await, "* SORT 2 4 1 3");
    assert_eq!(sort(&mut c, "j", "(REVERSE DISPLAYFROM) UTF-8 ALL").await, "* SORT 3 1 2 4");
    assert_eq!(sort(&mut c, "k", "(DISPLAYTO) UTF-8 ALL").await, "* SORT 1 2 3 4");
    let r = c.cmd("u", "UID SORT (REVERSE DATE) UTF-8 ALL").await;
    assert_eq!(r, ["* SORT 5 3 2 4", "u OK UID SORT completed"].map(String::from));
    // ESORT (RFC 5267 §3.2): the same order as an ESEARCH answer; MIN and MAX are
    // the first and last in that order, ALL keeps it.
    let r = c.cmd("es1", "SORT RETURN (MIN MAX COUNT ALL) (SUBJECT) UTF-8 ALL").await;
    assert_eq!(
        r,
        ["* ESEARCH (TAG \"es1\") MIN 2 MAX 4 COUNT 4 ALL 2:3,1,4", "es1 OK SORT completed"]
            .map(String::from)
    );
    let r = c.cmd("es2", "UID SORT RETURN (ALL) (REVERSE DATE) UTF-8 ALL").await;
    assert_eq!(r[0], "* ESEARCH (TAG \"es2\") UID ALL 5,3,2,4");
    let r = c.cmd("es3", "SORT RETURN (COUNT) (SUBJECT) UTF-8 SUBJECT nothing").await;
    assert_eq!(r[0], "* ESEARCH (TAG \"es3\") COUNT 0");
    let r = c.cmd("es4", "SORT RETURN (SAVE) (SUBJECT) UTF-8 ALL").await;
    assert!(r[0].starts_with("es4 BAD"), "{r:?}");
    // The mailbox changes after a sort by the same keys (and a narrow one between):
    // arrivals take their place in the order, the expunged leave it.
    let r = c.cmd("u1", "UID SORT (SUBJECT) UTF-8 ALL").await;
    assert_eq!(r[0], "* SORT 3 4 2 5");
    let r = c.cmd("n", "SORT (SUBJECT) UTF-8 SUBJECT nothing").await;
    assert_eq!(r[0], "* SORT");
    deliver(&app, &bob, "INBOX", &message("dan@example.com", "Re: aardvark", None, "x"), FlagSet::default())
        .await;
    deliver(&app, &bob, "INBOX", &message("eve@example.com", "delta", None, "x"), FlagSet::default()).await;
    c.cmd("d3", "UID STORE 3 +FLAGS.SILENT (\\Deleted)").await;
    c.cmd("x3", "EXPUNGE").await;
    let r = c.cmd("u2", "UID SORT (SUBJECT) UTF-8 ALL").await;
    assert!(r.contains(&"* SORT 6 4 2 7 5".to_string()), "{r:?}");
    let r = c.cmd("u3", "UID SORT (REVERSE SUBJECT) UTF-8 NOT FROM eve").await;
    assert!(r.contains(&"* SORT 5 2 4 6".to_string()), "{r:?}");
    let r = c.cmd("u4", "UID SORT (SUBJECT) UTF-8 ALL").await;
    assert!(r.contains(&"* SORT 6 4 2 7 5".to_string()), "{r:?}");
    let r = c.cmd("cs", "SORT (SUBJECT) KOI8-R ALL").await;
    assert!(r.last().unwrap().starts_with("cs NO [BADCHARSET"), "{r:?}");
    for (tag, bad) in
        [("b1", "SORT (BOGUS) UTF-8 ALL"), ("b2", "SORT SUBJECT UTF-8 ALL"), ("b3", "SORT (SUBJECT) UTF-8")]
    {
        let r = c.cmd(tag, bad).await;
        assert!(r.last().unwrap().starts_with(&format!("{tag} BAD")), "{bad}: {r:?}");
    }
}

/// THREAD (RFC 5256 §2, §4): REFERENCES from Message-ID / References /
/// In-Reply-To read from the stored headers, ORDEREDSUBJECT by base subject, the
/// response nesting, UID THREAD, and the search criteria applied first.
/// Subjects in UTF-8 (RFC 6532 headers, or RFC 2047 words decoded) sort and
/// thread like any other; a marker test counting bytes used to panic the
/// session's task on them (`Grüße`, `[Fwd: ßß]`).
#[tokio::test]
async fn sort_and_thread_take_utf8_subjects() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for subject in ["Grüße", "=?UTF-8?Q?Gr=C3=BC=C3=9Fe?= (fwd)", "[Fwd: ßß]", "Apfel"] {
        deliver(&app, &bob, "INBOX", &sample(subject, "x"), FlagSet::default()).await;
    }
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    let r = c.cmd("o1", "SORT (SUBJECT) UTF-8 ALL").await;
    assert_eq!(r, ["* SORT 4 1 2 3", "o1 OK SORT completed"]);
    let r = c.cmd("o2", "THREAD ORDEREDSUBJECT UTF-8 ALL").await;
    // Threads in the order of their first message's date (all equal here: then by
    // sequence number).
    assert_eq!(r, ["* THREAD (1 2)(3)(4)", "o2 OK THREAD completed"]);
    let r = c.cmd("o3", "SEARCH YOUNGER 3600").await;
    assert_eq!(r[0], "* SEARCH 1 2 3 4");
}

/// "Any of these" searches as clients write them: n alternatives as n − 1
/// nested ORs, chained either way, deeper than the parser's nine levels.
#[tokio::test]
async fn long_or_chains_search_sort_and_thread() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for i in 0..30 {
        let raw = format!(
            "From: sender{i}@example.com\r\nTo: bob@example.org\r\nSubject: note {i}\r\nMessage-ID: <m{i}@example.com>\r\n\r\nbody {i}\r\n"
        );
        deliver(&app, &bob, "INBOX", raw.as_bytes(), FlagSet::default()).await;
    }
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    // Right-nested: OR a (OR b (OR c …)).
    let wanted = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29];
    let keys: Vec<String> = wanted.iter().map(|i| format!("FROM sender{i}@")).collect();
    let right = format!("{}{}", "OR ".repeat(keys.len() - 1), keys.join(" "));
    let seqs: Vec<String> = wanted.iter().map(|i| (i + 1).to_string()).collect();
    let r = c.cmd("o1", &format!("SEARCH {right}")).await;
    assert_eq!(r, [format!("* SEARCH {}", seqs.join(" ")), "o1 OK SEARCH completed".into()]);
    // A Message-ID as clients search for it: with its angle brackets, as the
    // field holds it, or any part of it.
    let r = c.cmd("h1", "SEARCH HEADER Message-ID <m3@example.com>").await;
    assert_eq!(r[0], "* SEARCH 4");
    let r = c.cmd("h2", "SEARCH HEADER MESSAGE-ID \"m4@EXAMPLE.com>\"").await;
    assert_eq!(r[0], "* SEARCH 5");
    let r = c.cmd("h3", "SEARCH HEADER Message-ID <m3@example.co>").await;
    assert_eq!(r[0], "* SEARCH");
    // Left-nested, Message-IDs, one in a literal, under NOT and in parentheses.
    let mut left = String::from("HEADER Message-ID <m0@example.com>");
    for i in 1..25 {
        let id = format!("<m{i}@example.com>");
        let id = if i == 12 { format!("{{{}+}}\r\n{id}", id.len()) } else { id };
        left = format!("OR {left} HEADER Message-ID {id}");
    }
    let r = c.cmd("o2", &format!("UID SEARCH NOT ({left})")).await;
    assert_eq!(r, ["* SEARCH 26 27 28 29 30", "o2 OK UID SEARCH completed"]);
    let r = c.cmd("o3", &format!("SORT (REVERSE ARRIVAL) UTF-8 {right}")).await;
    let reversed: Vec<String> = seqs.iter().rev().cloned().collect();
    assert_eq!(r[0], format!("* SORT {}", reversed.join(" ")));
    let r = c.cmd("o4", &format!("UID THREAD ORDEREDSUBJECT UTF-8 SEEN {right}")).await;
    assert_eq!(r, ["* THREAD", "o4 OK UID THREAD completed"], "nothing is \\Seen");
    let r = c.cmd("o5", &format!("SEARCH RETURN (COUNT) {right}")).await;
    assert_eq!(r[0], "* ESEARCH (TAG \"o5\") COUNT 10");
    // Nesting that is not an OR chain keeps the parser's limit.
    let r = c.cmd("o6", &format!("SEARCH {}ALL", "NOT ".repeat(12))).await;
    assert!(tagged(&r).starts_with("o6 BAD"), "{r:?}");
}

#[tokio::test]
async fn thread_by_references_and_by_subject() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let message = |id: &str, subject: &str, day: u32, refs: &str| {
        format!(
            "From: a@example.com\r\nTo: bob@example.org\r\nSubject: {subject}\r\nMessage-ID: <{id}@x>\r\n\
             Date: Mon, {day} Jan 2024 10:00:00 +0000\r\n{refs}\r\nbody\r\n"
        )
        .into_bytes()
    };
    let raw = [
        message("a", "Lunch", 1, ""),
        message("b", "Re: Lunch", 2, "In-Reply-To: <a@x>\r\n"),
        message("z", "Budget", 3, ""),
        message("c", "Re: Lunch", 4, "References: <a@x>\r\n <b@x>\r\n"),
        message("d", "Re: Lunch", 5, "References: <a@x>\r\n"),
        message("e", "Re: Budget", 6, "In-Reply-To: <missing@x>\r\n"),
    ];
    for r in &raw {
        deliver(&app, &bob, "INBOX", r, FlagSet::default()).await;
    }
    let (mut c, _t) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("cap", "CAPABILITY").await;
    assert!(r[0].contains(" THREAD=REFERENCES") && r[0].contains(" THREAD=ORDEREDSUBJECT"), "{r:?}");
    c.cmd("s", "SELECT INBOX").await;

    let r = c.cmd("t1", "THREAD REFERENCES UTF-8 ALL").await;
    // a ← b ← c, a ← d; z, and e (its parent unknown) joined to z by subject.
    assert_eq!(r, ["* THREAD (1 (2 4)(5))(3 6)", "t1 OK THREAD completed"].map(String::from));
    let r = c.cmd("t2", "THREAD ORDEREDSUBJECT UTF-8 ALL").await;
    assert_eq!(r[0], "* THREAD (1 (2)(4)(5))(3 6)");
    c.cmd("d", "UID STORE 2 +FLAGS.SILENT (\\Deleted)").await;
    c.cmd("x", "EXPUNGE").await;
    // UID 2 is gone: c's chain still goes through it (References names it).
    let r = c.cmd("t3", "UID THREAD REFERENCES UTF-8 ALL").await;
    assert_eq!(r, ["* THREAD (1 (4)(5))(3 6)", "t3 OK UID THREAD completed"].map(String::from));
    let r = c.cmd("t4", "THREAD REFERENCES UTF-8 SUBJECT budget").await;
    assert_eq!(r[0], "* THREAD (2 5)");
    let r = c.cmd("t5", "THREAD REFERENCES UTF-8 SUBJECT nothing").await;
    assert_eq!(r[0], "* THREAD");
    for (tag, bad) in [("b1", "THREAD BOGUS UTF-8 ALL"), ("b2", "THREAD REFERENCES UTF-8")] {
        let r = c.cmd(tag, bad).await;
        assert!(r.last().unwrap().starts_with(&format!("{tag} BAD")), "{bad}: {r:?}");
    }
}

/// LIST-EXTENDED (RFC 5258), LIST-STATUS (RFC 5819) and STATUS=SIZE (RFC 8438):
/// selection and return options, several patterns, \NonExistent subscribed names,
/// CHILDINFO with RECURSIVEMATCH, a STATUS line after each selectable mailbox, and
/// SIZE as the sum of the messages' octets.
#[tokio::test]
async fn list_extended_and_status_size() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let one = sample("one", "first body");
    let two = sample("two", "second");
    deliver(&app, &bob, "INBOX", &one, FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &two, FlagSet { system: Flags::SEEN, keywords: vec![] }).await;
    let (mut c, _t) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("cap", "CAPABILITY").await;
    for cap in [" LIST-EXTENDED", " LIST-STATUS", " STATUS=SIZE"] {
        assert!(r[0].contains(cap), "{cap}: {r:?}");
    }
    // Gone stays subscribed after its deletion (RFC 3501 §6.3.6).
    for cmd in
        ["CREATE Work/Reports", "SUBSCRIBE Work/Reports", "CREATE Gone", "SUBSCRIBE Gone", "DELETE Gone"]
    {
        let r = c.cmd("p", cmd).await;
        assert!(r.last().unwrap().starts_with("p OK"), "{cmd}: {r:?}");
    }

    let size = one.len() + two.len();
    let r = c.cmd("s1", "STATUS INBOX (MESSAGES SIZE UNSEEN)").await;
    assert_eq!(r[0], format!("* STATUS \"INBOX\" (MESSAGES 2 SIZE {size} UNSEEN 1)"));
    let r = c.cmd("s2", "STATUS INBOX (SIZE)").await;
    assert_eq!(r, [format!("* STATUS \"INBOX\" (SIZE {size})"), "s2 OK STATUS completed".into()]);
    // APPENDLIMIT (RFC 7889): announced once for every mailbox, and per mailbox.
    let limit = app.config.imap.max_literal_bytes;
    let r = c.cmd("s3", "CAPABILITY").await;
    assert!(r[0].contains(&format!(" APPENDLIMIT={limit}")), "{r:?}");
    let r = c.cmd("s4", "STATUS INBOX (APPENDLIMIT MESSAGES)").await;
    assert_eq!(r[0], format!("* STATUS \"INBOX\" (APPENDLIMIT {limit} MESSAGES 2)"));

    // LIST-STATUS: a STATUS line right after each selectable mailbox.
    let r = c.cmd("l1", "LIST \"\" (INBOX Work) RETURN (STATUS (MESSAGES UNSEEN SIZE))").await;
    assert_eq!(
        r,
        [
            "* LIST (\\HasNoChildren) \"/\" \"INBOX\"".to_string(),
            format!("* STATUS \"INBOX\" (MESSAGES 2 UNSEEN 1 SIZE {size})"),
            "* LIST (\\HasChildren) \"/\" \"Work\"".to_string(),
            "* STATUS \"Work\" (MESSAGES 0 UNSEEN 0 SIZE 0)".to_string(),
            "l1 OK LIST completed".to_string(),
        ]
    );
    // Selection SUBSCRIBED: subscribed names only, a deleted one as \NonExistent.
    let r = c.cmd("l2", "LIST (SUBSCRIBED) \"\" \"*\"").await;
    assert!(has(&r, "* LIST (\\NonExistent \\Subscribed) \"/\" \"Gone\""), "{r:?}");
    assert!(has(&r, "* LIST (\\HasNoChildren \\Subscribed) \"/\" \"Work/Reports\""), "{r:?}");
    assert!(!r.iter().any(|l| l.ends_with("\"Work\"")), "Work is not subscribed: {r:?}");
    // RECURSIVEMATCH: Work matches `%` and has a subscribed child.
    let r = c.cmd("l3", "LIST (SUBSCRIBED RECURSIVEMATCH) \"\" \"%\"").await;
    assert!(has(&r, "* LIST (\\HasChildren) \"/\" \"Work\" (\"CHILDINFO\" (\"SUBSCRIBED\"))"), "{r:?}");
    // …but not when that child is listed itself: Work is neither subscribed nor
    // the parent of a subscribed name the patterns leave out.
    let r = c.cmd("l3b", "LIST (SUBSCRIBED RECURSIVEMATCH) \"\" (Work Work/Reports)").await;
    assert_eq!(
        r,
        ["* LIST (\\HasNoChildren \\Subscribed) \"/\" \"Work/Reports\"", "l3b OK LIST completed"],
        "{r:?}"
    );
    // Return SUBSCRIBED on a plain selection.
    let r = c.cmd("l4", "LIST \"\" \"Work/%\" RETURN (SUBSCRIBED CHILDREN)").await;
    assert_eq!(r[0], "* LIST (\\HasNoChildren \\Subscribed) \"/\" \"Work/Reports\"");
    // Selection SPECIAL-USE (RFC 6154): the special-use mailboxes only.
    let r = c.cmd("l5", "LIST (SPECIAL-USE) \"\" \"*\"").await;
    assert!(
        r.iter().filter(|l| l.starts_with("* LIST")).all(|l| l.contains("\\Sent")
            || l.contains("\\Trash")
            || l.contains("\\Drafts")
            || l.contains("\\Junk")
            || l.contains("\\Archive")),
        "{r:?}"
    );
    // A plain RFC 3501 LIST is unchanged.
    let r = c.cmd("l6", "LIST \"\" INBOX").await;
    assert_eq!(r[0], "* LIST (\\HasNoChildren) \"/\" \"INBOX\"");
    for (tag, bad) in [
        ("b1", "LIST (BOGUS) \"\" \"*\""),
        ("b2", "LIST (RECURSIVEMATCH) \"\" \"*\""),
        ("b3", "LIST \"\" \"*\" RETURN (STATUS (BOGUS))"),
        ("b4", "STATUS INBOX (SIZE BOGUS)"),
    ] {
        let r = c.cmd(tag, bad).await;
        assert!(r.last().unwrap().starts_with(&format!("{tag} BAD")), "{bad}: {r:?}");
    }
}

/// SEARCHRES (RFC 5182): SEARCH RETURN (SAVE) keeps the result as `$`, answered
/// by the tagged OK alone; `$` then names those messages in FETCH, UID STORE,
/// SEARCH (as a key, combined with others), UID COPY; SAVE with MIN/MAX keeps just
/// those; a new SELECT forgets it; `$` inside strings and `$Junk` are not it.
#[tokio::test]
async fn searchres_saves_and_reuses_a_result() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let flagged = FlagSet { system: Flags::FLAGGED, keywords: vec![] };
    for i in 1..=6 {
        let flags = if i % 2 == 0 { flagged.clone() } else { FlagSet::default() };
        deliver(&app, &bob, "INBOX", &sample(&format!("m{i}"), "x"), flags).await;
    }
    let (mut c, _t) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("cap", "CAPABILITY").await;
    assert!(r[0].contains(" SEARCHRES"), "{r:?}");
    c.cmd("s", "SELECT INBOX").await;
    let r = c.cmd("a", "FETCH $ (UID)").await;
    assert_eq!(r, ["a OK FETCH completed (the saved result is empty)"]);

    let r = c.cmd("A282", "SEARCH RETURN (SAVE) FLAGGED").await;
    assert_eq!(r, ["A282 OK SEARCH completed"], "SAVE alone: no ESEARCH");
    let r = c.cmd("A283", "FETCH $ (UID)").await;
    assert_eq!(r[..3], ["* 2 FETCH (UID 2)", "* 4 FETCH (UID 4)", "* 6 FETCH (UID 6)"].map(String::from));
    let r = c.cmd("A284", "UID STORE $ +FLAGS.SILENT ($Done)").await;
    assert!(r.last().unwrap().starts_with("A284 OK"), "{r:?}");
    let r = c.cmd("A285", "SEARCH $ KEYWORD $Done SUBJECT m4").await;
    assert_eq!(r[0], "* SEARCH 4");
    let r = c.cmd("A286", "SEARCH OR $ SUBJECT m1").await;
    assert_eq!(r[0], "* SEARCH 1 2 4 6");
    c.cmd("cr", "CREATE Other").await;
    let r = c.cmd("A287", "UID COPY $ Other").await;
    assert!(
        r.last().unwrap().starts_with("A287 OK [COPYUID ") && r.last().unwrap().contains(" 2,4,6 1:3]"),
        "{r:?}"
    );
    // Expunged messages drop out of $.
    c.cmd("d", "UID STORE 4 +FLAGS.SILENT (\\Deleted)").await;
    c.cmd("x", "EXPUNGE").await;
    let r = c.cmd("f", "UID FETCH $ (UID)").await;
    assert_eq!(r[..2], ["* 2 FETCH (UID 2)", "* 5 FETCH (UID 6)"].map(String::from));
    // SAVE with MIN MAX: those two only, and an ESEARCH for them.
    let r = c.cmd("mm", "UID SEARCH RETURN (SAVE MIN MAX) ALL").await;
    assert_eq!(r[0], "* ESEARCH (TAG \"mm\") UID MIN 1 MAX 6");
    let r = c.cmd("f2", "UID FETCH $ (UID)").await;
    assert_eq!(r[..2], ["* 1 FETCH (UID 1)", "* 5 FETCH (UID 6)"].map(String::from));
    // A new SELECT starts with an empty $.
    c.cmd("s2", "SELECT INBOX").await;
    let r = c.cmd("n", "SEARCH $").await;
    assert_eq!(r[0], "* SEARCH");
}

/// Expunge tombstones pruned while a session (and the process's SELECT cache) still
/// had the old view: the session learns what went from the full UID list, in
/// protocol order, and a later SELECT from the cache shows the mailbox as it is.
#[tokio::test]
async fn sessions_catch_up_after_tombstones_are_pruned() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for i in 1..=5 {
        deliver(&app, &bob, "INBOX", &sample(&format!("m{i}"), "x"), FlagSet::default()).await;
    }
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    a.cmd("s", "SELECT INBOX").await;
    b.cmd("s", "SELECT INBOX").await;
    b.cmd("d", "UID STORE 2,4 +FLAGS.SILENT (\\Deleted)").await;
    b.cmd("x", "EXPUNGE").await;
    let pruned = app.store.prune_tombstones(chrono::Utc::now() + chrono::Duration::seconds(5)).await.unwrap();
    assert_eq!(pruned, 2);

    let r = a.cmd("n", "NOOP").await;
    assert_eq!(r[..2], ["* 4 EXPUNGE", "* 2 EXPUNGE"].map(String::from), "{r:?}");
    let r = a.cmd("f", "FETCH 1:* (UID)").await;
    assert_eq!(r[..3], ["* 1 FETCH (UID 1)", "* 2 FETCH (UID 3)", "* 3 FETCH (UID 5)"].map(String::from));
    let (mut c, _tc) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("s", "SELECT INBOX").await;
    assert!(has(&r, "* 3 EXISTS"), "{r:?}");
    let r = c.cmd("f", "UID SEARCH ALL").await;
    assert_eq!(r[0], "* SEARCH 1 3 5");
}

/// A header list asked again is answered from the process's metadata cache —
/// with the flags of now, not of when the metadata was read — and after INBOX is
/// renamed away (its messages move to a new mailbox, INBOX goes on under a new
/// UIDVALIDITY) each mailbox's list names its own messages.
#[tokio::test]
async fn header_lists_come_from_the_metadata_cache_with_current_flags() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for subject in ["one", "two", "three"] {
        deliver(&app, &bob, "INBOX", &sample(subject, "body"), FlagSet::default()).await;
    }
    let meta_cache = |result: &str| app.metrics.imap.meta_cache.with_label_values(&[result]).get();
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    a.cmd("a1", "SELECT INBOX").await;
    b.cmd("b1", "SELECT INBOX").await;
    let r = a.cmd("a2", "FETCH 1:3 (FLAGS ENVELOPE)").await;
    assert!(
        r[1].starts_with("* 2 FETCH (FLAGS (") && !r[1].contains("Flagged") && r[1].contains("\"two\""),
        "{r:?}"
    );
    assert_eq!((meta_cache("hit"), meta_cache("miss")), (0, 3));

    let r = b.cmd("b2", "STORE 2 +FLAGS (\\Flagged $Later)").await;
    assert_eq!(tagged(&r), "b2 OK STORE completed");
    let r = a.cmd("a3", "FETCH 1:3 (FLAGS ENVELOPE RFC822.SIZE)").await;
    let line = r.iter().find(|l| l.starts_with("* 2 FETCH (FLAGS (")).expect("message 2");
    assert!(line.contains("\\Flagged") && line.contains("$Later") && line.contains("\"two\""), "{r:?}");
    assert!(has(&r, "* 3 FETCH (") && has(&r, "\"three\""), "{r:?}");
    assert_eq!(tagged(&r), "a3 OK FETCH completed");
    assert_eq!((meta_cache("hit"), meta_cache("miss")), (3, 3), "the second list is served from the cache");

    let r = a.cmd("a4", "RENAME INBOX Old").await;
    assert_eq!(tagged(&r), "a4 OK RENAME completed");
    deliver(&app, &bob, "INBOX", &sample("four", "body"), FlagSet::default()).await;
    a.cmd("a5", "SELECT INBOX").await;
    let r = a.cmd("a6", "UID FETCH 1:* (ENVELOPE)").await;
    assert!(has(&r, "\"four\"") && !has(&r, "\"one\""), "{r:?}");
    a.cmd("a7", "SELECT Old").await;
    let r = a.cmd("a8", "FETCH 1:3 (ENVELOPE)").await;
    assert!(
        has(&r, "\"one\"") && has(&r, "\"two\"") && has(&r, "\"three\"") && !has(&r, "\"four\""),
        "{r:?}"
    );
}

/// A session's own APPEND and EXPUNGE in its selected mailbox: announced at once
/// (RFC 3501 §6.3.11: the server SHOULD send EXISTS when appending to the selected
/// mailbox), with the flags and keywords the message was stored with, \Recent for
/// this session alone — and what other sessions changed meanwhile is announced
/// with it, never lost.
#[tokio::test]
async fn own_append_and_expunge_update_the_selected_view() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for i in 0..2 {
        deliver(&app, &bob, "INBOX", &sample(&format!("m{i}"), "x"), FlagSet::default()).await;
    }
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    let r = a.cmd("s", "SELECT INBOX").await;
    assert!(has(&r, "* 2 RECENT"), "{r:?}");

    // Nothing else changed: the new keyword widens FLAGS, then EXISTS and RECENT.
    let msg = String::from_utf8(sample("mine", "x")).expect("utf8");
    let r = a.cmd("a1", &format!("APPEND INBOX (\\Seen $Mine) {{{}+}}\r\n{msg}", msg.len())).await;
    assert!(r[0].starts_with("* FLAGS (") && r[0].contains("$Mine"), "{r:?}");
    assert!(r[1].starts_with("* OK [PERMANENTFLAGS (") && r[1].contains("$Mine"), "{r:?}");
    assert_eq!(r[2..4], ["* 3 EXISTS", "* 3 RECENT"].map(String::from), "{r:?}");
    assert!(tagged(&r).starts_with("a1 OK [APPENDUID ") && tagged(&r).contains(" 3] "), "{r:?}");
    let r = a.cmd("f1", "FETCH 3 (UID FLAGS)").await;
    assert_eq!(r[0], "* 3 FETCH (UID 3 FLAGS (\\Seen \\Recent $Mine))");
    // Taken by the appending session: no other session gets it as \Recent.
    let r = b.cmd("st", "STATUS INBOX (MESSAGES RECENT)").await;
    assert_eq!(r[0], "* STATUS \"INBOX\" (MESSAGES 3 RECENT 0)");

    // Another session's delivery and flag change land before the next APPEND:
    // the APPEND's answer carries them as well as its own message.
    b.cmd("s", "SELECT INBOX").await;
    b.cmd("f", "STORE 1 +FLAGS (\\Flagged)").await;
    deliver(&app, &bob, "INBOX", &sample("theirs", "x"), FlagSet::default()).await;
    let r = a.cmd("a2", &format!("APPEND INBOX {{{}+}}\r\n{msg}", msg.len())).await;
    assert!(has(&r, "* 1 FETCH (UID 1 FLAGS (\\Flagged \\Recent))"), "{r:?}");
    assert!(has(&r, "* 5 EXISTS") && has(&r, "* 5 RECENT"), "{r:?}");
    let r = a.cmd("f2", "UID FETCH 4:5 (FLAGS)").await;
    assert_eq!(
        r[..2],
        ["* 4 FETCH (UID 4 FLAGS (\\Recent))", "* 5 FETCH (UID 5 FLAGS (\\Recent))"].map(String::from)
    );

    // EXPUNGE alone: its own EXPUNGE lines, nothing else.
    a.cmd("d1", "STORE 2 +FLAGS.SILENT (\\Deleted)").await;
    let r = a.cmd("e1", "EXPUNGE").await;
    assert_eq!(r, ["* 2 EXPUNGE", "e1 OK EXPUNGE completed"].map(String::from));
    // EXPUNGE after another session's change: that change comes with it.
    a.cmd("d2", "UID STORE 5 +FLAGS.SILENT (\\Deleted)").await;
    b.cmd("n", "NOOP").await;
    b.cmd("f", "UID STORE 3 +FLAGS (\\Answered)").await;
    let r = a.cmd("e2", "EXPUNGE").await;
    assert!(has(&r, "* 4 EXPUNGE"), "{r:?}");
    assert!(has(&r, "* 2 FETCH (UID 3 FLAGS (\\Seen \\Answered \\Recent $Mine))"), "{r:?}");
    let r = a.cmd("f3", "FETCH 1:* (UID)").await;
    assert_eq!(
        r[..3],
        ["* 1 FETCH (UID 1)", "* 2 FETCH (UID 3)", "* 3 FETCH (UID 4)"].map(String::from),
        "{r:?}"
    );
}

/// An APPEND that group commit stores in one change with another delivery to the
/// same mailbox: the change is one modseq above the session's view, yet holds a
/// message the session did not write. The APPEND's answer announces both.
#[tokio::test]
async fn append_committed_with_other_mail_announces_both() {
    let (inner, _dir) = sqlite_store().await;
    let faulty = Arc::new(faulty::FaultyStore::new(inner));
    let store: Arc<dyn Store> = faulty.clone();
    let cache = Arc::new(mailcluster_server::cache::local::LocalCache::new());
    // One commit at a time: whatever queues while it runs shares the next one.
    let options = DeliveryOptions { max_concurrent: 1, ..Default::default() };
    let app = app_delivering(store, cache, options, |c| c.tls.allow_plaintext_auth = true);
    let bob = account(&app, "bob@example.org", "pw").await;
    deliver(&app, &bob, "INBOX", &sample("old", "x"), FlagSet::default()).await;
    let mailbox = |name: &'static str| {
        let app = app.clone();
        async move { app.store.mailbox_get(bob.id, name).await.expect("get").expect("mailbox").id }
    };
    let (inbox, drafts) = (mailbox("INBOX").await, mailbox("Drafts").await);
    let mail = |subject: &str, target: i64| {
        let raw = sample(subject, "x");
        NewDelivery {
            meta: mailcluster_model::message::parse_meta(&raw),
            raw: raw.into(),
            internal_date: chrono::Utc::now(),
            targets: vec![target],
            flags: FlagSet::default(),
        }
    };
    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    let r = a.cmd("s", "SELECT INBOX").await;
    assert!(has(&r, "* 1 EXISTS"), "{r:?}");

    // Mail to another mailbox holds the one commit slot; mail to INBOX and the
    // APPEND queue behind it and are committed together.
    faulty.commit_delay_ms.store(300, Ordering::SeqCst);
    let held = tokio::spawn({
        let app = app.clone();
        let d = mail("held", drafts);
        async move { app.deliverer.deliver(d).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let theirs = tokio::spawn({
        let app = app.clone();
        let d = mail("theirs", inbox);
        async move { app.deliverer.deliver(d).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let msg = String::from_utf8(sample("mine", "x")).expect("utf8");
    let r = a.cmd("a", &format!("APPEND INBOX {{{}+}}\r\n{msg}", msg.len())).await;
    held.await.expect("task").expect("deliver");
    theirs.await.expect("task").expect("deliver");
    // "old", "held", then the INBOX mail and the APPEND in one commit.
    assert_eq!(*faulty.batches.lock().unwrap(), [1, 1, 2], "the INBOX mail and the APPEND shared a commit");
    assert!(tagged(&r).starts_with("a OK [APPENDUID "), "{r:?}");
    assert!(has(&r, "* 3 EXISTS"), "both new messages announced: {r:?}");
    let r = a.cmd("f", "FETCH 1:* (UID)").await;
    assert_eq!(r.len(), 4, "{r:?}");
}

/// BINARY (RFC 3516): sections with their content-transfer-encoding removed,
/// their decoded sizes, literal8 for octets holding NUL, UNKNOWN-CTE, and APPEND
/// of binary content.
#[tokio::test]
async fn binary_fetch_decodes_sections_and_append_takes_literal8() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let raw = "From: a@example.com\r\nSubject: binary\r\nMIME-Version: 1.0\r\n\
        Content-Type: multipart/mixed; boundary=b\r\n\r\n\
        --b\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: Quoted-Printable\r\n\r\n\
        caf=C3=A9 is =\r\none line=3D\r\n\
        --b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64 (a comment)\r\n\r\n\
        AAECAwBh\r\nYg==\r\n\
        --b\r\nContent-Type: application/x-thing\r\nContent-Transfer-Encoding: x-uuencode\r\n\r\n\
        begin 644 x\r\n\
        --b\r\nContent-Type: text/plain\r\n\r\nplain 7bit\r\n\
        --b--\r\n";
    deliver(&app, &bob, "INBOX", raw.as_bytes(), FlagSet::default()).await;
    let single = "From: a@example.com\r\nSubject: one part\r\nContent-Transfer-Encoding: base64\r\n\r\naGVs\r\nbG8=\r\n";
    deliver(&app, &bob, "INBOX", single.as_bytes(), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("a", "CAPABILITY").await;
    assert!(r[0].contains(" BINARY "), "{r:?}");
    c.cmd("s", "SELECT INBOX").await;

    let r = c.cmd("b", "FETCH 1 (BINARY.SIZE[1] BINARY.SIZE[2] BINARY.SIZE[4])").await;
    assert_eq!(r[0], "* 1 FETCH (BINARY.SIZE[1] 18 BINARY.SIZE[2] 7 BINARY.SIZE[4] 10)");
    let r = c.cmd("c", "FETCH 1 (BINARY.PEEK[1])").await;
    assert_eq!(r[..2], ["* 1 FETCH (BINARY[1] {18}", "café is one line=)"]);
    // NUL in the decoded octets: a literal8.
    let r = c.cmd("d", "FETCH 1 (BINARY.PEEK[2])").await;
    assert_eq!(r[..2], ["* 1 FETCH (BINARY[2] ~{7}", "\0\u{1}\u{2}\u{3}\0ab)"]);
    // A partial range counts decoded octets; the response names its origin.
    let r = c.cmd("e", "FETCH 1 (BINARY.PEEK[2]<4.10>)").await;
    assert_eq!(r[..2], ["* 1 FETCH (BINARY[2]<4> ~{3}", "\0ab)"]);
    let r = c.cmd("f", "FETCH 1 (BINARY.PEEK[2]<1.2>)").await;
    assert_eq!(r[..2], ["* 1 FETCH (BINARY[2]<1> {2}", "\u{1}\u{2})"]);
    // An encoding the server cannot remove fails the command, with no FETCH
    // data for that message (not even the items it could answer).
    for (tag, items) in [("g", "BINARY.PEEK[3]"), ("g2", "UID BINARY.SIZE[3]")] {
        let r = c.cmd(tag, &format!("FETCH 1 ({items})")).await;
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(tagged(&r).starts_with(&format!("{tag} NO [UNKNOWN-CTE]")), "{r:?}");
    }
    // An offset alone (as Dovecot allows) reads to the end.
    let r = c.cmd("g3", "FETCH 1 (BINARY.PEEK[2]<5>)").await;
    assert_eq!(r[..2], ["* 1 FETCH (BINARY[2]<5> {2}", "ab)"]);
    // No encoding (7bit), and a MIME header: sent as they are.
    let r = c.cmd("h", "FETCH 1 (BINARY.PEEK[4] BINARY.PEEK[1.MIME])").await;
    let mime =
        "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: Quoted-Printable\r\n\r\n";
    assert_eq!(
        r[..2],
        ["* 1 FETCH (BINARY[4] {10}".to_string(), format!("plain 7bit BINARY[1.MIME] {{{}}}", mime.len())]
    );
    // A single-part message: part 1 under the message's own header.
    let r = c.cmd("i", "UID FETCH 2 (BINARY.SIZE[1] BINARY.PEEK[1])").await;
    assert_eq!(r[..2], ["* 2 FETCH (UID 2 BINARY.SIZE[1] 5 BINARY[1] {5}", "hello)"]);
    assert_eq!(tagged(&r), "i OK UID FETCH completed");
    // BINARY.PEEK leaves \Seen alone; BINARY sets it.
    let r = c.cmd("j", "FETCH 1 (FLAGS)").await;
    assert_eq!(r[0], "* 1 FETCH (FLAGS (\\Recent))");
    let r = c.cmd("k", "FETCH 1 (BINARY[4])").await;
    assert_eq!(r[..2], ["* 1 FETCH (BINARY[4] {10}", "plain 7bit FLAGS (\\Seen \\Recent))"]);
    // BINARY.SIZE takes no range; unknown BINARY items are errors.
    for (tag, bad) in [("l1", "FETCH 1 (BINARY.SIZE[1]<0.1>)"), ("l2", "FETCH 1 (BINARY.TEXT[1])")] {
        let r = c.cmd(tag, bad).await;
        assert!(tagged(&r).starts_with(&format!("{tag} BAD")), "{r:?}");
    }

    // APPEND of binary content as a literal8 (RFC 3516 §4.4); read back whole,
    // it holds NUL, so it comes back as a literal8 too.
    let body = "From: a@example.com\r\nSubject: raw\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n\r\nx\0y\r\n";
    c.send(&format!("m APPEND INBOX ~{{{}}}\r\n", body.len())).await;
    assert_eq!(c.line().await, "+ Ready for literal data");
    c.send(&format!("{body}\r\n")).await;
    let r = c.until_tag("m").await;
    assert!(tagged(&r).starts_with("m OK [APPENDUID "), "{r:?}");
    let r = c.cmd("n", "FETCH 3 (BODY.PEEK[] BINARY.PEEK[1])").await;
    let expected = format!("* 3 FETCH (BODY[] ~{{{}}}\r\n{body} BINARY[1] ~{{5}}\r\nx\0y\r\n)", body.len());
    assert_eq!(r[..r.len() - 1].join("\r\n"), expected);
}

/// Empty values are still values (RFC 3501 §7.4.2, RFC 3516 §4.2): the body of
/// an empty part is an empty literal `{0}`, as Dovecot answers and clients
/// expect, in BODY[], BINARY[] and 0 for BINARY.SIZE; so is the header of a part
/// without one, and an empty message's text. The message is APPENDed as a
/// literal8 (binary content).
#[tokio::test]
async fn empty_parts_and_fields_are_empty_values() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    // Part 1 is empty (the CRLF before a boundary is the boundary's, RFC 2046
    // §5.1.1); part 2 has no header of its own; part 3 is an empty message/rfc822.
    let raw = "From: a@example.com\r\nSubject:\r\nMIME-Version: 1.0\r\n\
        Content-Type: multipart/mixed; boundary=b\r\n\r\n\
        --b\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: binary\r\n\r\n\
        --b\r\n\r\nno header\x00\r\n\
        --b\r\nContent-Type: application/octet-stream\r\n\r\n\
        --b--\r\n";
    c.send(&format!("a APPEND INBOX ~{{{}}}\r\n", raw.len())).await;
    assert_eq!(c.line().await, "+ Ready for literal data");
    c.send(&format!("{raw}\r\n")).await;
    let r = c.until_tag("a").await;
    assert!(tagged(&r).starts_with("a OK [APPENDUID "), "{r:?}");

    let r = c.cmd("b", "FETCH 1 (BODY.PEEK[1])").await;
    assert_eq!(r[..2], ["* 1 FETCH (BODY[1] {0}", ")"], "{r:?}");
    let r = c.cmd("c", "FETCH 1 (BINARY.PEEK[1])").await;
    assert_eq!(r[..2], ["* 1 FETCH (BINARY[1] {0}", ")"], "{r:?}");
    let r = c.cmd("d", "FETCH 1 (BINARY.SIZE[1])").await;
    assert_eq!(r[0], "* 1 FETCH (BINARY.SIZE[1] 0)", "{r:?}");
    let r = c.cmd("e", "FETCH 1 (BODY.PEEK[3] BINARY.SIZE[3])").await;
    assert_eq!(r[..2], ["* 1 FETCH (BODY[3] {0}", " BINARY.SIZE[3] 0)"], "{r:?}");
    // A part without a header of its own: its MIME header is the blank line.
    let r = c.cmd("f", "FETCH 1 (BODY.PEEK[2.MIME])").await;
    assert_eq!(r[..3], ["* 1 FETCH (BODY[2.MIME] {2}", "", ")"], "{r:?}");
    // The empty part in BODYSTRUCTURE: size 0, lines 0.
    let r = c.cmd("g", "FETCH 1 (BODYSTRUCTURE)").await;
    assert!(
        r[0].starts_with("* 1 FETCH (BODYSTRUCTURE ((\"TEXT\" \"PLAIN\" NIL NIL NIL \"BINARY\" 0 0 "),
        "{r:?}"
    );
    // An empty Subject is an empty string, not NIL (the field is there).
    let r = c.cmd("h", "FETCH 1 (ENVELOPE)").await;
    assert!(r[0].starts_with("* 1 FETCH (ENVELOPE (NIL \"\" ((NIL NIL \"a\" \"example.com\"))"), "{r:?}");

    // A message that is only a header: TEXT is empty, and part 1 with it.
    let raw = "From: a@example.com\r\nSubject: only a header\r\n\r\n";
    c.send(&format!("i APPEND INBOX ~{{{}}}\r\n", raw.len())).await;
    assert_eq!(c.line().await, "+ Ready for literal data");
    c.send(&format!("{raw}\r\n")).await;
    let r = c.until_tag("i").await;
    assert!(tagged(&r).starts_with("i OK [APPENDUID "), "{r:?}");
    let r = c.cmd("j", "FETCH 2 (BODY.PEEK[TEXT] BODY.PEEK[1] BINARY.PEEK[1] BINARY.SIZE[1])").await;
    assert_eq!(
        r[..4],
        ["* 2 FETCH (BODY[TEXT] {0}", " BODY[1] {0}", " BINARY[1] {0}", " BINARY.SIZE[1] 0)"],
        "{r:?}"
    );
    let r = c.cmd("k", "FETCH 2 (BODYSTRUCTURE)").await;
    assert!(r[0].starts_with("* 2 FETCH (BODYSTRUCTURE (\"TEXT\" \"PLAIN\" "), "{r:?}");
    assert!(r[0].contains(" \"7BIT\" 0 0 "), "{r:?}");
}

/// SORT by address keys on messages with none, several, or a group first
/// (RFC 5256 §3: FROM, TO, CC sort by the addr-mailbox of the first address,
/// a missing one as the empty string; RFC 5957 §3: DISPLAYFROM, DISPLAYTO by
/// its display name, else its addr-spec, else its mailbox. A group's first
/// address structure is its start marker, whose mailbox is the group's name,
/// RFC 3501 §7.4.2). Equal keys keep mailbox order, reversed or not.
#[tokio::test]
async fn sort_by_address_keys_takes_the_first_address_or_nothing() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    for raw in [
        // 1: no Cc; the first To has no name.
        "From: Zed <aaa@example.com>\r\nTo: yy@example.com, Alpha <zz@example.com>\r\nSubject: 1\r\n\r\n.\r\n",
        // 2: several Cc, the first without a name; To is a group.
        "From: mmm@example.com\r\nTo: Team: <bb@example.com>;\r\nCc: zz@example.com, Able <aa@example.com>\r\nSubject: 2\r\n\r\n.\r\n",
        // 3: several From; no To.
        "From: \"Beta\" <zzz@example.com>, Aardvark <a@example.com>\r\nCc: Kim <kk@example.com>\r\nSubject: 3\r\n\r\n.\r\n",
        // 4: no From; Cc an empty group.
        "To: Xavier <cc@example.com>\r\nCc: undisclosed:;\r\nSubject: 4\r\n\r\n.\r\n",
        // 5: the same keys as 1.
        "From: Zed <aaa@example.com>\r\nTo: yy@example.com\r\nSubject: 5\r\n\r\n.\r\n",
    ] {
        deliver(&app, &bob, "INBOX", raw.as_bytes(), FlagSet::default()).await;
    }
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    for (keys, expected) in [
        ("CC", "1 5 3 4 2"),
        ("REVERSE CC", "2 4 3 1 5"),
        ("FROM", "4 1 5 2 3"),
        ("TO", "3 4 2 1 5"),
        ("DISPLAYFROM", "4 3 2 1 5"),
        ("DISPLAYTO", "3 2 4 1 5"),
        ("REVERSE DISPLAYTO", "1 5 4 2 3"),
    ] {
        let r = c.cmd("a", &format!("SORT ({keys}) UTF-8 ALL")).await;
        assert_eq!(r[0], format!("* SORT {expected}"), "SORT ({keys})");
        assert_eq!(tagged(&r), "a OK SORT completed");
    }
}

/// ENVELOPE of address lists holding groups (RFC 3501 §7.4.2): the start
/// marker `(NIL NIL "name" NIL)`, the members as any address, display names
/// included, the end marker `(NIL NIL NIL NIL)`; an empty group is the two
/// markers alone.
#[tokio::test]
async fn envelope_groups_keep_their_members_display_names() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    let raw = "From: a@example.com\r\nSubject: groups\r\n\
        To: Friends: \"foo\" <foo@example.com>, Bar <bar@example.com>, plain@example.com;, other@example.com\r\n\
        Cc: undisclosed-recipients:;\r\n\r\nbody\r\n";
    deliver(&app, &bob, "INBOX", raw.as_bytes(), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s", "SELECT INBOX").await;
    let r = c.cmd("f", "FETCH 1 (ENVELOPE)").await;
    let to = "((NIL NIL \"Friends\" NIL)(\"foo\" NIL \"foo\" \"example.com\")(\"Bar\" NIL \"bar\" \"example.com\")\
(NIL NIL \"plain\" \"example.com\")(NIL NIL NIL NIL)(NIL NIL \"other\" \"example.com\"))";
    let cc = "((NIL NIL \"undisclosed-recipients\" NIL)(NIL NIL NIL NIL))";
    assert!(r[0].contains(&format!(" {to} {cc} NIL NIL NIL)")), "{r:?}");
    assert_eq!(tagged(&r), "f OK FETCH completed");
}
