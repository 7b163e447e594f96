//! Store conformance suite: ONE set of tests, each run against PostgreSQL and
//! against the embedded SQLite store (`conformance!` below instantiates both).
//!
//! PostgreSQL tests create a fresh database (`mc_test_<random>`) on `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`), drop it afterwards and
//! FAIL when the server is unreachable. SQLite tests use a file in a tempdir.
//!
//! Run: `cargo test -p mailcluster-server --test store_conformance`

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use mailcluster_model::{
    DomainKey, Expunged, FlagOp, FlagRow, FlagSet, Flags, MessageMeta, NewDelivery, NewQueueItem,
    QueueAttempt, QueueStats, RecipientOutcome, RecipientStatus, SpecialUse, UidSet,
};
use mailcluster_server::store::{self, Store, StoreError};
use sqlx::Connection;

const TEST_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

use mailcluster_testkit::{Backend, TestDatabase, database_url};

/// What a test gets: the store under test plus the means to open a second store
/// on the same database and to peek at storage details the trait hides.
#[derive(Clone)]
struct Ctx {
    store: Arc<dyn Store>,
    backend: Backend,
    url: String,
    data_dir: PathBuf,
}

impl Ctx {
    /// Runs one statement behind the trait (`$1`-style placeholders are not used).
    async fn exec_sql(&self, sql: &str) {
        match self.backend {
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.expect("pg connect");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.expect("statement");
            }
            Backend::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url).expect("sqlite url");
                let mut c = sqlx::SqliteConnection::connect_with(&opts).await.expect("sqlite connect");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.expect("statement");
            }
        }
    }

    /// How many message bodies the database holds, linked or not.
    async fn body_count(&self) -> i64 {
        let sql = "SELECT count(*) FROM messages";
        match self.backend {
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.expect("pg connect");
                sqlx::query_scalar(sql).fetch_one(&mut c).await.expect("count")
            }
            Backend::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url).expect("sqlite url");
                let mut c = sqlx::SqliteConnection::connect_with(&opts).await.expect("sqlite connect");
                sqlx::query_scalar(sql).fetch_one(&mut c).await.expect("count")
            }
        }
    }

    async fn open_again(&self) -> Arc<dyn Store> {
        store::open(Some(&self.url), &self.data_dir, 4, CONNECT_TIMEOUT).await.expect("second store opens")
    }

    /// (compressed, stored length) of a message body, read behind the trait.
    async fn stored_body(&self, message_id: i64) -> (bool, i64) {
        match self.backend {
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.expect("pg connect");
                sqlx::query_as("SELECT compressed, length(body)::bigint FROM messages WHERE id = $1")
                    .bind(message_id)
                    .fetch_one(&mut c)
                    .await
                    .expect("body row")
            }
            Backend::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url).expect("sqlite url");
                let mut c = sqlx::SqliteConnection::connect_with(&opts).await.expect("sqlite connect");
                sqlx::query_as("SELECT compressed, length(body) FROM messages WHERE id = ?")
                    .bind(message_id)
                    .fetch_one(&mut c)
                    .await
                    .expect("body row")
            }
        }
    }
}

struct Harness {
    ctx: Ctx,
    pg_db: Option<TestDatabase>,
    _dir: tempfile::TempDir,
}

async fn harness(backend: Backend, migrate: bool) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, pg_db) = backend.fresh_database(dir.path(), "mc_test").await;
    let store = store::open(Some(&url), dir.path(), 8, CONNECT_TIMEOUT).await.expect("store opens");
    if migrate {
        store.migrate().await.expect("migrations apply");
    }
    Harness { ctx: Ctx { store, backend, url, data_dir: dir.path().to_path_buf() }, pg_db, _dir: dir }
}

impl Harness {
    /// The store's pool closes before its database is dropped.
    async fn teardown(self) {
        drop(self.ctx);
        drop(self.pg_db);
    }
}

/// Runs one test body with a bounded time, always dropping its database.
async fn run<F, Fut>(backend: Backend, migrate: bool, test: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let h = harness(backend, migrate).await;
    let outcome = tokio::time::timeout(TEST_TIMEOUT, tokio::spawn(test(h.ctx.clone()))).await;
    h.teardown().await;
    match outcome {
        Err(_) => panic!("test timed out after {TEST_TIMEOUT:?}"),
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(Err(e)) => panic!("test task failed: {e}"),
        Ok(Ok(())) => {}
    }
}

/// Instantiates each test once per backend: `postgres::name` and `sqlite::name`.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        conformance!(@on postgres Postgres, $($name),*);
        conformance!(@on sqlite Sqlite, $($name),*);
    };
    (@on $module:ident $backend:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::run(super::Backend::$backend, true, super::$name).await
                }
            )*
        }
    };
}

conformance!(
    basics_ping_stats_migrate,
    domains,
    accounts,
    account_delete_removes_bodies,
    mailboxes_create_get_list,
    mailbox_errors,
    mailbox_delete_removes_orphans_only,
    rename_with_children,
    rename_inbox,
    subscriptions,
    subscriptions_follow_rename,
    aliases,
    accounts_import_batches,
    account_senders,
    disabled_accounts,
    provisioning_is_idempotent,
    recipients,
    domain_keys,
    last_login,
    deliver_and_read,
    deliver_errors_store_nothing,
    deliver_stops_at_the_last_uid,
    body_stored_once_for_many_recipients,
    compression_round_trip,
    store_flags_semantics,
    uids_by_flags_queries,
    expunge_and_tombstones,
    maildrop_listing,
    mailbox_index_snapshot,
    conditional_store,
    message_links_and_bodies,
    changes_since_after_store_and_expunge,
    copy_and_move,
    several_uid_ranges_touch_their_messages_only,
    concurrent_group_commit,
    queue_lifecycle,
    queue_claim_is_exclusive,
    leases_limit_renew_expire,
    leases_are_exclusive_across_pods,
    recent_is_claimed_once,
    tombstones_pruned_past_a_floor,
    sort_rows_match_the_stored_metadata,
    quota_limits_and_usage,
    sieve_scripts,
    sieve_script_quota,
    sieve_scripts_go_with_their_account,
    sieve_vacation_once_per_period_across_pods,
    sieve_duplicate_and_prune,
);

// ---------------------------------------------------------------- helpers

fn ts(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().expect("valid timestamp")
}

fn meta_for(subject: &str, raw: &[u8]) -> MessageMeta {
    MessageMeta {
        size: raw.len() as u32,
        header_size: 20,
        envelope: format!("(NIL \"{subject}\" NIL NIL NIL NIL NIL NIL NIL NIL)"),
        body_structure: "(\"text\" \"plain\" NIL NIL NIL \"7bit\" 5 1)".into(),
        body: "(\"text\" \"plain\" NIL NIL NIL \"7bit\" 5 1)".into(),
        parts: vec![mailcluster_model::PartInfo {
            path: vec![1],
            header_start: 0,
            body_start: 20,
            body_end: 25,
            is_message: false,
        }],
        subject: subject.into(),
        from: "alice@example.com".into(),
        to: "bob@example.com".into(),
        cc: String::new(),
        bcc: String::new(),
        message_id: format!("<{subject}@example.com>"),
        sent_date: Some(ts(1_700_000_000)),
        sent_offset_minutes: None,
        // Kept with the rest (an APPEND's zone), on both backends.
        internal_offset_minutes: Some(-300),
    }
}

fn delivery(subject: &str, targets: &[i64]) -> NewDelivery {
    let raw = Bytes::from(format!("Subject: {subject}\r\n\r\nHello\r\n"));
    NewDelivery {
        meta: meta_for(subject, &raw),
        raw,
        internal_date: ts(1_700_000_100),
        targets: targets.to_vec(),
        flags: FlagSet::default(),
    }
}

fn flagset(system: Flags, keywords: &[&str]) -> FlagSet {
    FlagSet { system, keywords: keywords.iter().map(|k| k.to_string()).collect() }
}

/// A domain + account; returns (account id, INBOX id).
async fn account(s: &Arc<dyn Store>, email: &str) -> (i64, i64) {
    let domain = email.rsplit_once('@').expect("address").1;
    match s.domain_add(domain).await {
        Ok(()) | Err(StoreError::AlreadyExists(_)) => {}
        Err(e) => panic!("domain_add: {e}"),
    }
    let acc = s.account_create(email, "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA").await.expect("account");
    let inbox = s.mailbox_get(acc.id, "INBOX").await.expect("get").expect("INBOX exists");
    (acc.id, inbox.id)
}

async fn deliver_one(
    s: &Arc<dyn Store>,
    subject: &str,
    targets: &[i64],
) -> Vec<mailcluster_model::DeliveredTo> {
    let mut out = s.deliver_batch(&[delivery(subject, targets)]).await.expect("deliver");
    out.pop().expect("one result")
}

/// Delivers `n` messages, subjects "m0", "m1", …, to `mailbox`; their UIDs in order.
async fn deliver_numbered(s: &Arc<dyn Store>, n: usize, mailbox: i64) -> Vec<u32> {
    let mut uids = Vec::new();
    for i in 0..n {
        uids.push(deliver_one(s, &format!("m{i}"), &[mailbox]).await[0].uid);
    }
    uids
}

async fn message_id_of(s: &Arc<dyn Store>, mailbox: i64, uid: u32) -> i64 {
    let rows = s.messages_by_uid(mailbox, &UidSet::single(uid)).await.expect("messages_by_uid");
    rows.first().unwrap_or_else(|| panic!("uid {uid} in mailbox {mailbox}")).message_id
}

/// Checks the status counters against the rows themselves.
async fn assert_counts(s: &Arc<dyn Store>, mailbox: i64) {
    let status = s.mailbox_status(mailbox).await.expect("status");
    let uids = s.mailbox_uids(mailbox).await.expect("uids");
    let unseen = s.uids_by_flags(mailbox, Flags::NONE, Flags::SEEN).await.expect("unseen");
    assert_eq!(status.messages as usize, uids.len(), "messages counter of mailbox {mailbox}");
    assert_eq!(status.unseen as usize, unseen.len(), "unseen counter of mailbox {mailbox}");
    let listing = s.maildrop(mailbox, 0).await.expect("listing");
    for e in &listing {
        let body = s.message_body(e.message_id).await.expect("body");
        assert_eq!(body.len(), e.size as usize, "size of uid {} in mailbox {mailbox}", e.uid);
    }
    let octets: u64 = listing.iter().map(|e| u64::from(e.size)).sum();
    assert_eq!(s.mailbox_size(mailbox).await.expect("size"), octets, "bytes counter of mailbox {mailbox}");
    let deleted = s.uids_by_flags(mailbox, Flags::DELETED, Flags::NONE).await.expect("deleted");
    let deleted_octets: u64 =
        listing.iter().filter(|e| deleted.contains(&e.uid)).map(|e| u64::from(e.size)).sum();
    assert_eq!(
        s.mailbox_deleted(mailbox).await.expect("deleted"),
        (deleted.len() as u32, deleted_octets),
        "\\Deleted messages of mailbox {mailbox}"
    );
    if let Some(max) = uids.last() {
        assert!(status.uid_next > *max, "uid_next {} must exceed max uid {max}", status.uid_next);
    }
}

fn is_not_found<T: std::fmt::Debug>(r: Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::NotFound(_)))
}

// ---------------------------------------------------------------- tests

async fn basics_ping_stats_migrate(ctx: Ctx) {
    let s = &ctx.store;
    assert_eq!(
        s.backend(),
        match ctx.backend {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    );
    s.ping().await.expect("ping");
    // migrations are idempotent
    s.migrate().await.expect("second migrate");
    s.migrate().await.expect("third migrate");
    // A database a later release migrated further (a rollback): still accepted.
    let checksum = match ctx.backend {
        Backend::Postgres => "'\\x00'",
        Backend::Sqlite => "X'00'",
    };
    ctx.exec_sql(&format!(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99999, 'a later release', true, {checksum}, 0)"
    ))
    .await;
    s.migrate().await.expect("migrate with a later release's migration applied");
    let stats = s.pool_stats();
    assert!(stats.max >= 1, "{stats:?}");
    assert!(stats.idle + stats.in_use <= stats.max, "{stats:?}");
    // acquire times reach the observer (mail_db_pool_acquire_seconds)
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    s.set_acquire_observer(Arc::new(move |d: Duration| {
        assert!(d < CONNECT_TIMEOUT);
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }));
    s.domain_list().await.expect("list");
    s.ping().await.expect("ping");
    assert!(seen.load(std::sync::atomic::Ordering::Relaxed) >= 2, "observer called per acquisition");
    // a second store (another pod) on the same database agrees
    let other = ctx.open_again().await;
    other.migrate().await.expect("migrate from second store");
    s.domain_add("example.com").await.expect("domain");
    assert!(other.domain_exists("example.com").await.expect("exists"));
}

async fn domains(ctx: Ctx) {
    let s = &ctx.store;
    s.domain_add("Example.COM").await.expect("add");
    s.domain_add("other.org").await.expect("add");
    assert!(matches!(s.domain_add("example.com").await, Err(StoreError::AlreadyExists(_))));
    assert!(matches!(s.domain_add("").await, Err(StoreError::Invalid(_))));
    assert_eq!(s.domain_list().await.expect("list"), vec!["example.com", "other.org"]);
    assert!(s.domain_exists("EXAMPLE.com").await.expect("exists"));
    assert!(!s.domain_exists("nope.net").await.expect("exists"));
    assert!(is_not_found(s.domain_del("nope.net").await));
    s.account_create("a@example.com", "h").await.expect("account");
    assert!(matches!(s.domain_del("example.com").await, Err(StoreError::Invalid(_))));
    s.domain_del("other.org").await.expect("del");
    assert_eq!(s.domain_list().await.expect("list"), vec!["example.com"]);
    s.account_delete("a@example.com").await.expect("account delete");
    s.domain_del("example.com").await.expect("del after accounts gone");
    assert!(s.domain_list().await.expect("list").is_empty());
}

async fn accounts(ctx: Ctx) {
    let s = &ctx.store;
    s.domain_add("example.com").await.expect("domain");
    s.domain_add("b.org").await.expect("domain");
    let before = Utc::now() - chrono::Duration::seconds(5);
    let acc = s.account_create("Alice@Example.com", "hash1").await.expect("create");
    assert_eq!(acc.email, "alice@example.com");
    assert_eq!(acc.domain, "example.com");
    assert_eq!(acc.password_hash, "hash1");
    assert!(acc.created_at > before && acc.created_at <= Utc::now() + chrono::Duration::seconds(5));
    assert!(matches!(s.account_create("ALICE@example.com", "x").await, Err(StoreError::AlreadyExists(_))));
    assert!(is_not_found(s.account_create("bob@unknown.net", "x").await));
    assert!(matches!(s.account_create("no-at-sign", "x").await, Err(StoreError::Invalid(_))));

    let got = s.account_get("ALICE@EXAMPLE.COM").await.expect("get").expect("found");
    assert_eq!(got, acc);
    assert!(s.account_get("nobody@example.com").await.expect("get").is_none());

    // default mailboxes with their special-use attributes
    let boxes = s.mailbox_list(acc.id).await.expect("list");
    let names: BTreeMap<String, Option<SpecialUse>> =
        boxes.iter().map(|m| (m.name.clone(), m.special_use)).collect();
    let mut expected = BTreeMap::from([("INBOX".to_string(), None)]);
    for u in SpecialUse::ALL {
        expected.insert(u.default_name().to_string(), Some(u));
    }
    assert_eq!(names, expected);
    let validities: BTreeSet<u32> = boxes.iter().map(|m| m.uid_validity).collect();
    assert_eq!(validities.len(), boxes.len(), "UIDVALIDITY differs per mailbox");
    for m in &boxes {
        assert_eq!(m.uid_next, 1);
        assert_eq!(m.account_id, acc.id);
    }

    s.account_set_password("alice@EXAMPLE.com", "hash2").await.expect("set password");
    assert_eq!(s.account_get("alice@example.com").await.expect("get").expect("found").password_hash, "hash2");
    assert!(is_not_found(s.account_set_password("nobody@example.com", "h").await));

    s.account_create("carol@b.org", "h").await.expect("create");
    s.account_create("bob@example.com", "h").await.expect("create");
    let all: Vec<String> = s.account_list(None).await.expect("list").into_iter().map(|a| a.email).collect();
    assert_eq!(all, vec!["alice@example.com", "bob@example.com", "carol@b.org"]);
    let ex: Vec<String> =
        s.account_list(Some("Example.com")).await.expect("list").into_iter().map(|a| a.email).collect();
    assert_eq!(ex, vec!["alice@example.com", "bob@example.com"]);

    s.account_delete("Bob@example.com").await.expect("delete");
    assert!(s.account_get("bob@example.com").await.expect("get").is_none());
    assert!(is_not_found(s.account_delete("bob@example.com").await));
    // the address can be reused
    s.account_create("bob@example.com", "h").await.expect("re-create");
}

