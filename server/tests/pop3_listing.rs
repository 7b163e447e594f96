//! Every POP3 login lists the maildrop as it is at that moment (RFC 1939 §5:
//! STAT, LIST and UIDL describe the maildrop the session locked), whatever
//! changed since the previous login and wherever the change was made: deliveries,
//! IMAP expunges and flag changes, another session's DELE, and expunge tombstones
//! pruned away. A pod keeps recent listings and brings them up to date; these
//! tests compare each login's STAT, LIST and UIDL with the store's own rows and
//! bodies, over the embedded store (cache on and off) and over PostgreSQL (two
//! pods, one reads and the other changes; one pod without the cache, so every
//! login reads the whole maildrop; a fresh database per test, the test FAILS
//! when PostgreSQL or Redis is unreachable).

mod common;

use std::time::Duration;

use common::*;
use mailcluster_model::{Account, FlagOp, FlagSet, Flags, UidSet};
use mailcluster_server::app::App;
use mailcluster_server::net::{Protocol, SessionStream, Shutdown};
use mailcluster_server::pop3::Pop3Protocol;
use mailcluster_server::view::maildrop;
use mailcluster_server::view::shared_snapshot::{SharedEncoding, shared_key};
use mailcluster_testkit::TestDatabase;
use tokio::io::DuplexStream;

struct Pop3 {
    client: Client<DuplexStream>,
    _shutdown: tokio::sync::watch::Sender<bool>,
}

impl Pop3 {
    async fn login(app: &App) -> Pop3 {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (tx, shutdown) = Shutdown::new();
        let proto = Pop3Protocol::new(app.clone(), false);
        tokio::spawn(async move { proto.handle(SessionStream::Memory(server), ctx(shutdown)).await });
        let mut c = Pop3 { client: Client::new(client), _shutdown: tx };
        assert!(c.client.line().await.starts_with("+OK"), "greeting");
        assert!(c.cmd("USER bob@example.org").await.starts_with("+OK"));
        let r = c.cmd("PASS secret pw").await;
        assert!(r.starts_with("+OK"), "{r}");
        c
    }

    async fn cmd(&mut self, line: &str) -> String {
        self.client.send(&format!("{line}\r\n")).await;
        self.client.line().await
    }

    /// A multi-line command's lines up to the terminating ".".
    async fn multi(&mut self, line: &str) -> Vec<String> {
        let first = self.cmd(line).await;
        assert!(first.starts_with("+OK"), "{line}: {first}");
        let mut lines = Vec::new();
        loop {
            let l = self.client.line().await;
            if l == "." {
                return lines;
            }
            lines.push(l);
        }
    }
}

/// Logs in on `app` and checks STAT, LIST and UIDL against the INBOX's rows and
/// stored bodies as the store has them now; returns the UIDs listed.
async fn assert_login_lists_the_inbox(app: &App, bob: &Account, step: &str) -> Vec<u32> {
    let inbox = app.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX");
    let rows = app.store.messages_by_uid(inbox.id, &UidSet::all()).await.expect("rows");
    let mut sizes = Vec::new();
    for row in &rows {
        sizes.push(app.store.message_body(row.message_id).await.expect("body").len());
    }
    let mut c = Pop3::login(app).await;
    let total: usize = sizes.iter().sum();
    assert_eq!(c.cmd("STAT").await, format!("+OK {} {total}", rows.len()), "{step}: STAT");
    let list: Vec<String> = sizes.iter().enumerate().map(|(i, s)| format!("{} {s}", i + 1)).collect();
    assert_eq!(c.multi("LIST").await, list, "{step}: LIST");
    let uidl: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{} {:08x}{:08x}", i + 1, inbox.uid_validity, r.uid))
        .collect();
    assert_eq!(c.multi("UIDL").await, uidl, "{step}: UIDL");
    assert!(c.cmd("QUIT").await.starts_with("+OK"));
    rows.iter().map(|r| r.uid).collect()
}

async fn deliver_n(app: &App, bob: &Account, n: usize, tag: &str) {
    for i in 0..n {
        // Sizes differ per message, so a LIST that pairs a size with the wrong
        // message shows.
        let body = "x".repeat(10 + i * 7);
        deliver(app, bob, "INBOX", &sample(&format!("{tag} {i}"), &body), FlagSet::default()).await;
    }
}

