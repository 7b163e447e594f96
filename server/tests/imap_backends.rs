//! The IMAP session over the real stores: the embedded SQLite store and
//! PostgreSQL (`DATABASE_URL`, default postgres://postgres@127.0.0.1:5432/postgres;
//! a fresh database per test, dropped at the end; the test FAILS when PostgreSQL
//! is unreachable).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mailcluster_model::{FlagSet, Flags};
use mailcluster_server::app::App;
use mailcluster_server::cache::local::LocalCache;
use mailcluster_server::store;

const CONNECT: Duration = Duration::from_secs(10);

use mailcluster_testkit::TestDatabase;

#[tokio::test]
async fn sqlite_store_and_local_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store::open(None, dir.path(), 4, CONNECT).await.expect("open sqlite");
    store.migrate().await.expect("migrate");
    let app = app_with(store, Arc::new(LocalCache::new()), true);
    tokio::time::timeout(Duration::from_secs(120), full_session(app)).await.expect("session within 120 s");
}

/// Runs `test` with a fresh PostgreSQL database (its URL), dropped afterwards.
async fn with_pg_database<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let db = TestDatabase::create("mc_imap").await;
    let result = tokio::time::timeout(Duration::from_secs(120), tokio::spawn(test(db.url.clone()))).await;
    drop(db);
    result.expect("test within 120 s").expect("test passed");
}

/// Two pods of one database and one Redis key prefix, with domain example.org.
async fn two_pods(url: &str) -> (App, App, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = format!("mc_imap_test_{:08x}:", rand::random::<u32>());
    let a = pg_pod(url, &prefix, dir.path()).await;
    let b = pg_pod(url, &prefix, dir.path()).await;
    a.store.domain_add("example.org").await.expect("domain");
    (a, b, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_and_redis_cache() {
    with_pg_database(|url| async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = format!("mc_imap_test_{:08x}:", rand::random::<u32>());
        full_session(pg_pod(&url, &prefix, dir.path()).await).await;
    })
    .await;
}

/// Two pods (separate store pools and Redis connections, one database and one
/// Redis): an IDLE session on pod A hears an APPEND made on pod B through the
/// Redis notification, well before any polling would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_wakes_across_pods() {
    with_pg_database(|url| async move {
        let (a, b, _dir) = two_pods(&url).await;
        account(&a, "bob@example.org", "pw").await;
        let (mut idler, _ta) = login(&a, "bob@example.org", "pw").await;
        idler.cmd("s", "SELECT INBOX").await;
        idler.send("i IDLE\r\n").await;
        assert_eq!(idler.line().await, "+ idling");
        let (mut writer, _tb) = login(&b, "bob@example.org", "pw").await;
        let msg = String::from_utf8(sample("cross", "pod")).expect("utf8");
        let mut worst = Duration::ZERO;
        for n in 1..=5 {
            let r = writer.cmd("p", &format!("APPEND INBOX {{{}+}}\r\n{msg}", msg.len())).await;
            let sent = std::time::Instant::now();
            assert!(tagged(&r).starts_with("p OK"), "{r:?}");
            assert_eq!(idler.line().await, format!("* {n} EXISTS"));
            // The idling session is the first to learn of each message: recent for it.
            assert_eq!(idler.line().await, format!("* {n} RECENT"));
            worst = worst.max(sent.elapsed());
        }
        println!("IDLE wake-up across pods: worst of 5 = {worst:?}");
        // The target is 100 ms (typically ~5-60 ms here); the bound leaves room for
        // a loaded CI machine while still proving the push path: polling would
        // take `idle_poll_secs` (3 s).
        assert!(worst < Duration::from_millis(500), "{worst:?}");
        idler.send("DONE\r\n").await;
        assert_eq!(idler.line().await, "i OK IDLE terminated");
    })
    .await;
}

/// Six sessions on one INBOX, alternately on two pods, each checking what it
/// is told against what the others did (APPEND, UID STORE, EXPUNGE, UID MOVE,
/// FETCH, UID SEARCH, IDLE, QRESYNC), while each pod takes mail over SMTP and
/// serves a POP3 client that reads and deletes: the
/// cross-pod notifications and each pod's caches must give every session one
/// consistent mailbox, and every accepted message must be there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_on_two_pods_agree_on_the_mailbox() {
    use mailcluster_server::imap::ImapProtocol;
    use mailcluster_server::net::listener::TlsMode;
    use mailcluster_server::pop3::Pop3Protocol;
    use mailcluster_server::smtp::{SmtpKind, SmtpProtocol};
    with_pg_database(|url| async move {
        let (a, b, _dir) = two_pods(&url).await;
        let bob = account(&a, "bob@example.org", "pw").await;
        for n in 0..2 {
            deliver(&a, &bob, "INBOX", &sample(&format!("m{n}"), "body"), FlagSet::default()).await;
        }
        let (mut imap, mut smtp, mut pop3) = (Vec::new(), Vec::new(), Vec::new());
        for app in [&a, &b] {
            let ports = serve_loopback(
                app,
                tls_provider(),
                vec![
                    ("imap", TlsMode::Plain, Arc::new(ImapProtocol::new(app.clone(), false))),
                    ("smtp", TlsMode::Plain, Arc::new(SmtpProtocol::new(app.clone(), SmtpKind::Mx))),
                    ("pop3", TlsMode::Plain, Arc::new(Pop3Protocol::new(app.clone(), false))),
                ],
            );
            imap.push(ports[0].port());
            smtp.push(ports[1].port());
            pop3.push(ports[2].port());
        }
        imap_consistency(&imap, &smtp, &pop3).await;
    })
    .await;
}

