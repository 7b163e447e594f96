//! `domain`, `user`, `alias`, `sieve` and `migrate` against real stores: the embedded SQLite default
//! in a temporary directory and a fresh PostgreSQL database; and what an operator
//! sees when the database or Redis cannot be reached.

mod common;

use std::path::Path;
use std::time::Duration;

use common::TestDatabase;
use common::{Output, run, run_with};

fn with_password(cwd: &Path, args: &[&str], env: &[(&str, &str)], password: &str) -> Output {
    run_with(cwd, args, env, &format!("{password}\n"), Duration::from_secs(120))
}

/// The same administration session, whatever the backend.
fn administer(cwd: &Path, env: &[(&str, &str)]) {
    // A person's command prints its result and nothing else: no log lines.
    let out = run(cwd, &["domain", "add", "Example.COM"], env);
    out.ok();
    assert_eq!(out.stderr, "domain example.com added\n", "only the result");
    assert!(out.stdout.is_empty());
    run(cwd, &["domain", "add", "example.org"], env).ok();
    let out = run(cwd, &["domain", "list"], env);
    out.ok();
    assert_eq!(out.stdout, "example.com\nexample.org\n");

    with_password(cwd, &["user", "add", "alice@example.com"], env, "correct horse").ok();
    let pw_file = cwd.join("bob.pw");
    std::fs::write(&pw_file, "battery staple\n").unwrap();
    run(cwd, &["user", "add", "Bob@example.org", "--password-file", pw_file.to_str().unwrap()], env).ok();
    run(cwd, &["user", "add", "carol@example.org", "--password", "insecure"], env).ok();

    let out = run(cwd, &["user", "list"], env);
    out.ok();
    let mut users: Vec<&str> = out.stdout.lines().collect();
    users.sort_unstable();
    assert_eq!(users, ["alice@example.com", "bob@example.org", "carol@example.org"]);
    let out = run(cwd, &["user", "list", "--domain", "example.com"], env);
    out.ok();
    assert_eq!(out.stdout, "alice@example.com\n");

    // Store refusals are runtime errors (1) with one line naming what failed.
    let out = with_password(cwd, &["user", "add", "alice@example.com"], env, "again");
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.error_line().contains("alice@example.com"), "{}", out.stderr);
    let out = with_password(cwd, &["user", "add", "dave@unknown.test"], env, "pw");
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let out = run(cwd, &["domain", "del", "example.org"], env);
    assert_eq!(out.code, Some(1), "a domain with accounts is kept: {}", out.stderr);
    out.assert_no_panic();

    // Quotas: a domain default, an account's own limit over it, and back.
    let out = run(cwd, &["user", "quota", "alice@example.com"], env);
    out.ok();
    assert_eq!(out.stdout, "alice@example.com: used 0 B of no limit\n");
    run(cwd, &["domain", "quota", "example.com", "1G"], env).ok();
    let out = run(cwd, &["domain", "quota", "example.com"], env);
    assert_eq!(out.stdout, "example.com: default limit 1.0 GiB\n");
    let out = run(cwd, &["user", "quota", "alice@example.com"], env);
    assert_eq!(out.stdout, "alice@example.com: used 0 B of 1.0 GiB (domain default)\n");
    let out = run(cwd, &["user", "quota", "alice@example.com", "500M"], env);
    out.ok();
    assert_eq!(out.stderr, "quota of alice@example.com: 500.0 MiB\n");
    let out = run(cwd, &["user", "quota", "alice@example.com", "none"], env);
    assert_eq!(out.stderr, "quota of alice@example.com: no limit\n", "none beats the domain default");
    let out = run(cwd, &["user", "quota", "alice@example.com", "default"], env);
    assert_eq!(out.stderr, "quota of alice@example.com: 1.0 GiB\n");
    run(cwd, &["domain", "quota", "example.com", "none"], env).ok();
    let out = run(cwd, &["user", "quota", "alice@example.com"], env);
    assert_eq!(out.stdout, "alice@example.com: used 0 B of no limit\n");
    let out = run(cwd, &["user", "quota", "alice@example.com", "lots"], env);
    assert_eq!(out.code, Some(2), "a bad size is a usage error: {}", out.stderr);
    let out = run(cwd, &["user", "quota", "nobody@example.com", "1G"], env);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.error_line().contains("nobody@example.com"), "{}", out.stderr);

    // Catch-all: shown, set to an account only, removed.
    let out = run(cwd, &["domain", "catch-all", "example.com"], env);
    assert_eq!(out.ok().stdout, "example.com: catch-all none\n");
    let out = run(cwd, &["domain", "catch-all", "example.com", "nobody@example.com"], env);
    assert_eq!(out.code, Some(1), "not an account: {}", out.stderr);
    run(cwd, &["domain", "catch-all", "example.com", "Alice@example.com"], env).ok();
    let out = run(cwd, &["domain", "catch-all", "example.com"], env);
    assert_eq!(out.stdout, "example.com: catch-all alice@example.com\n");
    run(cwd, &["domain", "catch-all", "example.com", "--none"], env).ok();
    let out = run(cwd, &["domain", "catch-all", "example.com"], env);
    assert_eq!(out.stdout, "example.com: catch-all none\n");

    // Aliases: to accounts, listed per domain, taken apart a target at a time.
    let out = run(cwd, &["alias", "add", "Team@example.org", "alice@example.com", "bob@example.org"], env);
    out.ok();
    assert_eq!(
        out.stderr,
        "alias team@example.org → alice@example.com added\nalias team@example.org → bob@example.org added\n"
    );
    let out = run(cwd, &["alias", "list"], env);
    assert_eq!(out.stdout, "team@example.org alice@example.com\nteam@example.org bob@example.org\n");
    let out = run(cwd, &["alias", "list", "--domain", "example.com"], env);
    assert_eq!(out.stdout, "");
    for refused in [
        ["alias", "add", "alice@example.com", "bob@example.org"],
        ["alias", "add", "x@example.org", "nobody@example.org"],
        ["alias", "add", "x@unknown.test", "alice@example.com"],
        ["alias", "add", "team@example.org", "alice@example.com"],
    ] {
        let out = run(cwd, &refused, env);
        assert_eq!(out.code, Some(1), "{refused:?}: {}", out.stderr);
        out.assert_no_panic();
    }
    let out = run(cwd, &["alias", "add", "team@example.org"], env);
    assert_eq!(out.code, Some(2), "an alias needs a target: {}", out.stderr);

    // Senders: what an account may submit as besides its own address.
    let out =
        run(cwd, &["user", "senders", "add", "alice@example.com", "Sales@Example.com", "@Brand.test"], env);
    out.ok();
    assert_eq!(
        out.stderr,
        "alice@example.com may send as sales@example.com\nalice@example.com may send as @brand.test\n"
    );
    let out = run(cwd, &["user", "senders", "list", "alice@example.com"], env);
    out.ok();
    assert_eq!(out.stdout, "alias team@example.org\nallowed @brand.test\nallowed sales@example.com\n");
    for refused in [
        ["user", "senders", "add", "alice@example.com", "sales@example.com"],
        ["user", "senders", "add", "nobody@example.com", "x@example.com"],
        ["user", "senders", "add", "alice@example.com", "not an address"],
        ["user", "senders", "del", "alice@example.com", "never@example.com"],
    ] {
        let out = run(cwd, &refused, env);
        assert_eq!(out.code, Some(1), "{refused:?}: {}", out.stderr);
        out.assert_no_panic();
    }
    let out = run(cwd, &["user", "senders", "add", "alice@example.com"], env);
    assert_eq!(out.code, Some(2), "an address is needed: {}", out.stderr);
    run(cwd, &["user", "senders", "del", "alice@example.com", "sales@example.com"], env).ok();
    let out = run(cwd, &["user", "senders", "list", "alice@example.com"], env);
    assert_eq!(out.stdout, "alias team@example.org\nallowed @brand.test\n");
    run(cwd, &["alias", "del", "team@example.org", "bob@example.org"], env).ok();
    let out = run(cwd, &["alias", "list", "--domain", "example.org"], env);
    assert_eq!(out.stdout, "team@example.org alice@example.com\n");
    run(cwd, &["alias", "del", "team@example.org"], env).ok();
    assert_eq!(run(cwd, &["alias", "list"], env).stdout, "");
    assert_eq!(run(cwd, &["alias", "del", "team@example.org"], env).code, Some(1));

    with_password(cwd, &["user", "passwd", "alice@example.com"], env, "new password").ok();
    run(cwd, &["user", "del", "bob@example.org"], env).ok();
    run(cwd, &["user", "del", "carol@example.org"], env).ok();
    run(cwd, &["domain", "del", "example.org"], env).ok();
    let out = run(cwd, &["user", "list"], env);
    assert_eq!(out.stdout, "alice@example.com\n");
    let out = run(cwd, &["domain", "list"], env);
    assert_eq!(out.stdout, "example.com\n");
}

