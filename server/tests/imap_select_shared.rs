//! A SELECT on a pod whose own SELECT cache does not hold the mailbox reads a
//! large mailbox's index from the shared cache (Redis), written by whichever pod
//! read it last, and brings it up to date with what changed since. What the
//! client is told must be exactly what a pod that reads the whole mailbox from
//! PostgreSQL tells it (RFC 3501 §6.3.1 and RFC 7162 §3.1: EXISTS, RECENT,
//! UNSEEN, UIDNEXT, HIGHESTMODSEQ; each message's flags and modseq; a keyword
//! SEARCH), after deliveries, flag and keyword changes, expunges, pruned
//! tombstones and a batch of deliveries (after which the shared copy is the
//! mailbox as it is now);
//! and whatever else the shared cache holds under the key is a miss. A fresh
//! database per test; the test FAILS when PostgreSQL or Redis is unreachable.

mod common;

use std::time::Duration;

use common::*;
use mailcluster_model::{Account, FlagOp, FlagSet, Flags, MailboxIndex, UidSet};
use mailcluster_server::app::App;
use mailcluster_server::view::shared_snapshot::{SharedEncoding, shared_key};
use mailcluster_testkit::TestDatabase;

/// EXAMINE (which claims no \Recent, so two pods can be asked in turn) and what a
/// client asks next: every message's UID, flags and modseq, and a keyword SEARCH.
async fn view(app: &App) -> Vec<String> {
    let (mut c, _tx) = login(app, "bob@example.org", "pw").await;
    let mut lines = c.cmd("E1", "EXAMINE INBOX").await;
    let fetch = c.cmd("F1", "UID FETCH 1:* (FLAGS MODSEQ)").await;
    lines.extend(fetch);
    lines.extend(c.cmd("S1", "UID SEARCH KEYWORD $Work").await);
    lines.extend(c.cmd("S2", "UID SEARCH UNSEEN").await);
    assert!(c.cmd("Z", "LOGOUT").await.last().is_some_and(|l| l.starts_with("Z OK")));
    lines
}

/// The reader's view equals the view of a pod that reads everything from the store.
async fn assert_same_view(reader: &App, reference: &App, step: &str) -> Vec<String> {
    let want = view(reference).await;
    assert!(want.iter().any(|l| l.starts_with("E1 OK")), "{step}: {want:?}");
    let got = view(reader).await;
    assert_eq!(got, want, "{step}");
    got
}

async fn deliver_n(app: &App, bob: &Account, n: usize, tag: &str) -> Vec<u32> {
    let mut uids = Vec::new();
    for i in 0..n {
        let flags =
            if i % 3 == 0 { FlagSet { system: Flags::SEEN, keywords: vec![] } } else { FlagSet::default() };
        uids.push(deliver(app, bob, "INBOX", &sample(&format!("{tag} {i}"), "body"), flags).await);
    }
    uids
}

struct Pods {
    writer: App,
    /// No SELECT cache of its own; shares every index.
    reader: App,
    /// Its own SELECT cache; shares every index.
    sharer: App,
    /// Neither: every SELECT reads the whole mailbox.
    reference: App,
}

/// The pods over a fresh database (dropped with the returned guard).
async fn pods(db_name: &str) -> (TestDatabase, tempfile::TempDir, Pods) {
    let db = TestDatabase::create(db_name).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = format!("mc_select_shared_{:08x}:", rand::random::<u32>());
    let writer = pg_pod(&db.url, &prefix, dir.path()).await;
    writer.store.domain_add("example.org").await.expect("domain");
    let configured = |local: usize, shared: usize| {
        app_configured(writer.store.clone(), writer.cache.clone(), |c| {
            c.tls.allow_plaintext_auth = true;
            c.imap.select_cache_messages = local;
            c.imap.shared_index_min_messages = shared;
        })
    };
    let pods = Pods {
        reader: configured(0, 1),
        sharer: configured(1_000_000, 1),
        reference: configured(0, 0),
        writer,
    };
    (db, dir, pods)
}

const LIMIT: Duration = Duration::from_secs(120);