/// `UID FETCH n BODY.PEEK[]` answers from one query that also reports the
/// mailbox's modseq: a change made on another pod since the last command must
/// still be announced first (flags, new mail), and an unchanged mailbox adds
/// nothing. SEARCH and FETCH FLAGS, answered from the session's flag map, agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_fetch_and_flag_map_see_other_pods_changes() {
    with_pg_database(|url| async move {
        let (a, b, _dir) = two_pods(&url).await;
        let bob = account(&a, "bob@example.org", "pw").await;
        for i in 0..3 {
            deliver(&a, &bob, "INBOX", &sample(&format!("m{i}"), "x"), FlagSet::default()).await;
        }
        let (mut reader, _ta) = login(&a, "bob@example.org", "pw").await;
        let (mut writer, _tb) = login(&b, "bob@example.org", "pw").await;
        reader.cmd("s", "SELECT INBOX").await;
        writer.cmd("s", "SELECT INBOX").await;

        let quiet = reader.cmd("f0", "UID FETCH 2 BODY.PEEK[]").await;
        assert!(quiet[0].starts_with("* 2 FETCH (UID 2 BODY[] {"), "{quiet:?}");
        assert!(tagged(&quiet).starts_with("f0 OK"), "{quiet:?}");

        let r = writer.cmd("st", "UID STORE 1 +FLAGS.SILENT (\\Flagged $Urgent)").await;
        assert!(tagged(&r).starts_with("st OK"), "{r:?}");
        deliver(&b, &bob, "INBOX", &sample("late", "x"), FlagSet::default()).await;
        let r = reader.cmd("f1", "UID FETCH 2 BODY.PEEK[HEADER]").await;
        let body_at = r.iter().position(|l| l.starts_with("* 2 FETCH (UID 2 BODY[HEADER] {")).expect("body");
        let flags_at = r
            .iter()
            .position(|l| l.contains("* 1 FETCH (UID 1 FLAGS (\\Flagged \\Recent $Urgent))"))
            .expect("flags");
        let exists_at = r.iter().position(|l| l == "* 4 EXISTS").expect("EXISTS");
        assert!(flags_at < body_at && exists_at < body_at, "{r:?}");
        assert!(has(&r, "* FLAGS ("), "the new keyword is announced: {r:?}");

        let r = reader.cmd("q", "UID SEARCH FLAGGED").await;
        assert_eq!(r[0], "* SEARCH 1");
        let r = reader.cmd("k", "SEARCH KEYWORD $Urgent").await;
        assert_eq!(r[0], "* SEARCH 1");
        let r = writer.cmd("un", "UID STORE 1 -FLAGS.SILENT (\\Flagged)").await;
        assert!(tagged(&r).starts_with("un OK"), "{r:?}");
        let r = reader.cmd("q2", "UID SEARCH FLAGGED").await;
        assert!(r.contains(&"* SEARCH".to_string()), "{r:?}");
        let r = reader.cmd("ff", "FETCH 1:* (FLAGS)").await;
        // The reader selected first and saw message 4 arrive: all are \Recent for it.
        assert!(has(&r, "* 1 FETCH (FLAGS (\\Recent $Urgent))"), "{r:?}");
        assert!(has(&r, "* 4 FETCH (FLAGS (\\Recent))"), "{r:?}");

        // Expunged on the other pod: UID FETCH may say so, after the data.
        writer.cmd("d", "UID STORE 3 +FLAGS.SILENT (\\Deleted)").await;
        writer.cmd("e", "EXPUNGE").await;
        let r = reader.cmd("f2", "UID FETCH 3 BODY.PEEK[]").await;
        assert!(!has(&r, "BODY[]"), "an expunged message has no body: {r:?}");
        assert!(has(&r, "* 3 EXPUNGE"), "{r:?}");
        let r = reader.cmd("f3", "FETCH 3 BODY.PEEK[TEXT]").await;
        assert!(r[0].starts_with("* 3 FETCH (BODY[TEXT] {"), "the sequence map moved on: {r:?}");
    })
    .await;
}

