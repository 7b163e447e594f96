//! CONDSTORE and QRESYNC (RFC 7162) transcripts: MODSEQ in FETCH, CHANGEDSINCE,
//! conditional STORE with MODIFIED, SEARCH MODSEQ, STATUS and SELECT
//! HIGHESTMODSEQ, ENABLE, SELECT (QRESYNC …) with VANISHED (EARLIER), VANISHED
//! instead of EXPUNGE, and the CLOSED response code. Over the embedded store, and
//! over PostgreSQL with the changes made on a second pod (a fresh database per
//! test; the test FAILS when PostgreSQL or Redis is unreachable).

mod common;

use std::time::Duration;

use common::*;
use mailcluster_model::FlagSet;
use mailcluster_server::app::App;
use mailcluster_testkit::TestDatabase;

type Conn = Client<tokio::io::DuplexStream>;

fn tagged(lines: &[String]) -> &str {
    lines.last().map(String::as_str).unwrap_or_default()
}

/// The number after `key` in the first line that has it (`MODSEQ (12)` or
/// `[HIGHESTMODSEQ 12]` or `UIDVALIDITY 3`).
fn number_after(lines: &[String], key: &str) -> Option<u64> {
    lines.iter().find_map(|l| {
        let at = l.find(key)? + key.len();
        let digits: String =
            l[at..].trim_start_matches([' ', '(']).chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// `* n FETCH (…)` lines only.
fn fetches(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.starts_with("* ") && l.contains(" FETCH (")).collect()
}

async fn seed(app: &App, n: usize) {
    let bob = account(app, "bob@example.org", "pw").await;
    for i in 0..n {
        deliver(app, &bob, "INBOX", &sample(&format!("m{i}"), "body"), FlagSet::default()).await;
    }
}

async fn uids_of(c: &mut Conn, tag: &str) -> Vec<u32> {
    let r = c.cmd(tag, "UID SEARCH ALL").await;
    r[0].trim_start_matches("* SEARCH").split_whitespace().map(|u| u.parse().expect("uid")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condstore_fetch_store_and_search() {
    let (app, _dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    seed(&app, 4).await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    let r = c.cmd("a0", "CAPABILITY").await;
    assert!(r[0].contains(" CONDSTORE") && r[0].contains(" QRESYNC"), "{r:?}");
    let r = c.cmd("a1", "ENABLE CONDSTORE").await;
    assert_eq!(r, ["* ENABLED CONDSTORE", "a1 OK ENABLE completed"]);
    let r = c.cmd("a2", "SELECT INBOX").await;
    let h = number_after(&r, "[HIGHESTMODSEQ").expect("HIGHESTMODSEQ at SELECT");

    // Every message has a modseq, none above the mailbox's.
    let r = c.cmd("a3", "FETCH 1:* (FLAGS MODSEQ)").await;
    let f = fetches(&r);
    assert_eq!(f.len(), 4, "{r:?}");
    for line in &f {
        let m = number_after(&[line.to_string()], "MODSEQ").expect("MODSEQ in every line");
        assert!(m >= 1 && m <= h, "{line} (highest {h})");
    }
    // STORE tells the new modseq, above everything before (RFC 7162 §3.1.3).
    let r = c.cmd("a4", "STORE 2 +FLAGS (\\Seen)").await;
    assert_eq!(tagged(&r), "a4 OK STORE completed");
    let x = number_after(&r, "MODSEQ").expect("MODSEQ in STORE's FETCH");
    assert!(x > h, "{r:?}");
    assert!(r[0].starts_with("* 2 FETCH (FLAGS (\\Seen"), "{r:?}");

    // CHANGEDSINCE: only what changed after h.
    let r = c.cmd("a5", &format!("FETCH 1:* (FLAGS) (CHANGEDSINCE {h})")).await;
    assert_eq!(fetches(&r).len(), 1, "{r:?}");
    assert!(
        r[0].starts_with("* 2 FETCH (FLAGS (\\Seen") && r[0].ends_with(&format!(" MODSEQ ({x}))")),
        "{r:?}"
    );
    let r = c.cmd("a6", &format!("UID FETCH 1:* (FLAGS) (CHANGEDSINCE {x})")).await;
    assert_eq!(fetches(&r).len(), 0, "{r:?}");
    assert_eq!(tagged(&r), "a6 OK UID FETCH completed");

    // SEARCH MODSEQ (RFC 7162 §3.1.5): at or after, with the highest one found.
    let r = c.cmd("a7", &format!("SEARCH MODSEQ {x}")).await;
    assert_eq!(r[0], format!("* SEARCH 2 (MODSEQ {x})"));
    let r = c.cmd("a8", &format!("SEARCH UNDELETED MODSEQ \"/flags/\\\\seen\" all {x}")).await;
    assert_eq!(r[0], format!("* SEARCH 2 (MODSEQ {x})"));
    let r = c.cmd("a9", &format!("SEARCH MODSEQ {}", x + 1)).await;
    assert_eq!(r[0], "* SEARCH");
    let r = c.cmd("a10", &format!("SEARCH RETURN (COUNT) MODSEQ {x}")).await;
    assert_eq!(r[0], format!("* ESEARCH (TAG \"a10\") COUNT 1 MODSEQ {x}"));
    // With only MIN and/or MAX returned, MODSEQ is the highest of those messages,
    // not of every match (RFC 4731 §3.2).
    let r = c.cmd("a10m", "FETCH 1:4 (MODSEQ)").await;
    let each: Vec<u64> =
        fetches(&r).iter().map(|l| number_after(&[l.to_string()], "MODSEQ").expect("modseq")).collect();
    assert_eq!(each.len(), 4, "{r:?}");
    let r = c.cmd("a10n", "SEARCH RETURN (MIN) MODSEQ 1").await;
    assert_eq!(r[0], format!("* ESEARCH (TAG \"a10n\") MIN 1 MODSEQ {}", each[0]));
    let r = c.cmd("a10x", "SEARCH RETURN (MAX) MODSEQ 1").await;
    assert_eq!(r[0], format!("* ESEARCH (TAG \"a10x\") MAX 4 MODSEQ {}", each[3]));
    let r = c.cmd("a10b", "SEARCH RETURN (MIN MAX) MODSEQ 1").await;
    assert_eq!(r[0], format!("* ESEARCH (TAG \"a10b\") MIN 1 MAX 4 MODSEQ {}", each[0].max(each[3])));
    let r = c.cmd("a10c", "SEARCH RETURN (MIN COUNT) MODSEQ 1").await;
    assert_eq!(r[0], format!("* ESEARCH (TAG \"a10c\") MIN 1 COUNT 4 MODSEQ {x}"));
    // Nested, as in the RFC's example (`OR NOT MODSEQ n LARGER 50000`): messages
    // 1, 3 and 4 were not changed at or after x, none is larger than 50,000.
    let r = c.cmd("a11", &format!("SEARCH OR NOT MODSEQ {x} LARGER 50000")).await;
    assert_eq!(r[0], format!("* SEARCH 1 3 4 (MODSEQ {})", number_after(&r, "MODSEQ").unwrap_or(0)));
    assert!(number_after(&r, "MODSEQ").is_some_and(|m| m < x), "{r:?}");
    let r = c.cmd("a13", &format!("SEARCH (MODSEQ {} SEEN)", x + 100)).await;
    assert_eq!(r[0], "* SEARCH", "no message changed after x: {r:?}");

    // Conditional STORE, the RFC's example: message 2 changed after h, so it is
    // left alone and named in MODIFIED; the others change and tell their modseq.
    let r = c.cmd("b1", &format!("STORE 1:3 (UNCHANGEDSINCE {h}) +FLAGS.SILENT (\\Deleted)")).await;
    assert_eq!(tagged(&r), "b1 OK [MODIFIED 2] Conditional STORE failed", "{r:?}");
    let f = fetches(&r);
    assert_eq!(f.len(), 2, "{r:?}");
    assert!(f[0].starts_with("* 1 FETCH (MODSEQ (") && f[1].starts_with("* 3 FETCH (MODSEQ ("), "{r:?}");
    let r = c.cmd("b2", "FETCH 1:3 (FLAGS)").await;
    assert!(r[0].contains("\\Deleted") && !r[1].contains("\\Deleted") && r[2].contains("\\Deleted"), "{r:?}");
    // UNCHANGEDSINCE 0 always fails (§3.1.3); UID STORE names UIDs.
    let uids = uids_of(&mut c, "b3").await;
    let r = c.cmd("b4", &format!("UID STORE {} (UNCHANGEDSINCE 0) +FLAGS (\\Flagged)", uids[3])).await;
    assert_eq!(tagged(&r), format!("b4 OK [MODIFIED {}] Conditional STORE failed", uids[3]));
    assert!(fetches(&r).is_empty(), "{r:?}");

    // A change by another session arrives with its MODSEQ (§3.1.4).
    let (mut other, _tx2) = login(&app, "bob@example.org", "pw").await;
    other.cmd("o1", "SELECT INBOX").await;
    let r = other.cmd("o2", "STORE 4 +FLAGS (\\Answered)").await;
    assert!(!r[0].contains("MODSEQ"), "a session without CONDSTORE sees no MODSEQ: {r:?}");
    // Its first CONDSTORE-enabling command announces the selected mailbox's
    // HIGHESTMODSEQ (RFC 7162 §3.1); later ones do not.
    let r = other.cmd("o3", "FETCH 1 (MODSEQ)").await;
    let announced = number_after(&r, "* OK [HIGHESTMODSEQ").expect("HIGHESTMODSEQ announced");
    assert!(announced > x, "{r:?}");
    let r = other.cmd("o4", "FETCH 1 (MODSEQ)").await;
    assert!(!r.iter().any(|l| l.contains("HIGHESTMODSEQ")), "{r:?}");
    let r = c.cmd("c1", "NOOP").await;
    let line = r.iter().find(|l| l.starts_with("* 4 FETCH")).expect("the other session's change");
    assert!(line.contains("\\Answered") && line.contains("MODSEQ ("), "{r:?}");
    let newest = number_after(std::slice::from_ref(line), "MODSEQ").expect("modseq");

    // STATUS HIGHESTMODSEQ is the newest change; MODSEQ alone is a valid FETCH.
    let r = c.cmd("c2", "STATUS INBOX (HIGHESTMODSEQ MESSAGES)").await;
    assert_eq!(r[0], format!("* STATUS \"INBOX\" (HIGHESTMODSEQ {newest} MESSAGES 4)"));
    let r = c.cmd("c3", "FETCH 4 MODSEQ").await;
    assert_eq!(r[0], format!("* 4 FETCH (MODSEQ ({newest}))"));
    let r = c.cmd("c3u", "UID FETCH 1:* (MODSEQ)").await;
    assert!(r[3].starts_with("* 4 FETCH (UID ") && r[3].ends_with(&format!(" MODSEQ ({newest}))")), "{r:?}");
    let r = c.cmd("c4", "UID FETCH 1:* (UID BODY.PEEK[HEADER.FIELDS (SUBJECT)] MODSEQ)").await;
    assert_eq!(fetches(&r).len(), 4, "{r:?}");
    assert!(r.iter().any(|l| l.contains("MODSEQ (")), "{r:?}");

    // Malformed modifiers are BAD; VANISHED needs QRESYNC.
    for (tag, cmd) in [
        ("d1", "FETCH 1 (FLAGS) (CHANGEDSINCE x)"),
        ("d2", "FETCH 1 (FLAGS) (VANISHED)"),
        ("d3", "UID FETCH 1:* (FLAGS) (CHANGEDSINCE 1 VANISHED)"),
        ("d4", "STORE 1 (UNCHANGEDSINCE) +FLAGS (\\Seen)"),
        ("d5", "STORE 1 (FROB 1) +FLAGS (\\Seen)"),
        ("d6", "FETCH 1 (FLAGS) (CHANGEDSINCE 1 CHANGEDSINCE 2)"),
    ] {
        let r = c.cmd(tag, cmd).await;
        assert!(tagged(&r).starts_with(&format!("{tag} BAD")), "{cmd}: {r:?}");
    }
}

/// `* VANISHED (EARLIER) …` / `* VANISHED …` lines' UID sets, expanded.
fn vanished(lines: &[String], earlier: bool) -> Vec<u32> {
    let prefix = if earlier { "* VANISHED (EARLIER) " } else { "* VANISHED " };
    let mut out = Vec::new();
    for l in lines {
        if let Some(set) = l.strip_prefix(prefix) {
            if !earlier && set.starts_with('(') {
                continue;
            }
            for part in set.split(',') {
                let (lo, hi) = part.split_once(':').unwrap_or((part, part));
                out.extend(lo.parse::<u32>().expect("uid")..=hi.parse::<u32>().expect("uid"));
            }
        }
    }
    out
}

/// A QRESYNC client on `reader` while another client changes the mailbox on
/// `writer` (the same pod, or another of the same database).
async fn qresync_follows_changes(reader: &App, writer: &App) {
    let (mut a, _ta) = login(reader, "bob@example.org", "pw").await;
    let r = a.cmd("a0", "SELECT INBOX (QRESYNC (1 1))").await;
    assert!(tagged(&r).starts_with("a0 BAD"), "QRESYNC needs ENABLE first: {r:?}");
    let r = a.cmd("a1", "ENABLE QRESYNC").await;
    assert_eq!(r, ["* ENABLED QRESYNC", "a1 OK ENABLE completed"]);
    let r = a.cmd("a2", "SELECT INBOX").await;
    let validity = number_after(&r, "[UIDVALIDITY").expect("UIDVALIDITY");
    let h = number_after(&r, "[HIGHESTMODSEQ").expect("HIGHESTMODSEQ");
    let uids = uids_of(&mut a, "a3").await;
    assert_eq!(uids.len(), 5);

    // Another client: a flag change, an expunge, a new message.
    let (mut b, _tb) = login(writer, "bob@example.org", "pw").await;
    b.cmd("b1", "SELECT INBOX").await;
    b.cmd("b2", &format!("UID STORE {} +FLAGS (\\Flagged)", uids[0])).await;
    b.cmd("b3", &format!("UID STORE {} +FLAGS.SILENT (\\Deleted)", uids[2])).await;
    let r = b.cmd("b4", "EXPUNGE").await;
    assert_eq!(r[0], "* 3 EXPUNGE", "a session without QRESYNC is told EXPUNGE: {r:?}");
    let r = b.cmd("b5", "APPEND INBOX {17}\r\nSubject: new\r\n\r\nx").await;
    assert!(tagged(&r).starts_with("b5 OK"), "{r:?}");

    // The QRESYNC session hears VANISHED, not EXPUNGE (RFC 7162 §3.2.10).
    let mut heard = Vec::new();
    for i in 0..50 {
        let r = a.cmd(&format!("n{i}"), "NOOP").await;
        heard.extend(r);
        if heard.iter().any(|l| l.ends_with(" EXISTS")) && !vanished(&heard, false).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(vanished(&heard, false), vec![uids[2]], "{heard:?}");
    assert!(!heard.iter().any(|l| l.ends_with(" EXPUNGE")), "{heard:?}");
    assert!(heard.iter().any(|l| l.contains("\\Flagged") && l.contains("MODSEQ (")), "{heard:?}");

    // UID FETCH … (CHANGEDSINCE h VANISHED): what vanished in the set, then the
    // changes (§3.2.6).
    let r = a.cmd("a4", &format!("UID FETCH 1:* (FLAGS) (CHANGEDSINCE {h} VANISHED)")).await;
    assert_eq!(vanished(&r, true), vec![uids[2]], "{r:?}");
    assert_eq!(fetches(&r).len(), 2, "the flag change and the new message: {r:?}");
    let r =
        a.cmd("a5", &format!("UID FETCH {}:{} (FLAGS) (CHANGEDSINCE {h} VANISHED)", uids[3], uids[4])).await;
    assert!(vanished(&r, true).is_empty(), "only UIDs of the set: {r:?}");

    // A new QRESYNC session resynchronises in its SELECT (§3.2.5).
    let (mut c, _tc) = login(reader, "bob@example.org", "pw").await;
    c.cmd("c0", "ENABLE QRESYNC").await;
    let r = c.cmd("c1", &format!("SELECT INBOX (QRESYNC ({validity} {h}))")).await;
    assert_eq!(tagged(&r), "c1 OK [READ-WRITE] SELECT completed", "{r:?}");
    assert_eq!(vanished(&r, true), vec![uids[2]], "{r:?}");
    let f = fetches(&r);
    assert_eq!(f.len(), 2, "{r:?}");
    assert!(
        f[0].contains(&format!("UID {} ", uids[0]))
            && f[0].contains("\\Flagged")
            && f[0].contains("MODSEQ (")
    );
    // Known UIDs limit VANISHED; a sequence match is accepted.
    let known = format!("{}:{},{}", uids[0], uids[1], uids[3]);
    let r = c.cmd("c2", &format!("EXAMINE INBOX (QRESYNC ({validity} {h} {known} (1:2 {known})))")).await;
    assert_eq!(r[0], "* OK [CLOSED] Previous mailbox closed", "{r:?}");
    assert!(vanished(&r, true).is_empty(), "{r:?}");
    assert_eq!(tagged(&r), "c2 OK [READ-ONLY] EXAMINE completed");
    // Another UIDVALIDITY: nothing incremental, the client starts over.
    let r = c.cmd("c3", &format!("SELECT INBOX (QRESYNC ({} {h}))", validity + 1)).await;
    assert!(vanished(&r, true).is_empty() && fetches(&r).is_empty(), "{r:?}");
    // CONDSTORE as a SELECT parameter.
    let (mut d, _td) = login(reader, "bob@example.org", "pw").await;
    let r = d.cmd("d1", "SELECT INBOX (CONDSTORE)").await;
    assert!(r.iter().any(|l| l.starts_with("* OK [HIGHESTMODSEQ ")), "{r:?}");
    let r = d.cmd("d2", &format!("UID STORE {} +FLAGS (\\Seen)", uids[1])).await;
    assert!(r[0].contains("MODSEQ ("), "{r:?}");

    // Tombstones pruned past h: the answer is still complete (every UID below
    // UIDNEXT that is not there), never short.
    let pruned = writer.store.prune_tombstones(chrono::Utc::now() + chrono::Duration::days(1)).await;
    assert!(pruned.expect("prune") >= 1);
    let r = c.cmd("c4", &format!("SELECT INBOX (QRESYNC ({validity} {h}))")).await;
    let gone = vanished(&r, true);
    assert!(gone.contains(&uids[2]), "{r:?}");
    let now = uids_of(&mut c, "c5").await;
    assert!(gone.iter().all(|u| !now.contains(u)), "a present message reported as vanished: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qresync_on_the_embedded_store() {
    let (app, _dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    seed(&app, 5).await;
    qresync_follows_changes(&app, &app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qresync_across_two_postgres_pods() {
    let db = TestDatabase::create("mc_qresync").await;
    let url = db.url.clone();
    let test = tokio::spawn(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = format!("mc_qresync_{:08x}:", rand::random::<u32>());
        let reader = pg_pod(&url, &prefix, dir.path()).await;
        let writer = pg_pod(&url, &prefix, dir.path()).await;
        writer.store.domain_add("example.org").await.expect("domain");
        seed(&writer, 5).await;
        qresync_follows_changes(&reader, &writer).await;
    });
    let result = tokio::time::timeout(Duration::from_secs(120), test).await;
    drop(db);
    result.expect("test within 120 s").expect("test passed");
}
