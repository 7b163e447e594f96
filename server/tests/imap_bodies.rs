//! FETCH's shared body reads: the links of many sessions' commands from few
//! queries, bodies from the per-process cache, and never a link older than the
//! question.

#[path = "smtp_support/faulty.rs"]
#[allow(dead_code)]
mod faulty;

use mailcluster_server::store::Mailboxes;
use mailcluster_server::store::Messages;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use faulty::FaultyStore;
use mailcluster_model::{FlagOp, FlagSet, Flags, UidSet};
use mailcluster_server::store::{self};
use mailcluster_server::view::bodies::{BodyMetrics, BodyReader};

struct Counters {
    hits: prometheus::IntCounter,
    misses: prometheus::IntCounter,
    link_queries: prometheus::IntCounter,
}

fn reader(store: Arc<FaultyStore>, cache_bytes: usize) -> (Arc<BodyReader>, Counters) {
    let c = |n: &str| prometheus::IntCounter::new(n, n).expect("counter");
    let counters = Counters { hits: c("hits"), misses: c("misses"), link_queries: c("link_queries") };
    let metrics = BodyMetrics {
        hits: counters.hits.clone(),
        misses: counters.misses.clone(),
        cached_bytes: prometheus::IntGauge::new("bytes", "bytes").expect("gauge"),
        link_questions: c("link_questions"),
        link_queries: counters.link_queries.clone(),
        body_questions: c("body_questions"),
        body_queries: c("body_queries"),
    };
    (Arc::new(BodyReader::new(store, cache_bytes, metrics)), counters)
}

fn raw(i: usize) -> Bytes {
    Bytes::from(format!("Subject: message {i}\r\n\r\n{}\r\n", "body ".repeat(i + 1)))
}

/// A real (embedded) store with one account and `n` messages in its INBOX;
/// returns it wrapped, the INBOX id and the UIDs (message i has `raw(i)`).
async fn store_with_messages(dir: &std::path::Path, n: usize) -> (Arc<FaultyStore>, i64, Vec<u32>) {
    let inner = store::open(None, dir, 4, Duration::from_secs(5)).await.expect("open");
    inner.migrate().await.expect("migrate");
    inner.domain_add("example.org").await.expect("domain");
    let account = inner.account_create("bob@example.org", "x").await.expect("account");
    let inbox = inner.mailbox_get(account.id, "INBOX").await.expect("get").expect("INBOX");
    let mut uids = Vec::new();
    for i in 0..n {
        let raw = raw(i);
        let delivery = mailcluster_model::NewDelivery {
            meta: mailcluster_model::message::parse_meta(&raw),
            raw,
            internal_date: chrono::Utc::now(),
            targets: vec![inbox.id],
            flags: FlagSet::default(),
        };
        uids.push(inner.deliver_batch(&[delivery]).await.expect("deliver")[0][0].uid);
    }
    (Arc::new(FaultyStore::new(inner)), inbox.id, uids)
}