#[test]
fn domains_and_users_in_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    administer(dir.path(), &[]);
    // The default data dir is relative to where the command runs.
    assert!(dir.path().join("mailcluster-data").is_dir());
    // `migrate` on an up-to-date store is a no-op that succeeds.
    run(dir.path(), &["migrate"], &[]).ok();
    // Progress lines come back when asked for.
    let out = run(dir.path(), &["domain", "list", "--log-level", "info"], &[]);
    assert!(out.stderr.contains("store opened"), "{}", out.stderr);
}

#[test]
fn queue_commands_on_an_empty_and_a_filled_queue() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["queue", "list"], &[]);
    out.ok();
    assert_eq!(out.stdout, "queue is empty\n");
    let out = run(dir.path(), &["queue", "show", "7"], &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.error_line().contains("no queue item 7"), "{}", out.stderr);
    let out = run(dir.path(), &["queue", "delete", "7"], &[]);
    assert_eq!(out.code, Some(1));

    // One queued message, written by the store as a submission would.
    let store_dir = dir.path().join("mailcluster-data");
    common::cluster::block_on(async {
        let store =
            mailcluster_server::store::open(None, &store_dir, 1, Duration::from_secs(5)).await.unwrap();
        let now = chrono::Utc::now();
        store
            .queue_enqueue(&mailcluster_model::NewQueueItem {
                sender: "alice@example.com".into(),
                recipients: vec!["x@remote.test".into()],
                raw: bytes::Bytes::from_static(b"Subject: queued\r\n\r\nbody\r\n"),
                account_id: None,
                not_before: now + chrono::Duration::hours(1),
                expires_at: now + chrono::Duration::days(5),
                dsn: Default::default(),
            })
            .await
            .unwrap();
    });
    let out = run(dir.path(), &["queue", "list"], &[]);
    out.ok();
    assert!(
        out.stdout.contains("alice@example.com") && out.stdout.contains("x@remote.test"),
        "{}",
        out.stdout
    );
    let out = run(dir.path(), &["queue", "list", "--json"], &[]);
    let entry: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON object");
    let id = entry["id"].as_i64().unwrap().to_string();
    let out = run(dir.path(), &["queue", "show", &id], &[]);
    out.ok();
    assert!(
        out.stdout.contains("Subject: queued") && out.stdout.contains("<alice@example.com>"),
        "{}",
        out.stdout
    );
    let out = run(dir.path(), &["queue", "retry", &id], &[]);
    assert_eq!(out.stdout, "1 message(s) due now\n");
    run(dir.path(), &["queue", "delete", &id], &[]).ok();
    assert_eq!(run(dir.path(), &["queue", "list"], &[]).stdout, "queue is empty\n");
}