async fn account_delete_removes_bodies(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox_a) = account(s, "a@example.com").await;
    let (_, inbox_b) = account(s, "b@example.com").await;
    let only_a = deliver_one(s, "only-a", &[inbox_a]).await;
    let shared = deliver_one(s, "shared", &[inbox_a, inbox_b]).await;
    let only_a_msg = message_id_of(s, inbox_a, only_a[0].uid).await;
    let shared_msg = message_id_of(s, inbox_a, shared[0].uid).await;
    s.account_delete("a@example.com").await.expect("delete");
    assert!(is_not_found(s.message_body(only_a_msg).await), "unlinked body removed");
    assert!(s.message_body(shared_msg).await.is_ok(), "body still linked by b stays");
    assert!(s.mailbox_get_by_id(inbox_a).await.expect("get").is_none());
}

async fn mailboxes_create_get_list(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let m = s.mailbox_create(acc, "Projects/2024/Q1", None).await.expect("create");
    assert_eq!(m.name, "Projects/2024/Q1");
    assert_eq!(m.uid_next, 1);
    assert!(m.highest_modseq >= 1);
    // parents were created
    for parent in ["Projects", "Projects/2024"] {
        assert!(s.mailbox_get(acc, parent).await.expect("get").is_some(), "{parent} created");
    }
    let sent2 = s.mailbox_create(acc, "Sent Items", Some(SpecialUse::Sent)).await.expect("create");
    assert_eq!(sent2.special_use, Some(SpecialUse::Sent));
    assert_eq!(s.mailbox_get_by_id(m.id).await.expect("get"), Some(m.clone()));
    assert_eq!(s.mailbox_get(acc, "Projects/2024/Q1").await.expect("get"), Some(m.clone()));
    assert!(s.mailbox_get(acc, "projects/2024/q1").await.expect("get").is_none(), "names are case-sensitive");
    for spelling in ["INBOX", "inbox", "InBox"] {
        assert_eq!(s.mailbox_get(acc, spelling).await.expect("get").map(|m| m.id), Some(inbox));
    }
    let sub = s.mailbox_create(acc, "inbox/Sub", None).await.expect("create under INBOX");
    assert_eq!(sub.name, "INBOX/Sub");
    let names: Vec<String> = s.mailbox_list(acc).await.expect("list").into_iter().map(|m| m.name).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "list is sorted by name");
    assert!(names.contains(&"Projects/2024".to_string()));
    assert!(s.mailbox_get_by_id(i64::MAX).await.expect("get").is_none());
    let status = s.mailbox_status(m.id).await.expect("status");
    assert_eq!((status.messages, status.unseen, status.uid_next), (0, 0, 1));
    assert_eq!(status.uid_validity, m.uid_validity);
}

async fn mailbox_errors(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, _) = account(s, "a@example.com").await;
    s.mailbox_create(acc, "Work", None).await.expect("create");
    assert!(matches!(s.mailbox_create(acc, "Work", None).await, Err(StoreError::AlreadyExists(_))));
    assert!(matches!(s.mailbox_create(acc, "INBOX", None).await, Err(StoreError::AlreadyExists(_))));
    assert!(matches!(s.mailbox_create(acc, "inbox", None).await, Err(StoreError::AlreadyExists(_))));
    for bad in ["", "/x", "x/", "a//b"] {
        assert!(matches!(s.mailbox_create(acc, bad, None).await, Err(StoreError::Invalid(_))), "{bad:?}");
    }
    assert!(is_not_found(s.mailbox_create(i64::MAX, "X", None).await), "unknown account");
    assert!(matches!(s.mailbox_delete(acc, "INBOX").await, Err(StoreError::Invalid(_))));
    assert!(matches!(s.mailbox_delete(acc, "inbox").await, Err(StoreError::Invalid(_))));
    assert!(is_not_found(s.mailbox_delete(acc, "Nope").await));
    assert!(is_not_found(s.mailbox_rename(acc, "Nope", "Other").await));
    assert!(matches!(s.mailbox_rename(acc, "Work", "Sent").await, Err(StoreError::AlreadyExists(_))));
    assert!(matches!(s.mailbox_rename(acc, "Work", "INBOX").await, Err(StoreError::AlreadyExists(_))));
    assert!(matches!(s.mailbox_rename(acc, "Work", "Work/Sub").await, Err(StoreError::Invalid(_))));
    assert!(is_not_found(s.mailbox_status(i64::MAX).await));
    assert!(is_not_found(
        s.store_flags(i64::MAX, &UidSet::all(), FlagOp::Add, &flagset(Flags::SEEN, &[])).await
    ));
    assert!(is_not_found(s.expunge(i64::MAX, None).await));
    assert!(is_not_found(s.changes_since(i64::MAX, 0).await));
    assert!(is_not_found(s.message_body(i64::MAX).await));
    // deleting, then re-creating gives a new UIDVALIDITY
    let old = s.mailbox_get(acc, "Work").await.expect("get").expect("exists");
    s.mailbox_delete(acc, "Work").await.expect("delete");
    assert!(s.mailbox_get(acc, "Work").await.expect("get").is_none());
    let new = s.mailbox_create(acc, "Work", None).await.expect("re-create");
    assert!(new.uid_validity > old.uid_validity, "{} > {}", new.uid_validity, old.uid_validity);
}

async fn mailbox_delete_removes_orphans_only(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let work = s.mailbox_create(acc, "Work", None).await.expect("create").id;
    let child = s.mailbox_create(acc, "Work/Child", None).await.expect("create").id;
    let alone = deliver_one(s, "alone", &[work]).await;
    let both = deliver_one(s, "both", &[work, inbox]).await;
    let alone_msg = message_id_of(s, work, alone[0].uid).await;
    let both_msg = message_id_of(s, work, both[0].uid).await;
    s.mailbox_delete(acc, "Work").await.expect("delete");
    assert!(is_not_found(s.message_body(alone_msg).await));
    assert!(s.message_body(both_msg).await.is_ok());
    assert!(s.mailbox_get_by_id(work).await.expect("get").is_none());
    // children are not deleted with their parent
    assert_eq!(s.mailbox_get(acc, "Work/Child").await.expect("get").map(|m| m.id), Some(child));
    assert_counts(s, inbox).await;
}

async fn rename_with_children(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, _) = account(s, "a@example.com").await;
    let a = s.mailbox_create(acc, "A", None).await.expect("create");
    let ab = s.mailbox_create(acc, "A/B", None).await.expect("create");
    let abc = s.mailbox_create(acc, "A/B/C", None).await.expect("create");
    let sibling = s.mailbox_create(acc, "AB", None).await.expect("create");
    let got = deliver_one(s, "in-ab", &[ab.id]).await;
    s.mailbox_rename(acc, "A", "X/Y").await.expect("rename");
    for old in ["A", "A/B", "A/B/C"] {
        assert!(s.mailbox_get(acc, old).await.expect("get").is_none(), "{old} gone");
    }
    assert!(s.mailbox_get(acc, "X").await.expect("get").is_some(), "parent of the new name created");
    for (before, new_name) in [(&a, "X/Y"), (&ab, "X/Y/B"), (&abc, "X/Y/B/C")] {
        let m = s.mailbox_get(acc, new_name).await.expect("get").expect("renamed");
        assert_eq!(m.id, before.id, "{new_name} keeps its identity");
        assert_ne!(m.uid_validity, before.uid_validity, "{new_name} gets a new UIDVALIDITY");
    }
    assert_eq!(s.mailbox_get(acc, "AB").await.expect("get"), Some(sibling), "prefix match is not a child");
    let moved = s.mailbox_get(acc, "X/Y/B").await.expect("get").expect("renamed");
    assert_eq!(s.mailbox_uids(moved.id).await.expect("uids"), vec![got[0].uid]);
    // the new name exists now
    assert!(matches!(s.mailbox_rename(acc, "AB", "X/Y").await, Err(StoreError::AlreadyExists(_))));
}

async fn rename_inbox(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let sub = s.mailbox_create(acc, "INBOX/Sub", None).await.expect("create").id;
    let uids = deliver_numbered(s, 3, inbox).await;
    s.store_flags(inbox, &UidSet::single(uids[0]), FlagOp::Add, &flagset(Flags::SEEN, &[]))
        .await
        .expect("flag");
    let bodies: Vec<i64> = {
        let rows = s.messages_by_uid(inbox, &UidSet::all()).await.expect("rows");
        rows.iter().map(|r| r.message_id).collect()
    };
    let before = s.mailbox_status(inbox).await.expect("status");
    s.mailbox_rename(acc, "INBOX", "Old Mail").await.expect("rename INBOX");

    let old = s.mailbox_get(acc, "Old Mail").await.expect("get").expect("created");
    assert_ne!(old.id, inbox);
    let rows = s.messages_by_uid(old.id, &UidSet::all()).await.expect("rows");
    assert_eq!(
        rows.iter().map(|r| r.message_id).collect::<Vec<_>>(),
        bodies,
        "messages moved, bodies shared"
    );
    assert!(rows[0].flags.system.contains(Flags::SEEN), "flags move along");
    let st = s.mailbox_status(old.id).await.expect("status");
    assert_eq!((st.messages, st.unseen), (3, 2));
    assert_counts(s, old.id).await;

    let inbox_now = s.mailbox_get(acc, "INBOX").await.expect("get").expect("INBOX still exists");
    assert_eq!(inbox_now.id, inbox);
    assert!(s.mailbox_uids(inbox).await.expect("uids").is_empty());
    let st = s.mailbox_status(inbox).await.expect("status");
    assert_eq!((st.messages, st.unseen), (0, 0));
    assert!(st.highest_modseq > before.highest_modseq);
    let changes = s.changes_since(inbox, before.highest_modseq).await.expect("changes");
    assert_eq!(changes.expunged, uids, "INBOX sessions learn the messages left");
    // INBOX children stay where they are; new mail still gets fresh UIDs
    assert_eq!(s.mailbox_get(acc, "INBOX/Sub").await.expect("get").map(|m| m.id), Some(sub));
    let next = deliver_one(s, "after", &[inbox]).await;
    assert!(next[0].uid > *uids.last().expect("uids"));
}

async fn subscriptions(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, _) = account(s, "a@example.com").await;
    let defaults = s.subscriptions(acc).await.expect("subs");
    s.mailbox_subscribe(acc, "Zeta", true).await.expect("subscribe non-existent");
    s.mailbox_subscribe(acc, "Alpha/Beta", true).await.expect("subscribe");
    s.mailbox_subscribe(acc, "Alpha/Beta", true).await.expect("subscribe twice");
    let subs = s.subscriptions(acc).await.expect("subs");
    assert!(subs.contains(&"Zeta".to_string()) && subs.contains(&"Alpha/Beta".to_string()));
    assert_eq!(subs.len(), defaults.len() + 2);
    let mut sorted = subs.clone();
    sorted.sort();
    assert_eq!(subs, sorted);
    s.mailbox_subscribe(acc, "Zeta", false).await.expect("unsubscribe");
    s.mailbox_subscribe(acc, "Never", false).await.expect("unsubscribe unknown is fine");
    let subs = s.subscriptions(acc).await.expect("subs");
    assert!(!subs.contains(&"Zeta".to_string()));
    assert!(is_not_found(s.mailbox_subscribe(i64::MAX, "X", true).await));
}

async fn subscriptions_follow_rename(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, _) = account(s, "a@example.com").await;
    for name in ["Work", "Work/Old", "Work/Quiet", "Workshop"] {
        s.mailbox_create(acc, name, None).await.expect("create");
    }
    for name in ["Work", "Work/Old", "Workshop", "Done/Old"] {
        s.mailbox_subscribe(acc, name, true).await.expect("subscribe");
    }
    s.mailbox_rename(acc, "Work", "Done").await.expect("rename");
    let subs = s.subscriptions(acc).await.expect("subs");
    let has = |n: &str| subs.iter().any(|x| x == n);
    assert!(has("Done") && has("Done/Old"), "subscribed folders stay subscribed: {subs:?}");
    assert!(!has("Work") && !has("Work/Old"), "the old names go: {subs:?}");
    assert_eq!(subs.iter().filter(|x| *x == "Done/Old").count(), 1, "{subs:?}");
    assert!(!has("Done/Quiet"), "an unsubscribed child stays unsubscribed: {subs:?}");
    assert!(has("Workshop"), "a name sharing the prefix is not a child: {subs:?}");
    // a failed rename leaves the subscriptions as they were
    assert!(s.mailbox_rename(acc, "Workshop", "Done").await.is_err());
    assert_eq!(s.subscriptions(acc).await.expect("subs"), subs);
}

