//! `mailcluster stress` against `mailcluster serve` (embedded store, generated
//! self-signed certificate, free ports): the `submission-pop3` profile — AUTH PLAIN
//! on 465 and 587 with attachments, POP3 on 995 — runs without a single error, as
//! does the same load spelled out in flags; a sender the login does not own is
//! refused with 553 and counted as such. The in-cluster way: the migration adds the
//! domains, the runner provisions its accounts over PostgreSQL with a password that
//! lives for one run. `imap-mix` — a mail client's session, command by command —
//! runs clean and leaves each mailbox with exactly the messages its commands say.

mod common;

use std::path::Path;
use std::time::Duration;

use common::TestDatabase;
use common::cluster::{ServeProcess, ephemeral_ports};
use common::wire::{imap_exchange, imap_transcript};
use common::{Output, run, run_with};

const USERS: usize = 4;

/// Runs `mailcluster stress ARGS --json FILE` and returns its exit output and report.
fn stress(dir: &Path, args: &[&str]) -> (Output, serde_json::Value) {
    stress_with(dir, args, &[])
}

fn stress_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Output, serde_json::Value) {
    let json = dir.join(format!("report-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&json);
    let mut all = vec!["stress", "-q", "--no-progress", "--json", json.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run_with(dir, &all, env, "", Duration::from_secs(120));
    out.assert_no_panic();
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stdout: {}\nstderr: {}", out.stdout, out.stderr));
    (out, serde_json::from_str(&text).expect("JSON report"))
}

fn total(report: &serde_json::Value, op: &str, field: &str) -> u64 {
    report["totals"][op][field].as_u64().unwrap_or_else(|| panic!("no totals.{op}.{field} in {report:#}"))
}

/// Every primary operation of the run, with its error count.
fn errors(report: &serde_json::Value) -> Vec<(String, u64, serde_json::Value)> {
    report["totals"]
        .as_object()
        .expect("totals")
        .iter()
        .filter(|(_, v)| v["primary"] == true)
        .map(|(k, v)| (k.clone(), v["errors"].as_u64().unwrap_or(u64::MAX), v["errors_by_kind"].clone()))
        .collect()
}

fn assert_no_errors(report: &serde_json::Value, out: &Output) {
    let errs: Vec<_> = errors(report).into_iter().filter(|(_, n, _)| *n != 0).collect();
    assert!(errs.is_empty(), "errors: {errs:?}\nstdout: {}", out.stdout);
    // Latency SLOs of a debug build on a small machine are not this test's subject;
    // a failed run (1) or a success-rate miss would be.
    assert!(matches!(out.code, Some(0) | Some(3)), "exit {:?}: {}", out.code, out.stderr);
    assert_eq!(report["success_rate"].as_f64(), Some(100.0));
}

#[test]
fn submission_pop3_profile_runs_clean_against_serve() {
    let dir = tempfile::tempdir().unwrap();
    let env = ephemeral_ports();
    run(dir.path(), &["domain", "add", "example.test"], &env).ok();
    for n in 1..=USERS {
        let user = format!("user{n:04}@example.test");
        run_with(dir.path(), &["user", "add", &user], &env, "pass\n", Duration::from_secs(120)).ok();
    }
    let server = ServeProcess::start(dir.path(), &env, 7);
    let (p465, p587, p995) = (
        server.addr("submissions").to_string(),
        server.addr("submission").to_string(),
        server.addr("pop3s").to_string(),
    );
    let users = USERS.to_string();
    let concurrency = USERS.to_string();

    // The profile, made short: its targets moved to this server's ports, the
    // self-signed certificate accepted, a few seconds at a low rate.
    let (out, report) = stress(
        dir.path(),
        &[
            "--profile",
            "submission-pop3",
            "--submissions",
            &p465,
            "--submission",
            &p587,
            "--pop3",
            &p995,
            "-k",
            "--users-count",
            &users,
            "-c",
            &concurrency,
            "--messages-per-user",
            "2",
            "-r",
            "20",
            "-d",
            "3s",
            "--ramp-up",
            "0s",
        ],
    );
    assert_no_errors(&report, &out);
    assert_eq!(total(&report, "seed", "ok"), 2 * USERS as u64);
    for op in ["deliver-submissions", "deliver-submission", "pop3-session"] {
        assert!(total(&report, op, "ok") > 0, "no {op} in {report:#}");
    }
    // The seed filled every maildrop, so POP3 sessions fetched messages.
    assert!(total(&report, "pop3-retr", "ok") > 0, "{report:#}");

    // The same practice spelled out in flags, one SMTP target on 465.
    let (out, report) = stress(
        dir.path(),
        &[
            "--smtp",
            &p465,
            "--smtp-tls",
            "implicit",
            "--auth",
            "plain",
            "--pop3",
            &p995,
            "--pop3-tls",
            "implicit",
            "-k",
            "-s",
            "mixed",
            "--weights",
            "deliver=60,pop3=40",
            "--message-size",
            "4k:70",
            "--message-size",
            "64k:20:attach",
            "--message-size",
            "512k:10:attach",
            "--users-count",
            &users,
            "-c",
            &concurrency,
            "-r",
            "20",
            "-d",
            "3s",
            "--ramp-up",
            "0s",
        ],
    );
    assert_no_errors(&report, &out);
    assert!(total(&report, "deliver", "ok") > 0, "{report:#}");

    // A sender the authenticated user does not own: the server refuses it (553),
    // and the run says so instead of hiding it.
    let (out, report) = stress(
        dir.path(),
        &[
            "--submissions",
            &p465,
            "-k",
            "-s",
            "deliver",
            "--smtp-target",
            "submissions",
            "--auth",
            "plain",
            "--sender",
            "intruder@example.test",
            "--users-count",
            &users,
            "-c",
            "2",
            "--closed-loop",
            "--max-ops",
            "8",
            "-d",
            "10s",
        ],
    );
    assert_eq!(out.code, Some(3), "an SLO miss: {}", out.stdout);
    assert_eq!(total(&report, "deliver", "ok"), 0);
    assert_eq!(
        report["totals"]["deliver"]["errors_by_kind"],
        serde_json::json!({"smtp-553": 8}),
        "{report:#}"
    );
}

#[test]
fn imap_mix_runs_clean_and_leaves_the_mailboxes_its_commands_say() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = ephemeral_ports();
    // LOGIN on the plain port, as the benchmark does (the runner and the checks).
    env.push(("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"));
    run(dir.path(), &["domain", "add", "example.test"], &env).ok();
    for n in 1..=USERS {
        let user = format!("user{n:04}@example.test");
        run_with(dir.path(), &["user", "add", &user], &env, "pass\n", Duration::from_secs(120)).ok();
    }
    let server = ServeProcess::start(dir.path(), &env, 7);
    let (smtp, imap) = (server.addr("smtp"), server.addr("imap"));
    let (smtp_s, imap_s) = (smtp.to_string(), imap.to_string());
    let users = USERS.to_string();
    const SEEDED: u64 = 10;
    let (out, report) = stress(
        dir.path(),
        &["--smtp", &smtp_s, "-s", "seed", "--users-count", &users, "--messages-per-user", "10", "-c", "4"],
    );
    assert_no_errors(&report, &out);

    // One worker per user (the runner never puts two sessions on one user while
    // there are enough users), short sessions so LOGIN…LOGOUT repeat, and a
    // budget of commands so the run is bounded however fast the server is.
    let (out, report) = stress(
        dir.path(),
        &[
            "--imap",
            &imap_s,
            "-s",
            "imap-mix",
            "--users-count",
            &users,
            "-c",
            &users,
            "--ops-per-connection",
            "15",
            "--max-ops",
            "600",
            "-d",
            "60s",
            "--message-size",
            "2k",
        ],
    );
    assert_no_errors(&report, &out);
    for op in [
        "imap-login",
        "imap-list",
        "imap-status",
        "imap-select",
        "imap-fetch-flags",
        "imap-fetch-envelope",
        "imap-fetch-body",
        "imap-store",
        "imap-delete",
        "imap-expunge",
        "imap-append",
        "imap-noop",
        "imap-logout",
    ] {
        assert!(total(&report, op, "ok") > 0, "no {op} in {report:#}");
    }
    // Bodies and headers came back as literals.
    assert!(total(&report, "imap-fetch-body", "bytes") > 0, "{report:#}");
    // Every session opens with LOGIN … SELECT and ends with LOGOUT; only the last
    // session of each worker may be cut short by the budget.
    let logins = total(&report, "imap-login", "ok");
    for op in ["imap-select", "imap-logout"] {
        let n = total(&report, op, "ok");
        assert!(n <= logins && logins - n <= USERS as u64, "{op}: {n} of {logins} sessions\n{report:#}");
    }

    // What is in the mailboxes now is what the commands did: the seed, plus every
    // APPEND, less every delete (a delete whose EXPUNGE the budget cut off leaves
    // its message \Deleted, which UNDELETED leaves out).
    let expected =
        SEEDED * USERS as u64 + total(&report, "imap-append", "ok") - total(&report, "imap-delete", "ok");
    let mut found = 0u64;
    for n in 1..=USERS {
        let user = format!("user{n:04}@example.test");
        let lines =
            imap_transcript(imap, &user, "pass", &["SELECT INBOX", "SEARCH UNDELETED"]).expect("IMAP");
        let search = lines.iter().find(|l| l.starts_with("* SEARCH")).unwrap_or_else(|| panic!("{lines:?}"));
        found += search.split_ascii_whitespace().skip(2).count() as u64;
    }
    assert_eq!(found, expected, "{report:#}");
}

/// `migrate --domain` (the migration Job's spec.domains) then `stress
/// --provision-accounts` (the stress Job's accounts) against a server on a fresh
/// PostgreSQL database: nothing added by hand, no error, and the accounts' password
/// dies with the run.
#[test]
fn provisioned_accounts_serve_one_run_and_are_locked_after() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDatabase::create_blocking("stress_provision");
    let mut env = ephemeral_ports();
    env.push(("MAILCLUSTER_DATABASE_URL", &db.url));

    // Twice: the second run finds both domains and changes nothing.
    for _ in 0..2 {
        run(dir.path(), &["migrate", "--domain", "Example.Test", "--domain", "example.org"], &env).ok();
    }
    let listed = run(dir.path(), &["domain", "list"], &env);
    assert_eq!(listed.ok().stdout.lines().collect::<Vec<_>>(), ["example.org", "example.test"]);
    let bad = run(dir.path(), &["migrate", "--domain", "not a domain"], &env);
    assert_eq!(bad.code, Some(2), "a usage error: {}", bad.stderr);

    let server = ServeProcess::start(dir.path(), &env, 7);
    let (p465, p993) = (server.addr("submissions").to_string(), server.addr("imaps").to_string());
    let provisioned = |extra: &[&str]| {
        let mut args = vec![
            "--provision-accounts",
            "--users-template",
            "stress{:04}@example.test",
            "--users-count",
            "3",
            "--submissions",
            &p465,
            "--imap",
            &p993,
            "--imap-tls",
            "implicit",
            "-k",
            "-s",
            "deliver,auth",
            "--smtp-target",
            "submissions",
            "--auth",
            "plain",
            "-c",
            "3",
            "--closed-loop",
            "--max-ops",
            "6",
            "-d",
            "20s",
        ];
        args.extend_from_slice(extra);
        stress_with(dir.path(), &args, &env)
    };
    // The second run finds the accounts and gives them a new password.
    for _ in 0..2 {
        let (out, report) = provisioned(&[]);
        assert_no_errors(&report, &out);
        assert_eq!(total(&report, "deliver", "ok"), 6, "{report:#}");
        assert!(total(&report, "imap-authenticate-plain", "ok") > 0, "{report:#}");
        assert!(out.stderr.contains("3 stress accounts locked"), "{}", out.stderr);
    }
    let users = run(dir.path(), &["user", "list"], &env);
    assert_eq!(
        users.ok().stdout.lines().collect::<Vec<_>>(),
        ["stress0001@example.test", "stress0002@example.test", "stress0003@example.test"]
    );
    // After the run no password the runner might have used opens the account.
    let imap = server.addr("imap");
    for password in ["pass", "secret"] {
        let replies = imap_exchange(imap, "stress0001@example.test", password, &[]).expect("IMAP answers");
        assert!(replies[0].starts_with("a NO"), "{replies:?}");
    }

    // Flags that would bypass the run's password are refused up front.
    let (code, stderr) = {
        let out = run(
            dir.path(),
            &["stress", "--provision-accounts", "--password", "x", "--smtp", "127.0.0.1:1"],
            &env,
        );
        (out.code, out.stderr)
    };
    assert_eq!(code, Some(2), "{stderr}");
    // A domain the store does not serve: the run does not start, and says why.
    let out = run(
        dir.path(),
        &[
            "stress",
            "--provision-accounts",
            "--users-template",
            "u{}@nowhere.test",
            "--users-count",
            "1",
            "--smtp",
            &p465,
        ],
        &env,
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("u1@nowhere.test"), "{}", out.stderr);
}
