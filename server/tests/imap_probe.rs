//! The batched "has the mailbox changed?" probe of IMAP sessions: many questions,
//! few queries, and never an answer older than the question.

#[path = "smtp_support/faulty.rs"]
#[allow(dead_code)]
mod faulty;

use mailcluster_server::store::Mailboxes;
use mailcluster_server::store::Messages;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use faulty::FaultyStore;
use mailcluster_model::{FlagOp, FlagSet, Flags, UidSet};
use mailcluster_server::store::{self};
use mailcluster_server::view::probe::ModseqProbe;

fn counter(name: &str) -> prometheus::IntCounter {
    prometheus::IntCounter::new(name, name).expect("counter")
}

/// A real (embedded) store with one account; returns it wrapped, and the INBOX id.
async fn store_with_inbox(dir: &std::path::Path) -> (Arc<FaultyStore>, i64) {
    let inner = store::open(None, dir, 4, Duration::from_secs(5)).await.expect("open");
    inner.migrate().await.expect("migrate");
    inner.domain_add("example.org").await.expect("domain");
    let account = inner.account_create("bob@example.org", "x").await.expect("account");
    let inbox = inner.mailbox_get(account.id, "INBOX").await.expect("get").expect("INBOX");
    (Arc::new(FaultyStore::new(inner)), inbox.id)
}

/// Delivers one message (a new modseq); returns the mailbox's modseq after it.
async fn bump(store: &FaultyStore, inbox: i64) -> u64 {
    let raw = bytes::Bytes::from_static(b"Subject: x\r\n\r\nbody\r\n");
    let meta = mailcluster_model::message::parse_meta(&raw);
    let delivery = mailcluster_model::NewDelivery {
        raw,
        meta,
        internal_date: chrono::Utc::now(),
        targets: vec![inbox],
        flags: FlagSet::default(),
    };
    store.deliver_batch(&[delivery]).await.expect("deliver");
    store.mailbox_status(inbox).await.expect("status").highest_modseq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_questions_share_queries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, inbox) = store_with_inbox(dir.path()).await;
    let modseq = bump(&store, inbox).await;
    store.probe_delay_ms.store(30, Ordering::SeqCst);
    let probe = Arc::new(ModseqProbe::new(store.clone(), counter("q"), counter("b")));
    let asks: Vec<_> = (0..200)
        .map(|i| {
            let probe = probe.clone();
            let id = if i % 10 == 0 { inbox + 1000 } else { inbox };
            tokio::spawn(async move { (id, probe.highest_modseq(id).await.expect("probe")) })
        })
        .collect();
    for ask in asks {
        let (id, answer) = ask.await.expect("task");
        assert_eq!(answer, if id == inbox { Some(modseq) } else { None }, "mailbox {id}");
    }
    let batches = store.probe_batches.lock().expect("lock").clone();
    // 200 questions: the first query alone, the rest behind it in one or two.
    assert!(batches.len() <= 4, "{batches:?}");
    assert!(batches.iter().all(|&n| n <= 2), "mailbox ids are deduplicated: {batches:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_never_older_than_its_question() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, inbox) = store_with_inbox(dir.path()).await;
    let before = bump(&store, inbox).await;
    store.probe_delay_ms.store(200, Ordering::SeqCst);
    let probe = Arc::new(ModseqProbe::new(store.clone(), counter("q"), counter("b")));
    // A query reads `before` and holds its answer for 200 ms …
    let early = tokio::spawn({
        let probe = probe.clone();
        async move { probe.highest_modseq(inbox).await.expect("probe") }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // … a change commits meanwhile, then a new question is asked: it must not be
    // answered from the query already in flight.
    let after = bump(&store, inbox).await;
    assert!(after > before);
    let late = probe.highest_modseq(inbox).await.expect("probe");
    assert_eq!(early.await.expect("task"), Some(before));
    assert_eq!(late, Some(after));
    // And without any delay, a probe right after each change sees it.
    store.probe_delay_ms.store(0, Ordering::SeqCst);
    for _ in 0..20 {
        let m = bump(&store, inbox).await;
        assert_eq!(probe.highest_modseq(inbox).await.expect("probe"), Some(m));
        store
            .store_flags(
                inbox,
                &UidSet::all(),
                FlagOp::Add,
                &FlagSet { system: Flags::SEEN, keywords: vec![] },
            )
            .await
            .expect("flags");
        let m = store.mailbox_status(inbox).await.expect("status").highest_modseq;
        assert_eq!(probe.highest_modseq(inbox).await.expect("probe"), Some(m));
    }
}