async fn aliases(ctx: Ctx) {
    let s = &ctx.store;
    account(s, "a@example.com").await;
    account(s, "b@example.com").await;
    s.alias_add("Team@Example.COM", "a@example.com").await.expect("add");
    s.alias_add("team@example.com", "B@example.com").await.expect("add a second target");
    assert!(matches!(
        s.alias_add("team@example.com", "a@example.com").await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(matches!(s.alias_add("a@example.com", "b@example.com").await, Err(StoreError::Invalid(_))));
    assert!(is_not_found(s.alias_add("x@example.com", "nobody@example.com").await));
    assert!(is_not_found(s.alias_add("x@unknown.test", "a@example.com").await));
    assert_eq!(
        s.alias_targets("TEAM@example.com").await.expect("targets"),
        ["a@example.com", "b@example.com"]
    );
    assert!(s.alias_targets("nobody@example.com").await.expect("targets").is_empty());
    assert!(s.alias_targets("not an address").await.expect("targets").is_empty());
    let pairs =
        |v: &[(&str, &str)]| v.iter().map(|(a, t)| (a.to_string(), t.to_string())).collect::<Vec<_>>();
    let both = pairs(&[("team@example.com", "a@example.com"), ("team@example.com", "b@example.com")]);
    assert_eq!(s.alias_list(None).await.expect("list"), both);
    assert_eq!(s.alias_list(Some("example.com")).await.expect("list"), both);
    assert!(s.alias_list(Some("example.org")).await.expect("list").is_empty());
    s.alias_del("team@example.com", Some("a@example.com")).await.expect("del one target");
    assert_eq!(s.alias_targets("team@example.com").await.expect("targets"), ["b@example.com"]);
    assert!(is_not_found(s.alias_del("team@example.com", Some("a@example.com")).await));
    s.alias_del("team@example.com", None).await.expect("del all");
    assert!(s.alias_list(None).await.expect("list").is_empty());
    assert!(is_not_found(s.alias_del("team@example.com", None).await));
}

/// A bulk import's batch: created with quotas, aliases and mailboxes, existing
/// accounts left alone and listed, and all or nothing when one entry fails.
async fn accounts_import_batches(ctx: Ctx) {
    let s = &ctx.store;
    account(s, "old@example.com").await;
    let imported = |email: &str, quota: Option<u64>, aliases: &[&str]| mailcluster_model::ImportedAccount {
        email: email.into(),
        password_hash: format!("$6$salt${email}"),
        quota,
        aliases: aliases.iter().map(|a| a.to_string()).collect(),
    };
    let outcome = s
        .accounts_import(&[
            imported("A@example.com", Some(1000), &["sales@example.com", "Info@Example.com"]),
            imported("old@example.com", Some(5), &["stolen@example.com"]),
            imported("b@example.com", None, &["sales@example.com"]),
        ])
        .await
        .expect("import");
    assert_eq!(outcome.created, 2);
    assert_eq!(outcome.existing, ["old@example.com"]);
    let a = s.account_get("a@example.com").await.expect("get").expect("created");
    assert_eq!(a.password_hash, "$6$salt$A@example.com", "the hash as given");
    assert_eq!(s.quota(a.id).await.expect("quota").account_limit, Some(1000));
    let b = s.account_get("b@example.com").await.expect("get").expect("created");
    assert_eq!(s.quota(b.id).await.expect("quota").account_limit, None);
    for id in [a.id, b.id] {
        let names: Vec<String> =
            s.mailbox_list(id).await.expect("mailboxes").into_iter().map(|m| m.name).collect();
        assert!(names.contains(&"INBOX".to_string()) && names.len() == 6, "{names:?}");
    }
    assert_eq!(
        s.alias_targets("sales@example.com").await.expect("targets"),
        ["a@example.com", "b@example.com"]
    );
    assert_eq!(s.alias_targets("info@example.com").await.expect("targets"), ["a@example.com"]);
    assert!(s.alias_targets("stolen@example.com").await.expect("targets").is_empty(), "existing: untouched");
    let old = s.account_get("old@example.com").await.expect("get").expect("kept");
    assert_eq!(s.quota(old.id).await.expect("quota").account_limit, None);

    // Importing the same batch again changes nothing.
    let again = s
        .accounts_import(&[imported("a@example.com", Some(7), &["sales@example.com"])])
        .await
        .expect("again");
    assert_eq!((again.created, again.existing.as_slice()), (0, ["a@example.com".to_string()].as_slice()));

    // One entry in a domain not served: the whole batch is refused.
    let failed = s
        .accounts_import(&[imported("c@example.com", None, &[]), imported("d@unknown.test", None, &[])])
        .await;
    assert!(is_not_found(failed), "the unknown domain is reported");
    assert!(s.account_get("c@example.com").await.expect("get").is_none(), "nothing of the batch stays");
}

/// What an account may send as: its aliases (read by their target) and its
/// allowed senders, stored lower-cased, gone with the account.
async fn account_senders(ctx: Ctx) {
    let s = &ctx.store;
    account(s, "a@example.com").await;
    account(s, "b@example.com").await;
    s.alias_add("team@example.com", "a@example.com").await.expect("alias");
    s.alias_add("help@example.com", "b@example.com").await.expect("alias");
    s.account_sender_add("A@Example.com", "News@Brand.TEST").await.expect("add");
    s.account_sender_add("a@example.com", "@Partner.test.").await.expect("add a domain");
    assert!(matches!(
        s.account_sender_add("a@example.com", "news@brand.test").await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(is_not_found(s.account_sender_add("nobody@example.com", "x@brand.test").await));
    for bad in ["not an address", "@", "x@"] {
        assert!(
            matches!(s.account_sender_add("a@example.com", bad).await, Err(StoreError::Invalid(_))),
            "{bad}"
        );
    }
    let rights = s.sender_rights("a@EXAMPLE.com").await.expect("rights");
    assert_eq!(rights.aliases, ["team@example.com"]);
    assert_eq!(rights.allowed, ["@partner.test", "news@brand.test"]);
    assert_eq!(s.sender_rights("b@example.com").await.expect("rights").allowed, Vec::<String>::new());
    assert_eq!(s.sender_rights("nobody@example.com").await.expect("rights"), Default::default());
    s.account_sender_del("a@example.com", "NEWS@brand.test").await.expect("del");
    assert!(is_not_found(s.account_sender_del("a@example.com", "news@brand.test").await));
    s.account_delete("a@example.com").await.expect("delete");
    account(s, "a@example.com").await;
    assert!(
        s.sender_rights("a@example.com").await.expect("rights").allowed.is_empty(),
        "gone with the account"
    );
}

/// A disabled account keeps its mail but is no recipient, directly or through
/// an alias, until it is enabled again.
async fn disabled_accounts(ctx: Ctx) {
    use mailcluster_model::Recipient::{Alias, Mailbox, NoSuchUser};
    let s = &ctx.store;
    let (id, inbox) = account(s, "off@example.com").await;
    s.alias_add("team@example.com", "off@example.com").await.expect("alias");
    deliver_one(s, "kept", &[inbox]).await;
    assert!(s.account_get("off@example.com").await.unwrap().unwrap().enabled);
    s.account_set_enabled("OFF@example.com", false).await.expect("disable");
    assert!(!s.account_get("off@example.com").await.unwrap().unwrap().enabled);
    assert_eq!(s.recipient("off@example.com", None).await.unwrap(), NoSuchUser);
    assert_eq!(s.recipient("off+tag@example.com", Some("off@example.com")).await.unwrap(), NoSuchUser);
    assert_eq!(s.recipient("team@example.com", None).await.unwrap(), Alias(vec!["off@example.com".into()]));
    assert_eq!(s.mailbox_status(inbox).await.unwrap().messages, 1, "mail is kept");
    s.account_set_enabled("off@example.com", true).await.expect("enable");
    assert!(matches!(
        s.recipient("off@example.com", None).await.unwrap(),
        Mailbox { account_id, mailbox_id, .. } if account_id == id && mailbox_id == inbox
    ));
    assert!(is_not_found(s.account_set_enabled("nobody@example.com", false).await));
}

/// The shared path of the CLI and the operator: a second run with the same
/// wanted state changes nothing; aliases and senders follow the lists exactly.
async fn provisioning_is_idempotent(ctx: Ctx) {
    use mailcluster_server::provision::{self, PasswordSource, WantedAccount};
    let s = &*ctx.store;
    assert!(provision::ensure_domain(s, "Example.com").await.unwrap());
    assert!(!provision::ensure_domain(s, "example.com").await.unwrap());
    let hash = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".to_string();
    let mut wanted = WantedAccount {
        email: "ann@example.com".into(),
        password: Some(PasswordSource::Hash(hash.clone())),
        quota: Some(Some(1000)),
        enabled: Some(true),
        display_name: Some(Some("Ann Example".into())),
        aliases: Some(vec!["Annie@example.com".into()]),
        send_as: Some(vec!["news@example.com".into()]),
    };
    let first = provision::apply_account(s, &wanted).await.unwrap();
    assert!(first.created && first.password_changed);
    assert_eq!(first.account.display_name.as_deref(), Some("Ann Example"));
    assert_eq!(
        s.account_get("ann@example.com").await.unwrap().unwrap().display_name.as_deref(),
        Some("Ann Example")
    );
    let again = provision::apply_account(s, &wanted).await.unwrap();
    assert!(!again.changed(), "{again:?}");
    let rights = s.sender_rights("ann@example.com").await.unwrap();
    assert_eq!(
        (rights.aliases, rights.allowed),
        (vec!["annie@example.com".into()], vec!["news@example.com".into()])
    );
    wanted.aliases = Some(vec!["ann.b@example.com".into()]);
    wanted.send_as = Some(vec![]);
    wanted.enabled = Some(false);
    let change = provision::apply_account(s, &wanted).await.unwrap();
    assert!(!change.password_changed && !change.account.enabled);
    let rights = s.sender_rights("ann@example.com").await.unwrap();
    assert_eq!((rights.aliases, rights.allowed), (vec!["ann.b@example.com".into()], vec![]));
    assert!(change.changed_recipients.contains(&"annie@example.com".to_string()));
    let gone = provision::delete_account(s, "ann@example.com").await.unwrap();
    assert!(gone.is_some());
    assert!(provision::delete_account(s, "ann@example.com").await.unwrap().is_none());
    assert!(s.alias_targets("ann.b@example.com").await.unwrap().is_empty(), "its aliases go with it");
}

/// `Addresses::recipient` gives what the single reads give/// `Addresses::recipient` gives what the single reads give (and what RFC 5233
/// subaddressing and the alias rules say), whichever way a store answers it.
async fn recipients(ctx: Ctx) {
    use mailcluster_model::Recipient::{Alias, Mailbox, NoSuchUser, NotLocal};
    let s = &ctx.store;
    let (ann, ann_inbox) = account(s, "ann@example.com").await;
    let (ann_box, ann_box_inbox) = account(s, "ann+box@example.com").await;
    let (bob, bob_inbox) = account(s, "bob@example.com").await;
    let (lim, lim_inbox) = account(s, "lim@limited.test").await;
    let (own, own_inbox) = account(s, "own@limited.test").await;
    let (gone, _) = account(s, "noinbox@example.com").await;
    s.domain_add("empty.test").await.expect("domain");
    s.domain_set_quota("limited.test", Some(10_000)).await.expect("domain quota");
    s.account_set_quota("own@limited.test", Some(mailcluster_model::Quota::UNLIMITED))
        .await
        .expect("unlimited");
    s.account_set_quota("bob@example.com", Some(5_000)).await.expect("own limit");
    s.alias_add("team@example.com", "bob@example.com").await.expect("alias");
    s.alias_add("team@example.com", "ann@example.com").await.expect("alias");
    s.alias_add("list@example.com", "bob@example.com").await.expect("alias");
    s.alias_add("list+x@example.com", "ann@example.com").await.expect("alias");
    s.alias_add("ann+alias@example.com", "bob@example.com").await.expect("alias of a subaddress");
    ctx.exec_sql(&format!("DELETE FROM mailboxes WHERE account_id = {gone} AND name = 'INBOX'")).await;
    // limited.test's unknown local parts go to own@ (a catch-all), after its accounts and aliases.
    s.alias_add("sales@limited.test", "lim@limited.test").await.expect("alias");
    assert!(is_not_found(s.domain_set_catch_all("limited.test", Some("nobody@limited.test")).await));
    assert!(is_not_found(s.domain_set_catch_all("nowhere.test", Some("own@limited.test")).await));
    s.domain_set_catch_all("Limited.Test", Some("Own@limited.test")).await.expect("catch-all");
    assert_eq!(s.domain_catch_all("limited.test").await.expect("read"), Some("own@limited.test".into()));
    assert_eq!(s.domain_catch_all("empty.test").await.expect("read"), None);
    assert!(is_not_found(s.domain_catch_all("nowhere.test").await));

    let mailbox = |account_id, mailbox_id, limited| Mailbox { account_id, mailbox_id, limited };
    let cases: &[(&str, Option<&str>, mailcluster_model::Recipient)] = &[
        ("ann@example.com", None, mailbox(ann, ann_inbox, false)),
        ("ANN@Example.COM", None, mailbox(ann, ann_inbox, false)),
        ("bob@example.com", None, mailbox(bob, bob_inbox, true)),
        // the account's own address wins over its user's
        ("ann+box@example.com", Some("ann@example.com"), mailbox(ann_box, ann_box_inbox, false)),
        ("ann+other@example.com", Some("ann@example.com"), mailbox(ann, ann_inbox, false)),
        // an account (the user's) wins over the address's alias
        ("ann+alias@example.com", Some("ann@example.com"), mailbox(ann, ann_inbox, false)),
        ("ann+alias@example.com", None, Alias(vec!["bob@example.com".into()])),
        ("lim@limited.test", None, mailbox(lim, lim_inbox, true)),
        ("own@limited.test", None, mailbox(own, own_inbox, false)),
        ("sales@limited.test", None, Alias(vec!["lim@limited.test".into()])),
        ("anything@limited.test", None, Alias(vec!["own@limited.test".into()])),
        ("lim+x@limited.test", Some("lim@limited.test"), mailbox(lim, lim_inbox, true)),
        ("sales+x@limited.test", Some("sales@limited.test"), Alias(vec!["lim@limited.test".into()])),
        ("new+x@limited.test", Some("new@limited.test"), Alias(vec!["own@limited.test".into()])),
        ("team@example.com", None, Alias(vec!["ann@example.com".into(), "bob@example.com".into()])),
        (
            "team+x@example.com",
            Some("team@example.com"),
            Alias(vec!["ann@example.com".into(), "bob@example.com".into()]),
        ),
        // the address's own alias wins over its user's
        ("list+x@example.com", Some("list@example.com"), Alias(vec!["ann@example.com".into()])),
        ("list+y@example.com", Some("list@example.com"), Alias(vec!["bob@example.com".into()])),
        ("noinbox@example.com", None, NoSuchUser),
        ("nobody@example.com", None, NoSuchUser),
        ("nobody+x@example.com", Some("nobody@example.com"), NoSuchUser),
        ("anyone@empty.test", None, NoSuchUser),
        ("anyone@Empty.Test.", None, NoSuchUser),
        ("ann@elsewhere.test", None, NotLocal),
        ("no-at-sign", None, NotLocal),
        ("bad address@example.com", None, NoSuchUser),
    ];
    for (address, user, expected) in cases {
        let found = s.recipient(address, *user).await.expect("recipient");
        assert_eq!(&found, expected, "{address} (user {user:?})");
        let by_reads = store::recipient_by_reads(&**s, address, *user).await.expect("single reads");
        assert_eq!(found, by_reads, "{address}: one answer whichever way it is read");
    }
}

/// The last login: recorded, never moved backwards, per account.
async fn last_login(ctx: Ctx) {
    let s = &ctx.store;
    let (a, _) = account(s, "a@example.com").await;
    let (b, _) = account(s, "b@example.com").await;
    assert_eq!(s.account_last_login("A@example.com").await.expect("read"), None);
    s.account_record_login(a, ts(1_700_000_100)).await.expect("record");
    assert_eq!(s.account_last_login("a@example.com").await.expect("read"), Some(ts(1_700_000_100)));
    s.account_record_login(a, ts(1_700_000_050)).await.expect("an older time");
    assert_eq!(
        s.account_last_login("a@example.com").await.expect("read"),
        Some(ts(1_700_000_100)),
        "not backwards"
    );
    s.account_record_login(a, ts(1_700_000_200)).await.expect("record");
    assert_eq!(s.account_last_login("a@example.com").await.expect("read"), Some(ts(1_700_000_200)));
    assert_eq!(s.account_last_login("b@example.com").await.expect("read"), None, "per account");
    let _ = b;
    s.account_record_login(i64::MAX, ts(1_700_000_000)).await.expect("an unknown account changes nothing");
    assert!(is_not_found(s.account_last_login("nobody@example.com").await));
}

/// A domain's signing key: set, replaced, removed, and gone with its domain.
async fn domain_keys(ctx: Ctx) {
    let s = &ctx.store;
    s.domain_add("example.com").await.expect("domain");
    s.domain_add("example.org").await.expect("domain");
    assert_eq!(s.domain_keys().await.expect("keys"), vec![]);
    let key = |domain: &str, selector: &str| DomainKey {
        domain: domain.into(),
        selector: selector.into(),
        algorithm: "ed25519".into(),
        private_pem: format!("-----BEGIN PRIVATE KEY-----\n{selector}\n-----END PRIVATE KEY-----\n"),
    };
    s.domain_key_set("Example.ORG", Some(&key("ignored", "s1"))).await.expect("set");
    s.domain_key_set("example.com", Some(&key("example.com", "a"))).await.expect("set");
    assert_eq!(s.domain_keys().await.expect("keys"), vec![key("example.com", "a"), key("example.org", "s1")]);
    s.domain_key_set("example.org", Some(&key("example.org", "s2"))).await.expect("replace");
    assert_eq!(s.domain_keys().await.expect("keys"), vec![key("example.com", "a"), key("example.org", "s2")]);
    s.domain_key_set("example.com", None).await.expect("remove");
    s.domain_key_set("example.com", None).await.expect("removing none is no error");
    assert_eq!(s.domain_keys().await.expect("keys"), vec![key("example.org", "s2")]);
    assert!(is_not_found(s.domain_key_set("nowhere.test", Some(&key("nowhere.test", "x"))).await));
    assert!(is_not_found(s.domain_key_set("nowhere.test", None).await));
    s.domain_del("example.org").await.expect("delete the domain");
    assert_eq!(s.domain_keys().await.expect("keys"), vec![], "the key goes with its domain");
}

async fn deliver_and_read(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let drafts = s.mailbox_get(acc, "Drafts").await.expect("get").expect("Drafts").id;
    let before = s.mailbox_status(inbox).await.expect("status");
    let mut d1 = delivery("first", &[inbox]);
    d1.internal_date = ts(1_600_000_000);
    let mut d2 = delivery("second", &[inbox, drafts, inbox]); // duplicate target is linked once
    d2.flags = flagset(Flags(Flags::SEEN.0 | Flags::DRAFT.0), &["$Label1", "$Forwarded", "$Label1"]);
    let out = s.deliver_batch(&[d1.clone(), d2.clone()]).await.expect("deliver");
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].len(), 1);
    assert_eq!(out[0][0].mailbox_id, inbox);
    assert_eq!(out[1].iter().map(|d| d.mailbox_id).collect::<Vec<_>>(), vec![inbox, drafts]);
    let (u1, u2) = (out[0][0].uid, out[1][0].uid);
    assert!(u1 >= 1 && u2 == u1 + 1, "UIDs in batch order: {u1} {u2}");
    assert_eq!(out[1][1].uid, 1, "first message of Drafts");

    assert_eq!(s.mailbox_uids(inbox).await.expect("uids"), vec![u1, u2]);
    let st = s.mailbox_status(inbox).await.expect("status");
    assert_eq!((st.messages, st.unseen, st.uid_next), (2, 1, u2 + 1));
    assert!(st.highest_modseq > before.highest_modseq);
    // STATUS's one read: the mailbox by name and its counters, as read apart.
    let (mb, both) = s.mailbox_get_with_status(acc, "inbox").await.expect("read").expect("INBOX");
    assert_eq!((Some(mb), both), (s.mailbox_get(acc, "INBOX").await.expect("get"), st));
    assert!(s.mailbox_get_with_status(acc, "Nope").await.expect("read").is_none());
    // Each delivery tells the modseq it left in each mailbox: the mailbox's own,
    // one above the one before (the batch is one change per mailbox).
    assert_eq!((out[0][0].modseq, out[1][0].modseq), (before.highest_modseq + 1, st.highest_modseq));
    assert_eq!(out[1][1].modseq, s.mailbox_status(drafts).await.expect("status").highest_modseq);
    // …and how many messages that change added there: both to INBOX, one to Drafts.
    assert_eq!((out[0][0].added, out[1][0].added, out[1][1].added), (2, 2, 1));
    assert_counts(s, inbox).await;
    assert_counts(s, drafts).await;

    let rows = s.messages_by_uid(inbox, &UidSet(vec![(1, u32::MAX)])).await.expect("rows");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].uid, u1);
    assert_eq!(rows[0].meta, d1.meta);
    assert_eq!(rows[0].internal_date, ts(1_600_000_000));
    assert_eq!(rows[0].flags, FlagSet::default());
    assert_eq!(rows[1].meta, d2.meta);
    assert_eq!(rows[1].flags, flagset(Flags(Flags::SEEN.0 | Flags::DRAFT.0), &["$Forwarded", "$Label1"]));
    assert_eq!(rows[1].modseq, st.highest_modseq);
    assert_eq!(s.message_body(rows[0].message_id).await.expect("body"), d1.raw);
    assert_eq!(s.message_body(rows[1].message_id).await.expect("body"), d2.raw);

    // unknown UIDs are skipped, reversed ranges accepted, order ascending
    let some = s.messages_by_uid(inbox, &UidSet(vec![(u2, u2), (500, 600), (u1, u1)])).await.expect("rows");
    assert_eq!(some.iter().map(|r| r.uid).collect::<Vec<_>>(), vec![u1, u2]);
    let reversed = s.messages_by_uid(inbox, &UidSet(vec![(u2, u1)])).await.expect("reversed");
    assert_eq!(reversed.iter().map(|f| f.uid).collect::<Vec<_>>(), vec![u1, u2]);
    assert_eq!(reversed[1].flags, rows[1].flags);
    assert!(s.messages_by_uid(inbox, &UidSet(vec![(900, 1000)])).await.expect("rows").is_empty());
    assert!(s.messages_by_uid(inbox, &UidSet::default()).await.expect("rows").is_empty());
    assert!(s.deliver_batch(&[]).await.expect("empty batch").is_empty());
}

