//! QUOTA (RFC 9208) transcripts: GETQUOTAROOT and GETQUOTA with and without a
//! limit, the SETQUOTA refusal, APPEND (and MULTIAPPEND, all or nothing) and COPY
//! refused with OVERQUOTA while MOVE and EXPUNGE still work, and STATUS DELETED /
//! DELETED-STORAGE. Over the embedded store.

mod common;

use common::*;
use mailcluster_model::FlagSet;
use mailcluster_server::app::App;

type Conn = Client<tokio::io::DuplexStream>;

/// `* QUOTA "" (STORAGE used limit)` → (used, limit).
fn storage(lines: &[String]) -> (u64, u64) {
    let line =
        lines.iter().find(|l| l.starts_with("* QUOTA ")).unwrap_or_else(|| panic!("no QUOTA in {lines:?}"));
    let inner = line.split("(STORAGE ").nth(1).expect("STORAGE").trim_end_matches(')');
    let mut it = inner.split_whitespace().map(|n| n.parse::<u64>().expect("number"));
    (it.next().expect("used"), it.next().expect("limit"))
}

/// A message of exactly `octets` octets.
fn message_of(octets: usize) -> String {
    let head = "Subject: sized\r\n\r\n";
    format!("{head}{}", "x".repeat(octets - head.len()))
}

async fn append(c: &mut Conn, tag: &str, mailbox: &str, msg: &str) -> Vec<String> {
    c.send(&format!("{tag} APPEND {mailbox} {{{}+}}\r\n{msg}\r\n", msg.len())).await;
    c.until_tag(tag).await
}