/// 200 concurrent single-message FETCHes over `uids`; checks every answer.
async fn fetch_round(reader: &Arc<BodyReader>, inbox: i64, uids: &[u32]) {
    let asks: Vec<_> = (0..200)
        .map(|i| {
            let reader = reader.clone();
            let (n, uid) = (i % uids.len(), uids[i % uids.len()]);
            tokio::spawn(async move {
                let found = reader.links(inbox, &[uid, uid + 1000]).await.expect("links");
                assert!(found.highest_modseq.is_some());
                assert_eq!(
                    found.links.iter().map(|l| l.uid).collect::<Vec<_>>(),
                    vec![uid],
                    "unknown UIDs left out"
                );
                let link = &found.links[0];
                let bodies = reader.bodies(&[(link.message_id, link.internal_date)]).await.expect("bodies");
                let body = bodies[0].as_ref().expect("a linked message has a body");
                assert_eq!(body.body, raw(n), "uid {uid}");
                assert_eq!(body.header_size as usize, format!("Subject: message {n}\r\n\r\n").len());
            })
        })
        .collect();
    for ask in asks {
        ask.await.expect("task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fetches_share_queries_and_cached_bodies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, inbox, uids) = store_with_messages(dir.path(), 20).await;
    store.links_delay_ms.store(30, Ordering::SeqCst);
    let (reader, counters) = reader(store.clone(), 1024 * 1024);
    fetch_round(&reader, inbox, &uids).await;
    let links = store.link_batches.lock().expect("lock").clone();
    // 200 questions: the first query alone, the rest behind it in one or two.
    assert!(links.len() <= 4, "{links:?}");
    assert!(links.iter().all(|&n| n <= 40), "(mailbox, uid) pairs are deduplicated: {links:?}");
    assert_eq!(counters.link_queries.get(), links.len() as u64);
    // Sessions that miss the same body at once read it once between them.
    let reads = store.body_reads.lock().expect("lock").clone();
    let mut read: Vec<i64> = reads.iter().flatten().copied().collect();
    read.sort_unstable();
    let before_dedup = read.len();
    read.dedup();
    assert_eq!((before_dedup, read.len()), (uids.len(), uids.len()), "{reads:?}");
    // Every body is cached now: a second round reads none.
    let misses = counters.misses.get();
    assert_eq!(counters.hits.get() + misses, 200);
    fetch_round(&reader, inbox, &uids).await;
    assert_eq!(store.body_reads.lock().expect("lock").len(), reads.len(), "served from the cache");
    assert_eq!(counters.misses.get(), misses);
    assert_eq!(counters.hits.get() + misses, 400);
    // A link with another INTERNALDATE under a cached id (the id handed out again
    // after the database went back in time) is not served the cached body.
    let link = reader.links(inbox, &[uids[0]]).await.expect("links").links.remove(0);
    let other_date = link.internal_date + chrono::Duration::seconds(1);
    let reads_before = store.body_reads.lock().expect("lock").len();
    reader.bodies(&[(link.message_id, other_date)]).await.expect("bodies");
    assert_eq!(store.body_reads.lock().expect("lock").len(), reads_before + 1, "read again from the store");
    assert_eq!(counters.misses.get(), misses + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_cache_every_fetch_reads_its_body() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, inbox, uids) = store_with_messages(dir.path(), 5).await;
    let (reader, counters) = reader(store.clone(), 0);
    fetch_round(&reader, inbox, &uids).await;
    fetch_round(&reader, inbox, &uids).await;
    assert_eq!(counters.hits.get(), 0);
    assert_eq!(counters.misses.get(), 400);
    let read: usize = store.body_reads.lock().expect("lock").iter().map(Vec::len).sum();
    assert!(read >= 2 * uids.len(), "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_are_never_older_than_the_question() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, inbox, uids) = store_with_messages(dir.path(), 3).await;
    let before = store.mailbox_status(inbox).await.expect("status").highest_modseq;
    store.links_delay_ms.store(200, Ordering::SeqCst);
    let (reader, _) = reader(store.clone(), 1024 * 1024);
    // A query reads the links and holds its answer for 200 ms …
    let early = tokio::spawn({
        let (reader, uid) = (reader.clone(), uids[0]);
        async move { reader.links(inbox, &[uid]).await.expect("links") }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // … a STORE commits meanwhile, then the next question is asked: it must not be
    // answered from the query already in flight.
    let seen = FlagSet { system: Flags::SEEN, keywords: vec![] };
    store.store_flags(inbox, &UidSet::single(uids[0]), FlagOp::Add, &seen).await.expect("flags");
    let after = store.mailbox_status(inbox).await.expect("status").highest_modseq;
    assert!(after > before);
    let late = reader.links(inbox, &[uids[0]]).await.expect("links");
    let early = early.await.expect("task");
    assert_eq!(early.highest_modseq, Some(before));
    assert_eq!(early.links[0].flags.system, Flags::NONE);
    assert_eq!(late.highest_modseq, Some(after));
    assert_eq!(late.links[0].flags.system, Flags::SEEN);
    // An expunged message: no link, and the mailbox's new modseq says so.
    store.links_delay_ms.store(0, Ordering::SeqCst);
    store.expunge(inbox, Some(&UidSet::single(uids[1]))).await.expect("expunge");
    let gone = reader.links(inbox, &[uids[1]]).await.expect("links");
    assert!(gone.links.is_empty());
    assert!(gone.highest_modseq > Some(after));
    // A deleted mailbox: no modseq at all.
    let none = reader.links(inbox + 1000, &[1]).await.expect("links");
    assert_eq!(none.highest_modseq, None);
}