async fn deliver_errors_store_nothing(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    deliver_one(s, "ok", &[inbox]).await;
    let before = s.mailbox_status(inbox).await.expect("status");
    let bodies = ctx.body_count().await;
    let batch = [delivery("x", &[inbox]), delivery("y", &[i64::MAX])];
    assert!(is_not_found(s.deliver_batch(&batch).await), "unknown target fails the batch");
    assert_eq!(s.mailbox_status(inbox).await.expect("status"), before, "nothing of the batch stored");
    assert_eq!(s.mailbox_uids(inbox).await.expect("uids").len(), 1);
    assert_eq!(ctx.body_count().await, bodies, "no body of the failed batch left behind");
    let mut bad = delivery("bad", &[inbox]);
    bad.flags = flagset(Flags::NONE, &["has space"]);
    assert!(matches!(s.deliver_batch(&[bad]).await, Err(StoreError::Invalid(_))));
    assert_eq!(s.mailbox_status(inbox).await.expect("status"), before);
}

/// UIDs and UIDNEXT are 32-bit (RFC 9051 §2.3.1.1, `nz-number`): a share that
/// would push UIDNEXT past 4294967295 fails the whole batch, storing nothing
/// anywhere; the last UID, 4294967294, is usable and the mailbox stays readable.
async fn deliver_stops_at_the_last_uid(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let full = s.mailbox_create(acc, "Full", None).await.expect("create").id;
    ctx.exec_sql(&format!("UPDATE mailboxes SET uid_next = 4294967294 WHERE id = {full}")).await;
    let (inbox_before, full_before) =
        (s.mailbox_status(inbox).await.expect("status"), s.mailbox_status(full).await.expect("status"));
    let bodies = ctx.body_count().await;
    let batch = [delivery("a", &[inbox]), delivery("b", &[full]), delivery("c", &[full, inbox])];
    let err = s.deliver_batch(&batch).await.expect_err("two UIDs do not fit");
    assert!(matches!(err, StoreError::Invalid(ref m) if m.contains("out of UIDs")), "{err:?}");
    assert_eq!(s.mailbox_status(inbox).await.expect("status"), inbox_before);
    assert_eq!(s.mailbox_status(full).await.expect("status"), full_before);
    assert_eq!(ctx.body_count().await, bodies);

    let out = deliver_one(s, "last", &[full, inbox]).await;
    assert_eq!(
        out.iter().map(|d| (d.mailbox_id, d.uid)).collect::<Vec<_>>(),
        vec![(full, u32::MAX - 1), (inbox, 1)]
    );
    assert!(matches!(s.deliver_batch(&[delivery("d", &[full])]).await, Err(StoreError::Invalid(_))));
    assert_eq!(s.mailbox_uids(full).await.expect("uids"), vec![u32::MAX - 1]);
    assert_eq!(s.mailbox_status(full).await.expect("status").uid_next, u32::MAX);
}

async fn body_stored_once_for_many_recipients(ctx: Ctx) {
    let s = &ctx.store;
    let mut inboxes = Vec::new();
    for i in 0..5 {
        inboxes.push(account(s, &format!("user{i}@example.com")).await.1);
    }
    let out = deliver_one(s, "to-all", &inboxes).await;
    assert_eq!(out.len(), 5);
    let mut ids = BTreeSet::new();
    for d in &out {
        ids.insert(message_id_of(s, d.mailbox_id, d.uid).await);
    }
    assert_eq!(ids.len(), 1, "one body for five recipients");
    let body = *ids.first().expect("id");
    for d in &out[..4] {
        s.expunge(d.mailbox_id, Some(&UidSet::single(d.uid))).await.expect("expunge");
        assert!(s.message_body(body).await.is_ok(), "still linked");
    }
    s.expunge(out[4].mailbox_id, Some(&UidSet::single(out[4].uid))).await.expect("expunge");
    assert!(is_not_found(s.message_body(body).await), "body removed with its last link");
}

async fn compression_round_trip(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let mut raw = b"Subject: big\r\nContent-Type: text/plain\r\n\r\n".to_vec();
    for i in 0..40_000 {
        raw.extend_from_slice(format!("line {i} of a very compressible message body\r\n").as_bytes());
    }
    let mut big = delivery("big", &[inbox]);
    big.raw = Bytes::from(raw.clone());
    big.meta.size = raw.len() as u32;
    // not compressible: a pseudo-random body
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: Vec<u8> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let mut random = delivery("random", &[inbox]);
    random.raw = Bytes::from(noise.clone());
    let out = s.deliver_batch(&[big, random]).await.expect("deliver");
    let big_id = message_id_of(s, inbox, out[0][0].uid).await;
    let random_id = message_id_of(s, inbox, out[1][0].uid).await;
    assert_eq!(&s.message_body(big_id).await.expect("body")[..], &raw[..]);
    assert_eq!(&s.message_body(random_id).await.expect("body")[..], &noise[..]);
    let (compressed, len) = ctx.stored_body(big_id).await;
    assert!(
        compressed && (len as usize) < raw.len() / 5,
        "compressible body stored compressed ({len} bytes)"
    );
    let (compressed, len) = ctx.stored_body(random_id).await;
    assert!(!compressed && len as usize == noise.len(), "incompressible body stored as is");
}

async fn store_flags_semantics(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let uids = deliver_numbered(s, 4, inbox).await;
    let m0 = s.mailbox_status(inbox).await.expect("status").highest_modseq;

    let changed = s
        .store_flags(inbox, &UidSet(vec![(uids[0], uids[1])]), FlagOp::Add, &flagset(Flags::SEEN, &["Work"]))
        .await
        .expect("store");
    assert_eq!(changed.len(), 2);
    let m1 = changed[0].modseq;
    assert!(m1 > m0);
    assert!(changed.iter().all(|r| r.modseq == m1), "one modseq per call");
    assert_eq!(changed[0].flags, flagset(Flags::SEEN, &["Work"]));
    assert_eq!(s.mailbox_status(inbox).await.expect("status").highest_modseq, m1);
    assert_counts(s, inbox).await;

    // only rows that actually change come back
    let changed = s
        .store_flags(inbox, &UidSet(vec![(uids[0], uids[2])]), FlagOp::Add, &flagset(Flags::SEEN, &[]))
        .await
        .expect("store");
    assert_eq!(changed.iter().map(|r| r.uid).collect::<Vec<_>>(), vec![uids[2]]);
    let m2 = changed[0].modseq;
    assert!(m2 > m1);

    // a no-op does not bump the modseq
    let none = s.store_flags(inbox, &UidSet::single(uids[0]), FlagOp::Add, &flagset(Flags::SEEN, &[])).await;
    assert!(none.expect("store").is_empty());
    assert_eq!(s.mailbox_status(inbox).await.expect("status").highest_modseq, m2);

    let removed = s
        .store_flags(inbox, &UidSet::all(), FlagOp::Remove, &flagset(Flags::SEEN, &["Work"]))
        .await
        .expect("remove");
    assert_eq!(removed.iter().map(|r| r.uid).collect::<Vec<_>>(), uids[..3].to_vec());
    assert!(removed.iter().all(|r| r.flags == FlagSet::default()));
    assert_counts(s, inbox).await;

    let replaced = s
        .store_flags(
            inbox,
            &UidSet::single(uids[3]),
            FlagOp::Replace,
            &flagset(Flags(Flags::FLAGGED.0 | Flags::ANSWERED.0), &["b", "a"]),
        )
        .await
        .expect("replace");
    assert_eq!(replaced[0].flags, flagset(Flags(Flags::FLAGGED.0 | Flags::ANSWERED.0), &["a", "b"]));
    let replaced = s
        .store_flags(inbox, &UidSet::single(uids[3]), FlagOp::Replace, &flagset(Flags::SEEN, &[]))
        .await
        .expect("replace");
    assert_eq!(replaced[0].flags, flagset(Flags::SEEN, &[]));
    let rows = s.messages_by_uid(inbox, &UidSet::all()).await.expect("rows");
    assert_eq!(
        rows.last().map(|r| FlagRow { uid: r.uid, flags: r.flags.clone(), modseq: r.modseq }),
        Some(FlagRow { uid: uids[3], flags: flagset(Flags::SEEN, &[]), modseq: replaced[0].modseq })
    );
    assert_counts(s, inbox).await;
    // Keywords stay a set in byte order whatever the database's collation sorts
    // ("B" before "a"); adding one already there changes nothing, removing one
    // keeps the rest in order.
    let one = UidSet::single(uids[3]);
    s.store_flags(inbox, &one, FlagOp::Add, &flagset(Flags::NONE, &["a", "$Junk"])).await.expect("add");
    let added =
        s.store_flags(inbox, &one, FlagOp::Add, &flagset(Flags::NONE, &["B", "a"])).await.expect("add");
    assert_eq!(added[0].flags, flagset(Flags::SEEN, &["$Junk", "B", "a"]));
    let same = s.store_flags(inbox, &one, FlagOp::Add, &flagset(Flags::SEEN, &["a"])).await.expect("add");
    assert!(same.is_empty(), "{same:?}");
    let removed =
        s.store_flags(inbox, &one, FlagOp::Remove, &flagset(Flags::NONE, &["B"])).await.expect("rm");
    assert_eq!(removed[0].flags, flagset(Flags::SEEN, &["$Junk", "a"]));
    assert!(matches!(
        s.store_flags(inbox, &UidSet::all(), FlagOp::Add, &flagset(Flags::NONE, &["bad kw"])).await,
        Err(StoreError::Invalid(_))
    ));
    // unknown UIDs: nothing changes
    assert!(
        s.store_flags(inbox, &UidSet::single(999), FlagOp::Add, &flagset(Flags::SEEN, &[]))
            .await
            .expect("s")
            .is_empty()
    );
}

async fn uids_by_flags_queries(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let uids = deliver_numbered(s, 6, inbox).await;
    let set = |idx: &[usize]| UidSet::from_uids(&idx.iter().map(|&i| uids[i]).collect::<Vec<_>>());
    s.store_flags(inbox, &set(&[0, 1, 2]), FlagOp::Add, &flagset(Flags::SEEN, &[])).await.expect("s");
    s.store_flags(inbox, &set(&[1, 3]), FlagOp::Add, &flagset(Flags::FLAGGED, &[])).await.expect("s");
    s.store_flags(inbox, &set(&[2, 3, 4]), FlagOp::Add, &flagset(Flags::DELETED, &[])).await.expect("s");
    let pick = |idx: &[usize]| idx.iter().map(|&i| uids[i]).collect::<Vec<u32>>();
    assert_eq!(s.uids_by_flags(inbox, Flags::NONE, Flags::SEEN).await.expect("q"), pick(&[3, 4, 5]));
    assert_eq!(s.uids_by_flags(inbox, Flags::SEEN, Flags::NONE).await.expect("q"), pick(&[0, 1, 2]));
    assert_eq!(s.uids_by_flags(inbox, Flags::DELETED, Flags::NONE).await.expect("q"), pick(&[2, 3, 4]));
    let seen_flagged = Flags(Flags::SEEN.0 | Flags::FLAGGED.0);
    assert_eq!(s.uids_by_flags(inbox, seen_flagged, Flags::NONE).await.expect("q"), pick(&[1]));
    assert_eq!(s.uids_by_flags(inbox, Flags::FLAGGED, Flags::SEEN).await.expect("q"), pick(&[3]));
    let neither = Flags(Flags::SEEN.0 | Flags::DELETED.0);
    assert_eq!(s.uids_by_flags(inbox, Flags::NONE, neither).await.expect("q"), pick(&[5]));
    assert_eq!(s.uids_by_flags(inbox, Flags::NONE, Flags::NONE).await.expect("q"), uids);
}

async fn expunge_and_tombstones(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let uids = deliver_numbered(s, 5, inbox).await;
    let none = s.expunge(inbox, None).await.expect("expunge");
    assert_eq!(
        none,
        Expunged { uids: Vec::new(), modseq: 0 },
        "nothing \\Deleted yet, the mailbox unchanged"
    );
    let ms = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    s.store_flags(inbox, &UidSet::from_uids(&[uids[1], uids[3]]), FlagOp::Add, &flagset(Flags::DELETED, &[]))
        .await
        .expect("flag");
    let removed = s.expunge(inbox, None).await.expect("expunge");
    assert_eq!(removed.uids, vec![uids[1], uids[3]]);
    // The modseq the removal left: the mailbox's, one above the flag change's.
    let after = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    assert_eq!((removed.modseq, after), (ms + 2, ms + 2));
    assert_eq!(s.mailbox_uids(inbox).await.expect("uids"), vec![uids[0], uids[2], uids[4]]);
    assert_counts(s, inbox).await;
    // an explicit set removes those messages
    assert_eq!(
        s.expunge(inbox, Some(&UidSet(vec![(uids[4], u32::MAX)]))).await.expect("expunge"),
        Expunged { uids: vec![uids[4]], modseq: ms + 3 }
    );
    assert!(s.expunge(inbox, Some(&UidSet::single(uids[1]))).await.expect("gone already").uids.is_empty());
    let ch = s.changes_since(inbox, ms).await.expect("changes");
    assert_eq!(ch.expunged, vec![uids[1], uids[3], uids[4]]);
    let st = s.mailbox_status(inbox).await.expect("status");
    assert_eq!(st.messages, 2);
    assert_eq!(ch.highest_modseq, st.highest_modseq);
    // UIDs are never reused
    let next = deliver_one(s, "next", &[inbox]).await[0].uid;
    assert!(next > uids[4]);
}

/// The POP3 listing: every message of the mailbox with its body id and exact size,
/// in UID order, agreeing with the full rows; other mailboxes never leak in.
async fn maildrop_listing(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let other = s.mailbox_create(acc, "Other", None).await.expect("create").id;
    assert!(s.maildrop(inbox, 0).await.expect("empty maildrop").is_empty());
    let mut uids = Vec::new();
    for i in 0..4 {
        uids.push(deliver_one(s, &format!("subject number {i}"), &[inbox]).await[0].uid);
    }
    deliver_one(s, "elsewhere", &[other]).await;
    s.expunge(inbox, Some(&UidSet::single(uids[1]))).await.expect("expunge");
    let listing = s.maildrop(inbox, 0).await.expect("maildrop");
    let rows = s.messages_by_uid(inbox, &UidSet::all()).await.expect("rows");
    assert_eq!(listing.iter().map(|e| e.uid).collect::<Vec<_>>(), vec![uids[0], uids[2], uids[3]]);
    assert_eq!(listing.len(), rows.len());
    for (entry, row) in listing.iter().zip(&rows) {
        assert_eq!((entry.uid, entry.message_id), (row.uid, row.message_id));
        // To the microsecond: the shared body cache checks a message id against it.
        assert_eq!(entry.internal_date, row.internal_date, "INTERNALDATE of uid {}", row.uid);
        let body = s.message_body(entry.message_id).await.expect("body");
        assert_eq!(entry.size as usize, body.len(), "size is the stored octet count");
    }
    // What arrived after a listing: the UIDs above the one given, none at or below.
    let after = s.maildrop(inbox, uids[2]).await.expect("maildrop after");
    assert_eq!(after.iter().map(|e| e.uid).collect::<Vec<_>>(), vec![uids[3]]);
    assert_eq!(after[0], listing[2], "the same entry as in the full listing");
    assert!(s.maildrop(inbox, uids[3]).await.expect("nothing newer").is_empty());
    assert!(s.maildrop(inbox, u32::MAX).await.expect("past the last UID").is_empty());
}

