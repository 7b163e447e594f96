//! Who may send, and who hears back: submission's senders (MAIL FROM and the
//! header's originator fields against the account, its aliases, subaddresses
//! and allowed senders), the DKIM domain of what it queues, its hourly limits
//! across two servers sharing Redis; and on the MX, reports only to senders
//! that are who they say, bounces without bodies and within limits, and no
//! `Authentication-Results` in our name from outside.

mod smtp_support;

use mailcluster_server::store::Addresses;
use mailcluster_server::store::Directory;
use mailcluster_server::store::Queue;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use mailcluster_server::app::{App, MailExchange};
use mailcluster_server::config::Config;
use mailcluster_server::smtp::{SmtpKind, SmtpProtocol};
use mailcluster_testkit::dns::TestDns;
use smtp_support::sockets::{listen, tls_provider};
use smtp_support::{Backend, Harness, PASSWORD, config};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Logs in to submission over STARTTLS as `user` with smtplib and runs each
/// case `[mail_from, rcpt, header]` as one transaction with the body "body";
/// prints `[code, text]` per case, as JSON: the reply to the first command
/// that was not accepted, or DATA's.
const CASES: &str = r#"
import json, smtplib, ssl, sys
port, user, password, cases = int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
out = []
with smtplib.SMTP("127.0.0.1", port, timeout=60) as s:
    s.ehlo("py.test")
    s.starttls(context=ctx)
    s.ehlo("py.test")
    s.login(user, password)
    for mail_from, rcpt, header in cases:
        code, text = s.mail(mail_from)
        if code == 250:
            code, text = s.rcpt(rcpt)
        if code == 250:
            try:
                code, text = s.data((header + "\r\nSubject: case\r\n\r\nbody\r\n").encode())
            except smtplib.SMTPDataError as e:
                code, text = e.smtp_code, e.smtp_error
        else:
            s.rset()
        out.append([code, text.decode()])
print(json.dumps(out))
"#;

/// Runs [`CASES`] against the submission listener at `port`; the replies.
async fn submit(port: u16, user: &str, cases: &[(&str, &str, &str)]) -> Vec<(u16, String)> {
    let cases = serde_json::to_string(&cases.iter().map(|(a, b, c)| [a, b, c]).collect::<Vec<_>>()).unwrap();
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(CASES).args([&port.to_string(), user, PASSWORD, &cases]);
    let out =
        tokio::time::timeout(Duration::from_secs(120), tokio::task::spawn_blocking(move || cmd.output()))
            .await
            .expect("client finished in time")
            .expect("join")
            .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the client's JSON")
}

/// Each reply's code, checked against the expected one, case by case.
fn assert_codes(replies: &[(u16, String)], cases: &[(&str, &str, &str)], want: &[u16]) {
    for ((reply, case), want) in replies.iter().zip(cases).zip(want) {
        assert_eq!(reply.0, *want, "{case:?} → {reply:?}");
        if reply.0 == 553 {
            assert!(reply.1.starts_with("5.7.1 "), "553 says why: {reply:?}");
        }
    }
    assert_eq!(replies.len(), want.len());
}

fn refusals(h: &Harness, reason: &str) -> u64 {
    h.app.metrics.smtp.sender_refusals.with_label_values(&["submission", reason]).get()
}

/// MAIL FROM, `From:` (each of several addresses, each of several fields),
/// `Sender:` and `Resent-From:` with another user's address are refused with
/// 553 5.7.1 and nothing is delivered; so is the null sender.
async fn forged_senders_are_refused(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.submission.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let (me, bob) = ("alice@example.test", "bob@example.test");
    let cases = [
        ("director@example.test", bob, "From: alice@example.test"),
        ("", bob, "From: alice@example.test"),
        (me, bob, "From: director@example.test"),
        (me, bob, "From: Alice <alice@example.test>\r\nSender: director@example.test"),
        (me, bob, "From: alice@example.test, director@example.test"),
        (me, bob, "From: alice@example.test\r\nFROM: director@example.test"),
        (me, bob, "From: \"alice@example.test\" <director@example.test>"),
        (me, bob, "From: alice@example.test\r\nResent-From: director@example.test"),
        (me, bob, "From: alice@example.test\r\nResent-Sender: bob@example.test"),
        (me, bob, "From: undisclosed-senders:;"),
        (me, bob, "From: Alice <alice@example.test>\r\nSender: alice@example.test"),
    ];
    let replies = submit(addr.port(), me, &cases).await;
    assert_codes(&replies, &cases, &[553, 553, 553, 553, 553, 553, 553, 553, 553, 553, 250]);
    assert_eq!(h.messages(bob).await.len(), 1, "only the last one was delivered");
    assert!(h.store.queue_list(10).await.unwrap().is_empty());
    assert_eq!((refusals(&h, "sender"), refusals(&h, "header")), (2, 8));
}