fn tagged(lines: &[String]) -> &str {
    lines.last().map(String::as_str).unwrap_or_default()
}

fn has(lines: &[String], needle: &str) -> bool {
    lines.iter().any(|l| l.contains(needle))
}

/// One session touching every store call the IMAP layer makes.
async fn full_session(app: App) {
    app.store.domain_add("example.org").await.expect("domain");
    let bob = account(&app, "bob@example.org", "pw").await;
    let seen = FlagSet { system: Flags::SEEN, keywords: vec![] };
    deliver(&app, &bob, "INBOX", &sample("one", "first body"), seen).await;
    deliver(&app, &bob, "INBOX", &sample("two", "second body"), FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &sample("three", "third body"), FlagSet::default()).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let (mut other, _to) = login(&app, "bob@example.org", "pw").await;

    let r = c.cmd("l", "LIST \"\" *").await;
    assert!(has(&r, "\"INBOX\"") && has(&r, "\\Trash"), "{r:?}");
    let r = c.cmd("s", "SELECT INBOX").await;
    assert!(has(&r, "* 3 EXISTS") && has(&r, "* OK [UNSEEN 2]") && has(&r, "[UIDNEXT 4]"), "{r:?}");
    let r = c.cmd("f1", "UID FETCH 1:* (FLAGS RFC822.SIZE)").await;
    // The first SELECT takes the delivered messages as \Recent (RFC 3501 §2.3.2).
    assert!(r[0].starts_with("* 1 FETCH (UID 1 FLAGS (\\Seen \\Recent) RFC822.SIZE "), "{r:?}");
    let r = c.cmd("f2", "FETCH 2 (ENVELOPE BODY[])").await;
    assert!(r[0].contains("\"two\"") && has(&r, "second body"), "{r:?}");
    assert!(has(&r, "FLAGS (\\Seen \\Recent)"), "{r:?}");
    let r = c.cmd("u", "UID SEARCH UNSEEN").await;
    assert_eq!(r[0], "* SEARCH 3");
    let r = c.cmd("t", "SEARCH BODY third").await;
    assert_eq!(r[0], "* SEARCH 3");
    let r = c.cmd("st", "STORE 1 +FLAGS (\\Deleted $Later)").await;
    assert!(has(&r, "* 1 FETCH (FLAGS (\\Seen \\Deleted \\Recent $Later))"), "{r:?}");
    let r = c.cmd("cp", "UID COPY 2:3 Archive").await;
    assert!(tagged(&r).starts_with("cp OK [COPYUID "), "{r:?}");
    let r = c.cmd("oe", "FETCH 3 EMAILID").await;
    let moved = r[0].strip_prefix("* 3 FETCH (EMAILID (").and_then(|l| l.strip_suffix("))"));
    let moved = moved.unwrap_or_else(|| panic!("{r:?}")).to_string();
    let r = c.cmd("mv", "MOVE 3 Trash").await;
    assert!(r[0].starts_with("* OK [COPYUID ") && r[1] == "* 3 EXPUNGE", "{r:?}");
    let r = c.cmd("x", "EXPUNGE").await;
    assert_eq!(r[0], "* 1 EXPUNGE");
    let r = c.cmd("st2", "STATUS Archive (MESSAGES UNSEEN)").await;
    assert_eq!(r[0], "* STATUS \"Archive\" (MESSAGES 2 UNSEEN 1)");
    let msg = String::from_utf8(sample("appended", "hi")).expect("utf8");
    let r = c.cmd("a", &format!("APPEND INBOX (\\Flagged) {{{}+}}\r\n{msg}", msg.len())).await;
    assert!(tagged(&r).contains("APPEND completed") && has(&r, "* 2 EXISTS"), "{r:?}");

    // The other session learns everything at NOOP, in protocol order.
    other.cmd("s", "SELECT INBOX").await;
    c.cmd("st3", "UID STORE 2 +FLAGS.SILENT (\\Answered)").await;
    let r = other.cmd("n", "NOOP").await;
    assert!(has(&r, "FLAGS (\\Seen \\Answered)"), "{r:?}");
    other.send("i IDLE\r\n").await;
    assert_eq!(other.line().await, "+ idling");
    let r = c.cmd("a2", &format!("APPEND INBOX {{{}+}}\r\n{msg}", msg.len())).await;
    assert!(tagged(&r).contains("APPEND completed"), "{r:?}");
    assert_eq!(other.line().await, "* 3 EXISTS");
    // Recent for whichever of the two sessions learnt of it first: the count is 0 or 1.
    let recent = other.line().await;
    assert!(recent == "* 0 RECENT" || recent == "* 1 RECENT", "{recent}");
    other.send("DONE\r\n").await;
    assert_eq!(other.line().await, "i OK IDLE terminated");
    let r = c.cmd("d", "DELETE Archive").await;
    assert_eq!(tagged(&r), "d OK DELETE completed");
    let r = c.cmd("oi", "STATUS INBOX (MAILBOXID)").await;
    let inbox = r[0].clone();
    let r = c.cmd("rn", "RENAME INBOX Old").await;
    assert_eq!(tagged(&r), "rn OK RENAME completed");
    let r = c.cmd("st4", "STATUS Old (MESSAGES)").await;
    assert_eq!(r[0], "* STATUS \"Old\" (MESSAGES 3)");

    // OBJECTID (RFC 8474): INBOX stays the mailbox it was (its messages went to a
    // new one); a moved message keeps its EMAILID, and SEARCH finds it by it.
    let r = c.cmd("oi2", "STATUS INBOX (MAILBOXID)").await;
    assert_eq!(r[0], inbox);
    let r = c.cmd("oo", "STATUS Old (MAILBOXID)").await;
    assert_ne!(r[0].replace("\"Old\"", "\"INBOX\""), inbox, "{r:?}");
    c.cmd("ot", "SELECT Trash").await;
    let r = c.cmd("of", "FETCH 1:* EMAILID").await;
    assert!(has(&r, &format!(" FETCH (EMAILID ({moved}))")), "{moved} {r:?}");
    let r = c.cmd("os", &format!("UID SEARCH EMAILID {moved}")).await;
    assert!(r[0].starts_with("* SEARCH ") && r[0].len() > "* SEARCH ".len(), "{r:?}");
}