async fn mailbox_index_snapshot(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let empty = s.mailbox_index(inbox).await.expect("index");
    assert!(empty.uids.is_empty() && empty.flags.is_empty() && empty.keywords.is_empty());
    let uids = deliver_numbered(s, 6, inbox).await;
    let set = |idx: &[usize]| UidSet::from_uids(&idx.iter().map(|&i| uids[i]).collect::<Vec<_>>());
    s.store_flags(inbox, &set(&[0, 2]), FlagOp::Add, &flagset(Flags::SEEN, &["$Work"])).await.expect("s");
    s.store_flags(inbox, &set(&[3]), FlagOp::Add, &flagset(Flags::DELETED, &["$Junk", "$Work"]))
        .await
        .expect("s");
    s.store_flags(inbox, &set(&[1]), FlagOp::Add, &flagset(Flags::DELETED, &[])).await.expect("s");
    s.expunge(inbox, Some(&set(&[1]))).await.expect("expunge");

    let index = s.mailbox_index(inbox).await.expect("index");
    let status = s.mailbox_status(inbox).await.expect("status");
    assert_eq!(index.highest_modseq, status.highest_modseq);
    assert_eq!(index.uid_next, status.uid_next);
    assert_eq!(index.uids, s.mailbox_uids(inbox).await.expect("uids"));
    // Every message's flags and keywords agree with the per-row query.
    let rows = s.messages_by_uid(inbox, &UidSet::all()).await.expect("rows");
    assert_eq!(rows.len(), index.uids.len());
    for (i, row) in rows.iter().enumerate() {
        assert_eq!((index.uids[i], index.flags[i]), (row.uid, row.flags.system));
        assert_eq!(index.modseqs[i], row.modseq, "modseq of uid {}", row.uid);
        let kw =
            index.keywords.iter().find(|(u, _)| *u == row.uid).map(|(_, k)| k.clone()).unwrap_or_default();
        assert_eq!(kw, row.flags.keywords, "keywords of uid {}", row.uid);
    }
    assert_eq!(index.keywords.iter().map(|(u, _)| *u).collect::<Vec<_>>(), vec![uids[0], uids[2], uids[3]]);
    assert_eq!(index.flags[0], Flags::SEEN);
    assert!(is_not_found(s.mailbox_index(inbox + 1000).await));
    // The batched "anything changed?" probe: existing mailboxes only.
    let (acc, _) = account(s, "b@example.com").await;
    let other = s.mailbox_get(acc, "INBOX").await.expect("get").expect("INBOX");
    let mut found = s.highest_modseqs(&[inbox, other.id, inbox + 1000]).await.expect("modseqs");
    found.sort_unstable();
    assert_eq!(found, vec![(inbox, status.highest_modseq), (other.id, other.highest_modseq)]);
}

/// STORE (UNCHANGEDSINCE n), RFC 7162 §3.1.3: messages whose modseq is above n
/// are left alone and reported; the others change as with a plain STORE.
async fn conditional_store(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let uids = deliver_numbered(s, 4, inbox).await;
    let before = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    // Another client changes message 1 after we read `before`.
    let theirs = s
        .store_flags(inbox, &UidSet::single(uids[1]), FlagOp::Add, &flagset(Flags::FLAGGED, &[]))
        .await
        .expect("store");
    assert!(theirs[0].modseq > before);
    let all = UidSet::from_uids(&uids);
    let out = s
        .store_flags_unchanged_since(inbox, &all, FlagOp::Add, &flagset(Flags::DELETED, &["$X"]), before)
        .await
        .expect("conditional store");
    assert_eq!(out.modified, vec![uids[1]], "the message changed since `before` is left alone");
    assert_eq!(out.changed.iter().map(|r| r.uid).collect::<Vec<_>>(), vec![uids[0], uids[2], uids[3]]);
    let rows = s.messages_by_uid(inbox, &all).await.expect("rows");
    assert_eq!(rows[1].flags, flagset(Flags::FLAGGED, &[]), "untouched");
    assert_eq!(rows[0].flags, flagset(Flags::DELETED, &["$X"]));
    assert!(rows[0].modseq > theirs[0].modseq);
    // UNCHANGEDSINCE 0 fails for every message (RFC 7162 §3.1.3).
    let none = s
        .store_flags_unchanged_since(inbox, &all, FlagOp::Remove, &flagset(Flags::DELETED, &[]), 0)
        .await
        .expect("store");
    assert!(none.changed.is_empty());
    assert_eq!(none.modified, uids);
    // A range with `*`, and a test that passes: nothing needs changing, nothing fails.
    let now = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    let same = s
        .store_flags_unchanged_since(inbox, &UidSet::all(), FlagOp::Add, &flagset(Flags::FLAGGED, &[]), now)
        .await
        .expect("store");
    assert!(same.modified.is_empty());
    assert_eq!(same.changed.iter().map(|r| r.uid).collect::<Vec<_>>(), vec![uids[0], uids[2], uids[3]]);
    assert!(is_not_found(
        s.store_flags_unchanged_since(inbox + 1000, &all, FlagOp::Add, &flagset(Flags::SEEN, &[]), now).await
    ));
}

async fn message_links_and_bodies(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let (acc_b, _) = account(s, "b@example.com").await;
    let other = s.mailbox_get(acc_b, "INBOX").await.expect("get").expect("INBOX");
    let uids = deliver_numbered(s, 5, inbox).await;
    let theirs = deliver_one(s, "theirs", &[other.id]).await[0].uid;
    s.store_flags(inbox, &UidSet::single(uids[2]), FlagOp::Add, &flagset(Flags::FLAGGED, &["$Later"]))
        .await
        .expect("flag");
    let raw = |i: usize| Bytes::from(format!("Subject: m{i}\r\n\r\nHello\r\n"));
    let status = s.mailbox_status(inbox).await.expect("status");
    let other_modseq = s.mailbox_status(other.id).await.expect("status").highest_modseq;

    // Several mailboxes in one call; unknown UIDs and mailboxes are left out, but
    // an existing mailbox is reported even when none of its asked UIDs exists.
    let keys = [
        (inbox, uids[0]),
        (inbox, uids[2]),
        (inbox, uids[4] + 100),
        (other.id, theirs + 7),
        (inbox + 1000, 1),
    ];
    let found = s.message_links(&keys).await.expect("links");
    let mut mailboxes = found.mailboxes.clone();
    mailboxes.sort_unstable();
    assert_eq!(mailboxes, vec![(inbox, status.highest_modseq), (other.id, other_modseq)]);
    let mut links = found.links.clone();
    links.sort_by_key(|l| l.uid);
    assert_eq!(
        links.iter().map(|l| (l.mailbox_id, l.uid)).collect::<Vec<_>>(),
        vec![(inbox, uids[0]), (inbox, uids[2])]
    );
    assert_eq!(links[1].flags, flagset(Flags::FLAGGED, &["$Later"]));
    assert_eq!(links[1].internal_date, ts(1_700_000_100));
    let found = s.message_links(&[(other.id, theirs)]).await.expect("theirs");
    assert_eq!(found.links.len(), 1);
    assert!(s.message_links(&[]).await.expect("nothing").links.is_empty());
    // The same rules for one key alone (a statement of its own on PostgreSQL).
    let gone = s.message_links(&[(inbox, uids[4] + 100)]).await.expect("one missing");
    assert_eq!((gone.mailboxes, gone.links.len()), (vec![(inbox, status.highest_modseq)], 0));
    let nowhere = s.message_links(&[(inbox + 1000, 1)]).await.expect("no mailbox");
    assert!(nowhere.mailboxes.is_empty() && nowhere.links.is_empty());
    assert_eq!(s.highest_modseqs(&[inbox]).await.expect("one"), vec![(inbox, status.highest_modseq)]);
    assert!(s.highest_modseqs(&[inbox + 1000]).await.expect("none").is_empty());

    // Bodies by id: the stored bytes and the header length; unknown ids left out.
    let ids = [links[1].message_id, links[0].message_id, links[0].message_id + 10_000];
    let mut bodies = s.message_bodies(&ids).await.expect("bodies");
    bodies.sort_by_key(|b| b.message_id);
    assert_eq!(bodies.len(), 2);
    let by_id = |id: i64| bodies.iter().find(|b| b.message_id == id).expect("body");
    // The stored header length (the fixture's metadata says 20), not one found again.
    assert_eq!((&by_id(links[0].message_id).body, by_id(links[0].message_id).header_size), (&raw(0), 20));
    assert_eq!(by_id(links[1].message_id).body, raw(2));
    assert_eq!(s.message_bodies(&[links[1].message_id]).await.expect("one")[0].body, raw(2));
    assert!(s.message_bodies(&[links[0].message_id + 10_000]).await.expect("unknown").is_empty());

    // A change moves the reported modseq.
    s.store_flags(inbox, &UidSet::single(uids[0]), FlagOp::Add, &flagset(Flags::SEEN, &[]))
        .await
        .expect("flag");
    let after = s.message_links(&[(inbox, uids[1])]).await.expect("after");
    assert!(after.mailboxes[0].1 > status.highest_modseq);

    // A row written before the header length was stored: found in the body.
    ctx.exec_sql("UPDATE messages SET header_size = NULL").await;
    let old = s.message_bodies(&[links[0].message_id]).await.expect("old row");
    assert_eq!(old[0].header_size, "Subject: m0\r\n\r\n".len() as u32);
}

async fn changes_since_after_store_and_expunge(ctx: Ctx) {
    let s = &ctx.store;
    let (_, inbox) = account(s, "a@example.com").await;
    let uids = deliver_numbered(s, 5, inbox).await;
    let base = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    let none = s.changes_since(inbox, base).await.expect("changes");
    assert_eq!(none.highest_modseq, base);
    assert!(none.changed.is_empty() && none.expunged.is_empty());

    let all = s.changes_since(inbox, 0).await.expect("changes");
    assert_eq!(all.changed.iter().map(|r| r.uid).collect::<Vec<_>>(), uids);

    s.store_flags(inbox, &UidSet::single(uids[1]), FlagOp::Add, &flagset(Flags::FLAGGED, &[]))
        .await
        .expect("s");
    let after_store = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    s.expunge(inbox, Some(&UidSet::single(uids[2]))).await.expect("expunge");
    let new = deliver_one(s, "new", &[inbox]).await[0].uid;

    let ch = s.changes_since(inbox, base).await.expect("changes");
    assert_eq!(ch.changed.iter().map(|r| r.uid).collect::<Vec<_>>(), vec![uids[1], new]);
    assert_eq!(ch.changed[0].flags.system, Flags::FLAGGED);
    assert_eq!(ch.expunged, vec![uids[2]]);
    assert!(ch.changed.iter().all(|r| r.modseq > base && r.modseq <= ch.highest_modseq));
    assert_eq!(ch.highest_modseq, s.mailbox_status(inbox).await.expect("status").highest_modseq);

    let later = s.changes_since(inbox, after_store).await.expect("changes");
    assert_eq!(later.changed.iter().map(|r| r.uid).collect::<Vec<_>>(), vec![new]);
    assert_eq!(later.expunged, vec![uids[2]]);
    assert!(s.changes_since(inbox, u64::MAX).await.expect("changes").changed.is_empty());
}

/// Sets of several UID ranges with gaps between them (what `UID STORE 1:2,5,7:8`
/// and friends send): each operation reaches the messages in the ranges and
/// none in the gaps.
async fn several_uid_ranges_touch_their_messages_only(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let archive = s.mailbox_get(acc, "Archive").await.expect("get").expect("Archive").id;
    let u = deliver_numbered(s, 9, inbox).await;
    let set = UidSet(vec![(u[0], u[1]), (u[4], u[4]), (u[6], u[7])]);
    let picked = vec![u[0], u[1], u[4], u[6], u[7]];

    let rows = s.messages_by_uid(inbox, &set).await.expect("rows");
    assert_eq!(rows.iter().map(|r| r.uid).collect::<Vec<_>>(), picked);

    let changed =
        s.store_flags(inbox, &set, FlagOp::Add, &flagset(Flags::FLAGGED, &["Ranged"])).await.expect("store");
    assert_eq!(changed.iter().map(|r| r.uid).collect::<Vec<_>>(), picked);
    let flagged: Vec<u32> = s
        .messages_by_uid(inbox, &UidSet::all())
        .await
        .expect("rows")
        .iter()
        .filter(|r| r.flags == flagset(Flags::FLAGGED, &["Ranged"]))
        .map(|r| r.uid)
        .collect();
    assert_eq!(flagged, picked, "messages in the gaps keep their flags");
    assert_counts(s, inbox).await;

    let pairs = s.copy(inbox, &set, archive).await.expect("copy");
    assert_eq!(pairs.iter().map(|p| p.0).collect::<Vec<_>>(), picked);

    let gone = s.expunge(inbox, Some(&UidSet(vec![(u[1], u[2]), (u[5], u[5]), (u[8], u32::MAX)]))).await;
    assert_eq!(gone.expect("expunge").uids, vec![u[1], u[2], u[5], u[8]]);
    assert_eq!(s.mailbox_uids(inbox).await.expect("uids"), vec![u[0], u[3], u[4], u[6], u[7]]);
    assert_counts(s, inbox).await;
}

async fn copy_and_move(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "a@example.com").await;
    let archive = s.mailbox_get(acc, "Archive").await.expect("get").expect("Archive").id;
    let uids = deliver_numbered(s, 4, inbox).await;
    deliver_one(s, "pre-existing", &[archive]).await;
    s.store_flags(inbox, &UidSet::single(uids[0]), FlagOp::Add, &flagset(Flags::SEEN, &["Keep"]))
        .await
        .expect("flag");
    let src_rows = s.messages_by_uid(inbox, &UidSet::all()).await.expect("rows");

    let pairs = s.copy(inbox, &UidSet(vec![(uids[0], uids[1])]), archive).await.expect("copy");
    assert_eq!(pairs.iter().map(|p| p.0).collect::<Vec<_>>(), vec![uids[0], uids[1]]);
    assert_eq!(pairs[0].1, 2, "after the pre-existing message");
    assert_eq!(pairs[1].1, 3);
    let copied = s.messages_by_uid(archive, &UidSet(vec![(2, 3)])).await.expect("rows");
    assert_eq!(copied[0].message_id, src_rows[0].message_id, "body shared, not copied");
    assert_eq!(copied[0].flags, flagset(Flags::SEEN, &["Keep"]), "flags preserved");
    assert_eq!(copied[0].internal_date, src_rows[0].internal_date);
    assert_eq!(s.mailbox_uids(inbox).await.expect("uids"), uids, "source untouched by COPY");
    assert_counts(s, archive).await;
    assert!(s.copy(inbox, &UidSet::single(999), archive).await.expect("copy nothing").is_empty());
    assert!(is_not_found(s.copy(inbox, &UidSet::all(), i64::MAX).await));
    assert!(is_not_found(s.copy(i64::MAX, &UidSet::all(), archive).await));

    let before = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    let moved = s.move_messages(inbox, &UidSet::from_uids(&[uids[2], uids[3]]), archive).await.expect("move");
    assert_eq!(moved, vec![(uids[2], 4), (uids[3], 5)]);
    assert_eq!(s.mailbox_uids(inbox).await.expect("uids"), vec![uids[0], uids[1]]);
    assert_eq!(s.changes_since(inbox, before).await.expect("changes").expunged, vec![uids[2], uids[3]]);
    let moved_rows = s.messages_by_uid(archive, &UidSet(vec![(4, 5)])).await.expect("rows");
    assert_eq!(moved_rows[0].message_id, src_rows[2].message_id);
    assert!(s.message_body(moved_rows[0].message_id).await.is_ok(), "moved body survives");
    assert_counts(s, inbox).await;
    assert_counts(s, archive).await;
    assert!(is_not_found(s.move_messages(inbox, &UidSet::all(), i64::MAX).await));
    assert_eq!(s.mailbox_uids(inbox).await.expect("uids").len(), 2, "failed MOVE changed nothing");

    // Into its own mailbox (RFC 6851 §3.3): new UIDs for the same bodies and flags,
    // the old UIDs expunged, the count unchanged.
    let before = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    let next = s.mailbox_status(inbox).await.expect("status").uid_next;
    let moved = s.move_messages(inbox, &UidSet::single(uids[0]), inbox).await.expect("move into itself");
    assert_eq!(moved, vec![(uids[0], next)]);
    assert_eq!(s.mailbox_uids(inbox).await.expect("uids"), vec![uids[1], next]);
    assert_eq!(s.changes_since(inbox, before).await.expect("changes").expunged, vec![uids[0]]);
    let again = s.messages_by_uid(inbox, &UidSet::single(next)).await.expect("rows");
    assert_eq!(again[0].message_id, src_rows[0].message_id, "the same body");
    assert_eq!(again[0].flags, flagset(Flags::SEEN, &["Keep"]), "flags kept");
    assert_counts(s, inbox).await;
}