/// What an account may send as besides its own address: its aliases, its and
/// their subaddresses, and what `user senders add` allowed (an address, or a
/// whole domain, not its subdomains); withdrawn, it is refused at the next MAIL.
async fn aliases_subaddresses_and_allowed_senders_are_accepted(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let s = &h.store;
    s.alias_add("sales@example.test", "alice@example.test").await.unwrap();
    s.alias_add("support@example.test", "bob@example.test").await.unwrap();
    s.account_sender_add("alice@example.test", "News@Brand.test").await.unwrap();
    s.account_sender_add("alice@example.test", "@partner.test").await.unwrap();
    assert!(s.account_sender_add("alice@example.test", "@partner.test").await.is_err(), "twice");
    assert!(s.account_sender_add("nobody@example.test", "x@brand.test").await.is_err(), "no account");
    let addr = listen(h.submission.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let bob = "bob@example.test";
    let cases = [
        ("sales@example.test", bob, "From: Sales <sales@example.test>"),
        ("alice+tag@example.test", bob, "From: alice+tag@example.test"),
        ("sales+q4@example.test", bob, "From: sales+q4@example.test"),
        ("news@brand.test", bob, "From: news@brand.test"),
        ("anyone@PARTNER.test", bob, "From: anyone@partner.test"),
        ("alice@example.test", bob, "From: ALICE@example.test\r\nSender: sales@example.test"),
        ("support@example.test", bob, "From: support@example.test"),
        ("alice@example.test", bob, "From: other@brand.test"),
        ("x@sub.partner.test", bob, "From: x@sub.partner.test"),
        ("alice@example.test.evil", bob, "From: alice@example.test"),
    ];
    let replies = submit(addr.port(), "alice@example.test", &cases).await;
    assert_codes(&replies, &cases, &[250, 250, 250, 250, 250, 250, 553, 553, 553, 553]);
    assert_eq!(h.messages(bob).await.len(), 6);

    let rights = s.sender_rights("alice@example.test").await.unwrap();
    assert_eq!(rights.aliases, ["sales@example.test"]);
    assert_eq!(rights.allowed, ["@partner.test", "news@brand.test"]);
    s.account_sender_del("alice@example.test", "news@brand.test").await.unwrap();
    let cases = [("news@brand.test", bob, "From: news@brand.test")];
    assert_codes(&submit(addr.port(), "alice@example.test", &cases).await, &cases, &[553]);
    // the account's rows go with it
    s.account_delete("alice@example.test").await.unwrap();
    assert_eq!(s.sender_rights("alice@example.test").await.unwrap().allowed, Vec::<String>::new());
}

/// A submission protocol of `h`'s app signing with keys for `domains`.
fn signing_submission(h: &Harness, domains: &[&str], dir: &std::path::Path) -> Arc<SmtpProtocol> {
    let mut keys = Vec::new();
    for domain in domains {
        let key = mailcluster_server::dkim::generate("ed25519").unwrap();
        let path = dir.join(format!("{domain}.pem"));
        mailcluster_server::dkim::write_key_file(&path, &key.private_pem).unwrap();
        keys.push(mailcluster_api::config::DkimKey {
            domain: domain.to_string(),
            selector: "s1".into(),
            key_file: path,
            algorithm: "ed25519".into(),
        });
    }
    let signer =
        mailcluster_server::dkim::Signer::load(&mailcluster_api::config::DkimConfig { keys }).unwrap();
    let app = h.app.clone().with_mail(MailExchange {
        dns: None,
        signer: Arc::new(signer),
        relay_wake: Arc::new(tokio::sync::Notify::new()),
    });
    Arc::new(SmtpProtocol::new(app, SmtpKind::Submission))
}

/// The `d=` of each DKIM-Signature of the queued messages, oldest first
/// (`None` for a message without one); the queue is emptied.
async fn queued_dkim_domains(h: &Harness) -> Vec<Option<String>> {
    let mut out = Vec::new();
    let mut entries = h.store.queue_list(100).await.unwrap();
    entries.sort_by_key(|e| e.id);
    for entry in entries {
        let (_, raw) = h.store.queue_get(entry.id).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let d = text.strip_prefix("DKIM-Signature:").map(|sig| {
            let sig = &sig[..sig.find("\r\n\r\n").unwrap_or(sig.len())];
            let tag = sig.split(';').map(str::trim).find(|t| t.starts_with("d=")).expect("a d= tag");
            tag[2..].to_string()
        });
        out.push(d);
        h.store.queue_delete(entry.id).await.unwrap();
    }
    out
}

/// The signature of a submitted message is made for the domain of its
/// authorised `From:` address; with the sender checks off, a `From:` the user
/// may not use is not signed for at all (only the account's own domain is).
async fn dkim_signs_for_the_authorised_from_domain(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::new(b, config(|_| {})).await;
    h.store.account_sender_add("alice@example.test", "news@brand.test").await.unwrap();
    let submission = signing_submission(&h, &["example.test", "brand.test"], dir.path());
    let addr = listen(submission, tls_provider(), false, h.shutdown.clone()).await;
    let far = "friend@elsewhere.test";
    let cases = [
        ("alice@example.test", far, "From: Alice <alice@example.test>"),
        ("news@brand.test", far, "From: news@brand.test"),
        ("alice@example.test", far, "From: director@brand.test"),
    ];
    let replies = submit(addr.port(), "alice@example.test", &cases).await;
    assert_codes(&replies, &cases, &[250, 250, 553]);
    assert_eq!(queued_dkim_domains(&h).await, [Some("example.test".into()), Some("brand.test".into())]);

    let h = Harness::new(b, config(|c| c.smtp.sender_must_match_auth = false)).await;
    let other_dir = tempfile::tempdir().unwrap();
    let submission = signing_submission(&h, &["example.test", "brand.test"], other_dir.path());
    let addr = listen(submission, tls_provider(), false, h.shutdown.clone()).await;
    let cases = [
        ("director@brand.test", far, "From: director@brand.test"),
        ("alice@example.test", far, "From: alice@example.test"),
    ];
    let replies = submit(addr.port(), "alice@example.test", &cases).await;
    assert_codes(&replies, &cases, &[250, 250]);
    assert_eq!(queued_dkim_domains(&h).await, [None, Some("example.test".into())]);
}

/// A second server over the same store, with its own cache on the shared
/// Redis (`prefix`): another pod.
async fn second_server(h: &Harness, config: &Config, prefix: &str) -> Arc<SmtpProtocol> {
    let redis = mailcluster_testkit::redis_url();
    let cache = mailcluster_server::cache::open(Some(&redis), prefix, Duration::from_secs(5)).await.unwrap();
    let store: Arc<dyn mailcluster_server::store::Store> = h.store.clone();
    let deliverer = Arc::new(mailcluster_server::delivery::Deliverer::with_options(
        store.clone(),
        mailcluster_server::smtp::delivery_options(&config.smtp),
    ));
    let auth =
        mailcluster_server::auth::Authenticator::new(store.clone(), cache.clone(), config.auth.clone());
    let metrics = Arc::new(mailcluster_server::metrics::Metrics::new());
    let app = App::new(Arc::new(config.clone()), store, cache, metrics, Arc::new(auth), deliverer);
    Arc::new(SmtpProtocol::new(app, SmtpKind::Submission))
}

/// One session over a real socket: AUTH PLAIN as `user`, MAIL FROM itself,
/// then RCPT to each of `rcpts`; the codes of MAIL and of each RCPT.
async fn session(port: u16, user: &str, rcpts: &[&str]) -> Vec<u16> {
    use base64::Engine;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (r, mut w) = tcp.into_split();
    let mut r = BufReader::new(r);
    async fn reply(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> u16 {
        loop {
            let mut line = String::new();
            let n =
                tokio::time::timeout(Duration::from_secs(30), r.read_line(&mut line)).await.unwrap().unwrap();
            assert!(n > 0, "connection closed");
            if line.as_bytes().get(3) != Some(&b'-') {
                return line[..3].parse().unwrap();
            }
        }
    }
    assert_eq!(reply(&mut r).await, 220);
    let plain = base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{PASSWORD}"));
    for (line, want) in [("EHLO rate.test".to_string(), 250), (format!("AUTH PLAIN {plain}"), 235)] {
        w.write_all(format!("{line}\r\n").as_bytes()).await.unwrap();
        assert_eq!(reply(&mut r).await, want, "{line}");
    }
    let mut codes = Vec::new();
    w.write_all(format!("MAIL FROM:<{user}>\r\n").as_bytes()).await.unwrap();
    codes.push(reply(&mut r).await);
    for rcpt in rcpts {
        w.write_all(format!("RCPT TO:<{rcpt}>\r\n").as_bytes()).await.unwrap();
        codes.push(reply(&mut r).await);
    }
    let _ = w.write_all(b"QUIT\r\n").await;
    codes
}

/// The hourly message and recipient limits of an account hold exactly when
/// its sessions race on two servers sharing Redis: 450 4.7.1 past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hourly_limits_hold_under_parallel_sessions_on_two_servers() {
    let prefix = format!("{}:", mailcluster_testkit::unique("ratetest"));
    let config = config(|c| {
        c.smtp.require_tls_for_auth = false;
        c.smtp.submission_messages_per_hour = 5;
        c.smtp.submission_recipients_per_hour = 12;
    });
    let h = Harness::new(Backend::Postgres, config.clone()).await;
    let servers = [second_server(&h, &config, &prefix).await, second_server(&h, &config, &prefix).await];
    let mut ports = Vec::new();
    for server in &servers {
        ports.push(listen(server.clone(), tls_provider(), false, h.shutdown.clone()).await.port());
    }
    // 16 sessions of alice at once, half on each server: 5 get their MAIL.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 {
        let port = ports[i % 2];
        tasks.spawn(async move { session(port, "alice@example.test", &[]).await[0] });
    }
    let codes: Vec<u16> = tasks.join_all().await;
    assert_eq!(codes.iter().filter(|c| **c == 250).count(), 5, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 450).count(), 11, "{codes:?}");
    // 4 sessions of bob, 6 recipients each: 12 of the 24 are taken.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..4 {
        let port = ports[i % 2];
        tasks.spawn(async move {
            let rcpts =
                ["alice@example.test", "a@far.test", "b@far.test", "c@far.test", "d@far.test", "e@far.test"];
            session(port, "bob@example.test", &rcpts).await
        });
    }
    let all: Vec<Vec<u16>> = tasks.join_all().await;
    assert!(all.iter().all(|codes| codes[0] == 250), "{all:?}");
    let rcpts: Vec<u16> = all.iter().flat_map(|codes| codes[1..].to_vec()).collect();
    assert_eq!(rcpts.iter().filter(|c| **c == 250).count(), 12, "{all:?}");
    assert_eq!(rcpts.iter().filter(|c| **c == 450).count(), 12, "{all:?}");
}