#[test]
fn domains_and_users_in_postgres() {
    let db = TestDatabase::create_blocking("mc_cli");
    let dir = tempfile::tempdir().unwrap();
    let env =
        [("MAILCLUSTER_DATABASE_URL", db.url.as_str()), ("MAILCLUSTER_DATABASE__MIGRATE_ON_START", "false")];
    // With migrations off for admin commands, `migrate` creates the schema.
    run(dir.path(), &["migrate"], &env).ok();
    administer(dir.path(), &env);
    assert!(!dir.path().join("mailcluster-data").join("mailcluster.db").exists());
}

/// `sieve put/list/activate/get/delete`, whatever the backend.
fn manage_scripts(cwd: &Path, env: &[(&str, &str)]) {
    run(cwd, &["domain", "add", "example.com"], env).ok();
    with_password(cwd, &["user", "add", "alice@example.com"], env, "pw").ok();
    let script = cwd.join("vacation.sieve");
    std::fs::write(&script, "require \"vacation\";\nvacation \"Away\";\n").unwrap();
    let file = script.to_str().unwrap();
    let out = run(cwd, &["sieve", "put", "alice@example.com", "away", file, "--activate"], env);
    out.ok();
    assert_eq!(out.stderr, "script away of alice@example.com stored and active\n");
    let out = run_with(
        cwd,
        &["sieve", "put", "alice@example.com", "other", "-"],
        env,
        "keep;\n",
        Duration::from_secs(60),
    );
    out.ok();
    let out = run(cwd, &["sieve", "list", "alice@example.com"], env);
    assert_eq!(out.stdout, "away ACTIVE\nother\n");
    let out = run(cwd, &["sieve", "get", "alice@example.com", "away"], env);
    assert_eq!(out.stdout, "require \"vacation\";\nvacation \"Away\";\n");

    // The active script stays (RFC 5804 §2.10), until another is active or none.
    let out = run(cwd, &["sieve", "delete", "alice@example.com", "away"], env);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.error_line().contains("active"), "{}", out.stderr);
    run(cwd, &["sieve", "activate", "alice@example.com", "other"], env).ok();
    assert_eq!(run(cwd, &["sieve", "list", "alice@example.com"], env).stdout, "away\nother ACTIVE\n");
    run(cwd, &["sieve", "activate", "alice@example.com", "--none"], env).ok();
    assert_eq!(run(cwd, &["sieve", "list", "alice@example.com"], env).stdout, "away\nother\n");
    run(cwd, &["sieve", "delete", "alice@example.com", "away"], env).ok();

    // What ManageSieve refuses, the command refuses: names, scripts, limits.
    let bad = cwd.join("bad.sieve");
    std::fs::write(&bad, b"keep;\n\xff\n").unwrap();
    let out = run(cwd, &["sieve", "put", "alice@example.com", "bad", bad.to_str().unwrap()], env);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.error_line().contains("line 2"), "{}", out.stderr);
    let out = run(cwd, &["sieve", "put", "alice@example.com", "tab\there", file], env);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let limited: Vec<(&str, &str)> =
        env.iter().copied().chain([("MAILCLUSTER_SIEVE__MAX_SCRIPTS", "1")]).collect();
    let out = run(cwd, &["sieve", "put", "alice@example.com", "second", file], &limited);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.error_line().contains("over quota"), "{}", out.stderr);

    // Unknown users and scripts are runtime errors naming them.
    let out = run(cwd, &["sieve", "list", "nobody@example.com"], env);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.error_line().contains("nobody@example.com"), "{}", out.stderr);
    let out = run(cwd, &["sieve", "get", "alice@example.com", "gone"], env);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let out = run(cwd, &["sieve", "activate", "alice@example.com"], env);
    assert_eq!(out.code, Some(2), "a name or --none: {}", out.stderr);
    out.assert_no_panic();
}