async fn concurrent_group_commit(ctx: Ctx) {
    let s = ctx.store.clone();
    let mut mailboxes = Vec::new();
    for i in 0..3 {
        let (acc, inbox) = account(&s, &format!("u{i}@example.com")).await;
        mailboxes.push(inbox);
        mailboxes.push(s.mailbox_create(acc, "Lists", None).await.expect("create").id);
    }
    const TASKS: usize = 6;
    const BATCHES: usize = 8;
    const PER_BATCH: usize = 6;
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let s = s.clone();
        let mailboxes = mailboxes.clone();
        handles.push(tokio::spawn(async move {
            let mut mine: Vec<(String, Vec<i64>, Vec<mailcluster_model::DeliveredTo>)> = Vec::new();
            let mut last_uid: HashMap<i64, u32> = HashMap::new();
            for b in 0..BATCHES {
                let batch: Vec<NewDelivery> = (0..PER_BATCH)
                    .map(|k| {
                        // overlapping target sets, in varying order
                        let n = (t + b + k) % mailboxes.len();
                        let targets: Vec<i64> =
                            (0..=(k % 3)).map(|j| mailboxes[(n + j * 2) % mailboxes.len()]).rev().collect();
                        delivery(&format!("t{t}-b{b}-k{k}"), &targets)
                    })
                    .collect();
                let out = s.deliver_batch(&batch).await.expect("concurrent deliver");
                assert_eq!(out.len(), batch.len());
                // within a batch, UIDs per mailbox follow batch order; across this
                // task's sequential batches they keep increasing
                for (d, res) in batch.iter().zip(&out) {
                    assert_eq!(res.len(), d.targets.len());
                    for r in res {
                        let prev = last_uid.insert(r.mailbox_id, r.uid);
                        assert!(prev.is_none_or(|p| r.uid > p), "UIDs strictly increase per mailbox");
                    }
                    mine.push((d.meta.subject.clone(), d.targets.clone(), res.clone()));
                }
            }
            mine
        }));
    }
    let mut expected: HashMap<i64, BTreeMap<u32, String>> = HashMap::new();
    for h in handles {
        for (subject, targets, res) in h.await.expect("task") {
            let got: Vec<i64> = res.iter().map(|r| r.mailbox_id).collect();
            assert_eq!(got, targets);
            for r in res {
                let dup = expected.entry(r.mailbox_id).or_default().insert(r.uid, subject.clone());
                assert!(dup.is_none(), "UID {} handed out twice in mailbox {}", r.uid, r.mailbox_id);
            }
        }
    }
    let mut total = 0;
    for mb in &mailboxes {
        let want = expected.remove(mb).unwrap_or_default();
        let rows = s.messages_by_uid(*mb, &UidSet::all()).await.expect("rows");
        let got: BTreeMap<u32, String> = rows.into_iter().map(|r| (r.uid, r.meta.subject)).collect();
        assert_eq!(got, want, "mailbox {mb} holds every delivery exactly once");
        let uids: Vec<u32> = got.keys().copied().collect();
        assert_eq!(uids, (1..=uids.len() as u32).collect::<Vec<_>>(), "no gaps, no duplicates");
        assert_counts(&s, *mb).await;
        total += uids.len();
    }
    assert!(total > TASKS * BATCHES * PER_BATCH);
}

fn queue_item(tag: &str, not_before: DateTime<Utc>) -> NewQueueItem {
    NewQueueItem {
        sender: format!("{tag}@example.com"),
        recipients: vec!["x@remote.net".into(), "y@remote.net".into()],
        raw: Bytes::from(format!("Subject: {tag}\r\n\r\nbody\r\n")),
        account_id: None,
        not_before,
        expires_at: Utc::now() + chrono::Duration::days(5),
        dsn: Default::default(),
    }
}

async fn queue_lifecycle(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, _) = account(s, "a@example.com").await;
    let past = Utc::now() - chrono::Duration::seconds(10);
    let mut first = queue_item("first", past);
    first.account_id = Some(acc);
    first.dsn = mailcluster_model::DsnRequest {
        ret: Some(mailcluster_model::DsnRet::Full),
        envid: Some("env \u{e9}".into()),
        recipients: vec![mailcluster_model::RecipientDsn {
            recipient: "x@remote.net".into(),
            notify: Some(Default::default()),
            orcpt: Some("x\\x{E9}@remote.net".into()),
            orcpt_type: Some("utf-8".into()),
        }],
    };
    let id1 = s.queue_enqueue(&first).await.expect("enqueue");
    let id2 = s.queue_enqueue(&queue_item("second", past)).await.expect("enqueue");
    let _later =
        s.queue_enqueue(&queue_item("later", Utc::now() + chrono::Duration::hours(1))).await.expect("enq");

    let lease = Duration::from_secs(300);
    let claimed = s.queue_claim("w1", 10, lease).await.expect("claim");
    assert_eq!(claimed.iter().map(|i| i.id).collect::<Vec<_>>(), vec![id1, id2], "only due items");
    let c1 = &claimed[0];
    assert_eq!(c1.sender, "first@example.com");
    assert_eq!(c1.recipients, vec!["x@remote.net", "y@remote.net"]);
    assert_eq!(c1.raw, first.raw);
    assert_eq!(c1.account_id, Some(acc));
    assert_eq!(c1.dsn, first.dsn, "the DSN request is kept with the message");
    assert_eq!(claimed[1].dsn, Default::default());
    assert_eq!(c1.attempts, 1);
    assert!(c1.last_error.is_none());
    assert!(
        s.queue_claim("w2", 10, lease).await.expect("claim").is_empty(),
        "leased items are not re-claimed"
    );

    // An attempt that delivered to x and was deferred for y: only y remains,
    // due at retry_at; the outcomes accumulate.
    let outcome = |rcpt: &str, status| RecipientOutcome {
        recipient: rcpt.into(),
        status,
        reply: format!("reply for {rcpt}"),
        at: Utc::now(),
    };
    let attempt = QueueAttempt {
        remaining: vec!["y@remote.net".into()],
        outcomes: vec![
            outcome("x@remote.net", RecipientStatus::Sent),
            outcome("y@remote.net", RecipientStatus::Deferred),
        ],
        last_error: Some("451 try later".into()),
        retry_at: Utc::now() - chrono::Duration::seconds(1),
        delay_notified: true,
    };
    assert!(!s.queue_finish(id1, "w2", &attempt).await.expect("finish"), "only the claiming worker records");
    assert!(s.queue_finish(id1, "w1", &attempt).await.expect("finish"));
    let again = s.queue_claim("w2", 10, lease).await.expect("claim");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, id1);
    assert_eq!(again[0].attempts, 2);
    assert_eq!(again[0].recipients, vec!["y@remote.net"]);
    assert!(again[0].delay_notified);
    assert_eq!(again[0].last_error.as_deref(), Some("451 try later"));
    let second = QueueAttempt {
        outcomes: vec![outcome("y@remote.net", RecipientStatus::Deferred)],
        retry_at: Utc::now() + chrono::Duration::hours(1),
        ..attempt.clone()
    };
    assert!(s.queue_finish(id1, "w2", &second).await.expect("finish"));
    let (entry, raw) = s.queue_get(id1).await.expect("get").expect("still queued");
    assert_eq!(raw, first.raw);
    assert_eq!(entry.size, first.raw.len() as u64);
    assert_eq!(entry.locked_by, None, "finished: not in delivery");
    let statuses: Vec<_> = entry.outcomes.iter().map(|o| (o.recipient.as_str(), o.status)).collect();
    assert_eq!(
        statuses,
        vec![
            ("x@remote.net", RecipientStatus::Sent),
            ("y@remote.net", RecipientStatus::Deferred),
            ("y@remote.net", RecipientStatus::Deferred)
        ]
    );
    // retry now → claimable at once
    assert_eq!(s.queue_retry(Some(id1)).await.expect("retry"), 1);
    assert_eq!(s.queue_claim("w5", 10, lease).await.expect("claim")[0].id, id1);
    // nothing remaining: removed
    let done = QueueAttempt { remaining: vec![], ..attempt.clone() };
    assert!(s.queue_finish(id1, "w5", &done).await.expect("finish"));
    assert!(s.queue_get(id1).await.expect("get").is_none());
    // a released claim is due again and does not count as an attempt
    s.queue_release(id2, "w1").await.expect("release");
    let released = s.queue_claim("w6", 10, lease).await.expect("claim");
    assert_eq!(released.iter().map(|i| i.id).collect::<Vec<_>>(), vec![id2]);
    assert_eq!(released[0].attempts, 1);
    s.queue_complete(id2).await.expect("complete");
    assert!(is_not_found(s.queue_complete(id2).await));
    let listed = s.queue_list(10).await.expect("list");
    assert_eq!(listed.len(), 1, "only the later item is left");
    let stats = s.queue_stats().await.expect("stats");
    assert_eq!(stats.depth, 1);
    assert!(stats.oldest.is_some());
    assert!(s.queue_delete(listed[0].id).await.expect("delete"));
    assert!(!s.queue_delete(listed[0].id).await.expect("delete"));
    assert_eq!(s.queue_stats().await.expect("stats"), QueueStats::default());

    // an expired lease makes the item claimable again (a worker died)
    let id3 = s.queue_enqueue(&queue_item("third", past)).await.expect("enqueue");
    let short = s.queue_claim("w3", 10, Duration::from_millis(1)).await.expect("claim");
    assert_eq!(short.iter().map(|i| i.id).collect::<Vec<_>>(), vec![id3]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let retaken = s.queue_claim("w4", 10, lease).await.expect("claim");
    assert_eq!(retaken.iter().map(|i| i.id).collect::<Vec<_>>(), vec![id3]);
    assert_eq!(retaken[0].attempts, 2);
    // the account going away keeps its queued mail
    s.account_delete("a@example.com").await.expect("delete account");
}

async fn queue_claim_is_exclusive(ctx: Ctx) {
    let s = ctx.store.clone();
    let past = Utc::now() - chrono::Duration::seconds(10);
    let mut all = BTreeSet::new();
    for i in 0..120 {
        all.insert(s.queue_enqueue(&queue_item(&format!("m{i}"), past)).await.expect("enqueue"));
    }
    // claimers on separate stores, as on separate pods
    let mut handles = Vec::new();
    for w in 0..4 {
        let store = if w % 2 == 0 { s.clone() } else { ctx.open_again().await };
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got =
                    store.queue_claim(&format!("w{w}"), 7, Duration::from_secs(600)).await.expect("claim");
                if got.is_empty() {
                    break;
                }
                mine.extend(got.into_iter().map(|i| i.id));
            }
            mine
        }));
    }
    let mut seen = BTreeSet::new();
    for h in handles {
        for id in h.await.expect("claimer") {
            assert!(seen.insert(id), "item {id} claimed twice");
        }
    }
    assert_eq!(seen, all, "every item claimed exactly once");
}

/// \Recent (RFC 3501 §2.3.2): each new message is recent for exactly one claimer,
/// even when claims race from separate stores (pods); STATUS counts what nobody
/// has claimed yet.
async fn recent_is_claimed_once(ctx: Ctx) {
    let s = ctx.store.clone();
    let (_acc, inbox) = account(&s, "r@example.com").await;
    let fresh = s.mailbox_get_by_id(inbox).await.expect("get").expect("inbox");
    assert_eq!(fresh.recent_floor, 0, "a new mailbox has given out nothing");
    for i in 0..3 {
        deliver_one(&s, &format!("r{i}"), &[inbox]).await;
    }
    assert_eq!(s.recent_count(inbox).await.expect("recent"), 3);

    let mut handles = Vec::new();
    for w in 0..6 {
        let store = if w % 2 == 0 { s.clone() } else { ctx.open_again().await };
        handles.push(tokio::spawn(async move { store.recent_claim(inbox, 3).await.expect("claim") }));
    }
    let mut floors = Vec::new();
    for h in handles {
        floors.push(h.await.expect("claimer"));
    }
    floors.sort_unstable();
    assert_eq!(floors, [0, 3, 3, 3, 3, 3], "exactly one claimer got UIDs 1..3");
    assert_eq!(s.recent_count(inbox).await.expect("recent"), 0);
    assert_eq!(s.mailbox_get_by_id(inbox).await.expect("get").expect("inbox").recent_floor, 3);

    // The floor never goes down; new mail above it is recent again.
    assert_eq!(s.recent_claim(inbox, 1).await.expect("claim"), 3);
    deliver_one(&s, "r3", &[inbox]).await;
    deliver_one(&s, "r4", &[inbox]).await;
    assert_eq!(s.recent_count(inbox).await.expect("recent"), 2);
    s.expunge(inbox, Some(&UidSet::single(5))).await.expect("expunge");
    assert_eq!(s.recent_count(inbox).await.expect("recent"), 1, "expunged messages are not counted");
    assert_eq!(s.recent_claim(inbox, 5).await.expect("claim"), 3);
    assert_eq!(s.recent_count(inbox).await.expect("recent"), 0);
    assert!(is_not_found(s.recent_claim(i64::MAX, 1).await), "unknown mailbox");
}

/// Expunge tombstones are pruned after a while; asking for changes from before the
/// newest pruned one gets the full UID list (`present`), later ones the tombstones.
async fn tombstones_pruned_past_a_floor(ctx: Ctx) {
    let s = ctx.store.clone();
    let (_acc, inbox) = account(&s, "t@example.com").await;
    let (_acc2, other) = account(&s, "u@example.com").await;
    for i in 0..5 {
        deliver_one(&s, &format!("t{i}"), &[inbox, other]).await;
    }
    let before = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    s.expunge(inbox, Some(&UidSet::from_uids(&[2, 4]))).await.expect("expunge");
    let changes = s.changes_since(inbox, before).await.expect("changes");
    assert_eq!((changes.expunged.clone(), changes.present.clone()), (vec![2, 4], None));

    // Nothing is old enough yet.
    let an_hour_ago = Utc::now() - chrono::Duration::hours(1);
    assert_eq!(s.prune_tombstones(an_hour_ago).await.expect("prune"), 0);
    assert_eq!(s.changes_since(inbox, before).await.expect("changes").expunged, [2, 4]);

    let soon = Utc::now() + chrono::Duration::seconds(5);
    assert_eq!(s.prune_tombstones(soon).await.expect("prune"), 2);
    let after_prune = s.changes_since(inbox, before).await.expect("changes");
    assert_eq!(after_prune.present.as_deref(), Some(&[1, 3, 5][..]), "{after_prune:?}");
    // From the floor on, tombstones answer again.
    let floor = s.mailbox_status(inbox).await.expect("status").highest_modseq;
    s.expunge(inbox, Some(&UidSet::single(5))).await.expect("expunge");
    let later = s.changes_since(inbox, floor).await.expect("changes");
    assert_eq!((later.expunged, later.present), (vec![5], None));
    // Another mailbox had nothing pruned.
    assert_eq!(s.changes_since(other, 0).await.expect("changes").present, None);
    assert_eq!(s.prune_tombstones(soon).await.expect("prune"), 1, "the later one, now old too");
}

/// SORT's summary columns say what the stored metadata says.
async fn sort_rows_match_the_stored_metadata(ctx: Ctx) {
    let s = ctx.store.clone();
    let (_acc, inbox) = account(&s, "s@example.com").await;
    for i in 0..4 {
        deliver_one(&s, &format!("sorted {i}"), &[inbox]).await;
    }
    let some = UidSet::from_uids(&[1, 3, 4]);
    let full: Vec<mailcluster_model::SortRow> = s
        .messages_by_uid(inbox, &some)
        .await
        .expect("rows")
        .iter()
        .map(mailcluster_model::SortRow::of)
        .collect();
    let sort = s.sort_rows(inbox, &some).await.expect("sort rows");
    assert_eq!(sort, full);
    assert_eq!(sort.iter().map(|r| r.uid).collect::<Vec<_>>(), [1, 3, 4]);
}