/// An MX whose resolver sees `spf-fail.test` (SPF -all) and `spf-pass.test`
/// (SPF allowing 192.0.2.10, where the test's client connects from).
async fn mx_with_spf(edit: impl FnOnce(&mut Config)) -> (Harness, Arc<SmtpProtocol>, TestDns) {
    let dns = TestDns::start(&[
        ("spf-fail.test.", "@ 60 IN TXT \"v=spf1 -all\"\n"),
        ("spf-pass.test.", "@ 60 IN TXT \"v=spf1 ip4:192.0.2.10 -all\"\n"),
    ])
    .await;
    let mut c = config(edit);
    c.dns.nameservers = vec![dns.addr()];
    let h = Harness::new(Backend::Sqlite, c).await;
    let resolver = mailcluster_server::dns::Dns::from_config(&h.app.config.dns).unwrap();
    let app = h.app.clone().with_mail(MailExchange {
        dns: Some(Arc::new(resolver)),
        signer: Arc::new(Default::default()),
        relay_wake: Arc::new(tokio::sync::Notify::new()),
    });
    let mx = Arc::new(SmtpProtocol::new(app, SmtpKind::Mx));
    (h, mx, dns)
}

/// The reports queued for other domains, and empties the queue.
async fn queued_reports(h: &Harness) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    for entry in h.store.queue_list(100).await.unwrap() {
        let (_, raw) = h.store.queue_get(entry.id).await.unwrap().unwrap();
        out.push((entry.recipients.clone(), String::from_utf8_lossy(&raw).into_owned()));
        h.store.queue_delete(entry.id).await.unwrap();
    }
    out
}