#[test]
fn sieve_scripts_in_the_embedded_store_and_postgres() {
    let dir = tempfile::tempdir().unwrap();
    manage_scripts(dir.path(), &[]);
    let db = TestDatabase::create_blocking("mc_cli");
    let dir = tempfile::tempdir().unwrap();
    manage_scripts(dir.path(), &[("MAILCLUSTER_DATABASE_URL", db.url.as_str())]);
}

#[test]
fn unreachable_postgres_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("MAILCLUSTER_DATABASE_URL", "postgres://postgres:hunter2@127.0.0.1:1/x"),
        ("MAILCLUSTER_DATABASE__CONNECT_TIMEOUT_SECS", "3"),
    ];
    for args in [&["serve"][..], &["user", "list"], &["migrate"]] {
        let out = run(dir.path(), args, &env);
        assert_eq!(out.code, Some(1), "{args:?}: {}", out.stderr);
        out.assert_no_panic();
        let line = out.error_line();
        assert!(line.contains("127.0.0.1:1"), "names the database: {line}");
        assert!(!out.stderr.contains("hunter2"), "password leaked: {}", out.stderr);
    }
}

/// Redis is a cache: a pod whose Redis does not answer starts anyway, serves and
/// is ready (docs/outages.md), and says so in one warning naming the Redis — never
/// its password.
#[test]
fn unreachable_redis_does_not_keep_serve_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = common::cluster::ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_REDIS_URL", "redis://:hunter2@127.0.0.1:1"),
        ("MAILCLUSTER_REDIS__CONNECT_TIMEOUT_SECS", "3"),
    ]);
    let server = common::cluster::ServeProcess::start(dir.path(), &env, 8);
    let (status, body) = common::wire::http_get(server.admin, "/readyz");
    assert_eq!(status, 200, "{body}");
    let (_, health) = common::wire::http_get(server.admin, "/healthz");
    assert!(health.contains("cache (redis): down"), "{health}");
    let log = server.log_text();
    let warning =
        log.lines().find(|l| l.contains("Redis unavailable at start")).unwrap_or_else(|| panic!("{log}"));
    assert!(warning.contains("127.0.0.1:1"), "names the Redis: {warning}");
    assert!(!log.contains("hunter2"), "password leaked: {log}");
}