async fn leases_limit_renew_expire(ctx: Ctx) {
    let s = ctx.store.clone();
    let ttl = Duration::from_secs(60);
    assert!(s.lease_acquire("k", "a", 2, ttl).await.expect("acquire"));
    assert!(s.lease_acquire("k", "b", 2, ttl).await.expect("acquire"));
    assert!(!s.lease_acquire("k", "c", 2, ttl).await.expect("acquire"), "limit 2");
    assert!(s.lease_acquire("k", "a", 2, ttl).await.expect("renew"), "a holder renews at the limit");
    assert_eq!(s.lease_count("k").await.expect("count"), 2);
    assert_eq!(s.lease_count("other").await.expect("count"), 0, "keys are independent");
    assert!(s.lease_extend("k", "a", ttl).await.expect("extend"));
    assert!(!s.lease_extend("k", "c", ttl).await.expect("extend"), "c holds nothing");
    s.lease_release("k", "b").await.expect("release");
    s.lease_release("k", "b").await.expect("a second release is harmless");
    assert!(s.lease_acquire("k", "c", 2, ttl).await.expect("acquire"), "b's slot is free");

    // Expiry: a lapsed lease neither counts nor extends, and its slot is taken.
    let short = Duration::from_millis(200);
    assert!(s.lease_acquire("e", "old", 1, short).await.expect("acquire"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.lease_count("e").await.expect("count"), 0);
    assert!(!s.lease_extend("e", "old", ttl).await.expect("extend"), "lapsed");
    assert!(s.lease_acquire("e", "new", 1, ttl).await.expect("acquire"));
}

async fn leases_are_exclusive_across_pods(ctx: Ctx) {
    // 8 contenders on 2 store handles (as on 2 pods) race for a limit of 3.
    let stores = [ctx.store.clone(), ctx.open_again().await];
    let mut handles = Vec::new();
    for i in 0..8 {
        let store = stores[i % 2].clone();
        handles.push(tokio::spawn(async move {
            store.lease_acquire("race", &format!("m{i}"), 3, Duration::from_secs(60)).await.expect("acquire")
        }));
    }
    let mut won = 0;
    for h in handles {
        won += usize::from(h.await.expect("contender"));
    }
    assert_eq!(won, 3, "exactly the limit");
    assert_eq!(ctx.store.lease_count("race").await.expect("count"), 3);
}

const SIEVE_QUOTA: store::SieveQuota = store::SieveQuota { max_scripts: 3, max_bytes: 100 };

/// RFC 5804: PUTSCRIPT replaces, SETACTIVE keeps one active, DELETESCRIPT
/// refuses the active script (§2.10), RENAMESCRIPT keeps it active (§2.11.1).
async fn sieve_scripts(ctx: Ctx) {
    let s = ctx.store.clone();
    let (acc, _) = account(&s, "sieve@example.com").await;
    let (other, _) = account(&s, "other@example.com").await;
    assert!(s.sieve_list(acc).await.expect("list").is_empty());
    assert_eq!(s.sieve_active(acc).await.expect("active"), None);
    s.sieve_put(acc, "main", b"keep;", SIEVE_QUOTA).await.expect("put");
    s.sieve_put(acc, "Main", b"discard;", SIEVE_QUOTA).await.expect("names are case-sensitive");
    s.sieve_put(acc, "main", b"stop;\r\n", SIEVE_QUOTA).await.expect("replace");
    assert_eq!(s.sieve_get(acc, "main").await.expect("get").as_deref(), Some(&b"stop;\r\n"[..]));
    assert_eq!(s.sieve_get(acc, "none").await.expect("get"), None);
    assert_eq!(s.sieve_get(other, "main").await.expect("get"), None, "scripts are per account");
    let names =
        |l: Vec<store::SieveEntry>| l.into_iter().map(|e| (e.name, e.active, e.size)).collect::<Vec<_>>();
    assert_eq!(
        names(s.sieve_list(acc).await.expect("list")),
        [("Main".into(), false, 8), ("main".into(), false, 7)]
    );

    s.sieve_activate(acc, Some("main")).await.expect("activate");
    assert_eq!(s.sieve_active(acc).await.expect("active"), Some(("main".into(), b"stop;\r\n".to_vec())));
    s.sieve_activate(acc, Some("Main")).await.expect("activate another");
    assert_eq!(
        names(s.sieve_list(acc).await.expect("list")),
        [("Main".into(), true, 8), ("main".into(), false, 7)]
    );
    assert!(is_not_found(s.sieve_activate(acc, Some("none")).await));
    assert_eq!(s.sieve_active(acc).await.expect("active").map(|a| a.0).as_deref(), Some("Main"), "unchanged");
    s.sieve_put(acc, "Main", b"keep;", SIEVE_QUOTA).await.expect("replace the active one");
    assert_eq!(s.sieve_active(acc).await.expect("active"), Some(("Main".into(), b"keep;".to_vec())));

    assert!(matches!(s.sieve_delete(acc, "Main").await, Err(StoreError::Invalid(_))), "active");
    assert!(is_not_found(s.sieve_delete(acc, "none").await));
    assert!(matches!(s.sieve_rename(acc, "Main", "main").await, Err(StoreError::AlreadyExists(_))));
    assert!(is_not_found(s.sieve_rename(acc, "none", "x").await));
    s.sieve_rename(acc, "Main", "renamed").await.expect("rename");
    assert_eq!(s.sieve_active(acc).await.expect("active").map(|a| a.0).as_deref(), Some("renamed"));
    s.sieve_delete(acc, "main").await.expect("delete");
    s.sieve_activate(acc, None).await.expect("deactivate");
    assert_eq!(s.sieve_active(acc).await.expect("active"), None);
    s.sieve_delete(acc, "renamed").await.expect("an inactive script goes");
    assert!(s.sieve_list(acc).await.expect("list").is_empty());

    let long: String = "é".repeat(129);
    for bad in ["", "a\nb", "tab\there", "nul\0", "line\u{2028}sep", "del\u{7f}", "c1\u{85}", &long] {
        assert!(
            matches!(s.sieve_put(acc, bad, b"keep;", SIEVE_QUOTA).await, Err(StoreError::Invalid(_))),
            "{bad:?}"
        );
    }
    s.sieve_put(acc, &"é".repeat(128), b"keep;", SIEVE_QUOTA).await.expect("128 characters are a name");
    s.sieve_put(acc, "with space \"and\" {braces}", b"keep;", SIEVE_QUOTA).await.expect("printable names");
    assert!(is_not_found(s.sieve_put(9_999_999, "x", b"keep;", SIEVE_QUOTA).await));
}

/// `sieve.max_scripts` counts new scripts only; `sieve.max_script_bytes` every
/// write. Concurrent new scripts never pass the count together.
async fn sieve_script_quota(ctx: Ctx) {
    let s = ctx.store.clone();
    let (acc, _) = account(&s, "quota@example.com").await;
    assert!(matches!(
        s.sieve_put(acc, "big", &[b'#'; 101], SIEVE_QUOTA).await,
        Err(StoreError::OverQuota(_))
    ));
    s.sieve_put(acc, "full", &[b'#'; 100], SIEVE_QUOTA).await.expect("at the size limit");
    for name in ["b", "c"] {
        s.sieve_put(acc, name, b"keep;", SIEVE_QUOTA).await.expect("put");
    }
    assert!(matches!(s.sieve_put(acc, "d", b"keep;", SIEVE_QUOTA).await, Err(StoreError::OverQuota(_))));
    s.sieve_put(acc, "c", b"discard;", SIEVE_QUOTA).await.expect("a replacement is no new script");
    assert!(
        matches!(s.sieve_put(acc, "c", &[b'#'; 101], SIEVE_QUOTA).await, Err(StoreError::OverQuota(_))),
        "nor a way past the size"
    );
    assert_eq!(s.sieve_get(acc, "c").await.expect("get").as_deref(), Some(&b"discard;"[..]));

    let (racer, _) = account(&s, "racer@example.com").await;
    let stores = [ctx.store.clone(), ctx.open_again().await];
    let handles: Vec<_> = (0..24)
        .map(|i| {
            let store = stores[i % 2].clone();
            tokio::spawn(async move { store.sieve_put(racer, &format!("s{i}"), b"keep;", SIEVE_QUOTA).await })
        })
        .collect();
    let mut stored = 0;
    for h in handles {
        match h.await.expect("writer") {
            Ok(()) => stored += 1,
            Err(StoreError::OverQuota(_)) => {}
            Err(e) => panic!("put: {e}"),
        }
    }
    assert_eq!(stored, 3, "exactly max_scripts");
    assert_eq!(s.sieve_list(racer).await.expect("list").len(), 3);
}

async fn sieve_scripts_go_with_their_account(ctx: Ctx) {
    let s = ctx.store.clone();
    let (acc, _) = account(&s, "leaving@example.com").await;
    s.sieve_put(acc, "main", b"keep;", SIEVE_QUOTA).await.expect("put");
    s.sieve_activate(acc, Some("main")).await.expect("activate");
    assert!(!s.sieve_vacation_seen(acc, "h", "a@example.org", 3600).await.expect("seen"));
    s.account_delete("leaving@example.com").await.expect("delete account");
    let (again, _) = account(&s, "leaving@example.com").await;
    assert!(s.sieve_list(again).await.expect("list").is_empty());
    assert_eq!(s.sieve_active(acc).await.expect("active"), None);
    assert!(!s.sieve_vacation_seen(again, "h", "a@example.org", 3600).await.expect("seen"), "forgotten");
}

/// RFC 5230 §4.2: one reply per sender and handle per period, whichever pod
/// delivers; senders and handles are apart.
async fn sieve_vacation_once_per_period_across_pods(ctx: Ctx) {
    let s = ctx.store.clone();
    let (acc, _) = account(&s, "away@example.com").await;
    let stores = [ctx.store.clone(), ctx.open_again().await];
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let store = stores[i % 2].clone();
            tokio::spawn(async move {
                store.sieve_vacation_seen(acc, "holiday", "Friend@Example.org", 3600).await
            })
        })
        .collect();
    let mut unseen = 0;
    for h in handles {
        unseen += usize::from(!h.await.expect("caller").expect("seen"));
    }
    assert_eq!(unseen, 1, "one caller records the reply, the others see it");
    assert!(
        s.sieve_vacation_seen(acc, "holiday", "friend@example.org", 3600).await.expect("seen"),
        "any case"
    );
    assert!(!s.sieve_vacation_seen(acc, "holiday", "other@example.org", 3600).await.expect("seen"));
    assert!(!s.sieve_vacation_seen(acc, "work", "friend@example.org", 3600).await.expect("seen"));
    // A period of one second is over after two.
    assert!(!s.sieve_vacation_seen(acc, "short", "friend@example.org", 1).await.expect("seen"));
    assert!(s.sieve_vacation_seen(acc, "short", "friend@example.org", 1).await.expect("seen"));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(
        !s.sieve_vacation_seen(acc, "short", "friend@example.org", 1).await.expect("seen"),
        "period over"
    );
    assert!(
        s.sieve_vacation_seen(acc, "short", "friend@example.org", 1).await.expect("seen"),
        "recorded again"
    );
}

async fn sieve_duplicate_and_prune(ctx: Ctx) {
    let s = ctx.store.clone();
    let (acc, _) = account(&s, "dup@example.com").await;
    let id = format!("<{}@example.org>", "x".repeat(10_000));
    assert!(!s.sieve_duplicate_seen(acc, &id, 1).await.expect("seen"));
    assert!(s.sieve_duplicate_seen(acc, &id, 1).await.expect("seen"));
    assert!(!s.sieve_vacation_seen(acc, &id, "", 1).await.expect("seen"), "vacation keys are apart");
    assert!(!s.sieve_duplicate_seen(acc, "kept", 3600).await.expect("seen"));
    assert_eq!(s.sieve_seen_prune().await.expect("prune"), 0, "nothing is over yet");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(s.sieve_seen_prune().await.expect("prune"), 2);
    assert!(s.sieve_duplicate_seen(acc, "kept", 3600).await.expect("seen"), "a live record stays");
    assert!(!s.sieve_duplicate_seen(acc, &id, 1).await.expect("seen"), "a pruned one is gone");
    assert!(is_not_found(s.sieve_duplicate_seen(9_999_999, "x", 60).await));
}

// ------------------------------------------------ backend-specific, outside the macro

#[tokio::test]
async fn open_default_creates_sqlite_in_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("nested/data");
    let s = store::open(None, &data, 2, CONNECT_TIMEOUT).await.expect("open");
    s.migrate().await.expect("migrate");
    assert_eq!(s.backend(), "sqlite");
    assert!(data.join(store::SQLITE_FILE).exists());
}

#[tokio::test]
async fn unreachable_postgres_is_unavailable_without_secrets() {
    let dir = tempfile::tempdir().expect("tempdir");
    // port 1 on loopback: connection refused
    let url = "postgres://mailuser:hunter2secret@127.0.0.1:1/mail";
    let err = match store::open(Some(url), dir.path(), 2, Duration::from_secs(3)).await {
        Ok(_) => panic!("nothing listens on port 1"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Unavailable(_)), "{msg}");
    assert!(msg.contains("127.0.0.1:1"), "names host and port: {msg}");
    assert!(!msg.contains("hunter2secret"), "no password in: {msg}");
}