/// RFC 3461's NOTIFY=SUCCESS and RET=FULL from a sender whose SPF fails are
/// ignored: the mail is delivered, no report goes to the (maybe forged)
/// sender. A sender passing SPF gets its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_reports_go_only_to_senders_passing_spf() {
    let (h, mx, _dns) = mx_with_spf(|_| {}).await;
    for (sender, reports) in [("victim@spf-fail.test", 0), ("someone@spf-pass.test", 1)] {
        let mut c = h.connect_from(&mx, "192.0.2.10:40000".parse().unwrap());
        c.ehlo().await;
        c.cmd(&format!("MAIL FROM:<{sender}> RET=FULL"), "250 ").await;
        c.cmd("RCPT TO:<bob@example.test> NOTIFY=SUCCESS,FAILURE", "250 ").await;
        c.data(&format!("From: {sender}\r\nSubject: hi\r\n\r\nbody\r\n.\r\n"), "250 ").await;
        let queued = queued_reports(&h).await;
        assert_eq!(queued.len(), reports, "{sender}: {queued:?}");
        if let Some((to, report)) = queued.first() {
            assert_eq!(to, &[sender.to_string()]);
            assert!(report.contains("Action: delivered"), "{report}");
        }
    }
    assert_eq!(h.messages("bob@example.test").await.len(), 2);
}