/// `reader` lists the maildrop at every step; `writer` (the same pod, or another
/// one of the same database) changes it in between.
async fn listing_follows_every_change(reader: &App, writer: &App) {
    let bob = account(writer, "bob@example.org", "secret pw").await;
    let inbox = writer.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX").id;
    assert!(assert_login_lists_the_inbox(reader, &bob, "empty").await.is_empty());
    deliver_n(writer, &bob, 4, "first").await;
    let uids = assert_login_lists_the_inbox(reader, &bob, "four delivered").await;
    assert_eq!(uids.len(), 4);
    assert_login_lists_the_inbox(reader, &bob, "nothing changed").await;

    // New mail, an IMAP expunge of the oldest, a flag change on another.
    deliver_n(writer, &bob, 2, "second").await;
    writer.store.expunge(inbox, Some(&UidSet::single(uids[0]))).await.expect("expunge");
    let seen = FlagSet { system: Flags::SEEN.union(Flags::FLAGGED), keywords: vec!["$Work".into()] };
    writer.store.store_flags(inbox, &UidSet::single(uids[2]), FlagOp::Add, &seen).await.expect("flags");
    let uids = assert_login_lists_the_inbox(reader, &bob, "delivery, expunge, flags").await;
    assert_eq!(uids.len(), 5);

    // A POP3 session on the writer: RETR (\Seen at QUIT) and DELE of message 2.
    let mut c = Pop3::login(writer).await;
    assert!(c.multi("RETR 1").await.len() > 3);
    assert!(c.cmd("DELE 2").await.starts_with("+OK"));
    assert!(c.cmd("QUIT").await.starts_with("+OK"));
    let left = assert_login_lists_the_inbox(reader, &bob, "another session's DELE").await;
    assert_eq!(left, [&uids[..1], &uids[2..]].concat());

    // The highest UID listed is expunged, then more mail arrives.
    let highest = *left.last().expect("messages left");
    writer.store.expunge(inbox, Some(&UidSet::single(highest))).await.expect("expunge");
    deliver_n(writer, &bob, 3, "third").await;
    let now = assert_login_lists_the_inbox(reader, &bob, "highest expunged, more mail").await;
    assert!(!now.contains(&highest) && now.len() == left.len() - 1 + 3);

    // Tombstones pruned past what the reader listed: the full UID list decides.
    writer.store.expunge(inbox, Some(&UidSet::from_uids(&now[1..3]))).await.expect("expunge");
    let pruned =
        writer.store.prune_tombstones(chrono::Utc::now() + chrono::Duration::days(1)).await.expect("prune");
    assert!(pruned >= 2, "the store keeps tombstones and prunes them: {pruned}");
    deliver_n(writer, &bob, 1, "fourth").await;
    let last = assert_login_lists_the_inbox(reader, &bob, "tombstones pruned").await;
    assert_eq!(last.len(), now.len() - 2 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_lists_the_maildrop_as_it_is() {
    let (app, _dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    listing_follows_every_change(&app, &app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_without_the_listing_cache_answers_the_same() {
    let (app, _dir) = embedded_app(|c| {
        c.tls.allow_plaintext_auth = true;
        c.pop3.maildrop_cache_messages = 0;
    })
    .await;
    listing_follows_every_change(&app, &app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pod_lists_what_another_pod_changed() {
    on_postgres("mc_pop3_listing", Setup::TwoPods).await;
}

/// Every login reads the whole maildrop from PostgreSQL: what happens to a pod
/// whose maildrops exceed the listing cache's budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pod_without_the_listing_cache_answers_the_same() {
    on_postgres("mc_pop3_listing_uncached", Setup::Uncached).await;
}

/// A pod without a cache of its own reads large maildrops' listings from the
/// shared cache (Redis) that another pod wrote, and brings them up to date with
/// what changed since; each login still lists the maildrop exactly as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pod_lists_from_the_shared_cache() {
    on_postgres("mc_pop3_listing_shared", Setup::Shared).await;
}

/// Whatever the shared cache holds under a maildrop's key (another encoding,
/// another UIDVALIDITY, a cut value) is a miss: the login reads the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pod_ignores_an_unreadable_shared_listing() {
    on_postgres("mc_pop3_listing_garbage", Setup::Garbage).await;
}

#[derive(Clone, Copy, PartialEq)]
enum Setup {
    /// One pod lists, another changes.
    TwoPods,
    /// One pod without the listing cache does both.
    Uncached,
    /// The reader has no cache of its own; both share every listing.
    Shared,
    /// The reader finds junk under the shared key.
    Garbage,
}

async fn on_postgres(db_name: &str, setup: Setup) {
    let db = TestDatabase::create(db_name).await;
    let url = db.url.clone();
    let test = tokio::spawn(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = format!("mc_pop3_listing_{:08x}:", rand::random::<u32>());
        let writer = pg_pod(&url, &prefix, dir.path()).await;
        writer.store.domain_add("example.org").await.expect("domain");
        let configured = |local: usize, shared: usize| {
            app_configured(writer.store.clone(), writer.cache.clone(), |c| {
                c.tls.allow_plaintext_auth = true;
                c.pop3.maildrop_cache_messages = local;
                c.pop3.shared_listing_min_messages = shared;
            })
        };
        match setup {
            Setup::TwoPods => {
                let reader = pg_pod(&url, &prefix, dir.path()).await;
                listing_follows_every_change(&reader, &writer).await;
            }
            Setup::Uncached => {
                let pod = configured(0, 0);
                listing_follows_every_change(&pod, &pod).await;
            }
            Setup::Shared => {
                let (reader, sharer) = (configured(0, 1), configured(1_000_000, 1));
                listing_follows_every_change(&reader, &sharer).await;
                let from = |source| reader.metrics.imap.pop3_listings.with_label_values(&[source]).get();
                assert!(from("shared") >= 4, "logins served from the shared cache: {}", from("shared"));
                assert_eq!(from("local"), 0, "the reader has no cache of its own");
            }
            Setup::Garbage => junk_is_a_miss(&configured(0, 1), &writer).await,
        }
    });
    let result = tokio::time::timeout(Duration::from_secs(120), test).await;
    drop(db);
    result.expect("test within 120 s").expect("test passed");
}

/// Puts values that are not bob's INBOX listing under its shared key, one at a
/// time, and checks that each login lists the maildrop from the store.
async fn junk_is_a_miss(reader: &App, writer: &App) {
    let bob = account(writer, "bob@example.org", "secret pw").await;
    deliver_n(writer, &bob, 3, "first").await;
    let inbox = writer.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX");
    let epoch = reader.store.epoch().await.expect("epoch").unwrap_or_default();
    let key = shared_key(maildrop::Listing::NAMESPACE, &epoch, inbox.id);
    let header = |version: u8, uid_validity: u32, count: u32| {
        [
            &[version][..],
            &uid_validity.to_le_bytes(),
            &inbox.highest_modseq.to_le_bytes(),
            &count.to_le_bytes(),
        ]
        .concat()
    };
    let junk: [(&str, Vec<u8>); 4] = [
        ("another encoding", header(2, inbox.uid_validity, 0)),
        // Well formed and empty: taken for the listing, it would list nothing.
        ("another UIDVALIDITY", header(1, inbox.uid_validity ^ 1, 0)),
        ("fewer entries than counted", [header(1, inbox.uid_validity, 3), vec![0; 48]].concat()),
        ("not a listing at all", b"+OK".to_vec()),
    ];
    let from = |source| reader.metrics.imap.pop3_listings.with_label_values(&[source]).get();
    for (what, value) in junk {
        reader.cache.value_put(&key, &value, Duration::from_secs(60)).await.expect("put junk");
        let store_reads = from("store");
        assert_login_lists_the_inbox(reader, &bob, what).await;
        assert_eq!(from("store"), store_reads + 1, "{what}: read from the store");
        // The login shares what it read, in the background: wait for it, so the
        // next junk is not overwritten.
        for _ in 0..500 {
            if reader.cache.value_get(&key).await.expect("get").is_some_and(|v| v != value) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(from("shared"), 0, "junk is never a listing");
    // What the last login shared serves the next one.
    assert_login_lists_the_inbox(reader, &bob, "shared by the previous login").await;
    assert_eq!(from("shared"), 1);
}