#[tokio::test]
async fn bad_url_scheme_is_invalid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err =
        store::open(Some("mysql://u:pw@h/db"), dir.path(), 2, CONNECT_TIMEOUT).await.err().expect("error");
    assert!(matches!(err, StoreError::Invalid(_)));
    assert!(!err.to_string().contains("pw@"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_migrations_on_fresh_database() {
    run(Backend::Postgres, false, |ctx: Ctx| async move {
        // two pods starting at once: sqlx serialises them with an advisory lock
        let mut handles = Vec::new();
        for _ in 0..3 {
            let ctx = ctx.clone();
            handles.push(tokio::spawn(async move { ctx.open_again().await.migrate().await }));
        }
        handles.push(tokio::spawn({
            let s = ctx.store.clone();
            async move { s.migrate().await }
        }));
        for h in handles {
            h.await.expect("task").expect("concurrent migrate succeeds");
        }
        ctx.store.domain_add("example.com").await.expect("schema usable");
    })
    .await;
}

/// The PostgreSQL prune works in batches (short transactions): more tombstones than
/// one batch all go, and the floor is the newest of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_prunes_many_tombstones_in_batches() {
    run(Backend::Postgres, true, |ctx: Ctx| async move {
        let (_acc, inbox) = account(&ctx.store, "p@example.com").await;
        ctx.exec_sql(&format!(
            "INSERT INTO expunged (mailbox_id, uid, modseq, expunged_at) \
             SELECT {inbox}, g, g, now() - interval '40 days' FROM generate_series(1, 25000) AS g; \
             UPDATE mailboxes SET highest_modseq = 30000, uid_next = 25001 WHERE id = {inbox}"
        ))
        .await;
        let cutoff = Utc::now() - chrono::Duration::days(30);
        assert_eq!(ctx.store.prune_tombstones(cutoff).await.expect("prune"), 25_000);
        assert_eq!(ctx.store.prune_tombstones(cutoff).await.expect("prune"), 0);
        let changes = ctx.store.changes_since(inbox, 24_999).await.expect("changes");
        assert!(changes.present.is_some(), "asked from below the floor 25000");
        let changes = ctx.store.changes_since(inbox, 25_000).await.expect("changes");
        assert!(changes.present.is_none(), "from the floor on, tombstones answer");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_keeps_synchronous_commit_on() {
    run(Backend::Postgres, true, |ctx: Ctx| async move {
        // The store must not trade durability for speed: COMMIT (and so the 250
        // after deliver_batch) has to wait for the WAL flush on the store's own
        // connections.
        let pg = store::postgres::PgStore::connect(&ctx.url, 2, CONNECT_TIMEOUT).await.expect("connect");
        assert_eq!(pg.synchronous_commit().await.expect("show"), "on");
        let (_, inbox) = account(&ctx.store, "a@example.com").await;
        deliver_one(&ctx.store, "durable", &[inbox]).await;
    })
    .await;
}

/// The store at `db` and its test account's INBOX, for the kill -9 tests.
async fn kill9_inbox(db: &std::path::Path, scratch: &std::path::Path) -> (Arc<dyn Store>, i64) {
    let s = store::open(Some(&format!("sqlite://{}", db.display())), scratch, 4, CONNECT_TIMEOUT)
        .await
        .expect("open");
    let acc = s.account_get("k@example.com").await.expect("get").expect("account");
    let inbox = s.mailbox_get(acc.id, "INBOX").await.expect("get").expect("inbox").id;
    (s, inbox)
}

/// Runs the ignored test `child` as a child process writing into a fresh
/// database, reads `acks` of its `ACK …` lines, kills it with SIGKILL and
/// reopens the database: the store, its INBOX and the acknowledgements (the text
/// after `ACK `). The tempdir holds the database.
async fn kill9_after_acks(child: &str, acks: usize) -> (tempfile::TempDir, Arc<dyn Store>, i64, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("kill.db");
    {
        let s = store::open(Some(&format!("sqlite://{}", db.display())), dir.path(), 2, CONNECT_TIMEOUT)
            .await
            .expect("open");
        s.migrate().await.expect("migrate");
        account(&s, "k@example.com").await;
    }
    let mut process = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", child, "--ignored", "--nocapture", "--test-threads=1"])
        .env("MC_KILL_DB", &db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = process.stdout.take().expect("stdout");
    let reader = tokio::task::spawn_blocking(move || {
        let mut acked = Vec::new();
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if let Some(ack) = line.strip_prefix("ACK ") {
                acked.push(ack.trim().to_string());
                if acked.len() == acks {
                    break;
                }
            }
        }
        // The pipe stays open until the kill: the child writes on, unaware.
        (acked, lines)
    });
    let (acked, _pipe) = tokio::time::timeout(Duration::from_secs(120), reader)
        .await
        .expect("child acknowledges in time")
        .expect("reader");
    process.kill().expect("SIGKILL the child amid its writes");
    let _ = process.wait();
    assert_eq!(acked.len(), acks, "child acknowledged writes");
    let (s, inbox) = kill9_inbox(&db, dir.path()).await;
    (dir, s, inbox, acked)
}

/// Helper run as a child process by `sqlite_acknowledged_delivery_survives_kill_9`:
/// delivers into the database named by `MC_KILL_DB` forever, printing each
/// acknowledged UID. Ignored on its own (it never ends).
#[tokio::test]
#[ignore = "child process of sqlite_acknowledged_delivery_survives_kill_9"]
async fn kill9_child_delivers_forever() {
    let Ok(db) = std::env::var("MC_KILL_DB") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, inbox) = kill9_inbox(db.as_ref(), dir.path()).await;
    for i in 0.. {
        let out = s.deliver_batch(&[delivery(&format!("k{i}"), &[inbox])]).await.expect("deliver");
        // the acknowledgement: printed only after deliver_batch returned
        println!("ACK {}", out[0][0].uid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_acknowledged_delivery_survives_kill_9() {
    let (_dir, s, inbox, acked) = kill9_after_acks("kill9_child_delivers_forever", 200).await;
    let present: BTreeSet<u32> = s.mailbox_uids(inbox).await.expect("uids").into_iter().collect();
    for uid in acked.iter().map(|a| a.parse::<u32>().expect("uid")) {
        assert!(present.contains(&uid), "acknowledged UID {uid} lost after kill -9");
    }
    assert_counts(&s, inbox).await;
}

/// Helper run as a child process by `sqlite_acknowledged_concurrent_writes_survive_kill_9`:
/// sixteen writers deliver, flag and expunge in the database named by
/// `MC_KILL_DB` forever, printing each acknowledged write. Ignored on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of sqlite_acknowledged_concurrent_writes_survive_kill_9"]
async fn kill9_child_writes_concurrently_forever() {
    let Ok(db) = std::env::var("MC_KILL_DB") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, inbox) = kill9_inbox(db.as_ref(), dir.path()).await;
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0u64.. {
                    // Kept messages are never expunged, so their acknowledgements
                    // hold whatever the child did after the parent stopped reading;
                    // another message is delivered to be expunged.
                    let out =
                        s.deliver_batch(&[delivery(&format!("w{w}-{i}"), &[inbox])]).await.expect("deliver");
                    let kept = out[0][0].uid;
                    // each line printed only after the store call returned
                    println!("ACK D {kept}");
                    let seen = flagset(Flags::SEEN, &[]);
                    s.store_flags(inbox, &UidSet::single(kept), FlagOp::Add, &seen).await.expect("store");
                    println!("ACK F {kept}");
                    let out =
                        s.deliver_batch(&[delivery(&format!("x{w}-{i}"), &[inbox])]).await.expect("deliver");
                    let gone = out[0][0].uid;
                    s.expunge(inbox, Some(&UidSet::single(gone))).await.expect("expunge");
                    println!("ACK X {gone}");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
}

/// Writes that share a commit (the embedded store's write gate) are each durable
/// when acknowledged: kill -9 amid sixteen concurrent writers loses none of the
/// deliveries, flag changes or expunges already answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_acknowledged_concurrent_writes_survive_kill_9() {
    let (_dir, s, inbox, acked) = kill9_after_acks("kill9_child_writes_concurrently_forever", 1500).await;
    let acked: Vec<(&str, u32)> = acked
        .iter()
        .map(|a| a.split_once(' ').expect("kind and uid"))
        .map(|(kind, uid)| (kind, uid.parse().expect("uid")))
        .collect();
    let index = s.mailbox_index(inbox).await.expect("index");
    let flags: HashMap<u32, Flags> = index.uids.iter().copied().zip(index.flags.iter().copied()).collect();
    let expunged = acked.iter().filter(|(k, _)| *k == "X").count();
    for &(kind, uid) in &acked {
        match kind {
            "X" => assert!(!flags.contains_key(&uid), "acknowledged expunge of UID {uid} undone by kill -9"),
            "D" => assert!(flags.contains_key(&uid), "acknowledged UID {uid} lost after kill -9"),
            _ => assert!(
                flags.get(&uid).is_some_and(|f| f.contains(Flags::SEEN)),
                "acknowledged \\Seen on UID {uid} lost after kill -9"
            ),
        }
    }
    assert!(expunged > 0, "the child expunged");
    assert_counts(&s, inbox).await;
}

/// The database epoch for a role with and without the right to read the cluster's
/// control data: both give a stable value (the second falls back to the server's
/// start time); the embedded store has none.
#[tokio::test]
async fn postgres_epoch_with_and_without_pg_monitor() {
    let admin = database_url();
    let dir = tempfile::tempdir().expect("tempdir");
    let full = store::open(Some(&admin), dir.path(), 2, CONNECT_TIMEOUT).await.expect("open");
    let epoch = full.epoch().await.expect("epoch").expect("postgres has one");
    assert_eq!(full.epoch().await.expect("epoch").as_deref(), Some(epoch.as_str()), "stable");

    // A role without pg_monitor (the usual application role).
    let role = format!("mc_epoch_{}", std::process::id());
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await.expect("admin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD 'x'"
    )))
    .execute(&mut conn)
    .await
    .expect("role");
    let (scheme, rest) = admin.split_once("://").expect("scheme");
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let plain = format!("{scheme}://{role}:x@{host}");
    let limited = store::open(Some(&plain), dir.path(), 2, CONNECT_TIMEOUT).await.expect("open as role");
    let first = limited.epoch().await.expect("epoch without pg_monitor").expect("some");
    assert_eq!(limited.epoch().await.expect("again").as_deref(), Some(first.as_str()));
    assert!(epoch.ends_with(&first), "the start time is part of both: {epoch} / {first}");
    drop(limited);
    let _ =
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}"))).execute(&mut conn).await;

    let sqlite = store::open(None, dir.path(), 2, CONNECT_TIMEOUT).await.expect("sqlite");
    assert_eq!(sqlite.epoch().await.expect("epoch"), None);
}

/// RFC 9208 STORAGE: an account's usage is the octets of every message in every
/// one of its mailboxes (a copy counts again, a move does not), kept by each
/// write; its limit is its own, else its domain's default.
async fn quota_limits_and_usage(ctx: Ctx) {
    let s = &ctx.store;
    let (acc, inbox) = account(s, "q@example.com").await;
    let (other, other_inbox) = account(s, "other@example.com").await;
    let archive = s.mailbox_get(acc, "Archive").await.expect("get").expect("Archive").id;
    let empty = s.quota(acc).await.expect("quota");
    assert_eq!((empty.account_limit, empty.domain_limit, empty.used, empty.limit()), (None, None, 0, None));

    let d = delivery("one", &[inbox]);
    let size = d.raw.len() as u64;
    s.deliver_batch(&[d, delivery("two", &[inbox, archive])]).await.expect("deliver");
    deliver_one(s, "six", &[other_inbox]).await;
    assert_eq!(s.quota(acc).await.expect("quota").used, 3 * size, "a message in two mailboxes counts twice");
    assert_eq!(s.quota(other).await.expect("quota").used, size, "accounts do not share usage");

    s.copy(inbox, &UidSet::single(1), archive).await.expect("copy");
    assert_eq!(s.quota(acc).await.expect("quota").used, 4 * size);
    s.move_messages(archive, &UidSet::all(), inbox).await.expect("move");
    assert_eq!(s.quota(acc).await.expect("quota").used, 4 * size, "a move changes nothing");
    s.store_flags(inbox, &UidSet::single(1), FlagOp::Add, &flagset(Flags::DELETED, &[])).await.expect("flag");
    assert_eq!(s.mailbox_deleted(inbox).await.expect("deleted"), (1, size));
    assert_eq!(s.quota(acc).await.expect("quota").used, 4 * size, "\\Deleted still counts");
    s.expunge(inbox, None).await.expect("expunge");
    assert_eq!(s.quota(acc).await.expect("quota").used, 3 * size);
    assert_counts(s, inbox).await;
    s.mailbox_rename(acc, "INBOX", "Old").await.expect("rename INBOX");
    assert_eq!(s.mailbox_size(inbox).await.expect("size"), 0, "INBOX left empty");
    assert_eq!(s.quota(acc).await.expect("quota").used, 3 * size, "renaming INBOX moves the usage");
    s.mailbox_delete(acc, "Old").await.expect("delete");
    assert_eq!(s.quota(acc).await.expect("quota").used, 0, "a deleted mailbox frees its octets");

    // Limits: the domain's default applies until the account has its own.
    s.domain_set_quota("example.com", Some(10_000)).await.expect("domain quota");
    assert_eq!(s.domain_quota("example.com").await.expect("domain quota"), Some(10_000));
    let q = s.quota(acc).await.expect("quota");
    assert_eq!((q.account_limit, q.domain_limit, q.limit()), (None, Some(10_000), Some(10_000)));
    s.account_set_quota("Q@Example.com", Some(2_000)).await.expect("account quota");
    assert_eq!(s.quota(acc).await.expect("quota").limit(), Some(2_000), "the account's own limit wins");
    // APPEND's one read: the mailbox by name and the account's quota, as read apart.
    let seven = delivery("seven", &[archive]);
    let seven_size = seven.raw.len() as u64;
    s.deliver_batch(&[seven]).await.expect("deliver");
    let (mb, q) = s.mailbox_with_quota(acc, "Archive").await.expect("read").expect("Archive");
    assert_eq!(Some(mb), s.mailbox_get(acc, "Archive").await.expect("get"));
    assert_eq!(q, s.quota(acc).await.expect("quota"));
    assert_eq!((q.used, q.limit()), (seven_size, Some(2_000)));
    assert!(s.mailbox_with_quota(acc, "Nope").await.expect("read").is_none());
    assert!(
        s.mailbox_with_quota(other, "Archive")
            .await
            .expect("read")
            .is_some_and(|(_, q)| q.limit() == Some(10_000))
    );
    assert_eq!(s.quota(other).await.expect("quota").limit(), Some(10_000), "others keep the default");
    s.account_set_quota("q@example.com", Some(mailcluster_model::Quota::UNLIMITED)).await.expect("unlimited");
    assert_eq!(s.quota(acc).await.expect("quota").limit(), None, "unlimited despite the default");
    s.account_set_quota("q@example.com", None).await.expect("back to default");
    assert_eq!(s.quota(acc).await.expect("quota").limit(), Some(10_000));
    s.domain_set_quota("example.com", None).await.expect("no default");
    assert_eq!(s.quota(acc).await.expect("quota").limit(), None);
    s.account_set_quota("q@example.com", Some(u64::MAX)).await.expect("huge limit");
    assert_eq!(s.quota(acc).await.expect("quota").limit(), None, "past the column: no limit");

    assert!(is_not_found(s.account_set_quota("nobody@example.com", Some(1)).await));
    assert!(is_not_found(s.domain_set_quota("nowhere.example", Some(1)).await));
    assert!(is_not_found(s.domain_quota("nowhere.example").await));
    assert!(is_not_found(s.quota(i64::MAX).await));
    assert!(is_not_found(s.mailbox_size(i64::MAX).await));
}

/// Statements reuse their generic plans (see `generic_plans` in the store) unless
/// the URL sets `plan_cache_mode` itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_reuse_generic_plans_unless_the_url_says_otherwise() {
    let db = TestDatabase::create("mc_plans").await;
    let mode = |pg: store::postgres::PgStore| async move {
        let mode: String =
            sqlx::query_scalar("SHOW plan_cache_mode").fetch_one(pg.pool()).await.expect("show");
        mode
    };
    let pg = store::postgres::PgStore::connect(&db.url, 1, CONNECT_TIMEOUT).await.expect("connect");
    assert_eq!(mode(pg).await, "force_generic_plan");
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}options=-c%20plan_cache_mode%3Dauto", db.url);
    let pg = store::postgres::PgStore::connect(&url, 1, CONNECT_TIMEOUT).await.expect("connect with options");
    assert_eq!(mode(pg).await, "auto", "the URL's own setting wins");
}

/// Whether the store's connections to the test database use TLS.
async fn store_uses_tls(url: &str) -> bool {
    let pg = store::postgres::PgStore::connect(url, 1, CONNECT_TIMEOUT).await.expect("connect");
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pg.pool())
        .await
        .expect("pg_stat_ssl")
}

/// Over loopback the store speaks plain TCP unless the URL asks for TLS: the
/// driver's default (`prefer`) would take the TLS the server offers, at a cost
/// and for no protection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_connections_skip_tls_unless_the_url_asks() {
    let db = TestDatabase::create("mc_loopback_tls").await;
    let host = sqlx::postgres::PgConnectOptions::from_str(&db.url).expect("url").get_host().to_string();
    assert!(
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()),
        "the test database is on this host ({host})"
    );
    assert!(!store_uses_tls(&db.url).await, "no TLS over loopback by default");
    let raw = sqlx::PgConnection::connect(&db.url).await.expect("plain sqlx connection");
    let mut raw = raw;
    let offered: String = sqlx::query_scalar("SHOW ssl").fetch_one(&mut raw).await.expect("SHOW ssl");
    if offered == "on" {
        let sep = if db.url.contains('?') { '&' } else { '?' };
        assert!(
            store_uses_tls(&format!("{}{sep}sslmode=require", db.url)).await,
            "an explicit sslmode is kept"
        );
    } else {
        eprintln!("the server offers no TLS: the explicit-sslmode half is not checked here");
    }
}

/// An EXPUNGE that waited for the mailbox while another pod's COPY linked the same
/// message elsewhere keeps the body: the copy's link is not in the snapshot the
/// EXPUNGE's statement started with, and deleting the body from under it must not
/// happen (nor fail the EXPUNGE).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_expunge_keeps_a_body_linked_while_it_waited() {
    run(Backend::Postgres, true, |ctx: Ctx| async move {
        let s = ctx.store.clone();
        let (acc, inbox) = account(&s, "a@example.com").await;
        let other = s.mailbox_create(acc, "Other", None).await.expect("create").id;
        let uid = deliver_one(&s, "copied while expunged", &[inbox]).await[0].uid;
        s.store_flags(inbox, &UidSet::single(uid), FlagOp::Add, &flagset(Flags::DELETED, &[]))
            .await
            .expect("flag");
        let body = s.messages_by_uid(inbox, &UidSet::single(uid)).await.expect("rows")[0].message_id;

        // The COPY as a transaction does it: the source mailbox locked, a link into
        // the destination, committed only once the EXPUNGE waits for the lock.
        let mut copier = sqlx::PgConnection::connect(&ctx.url).await.expect("connect");
        let mut tx = copier.begin().await.expect("begin");
        sqlx::query("SELECT id FROM mailboxes WHERE id = $1 FOR UPDATE")
            .bind(inbox)
            .execute(&mut *tx)
            .await
            .expect("lock");
        sqlx::query(
            "INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, size) \
             SELECT $1, 1, message_id, 0, '', 1, internal_date, size FROM mailbox_messages \
             WHERE mailbox_id = $2 AND uid = $3",
        )
        .bind(other)
        .bind(inbox)
        .bind(i64::from(uid))
        .execute(&mut *tx)
        .await
        .expect("link");
        let expunge = tokio::spawn({
            let s = s.clone();
            async move { s.expunge(inbox, None).await }
        });
        let mut watcher = sqlx::PgConnection::connect(&ctx.url).await.expect("connect");
        let mut waiting = false;
        for _ in 0..200 {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE '%DELETE FROM mailbox_messages%'",
            )
            .fetch_one(&mut watcher)
            .await
            .expect("activity");
            if n > 0 {
                waiting = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(waiting, "the EXPUNGE waits for the mailbox lock the copy holds");
        tx.commit().await.expect("commit the copy");

        let removed = expunge.await.expect("task").expect("the EXPUNGE succeeds");
        assert_eq!(removed.uids, vec![uid]);
        assert_eq!(s.mailbox_uids(other).await.expect("uids"), vec![1], "the copy's link is there");
        assert!(s.message_body(body).await.is_ok(), "the body the copy linked stays");
        assert!(s.mailbox_uids(inbox).await.expect("uids").is_empty());
    })
    .await;
}