/// A bounce (here: a recipient over quota) to a sender that passed neither
/// SPF nor DMARC quotes the header only, whatever RET asked, and no more of
/// them go to one address than `inbound.bounces_per_address_per_hour`; the
/// rest are dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounces_to_unverified_senders_carry_headers_only_and_are_limited() {
    let (h, mx, _dns) = mx_with_spf(|c| c.inbound.bounces_per_address_per_hour = 2).await;
    h.store.account_set_quota("alice@example.test", Some(64)).await.unwrap();
    for _ in 0..3 {
        let mut c = h.connect_from(&mx, "192.0.2.10:40000".parse().unwrap());
        c.ehlo().await;
        c.cmd("MAIL FROM:<victim@spf-fail.test> RET=FULL", "250 ").await;
        c.cmd("RCPT TO:<alice@example.test>", "250 ").await;
        c.cmd("RCPT TO:<bob@example.test>", "250 ").await;
        let body = "SECRET-BODY-LINE ".repeat(20);
        c.data(&format!("From: victim@spf-fail.test\r\nSubject: backscatter\r\n\r\n{body}\r\n.\r\n"), "250 ")
            .await;
    }
    let queued = queued_reports(&h).await;
    assert_eq!(queued.len(), 2, "two bounces, the third dropped: {queued:?}");
    for (to, report) in &queued {
        assert_eq!(to, &["victim@spf-fail.test".to_string()]);
        assert!(report.contains("Action: failed") && report.contains("Subject: backscatter"), "{report}");
        assert!(!report.contains("SECRET-BODY-LINE"), "headers only: {report}");
    }
    assert_eq!(h.app.metrics.smtp.bounces_dropped.with_label_values(&["smtp"]).get(), 1);
    assert_eq!(h.messages("bob@example.test").await.len(), 3);
}