/// A STORE answers the session's own change once and still reports what other
/// sessions (here on another pod) changed before it, whether the session could
/// take its own rows as the whole change (nothing else happened) or had to read
/// the changes back. FETCH lines of a response, by message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_reports_own_and_other_changes_once_across_pods() {
    fn fetches(lines: &[String]) -> Vec<&str> {
        let mut f: Vec<&str> = lines.iter().filter(|l| l.contains(" FETCH ")).map(String::as_str).collect();
        f.sort_unstable();
        f
    }
    with_pg_database(|url| async move {
        let (a_pod, b_pod, _dir) = two_pods(&url).await;
        let bob = account(&a_pod, "bob@example.org", "pw").await;
        for i in 0..3 {
            deliver(&a_pod, &bob, "INBOX", &sample(&format!("m{i}"), "x"), FlagSet::default()).await;
        }
        let (mut a, _ta) = login(&a_pod, "bob@example.org", "pw").await;
        let (mut b, _tb) = login(&b_pod, "bob@example.org", "pw").await;
        a.cmd("s", "SELECT INBOX").await;
        b.cmd("s", "SELECT INBOX").await;

        // Nothing else changed: the own change, once, and nothing at the next NOOP.
        let r = a.cmd("1", "UID STORE 1 +FLAGS (\\Seen)").await;
        assert_eq!(fetches(&r).len(), 1, "{r:?}");
        assert!(r[0].starts_with("* 1 FETCH (FLAGS (\\Seen") && r[0].ends_with("UID 1)"), "{r:?}");
        let r = a.cmd("2", "NOOP").await;
        assert!(fetches(&r).is_empty(), "{r:?}");

        // Another pod's change first: it comes with this STORE's own, each once.
        b.cmd("3", "UID STORE 2 +FLAGS (\\Flagged)").await;
        let r = a.cmd("4", "UID STORE 3 +FLAGS (\\Seen)").await;
        let f = fetches(&r);
        assert_eq!(f.len(), 2, "{r:?}");
        assert!(f[0].starts_with("* 2 FETCH (UID 2 FLAGS (\\Flagged"), "{r:?}");
        assert!(f[1].starts_with("* 3 FETCH (FLAGS (\\Seen"), "{r:?}");
        let r = a.cmd("5", "NOOP").await;
        assert!(fetches(&r).is_empty(), "{r:?}");

        // .SILENT: no FETCH for the own change, now or later.
        let r = a.cmd("6", "UID STORE 1 +FLAGS.SILENT (\\Flagged)").await;
        assert!(fetches(&r).is_empty(), "{r:?}");
        let r = a.cmd("7", "NOOP").await;
        assert!(fetches(&r).is_empty(), "{r:?}");

        // The other session hears all of them.
        let r = b.cmd("8", "NOOP").await;
        let f = fetches(&r);
        assert_eq!(f.len(), 2, "{r:?}");
        assert!(f[0].starts_with("* 1 FETCH (UID 1 FLAGS (\\Seen \\Flagged"), "{r:?}");
        assert!(f[1].starts_with("* 3 FETCH (UID 3 FLAGS (\\Seen"), "{r:?}");
        assert!(r.last().is_some_and(|l| l.starts_with("8 OK")), "{r:?}");
    })
    .await;
}