#[test]
fn startup_retries_an_unavailable_database_then_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("MAILCLUSTER_DATABASE_URL", "postgres://postgres@127.0.0.1:1/x"),
        ("MAILCLUSTER_DATABASE__CONNECT_TIMEOUT_SECS", "1"),
        ("MAILCLUSTER_DATABASE__STARTUP_RETRY_SECS", "3"),
    ];
    let started = std::time::Instant::now();
    let out = run(dir.path(), &["serve"], &env);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(started.elapsed() >= Duration::from_secs(2), "gave up too early: {:?}", started.elapsed());
    let retries = out.stderr.lines().filter(|l| l.contains("database unavailable")).count();
    assert!(retries >= 2, "expected retries to be logged: {}", out.stderr);
    assert!(out.error_line().contains("127.0.0.1:1"), "{}", out.stderr);
    out.assert_no_panic();
}

/// `user import` from a Dovecot passwd-file and a CSV into PostgreSQL: the
/// accounts log in with the passwords their imported hashes were made from,
/// quotas and aliases arrive, a second run changes nothing, the manifests name
/// the Secrets, and a file with one bad entry imports nothing.
#[test]
fn accounts_imported_from_dovecot_and_csv_log_in_with_their_hashes() {
    let db = TestDatabase::create_blocking("mc_import");
    let dir = tempfile::tempdir().unwrap();
    let env =
        [("MAILCLUSTER_DATABASE_URL", db.url.as_str()), ("MAILCLUSTER_DATABASE__MIGRATE_ON_START", "false")];
    run(dir.path(), &["migrate"], &env).ok();
    // Hashes made by glibc's crypt(3) (Python's crypt module), not by the
    // crates the server verifies with: crypt('migrated pass', '$6$saltsalt$'),
    // crypt('migrated pass', '$2y$05$abcdefghijklmnopqrstuu').
    let sha512 =
        "$6$saltsalt$UV8BYgqN7u34iPYiLihbOjmF22xo0X75SlnQFYRpDJsgJaXUiVT9jRyx4l4tz0FMJBBZGZbqw/l1xfhEu2dJa/";
    let bcrypt = "$2y$05$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2";
    let passwd = dir.path().join("users.passwd");
    std::fs::write(
        &passwd,
        format!(
            "alice@example.com:{{SHA512-CRYPT}}{sha512}:1000:1000::/home/alice::userdb_quota_rule=*:storage=1G\n\
             bob@example.org:{{BLF-CRYPT}}{bcrypt}\n\
             carol@example.com:{{PLAIN}}carol's password\n"
        ),
    )
    .unwrap();
    let csv = dir.path().join("users.csv");
    std::fs::write(
        &csv,
        format!("address,password-hash,quota,aliases\ndave@example.com,{bcrypt},500M,sales@example.com;info@example.com\n"),
    )
    .unwrap();
    let manifests = dir.path().join("manifests");
    let out = run(
        dir.path(),
        &[
            "user",
            "import",
            passwd.to_str().unwrap(),
            "--batch",
            "2",
            "--emit-manifests",
            manifests.to_str().unwrap(),
        ],
        &env,
    );
    out.ok();
    assert!(out.stderr.contains("3 accounts created, 0 existed already"), "{}", out.stderr);
    assert!(out.stderr.contains("domain example.org added"), "{}", out.stderr);
    run(dir.path(), &["user", "import", csv.to_str().unwrap()], &env).ok();
    let again = run(dir.path(), &["user", "import", passwd.to_str().unwrap()], &env);
    again.ok();
    assert!(again.stderr.contains("0 accounts created, 3 existed already"), "{}", again.stderr);

    common::cluster::block_on(async {
        let store = mailcluster_server::store::open(Some(&db.url), dir.path(), 1, Duration::from_secs(5))
            .await
            .unwrap();
        for (email, password) in [
            ("alice@example.com", "migrated pass"),
            ("bob@example.org", "migrated pass"),
            ("carol@example.com", "carol's password"),
            ("dave@example.com", "migrated pass"),
        ] {
            let account = store.account_get(email).await.unwrap().expect(email);
            assert!(
                mailcluster_server::auth::verify_password(password, &account.password_hash).unwrap(),
                "{email}"
            );
            assert!(
                !mailcluster_server::auth::verify_password("wrong", &account.password_hash).unwrap(),
                "{email}"
            );
        }
        let carol = store.account_get("carol@example.com").await.unwrap().unwrap();
        assert!(carol.password_hash.starts_with("$argon2id$"), "a {{PLAIN}} password is hashed");
        let alice = store.account_get("alice@example.com").await.unwrap().unwrap();
        assert_eq!(store.quota(alice.id).await.unwrap().account_limit, Some(1 << 30));
        let dave = store.account_get("dave@example.com").await.unwrap().unwrap();
        assert_eq!(store.quota(dave.id).await.unwrap().account_limit, Some(500 << 20));
        assert_eq!(store.alias_targets("sales@example.com").await.unwrap(), ["dave@example.com"]);
    });

    let manifest: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(manifests.join("alice-at-example.com.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["kind"], "MailAccount");
    assert_eq!(manifest["spec"]["address"], "alice@example.com");
    assert_eq!(manifest["spec"]["quotaBytes"], 1u64 << 30);
    assert_eq!(manifest["spec"]["passwordSecretRef"]["name"], "alice-at-example.com-password");
    let secret: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(manifests.join("secrets/alice-at-example.com-password.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(secret["stringData"]["password"], sha512);

    // One bad entry: a usage error naming its line, and nothing imported.
    let bad = dir.path().join("bad.passwd");
    std::fs::write(&bad, "erin@example.com:{PLAIN}x\nfrank@example.com:{MD5-CRYPT}$1$a$b\n").unwrap();
    let out = run(dir.path(), &["user", "import", bad.to_str().unwrap()], &env);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("line 2:"), "{}", out.stderr);
    let users = run(dir.path(), &["user", "list"], &env);
    assert!(!users.stdout.contains("erin@"), "{}", users.stdout);
}