const SENDMAIL_RAW: &str = r#"
import smtplib, sys
port, message = int(sys.argv[1]), sys.argv[2]
with smtplib.SMTP("127.0.0.1", port, timeout=60) as s:
    s.sendmail("someone@remote.test", ["bob@example.test"], message.encode())
print("OK")
"#;

/// `Authentication-Results` naming this server (RFC 8601 §5), sent from
/// outside to port 25, is gone from the stored message; another server's stays.
async fn forged_authentication_results_are_removed_on_the_mx(b: Backend) {
    let h = Harness::new(b, config(|c| c.inbound.authserv_id = "mx.example.test".into())).await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let message = "Authentication-Results: mx.example.test; dkim=pass header.d=example.test\r\n\
                   Authentication-Results: MX.EXAMPLE.TEST (forged);\r\n\tdmarc=pass\r\n\
                   Authentication-Results: relay.remote.test; spf=pass\r\n\
                   From: director@example.test\r\nSubject: trust me\r\n\r\nbody\r\n";
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(SENDMAIL_RAW).args([&addr.port().to_string(), message]);
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stored = h.messages("bob@example.test").await;
    let stored = String::from_utf8_lossy(&stored[0]);
    assert!(!stored.to_ascii_lowercase().contains("mx.example.test"), "{stored}");
    assert!(!stored.contains("dmarc=pass"), "{stored}");
    assert!(stored.contains("Authentication-Results: relay.remote.test; spf=pass\r\n"), "{stored}");
    assert!(stored.contains("Subject: trust me\r\n\r\nbody\r\n"), "{stored}");
}

/// The relay is woken, and the remote copy of a message becomes due, only
/// after the local delivery committed: while it is in flight no relay worker
/// can claim the queued copy, and when it then fails (451) the copy is gone
/// without having been due, and nobody was woken.
async fn remote_copy_waits_for_the_local_delivery(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.require_tls_for_auth = false)).await;
    let wake = h.app.mail.relay_wake.clone();
    let woken = || async { tokio::time::timeout(Duration::from_millis(300), wake.notified()).await.is_ok() };
    h.store.commit_delay_ms.store(1500, std::sync::atomic::Ordering::SeqCst);
    for fail in [true, false] {
        h.store.fail_deliveries.store(fail, std::sync::atomic::Ordering::SeqCst);
        let mut c = h.connect(&h.submission);
        c.ehlo().await;
        c.cmd("AUTH PLAIN AGFsaWNlQGV4YW1wbGUudGVzdABjb3JyZWN0IGhvcnNlIGJhdHRlcnkgc3RhcGxl", "235 ").await;
        c.envelope("alice@example.test", "bob@example.test").await;
        c.cmd("RCPT TO:<friend@elsewhere.test>", "250 ").await;
        c.cmd("DATA", "354 ").await;
        c.send("From: alice@example.test\r\nSubject: both\r\n\r\nx\r\n.\r\n").await;
        // The local delivery is under way (held 1.5 s): the queued copy is not
        // to be had, and the relay was not woken.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let claimed = h.store.queue_claim("probe", 10, Duration::from_secs(60)).await.unwrap();
        assert!(claimed.is_empty(), "claimable before the local commit: {claimed:?}");
        assert!(!woken().await, "woken before the local commit");
        if fail {
            c.expect("451 ").await;
            assert!(h.store.queue_list(10).await.unwrap().is_empty(), "withdrawn");
            assert!(!woken().await, "woken for a withdrawn copy");
        } else {
            c.expect("250 ").await;
            assert!(woken().await, "woken after the commit");
            let claimed = h.store.queue_claim("probe", 10, Duration::from_secs(60)).await.unwrap();
            assert_eq!(claimed.len(), 1, "due after the commit");
        }
    }
}

both_backends!(
    forged_senders_are_refused,
    aliases_subaddresses_and_allowed_senders_are_accepted,
    dkim_signs_for_the_authorised_from_domain,
    forged_authentication_results_are_removed_on_the_mx,
    remote_copy_waits_for_the_local_delivery,
);