fn select_cache(app: &App, result: &str) -> u64 {
    app.metrics.imap.select_cache.with_label_values(&[result]).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_its_own_cache_selects_from_the_shared_index() {
    let (_db, _dir, p) = pods("mc_select_shared").await;
    tokio::time::timeout(LIMIT, async {
        let bob = account(&p.writer, "bob@example.org", "pw").await;
        let inbox = p.writer.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX").id;
        assert_same_view(&p.reader, &p.reference, "empty").await;
        let uids = deliver_n(&p.writer, &bob, 6, "first").await;
        assert_same_view(&p.reader, &p.reference, "six delivered").await;
        assert_same_view(&p.reader, &p.reference, "nothing changed").await;

        // Flags and keywords on two, one expunged, more mail.
        let work = FlagSet { system: Flags::FLAGGED, keywords: vec!["$Work".into()] };
        p.writer
            .store
            .store_flags(inbox, &UidSet::from_uids(&uids[1..3]), FlagOp::Add, &work)
            .await
            .expect("flags");
        p.writer.store.expunge(inbox, Some(&UidSet::single(uids[0]))).await.expect("expunge");
        deliver_n(&p.writer, &bob, 2, "second").await;
        assert_same_view(&p.reader, &p.reference, "flags, keywords, expunge, delivery").await;

        // The sharer (with a cache of its own) selects too; then a keyword removed.
        assert_same_view(&p.sharer, &p.reference, "the sharer's view").await;
        let off = FlagSet { system: Flags::NONE, keywords: vec!["$Work".into()] };
        p.writer
            .store
            .store_flags(inbox, &UidSet::single(uids[1]), FlagOp::Remove, &off)
            .await
            .expect("flags");
        assert_same_view(&p.reader, &p.reference, "keyword removed").await;

        // Tombstones pruned past the shared copy's modseq: the full UID list decides.
        p.writer.store.expunge(inbox, Some(&UidSet::from_uids(&uids[3..5]))).await.expect("expunge");
        let pruned = p
            .writer
            .store
            .prune_tombstones(chrono::Utc::now() + chrono::Duration::days(1))
            .await
            .expect("prune");
        assert!(pruned >= 2, "tombstones pruned: {pruned}");
        assert_same_view(&p.reader, &p.reference, "tombstones pruned").await;

        // A SELECT that brought the index up to date writes it back.
        let epoch = p.reader.store.epoch().await.expect("epoch").unwrap_or_default();
        let key = shared_key(MailboxIndex::NAMESPACE, &epoch, inbox);
        let uid_validity =
            p.writer.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX").uid_validity;
        let shared_modseq = async || {
            let value = p.reader.cache.value_get(&key).await.expect("get").expect("a shared index");
            MailboxIndex::decode(&value, uid_validity).expect("decodes").highest_modseq
        };
        let before = shared_modseq().await;
        deliver_n(&p.writer, &bob, 70, "many").await;
        assert_same_view(&p.reader, &p.reference, "seventy delivered").await;
        let now =
            p.writer.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX").highest_modseq;
        let mut refreshed = false;
        for _ in 0..500 {
            if shared_modseq().await == now {
                refreshed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(refreshed, "the shared copy was written back: {before} -> {now}");
        assert_same_view(&p.reader, &p.reference, "after the refresh").await;

        assert_eq!(select_cache(&p.reader, "hit"), 0, "the reader has no cache of its own");
        assert!(select_cache(&p.reader, "shared") >= 6, "SELECTs from the shared index");
        assert_eq!(select_cache(&p.reference, "shared"), 0, "sharing off");
    })
    .await
    .expect("test within 120 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_under_the_shared_key_is_a_miss() {
    let (_db, _dir, p) = pods("mc_select_shared_junk").await;
    tokio::time::timeout(LIMIT, async {
        let bob = account(&p.writer, "bob@example.org", "pw").await;
        deliver_n(&p.writer, &bob, 3, "first").await;
        let inbox = p.writer.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX");
        let epoch = p.reader.store.epoch().await.expect("epoch").unwrap_or_default();
        let key = shared_key(MailboxIndex::NAMESPACE, &epoch, inbox.id);
        let header = |version: u8, uid_validity: u32, count: u32| {
            [
                &[version][..],
                &uid_validity.to_le_bytes(),
                &inbox.highest_modseq.to_le_bytes(),
                &inbox.uid_next.to_le_bytes(),
                &count.to_le_bytes(),
            ]
            .concat()
        };
        let no_keywords = 0u32.to_le_bytes();
        let junk: [(&str, Vec<u8>); 5] = [
            ("another encoding", [header(2, inbox.uid_validity, 0), no_keywords.to_vec()].concat()),
            // Well formed and empty: taken for the index, it would show nothing.
            ("another UIDVALIDITY", [header(1, inbox.uid_validity ^ 1, 0), no_keywords.to_vec()].concat()),
            ("fewer messages than counted", [header(1, inbox.uid_validity, 3), vec![0; 32]].concat()),
            ("no keyword section", header(1, inbox.uid_validity, 0)),
            ("not an index at all", b"* OK".to_vec()),
        ];
        for (what, value) in junk {
            p.reader.cache.value_put(&key, &value, Duration::from_secs(60)).await.expect("put junk");
            let misses = select_cache(&p.reader, "miss");
            assert_same_view(&p.reader, &p.reference, what).await;
            assert_eq!(select_cache(&p.reader, "miss"), misses + 1, "{what}: read from the store");
            // The SELECT shares what it read, in the background: wait for it, so
            // the next junk is not overwritten.
            for _ in 0..500 {
                if p.reader.cache.value_get(&key).await.expect("get").is_some_and(|v| v != value) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        assert_eq!(select_cache(&p.reader, "shared"), 0, "junk is never an index");
        assert_same_view(&p.reader, &p.reference, "shared by the previous SELECT").await;
        assert_eq!(select_cache(&p.reader, "shared"), 1);
    })
    .await
    .expect("test within 120 s");
}
