//! FETCH racing another session's EXPUNGE (RFC 2180 §4.1, RFC 5530): a message
//! still in this session's view whose body was removed between this FETCH's reads
//! gets no FETCH data — never an empty or different value, which the client would
//! cache as that UID's content for ever — and the command answers
//! `NO [EXPUNGEISSUED]`.

mod common;
#[path = "smtp_support/faulty.rs"]
#[allow(dead_code)]
mod faulty;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use faulty::FaultyStore;
use mailcluster_model::FlagSet;
use mailcluster_server::cache::local::LocalCache;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_of_a_message_expunged_meanwhile_is_expungeissued_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let inner = mailcluster_server::store::open(None, dir.path(), 4, Duration::from_secs(5)).await.unwrap();
    inner.migrate().await.unwrap();
    inner.domain_add("example.org").await.unwrap();
    let store = Arc::new(FaultyStore::new(inner));
    // No body cache: the body is read from the store, after the links.
    let app = app_configured(store.clone(), Arc::new(LocalCache::new()), |c| {
        c.imap.body_cache_bytes = 0;
        c.tls.allow_plaintext_auth = true;
    });
    let bob = account(&app, "bob@example.org", "pw").await;
    deliver(&app, &bob, "INBOX", &sample("doomed", "soon gone"), FlagSet::default()).await;
    deliver(&app, &bob, "INBOX", &sample("stays", "still here"), FlagSet::default()).await;

    let (mut a, _ta) = login(&app, "bob@example.org", "pw").await;
    let (mut b, _tb) = login(&app, "bob@example.org", "pw").await;
    a.cmd("s", "SELECT INBOX").await;
    b.cmd("s", "SELECT INBOX").await;

    // A's FETCH reads the links, then waits; meanwhile B expunges message 1, whose
    // body goes with its last link.
    store.links_delay_ms.store(400, Ordering::SeqCst);
    let fetch = tokio::spawn(async move {
        let r = a.cmd("f", "FETCH 1:2 (BODY.PEEK[HEADER.FIELDS (SUBJECT)])").await;
        (a, r)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.links_delay_ms.store(0, Ordering::SeqCst);
    let r = b.cmd("d", "STORE 1 +FLAGS.SILENT (\\Deleted)").await;
    assert!(r.last().unwrap().starts_with("d OK"), "{r:?}");
    let r = b.cmd("e", "EXPUNGE").await;
    assert!(r.iter().any(|l| l == "* 1 EXPUNGE"), "{r:?}");

    let (mut a, r) = fetch.await.unwrap();
    let text = r.join("\n");
    assert!(!text.contains("{0}") && !text.contains("\"\""), "no empty content for a known UID: {r:?}");
    assert!(text.contains("Subject: stays"), "the other message is served: {r:?}");
    assert!(!text.contains("* 1 FETCH"), "nothing for the expunged one: {r:?}");
    assert!(r.last().unwrap().starts_with("f NO [EXPUNGEISSUED]"), "{r:?}");
    // The EXPUNGE reaches A at its next command.
    let r = a.cmd("n", "NOOP").await;
    assert!(r.iter().any(|l| l == "* 1 EXPUNGE"), "{r:?}");
}