async fn used(app: &App, email: &str) -> u64 {
    let account = app.store.account_get(email).await.expect("lookup").expect("account");
    app.store.quota(account.id).await.expect("quota").used
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_roots_limits_and_overquota() {
    let (app, _dir, bob) = embedded_app_with_bob().await;
    deliver(&app, &bob, "INBOX", &sample("first", "hello"), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("a0", "CAPABILITY").await;
    assert!(r[0].contains(" QUOTA ") && r[0].contains(" QUOTA=RES-STORAGE"), "{r:?}");
    assert!(!r[0].contains("QUOTASET"), "limits are not the user's to set: {r:?}");

    // No limit: no quota root (RFC 9208 §4.1.2 allows a mailbox without one).
    let r = c.cmd("a1", "GETQUOTAROOT INBOX").await;
    assert_eq!(r, ["* QUOTAROOT \"INBOX\"", "a1 OK GETQUOTAROOT completed"]);
    let r = c.cmd("a2", "GETQUOTA \"\"").await;
    assert!(r[0].starts_with("a2 NO [NONEXISTENT]"), "{r:?}");

    // 8 KiB for the account (the domain default would do the same).
    app.store.account_set_quota("bob@example.org", Some(8 * 1024)).await.expect("set quota");
    let already = used(&app, "bob@example.org").await;
    assert!(already > 0);
    let r = c.cmd("a3", "GETQUOTAROOT inbox").await;
    assert_eq!(r[0], "* QUOTAROOT \"INBOX\" \"\"");
    assert_eq!(storage(&r), (already.div_ceil(1024), 8), "usage in KiB, rounded up");
    assert_eq!(r.last().unwrap(), "a3 OK GETQUOTAROOT completed");
    let r = c.cmd("a4", "GETQUOTA \"\"").await;
    assert_eq!(storage(&r), (already.div_ceil(1024), 8));
    assert_eq!(r.last().unwrap(), "a4 OK GETQUOTA completed");
    let r = c.cmd("a5", "GETQUOTA \"user.bob\"").await;
    assert!(r[0].starts_with("a5 NO [NONEXISTENT]"), "{r:?}");
    let r = c.cmd("a6", "GETQUOTAROOT Nowhere").await;
    assert!(r[0].starts_with("a6 NO [NONEXISTENT]"), "{r:?}");
    let r = c.cmd("a7", "SETQUOTA \"\" (STORAGE 1000000)").await;
    assert!(r[0].starts_with("a7 NO [NOPERM]"), "{r:?}");
    for bad in ["GETQUOTA", "GETQUOTAROOT", "SETQUOTA \"\"", "SETQUOTA \"\" (STORAGE)", "GETQUOTA a b"] {
        let r = c.cmd("a8", bad).await;
        assert!(r[0].starts_with("a8 BAD"), "{bad}: {r:?}");
    }

    // APPEND up to the limit exactly, then one octet more is refused.
    let room = (8 * 1024 - already) as usize;
    let r = append(&mut c, "b1", "INBOX", &message_of(room - 100)).await;
    assert!(r.last().unwrap().starts_with("b1 OK [APPENDUID"), "{r:?}");
    let r = append(&mut c, "b2", "INBOX", &message_of(101)).await;
    assert_eq!(r.last().unwrap(), "b2 NO [OVERQUOTA] Quota exceeded (storage)");
    let r = append(&mut c, "b3", "INBOX", &message_of(100)).await;
    assert!(r.last().unwrap().starts_with("b3 OK"), "exactly full fits: {r:?}");
    assert_eq!(used(&app, "bob@example.org").await, 8 * 1024);
    let r = c.cmd("b4", "STATUS INBOX (MESSAGES SIZE)").await;
    assert_eq!(r[0], "* STATUS \"INBOX\" (MESSAGES 3 SIZE 8192)");

    // COPY would add to the usage; MOVE does not; EXPUNGE frees room.
    c.cmd("c1", "SELECT INBOX").await;
    let r = c.cmd("c2", "COPY 1 Archive").await;
    assert_eq!(r.last().unwrap(), "c2 NO [OVERQUOTA] Quota exceeded (storage)");
    let r = c.cmd("c3", "STATUS Archive (MESSAGES)").await;
    assert_eq!(r[0], "* STATUS \"Archive\" (MESSAGES 0)", "nothing copied");
    let r = c.cmd("c4", "MOVE 3 Archive").await;
    assert!(r.last().unwrap().starts_with("c4 OK"), "{r:?}");
    let r = c.cmd("c5", "STORE 2 +FLAGS.SILENT (\\Deleted)").await;
    assert!(r.last().unwrap().starts_with("c5 OK"), "{r:?}");
    let r = c.cmd("c6", "STATUS INBOX (DELETED DELETED-STORAGE)").await;
    assert_eq!(r[0], format!("* STATUS \"INBOX\" (DELETED 1 DELETED-STORAGE {})", room - 100));
    let r = c.cmd("c7", "EXPUNGE").await;
    assert!(r.last().unwrap().starts_with("c7 OK"), "{r:?}");
    let r = c.cmd("c8", "STATUS INBOX (DELETED DELETED-STORAGE)").await;
    assert_eq!(r[0], "* STATUS \"INBOX\" (DELETED 0 DELETED-STORAGE 0)");
    let r = c.cmd("c9", "COPY 1 Archive").await;
    assert!(r.last().unwrap().starts_with("c9 OK [COPYUID"), "room again: {r:?}");

    // MULTIAPPEND (RFC 3502) is all or nothing: two messages that fit one by one
    // but not together store neither.
    let free = 8 * 1024 - used(&app, "bob@example.org").await as usize;
    let half = message_of(free / 2 + 10);
    c.send(&format!("d1 APPEND INBOX {{{n}+}}\r\n{half} {{{n}+}}\r\n{half}\r\n", n = half.len())).await;
    let r = c.until_tag("d1").await;
    assert_eq!(r.last().unwrap(), "d1 NO [OVERQUOTA] Quota exceeded (storage)");
    let r = c.cmd("d2", "STATUS INBOX (MESSAGES)").await;
    assert_eq!(r[0], "* STATUS \"INBOX\" (MESSAGES 1)");
    let r = append(&mut c, "d3", "INBOX", &half).await;
    assert!(r.last().unwrap().starts_with("d3 OK"), "one of them fits: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_commands_need_authentication() {
    let (app, _dir, _bob) = embedded_app_with_bob().await;
    let (mut c, _tx) = connect(&app);
    c.line().await;
    for cmd in ["GETQUOTAROOT INBOX", "GETQUOTA \"\"", "SETQUOTA \"\" (STORAGE 1)"] {
        let r = c.cmd("n1", cmd).await;
        assert!(r[0].starts_with("n1 BAD") || r[0].starts_with("n1 NO"), "{cmd}: {r:?}");
        assert!(!r.iter().any(|l| l.starts_with("* QUOTA")), "{cmd}: {r:?}");
    }
}
