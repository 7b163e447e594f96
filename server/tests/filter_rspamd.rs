//! The content filter against a real rspamd (`/usr/bin/rspamd`, Debian's
//! package) started per test on a loopback port with a configuration of its
//! own: mail sent by Python's smtplib to the MX over TCP, Junk filing by IMAP
//! MOVE over TCP, and rspamd's answers deciding the SMTP replies and the
//! mailboxes. Without rspamd installed the tests say so and pass, unless
//! `MAILCLUSTER_REQUIRE_RSPAMD` is set (CI sets it).
//!
//! rspamd's configuration: its packaged rules, one controller worker (which
//! answers `/checkv2` as well as the learning and `/stat` calls), the
//! `http_headers` module on (so the pod's SPF/DKIM/DMARC results are taken),
//! actions `greylist` at 30, `add header` at 50, `rewrite subject` at 100 and
//! `reject` at 150, rules scoring subjects with "grey-test" (35),
//! "spammy-test" (60) and "rewrite-test" (110), a prefilter answering `soft
//! reject` to subjects with "tempfail-test", and the Bayes classifier in this
//! machine's Redis, database 14 (its own keys, never flushed).

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Client, account, embedded_app, serve_loopback, tls_provider};
use mailcluster_api::config::{Config, FailMode, Secret};
use mailcluster_model::UidSet;
use mailcluster_server::app::App;
use mailcluster_server::imap::ImapProtocol;
use mailcluster_server::net::TlsMode;
use mailcluster_server::smtp::{SmtpKind, SmtpProtocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RSPAMD: &str = "/usr/bin/rspamd";
const PASSWORD: &str = "rspamd-test-password";
const GTUBE: &str = "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X";

/// One rspamd process and its directory; stopped (SIGTERM to its main
/// process, which stops its workers) when dropped.
struct Rspamd {
    child: Option<std::process::Child>,
    port: u16,
    _dir: tempfile::TempDir,
}

/// Whether rspamd is here; when it is not, either the test passes saying so
/// or, with `MAILCLUSTER_REQUIRE_RSPAMD`, fails.
fn rspamd_installed() -> bool {
    if std::path::Path::new(RSPAMD).exists() {
        return true;
    }
    if std::env::var_os("MAILCLUSTER_REQUIRE_RSPAMD").is_some() {
        panic!("MAILCLUSTER_REQUIRE_RSPAMD is set but {RSPAMD} is missing (apt-get install rspamd)");
    }
    eprintln!("SKIPPED: {RSPAMD} is not installed (set MAILCLUSTER_REQUIRE_RSPAMD to make this a failure)");
    false
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

impl Rspamd {
    async fn start() -> Rspamd {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let redis = mailcluster_testkit::redis_url();
        let redis = redis.trim_start_matches("redis://").trim_end_matches('/');
        // Compiled regular expressions are kept between runs: the first start
        // compiles them for seconds, later ones load them.
        let hs_cache: PathBuf = std::env::temp_dir().join("mailcluster-rspamd-hs-cache");
        std::fs::create_dir_all(&hs_cache).expect("hyperscan cache dir");
        let conf = format!(
            r#".include "$CONFDIR/common.conf"
options {{
  .include "$CONFDIR/options.inc"
  hs_cache_dir = "{hs}/";
  # No name server: rules that look names up give up at once.
  dns {{ nameserver = ["127.0.0.1:9"]; timeout = 0.1s; retransmits = 1; }}
}}
logging {{ type = "console"; level = "error"; }}
worker "controller" {{
  bind_socket = "127.0.0.1:{port}";
  count = 1;
  password = "{PASSWORD}";
  enable_password = "{PASSWORD}";
  secure_ip = [];
  static_dir = "${{WWWDIR}}";
}}
"#,
            hs = hs_cache.display()
        );
        let d = dir.path();
        std::fs::create_dir_all(d.join("local.d")).expect("local.d");
        std::fs::write(d.join("rspamd.conf"), conf).expect("conf");
        std::fs::write(
            d.join("local.d/actions.conf"),
            "reject = 150;\nrewrite_subject = 100;\nadd_header = 50;\ngreylist = 30;\nsubject = \"[SPAM] %s\";\n",
        )
        .expect("actions");
        std::fs::write(d.join("local.d/http_headers.conf"), "enabled = true;\n").expect("http_headers");
        std::fs::write(
            d.join("local.d/classifier-bayes.conf"),
            format!("servers = \"{redis}\";\ndb = \"14\";\nmin_learns = 1;\nautolearn = false;\n"),
        )
        .expect("bayes");
        std::fs::write(
            d.join("rspamd.local.lua"),
            r#"local function subject_rule(name, pattern, score)
  rspamd_config[name] = {
    callback = function(task)
      return (task:get_subject() or ''):find(pattern) ~= nil
    end,
    score = score,
    description = 'Mailcluster test rule',
  }
end
subject_rule('MC_TEST_GREY', 'grey%-test', 35.0)
subject_rule('MC_TEST_SPAMMY', 'spammy%-test', 60.0)
subject_rule('MC_TEST_REWRITE', 'rewrite%-test', 110.0)
rspamd_config:register_symbol({
  name = 'MC_TEST_TEMPFAIL',
  type = 'prefilter',
  callback = function(task)
    if (task:get_subject() or ''):find('tempfail%-test') then
      task:set_pre_result('soft reject', 'come back later')
    end
  end,
})
"#,
        )
        .expect("lua");
        let child = std::process::Command::new(RSPAMD)
            .args(["-f", "-u", "root", "-g", "root", "-c"])
            .arg(d.join("rspamd.conf"))
            .arg(format!("--var=LOCAL_CONFDIR={}", d.display()))
            .arg(format!("--var=DBDIR={}", d.display()))
            .arg(format!("--var=RUNDIR={}", d.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("rspamd starts");
        let rspamd = Rspamd { child: Some(child), port, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok((200, body)) = rspamd.get("/ping").await
                && body.starts_with(b"pong")
            {
                return rspamd;
            }
            assert!(Instant::now() < deadline, "rspamd answered /ping within 120 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A GET on the controller: status and body.
    async fn get(&self, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        let request = format!("GET {path} HTTP/1.0\r\nPassword: {PASSWORD}\r\n\r\n");
        s.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await??;
        let head_end = memchr::memmem::find(&answer, b"\r\n\r\n").unwrap_or(answer.len());
        let status = std::str::from_utf8(&answer[..head_end])
            .ok()
            .and_then(|h| h.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, answer[(head_end + 4).min(answer.len())..].to_vec()))
    }

    /// Messages rspamd's classifier has learnt (`/stat`'s `learned`).
    async fn learned(&self) -> u64 {
        let (status, body) = self.get("/stat").await.expect("/stat");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let stat: serde_json::Value = serde_json::from_slice(&body).expect("/stat is JSON");
        stat["learned"].as_u64().expect("learned")
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }
}

impl Drop for Rspamd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A pod (embedded store, bob@example.org) whose filter is rspamd at `url`,
/// serving the MX, IMAP and submission on loopback.
struct Pod {
    app: App,
    smtp: SocketAddr,
    imap: SocketAddr,
    submission: SocketAddr,
    _dir: tempfile::TempDir,
}

async fn pod(url: &str, tweak: impl FnOnce(&mut Config)) -> Pod {
    let (app, dir) = embedded_app(|c| {
        c.hostname = "mx.example.org".into();
        c.tls.allow_plaintext_auth = true;
        c.filter.rspamd.url = url.into();
        c.filter.rspamd.password = Some(Secret(PASSWORD.into()));
        tweak(c);
    })
    .await;
    account(&app, "bob@example.org", "pw").await;
    let addrs = serve_loopback(
        &app,
        tls_provider(),
        vec![
            ("smtp", TlsMode::Plain, Arc::new(SmtpProtocol::new(app.clone(), SmtpKind::Mx))),
            ("imap", TlsMode::Plain, Arc::new(ImapProtocol::new(app.clone(), false))),
            ("submission", TlsMode::Plain, Arc::new(SmtpProtocol::new(app.clone(), SmtpKind::Submission))),
        ],
    );
    Pod { app, smtp: addrs[0], imap: addrs[1], submission: addrs[2], _dir: dir }
}

/// Sends `message` from alice@example.com to bob@example.org with smtplib;
/// the server's reply to the message: code and text.
async fn send(smtp: SocketAddr, message: &str) -> (u16, String) {
    send_as(smtp, message, None).await
}

/// [`send`], logged in as `login` (user, password) and from that user when
/// given.
async fn send_as(smtp: SocketAddr, message: &str, login: Option<(&str, &str)>) -> (u16, String) {
    const SCRIPT: &str = r#"
import smtplib, sys
s = smtplib.SMTP("127.0.0.1", int(sys.argv[1]), local_hostname="client.example.net", timeout=60)
sender = "alice@example.com"
if len(sys.argv) > 3:
    s.login(sys.argv[2], sys.argv[3])
    sender = sys.argv[2]
try:
    s.sendmail(sender, ["bob@example.org"], sys.stdin.buffer.read())
    print("250 accepted")
except smtplib.SMTPDataError as e:
    print(e.smtp_code, e.smtp_error.decode())
s.quit()
"#;
    let mut child = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(smtp.port().to_string())
        .args(login.map(|(user, password)| [user, password]).into_iter().flatten())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(message.as_bytes()).await.expect("message written");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("smtplib finished within 90 s")
        .expect("smtplib output");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success(), "smtplib failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    let (code, rest) = text.split_once(' ').expect("code and text");
    (code.parse().expect("code"), rest.to_string())
}

/// A message of ordinary words (enough for rspamd's classifier to learn),
/// made unique by `tag`.
fn message(subject: &str, tag: &str, extra_header: &str) -> String {
    let words = [
        "meeting", "tomorrow", "project", "report", "garden", "weekend", "budget", "travel", "coffee",
        "library", "river", "music", "window", "summer", "number", "letter", "market", "bicycle",
    ];
    let seed: u64 = rand::random();
    let body: Vec<&str> =
        (0..80).map(|i| words[((seed >> (i % 60)) as usize + i * 7) % words.len()]).collect();
    format!(
        "From: Alice <alice@example.com>\r\nTo: Bob <bob@example.org>\r\nSubject: {subject}\r\n\
         Date: Mon, 7 Dec 2026 10:00:00 +0000\r\nMessage-ID: <{tag}.{seed}@example.com>\r\n{extra_header}\r\n\
         Hello Bob,\r\n{}\r\n{tag}\r\n",
        body.join(" ")
    )
}

/// The messages of bob's mailbox `name`, as text.
async fn mailbox(app: &App, name: &str) -> Vec<String> {
    let bob = app.store.account_get("bob@example.org").await.expect("lookup").expect("bob");
    let mb = app.store.mailbox_get(bob.id, name).await.expect("lookup").expect("mailbox");
    let rows = app.store.messages_by_uid(mb.id, &UidSet::all()).await.expect("rows");
    let mut out = Vec::new();
    for row in rows {
        let body = app.store.message_body(row.message_id).await.expect("body");
        out.push(String::from_utf8_lossy(&body).into_owned());
    }
    out
}

fn header_of(message: &str) -> &str {
    message.split("\r\n\r\n").next().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rspamd_actions_decide_reply_and_mailbox() {
    if !rspamd_installed() {
        return;
    }
    let rspamd = Rspamd::start().await;
    let Pod { app, smtp, submission, _dir, .. } = pod(&rspamd.url(), |_| {}).await;

    // GTUBE: rspamd's action is reject, so is ours, and nothing is stored.
    let (code, text) = send(smtp, &message("hello", GTUBE, "")).await;
    assert_eq!(code, 550, "{text}");
    assert!(text.starts_with("5.7.1"), "{text}");
    assert!(mailbox(&app, "INBOX").await.is_empty() && mailbox(&app, "Junk").await.is_empty());

    // Over `add header`: delivered into Junk, marked, the sender's own
    // X-Spam fields gone.
    let forged = "X-Spam: No\r\nX-Spam-Score: -100\r\n";
    let (code, text) = send(smtp, &message("spammy-test offer", "spammy", forged)).await;
    assert_eq!(code, 250, "{text}");
    let junk = mailbox(&app, "Junk").await;
    assert_eq!(junk.len(), 1, "in Junk");
    let header = header_of(&junk[0]);
    assert!(header.contains("\r\nX-Spam: Yes\r\n"), "{header}");
    assert!(!header.contains("X-Spam: No") && !header.contains("-100"), "forged fields removed: {header}");
    let score = header.split("X-Spam-Score: ").nth(1).expect("X-Spam-Score").split("\r\n").next().unwrap();
    let (score, required) = score.split_once(" / ").expect("score / required");
    assert!(score.parse::<f64>().unwrap() >= 50.0, "{score}");
    assert_eq!(required, "150.00");
    assert!(mailbox(&app, "INBOX").await.is_empty());

    // Clean mail: INBOX, with its score and without X-Spam.
    let (code, text) = send(smtp, &message("lunch", "clean", "")).await;
    assert_eq!(code, 250, "{text}");
    let inbox = mailbox(&app, "INBOX").await;
    assert_eq!(inbox.len(), 1);
    let header = header_of(&inbox[0]);
    assert!(header.contains("\r\nX-Spam-Score: "), "{header}");
    assert!(!header.contains("X-Spam: Yes") && !header.contains("unchecked"), "{header}");

    let checks = &app.metrics.filter.checks;
    assert_eq!(checks.with_label_values(&["reject"]).get(), 1);
    assert_eq!(checks.with_label_values(&["add_header"]).get(), 1);
    assert_eq!(checks.with_label_values(&["no_action"]).get(), 1);
    assert_eq!(app.metrics.filter.seconds.get_sample_count(), 3);

    // Over `max_size`: not sent to rspamd (GTUBE would be refused) but
    // delivered, and marked unchecked.
    let small = pod(&rspamd.url(), |c| c.filter.rspamd.max_size = 1024).await;
    let (code, text) = send(small.smtp, &message("big", GTUBE, "")).await;
    assert_eq!(code, 250, "{text}");
    let inbox = mailbox(&small.app, "INBOX").await;
    assert!(header_of(&inbox[0]).contains("X-Spam-Status: unchecked (too large)"), "{}", inbox[0]);
    assert_eq!(small.app.metrics.filter.unscanned.with_label_values(&["too_large"]).get(), 1);

    // Submitted mail is not scanned by default; with `scan_submission` it is.
    let gtube_from_bob =
        message("hello", GTUBE, "").replace("From: Alice <alice@example.com>", "From: bob@example.org");
    let (code, text) = send_as(submission, &gtube_from_bob, Some(("bob@example.org", "pw"))).await;
    assert_eq!(code, 250, "{text}");
    let strict = pod(&rspamd.url(), |c| c.filter.rspamd.scan_submission = true).await;
    let (code, text) = send_as(strict.submission, &gtube_from_bob, Some(("bob@example.org", "pw"))).await;
    assert_eq!(code, 550, "{text}");
}

/// rspamd's other actions, each from rspamd's own scoring: `rewrite subject`
/// files into Junk under rspamd's subject (the sender's Subject gone, not
/// kept beside it); `soft reject` from a prefilter and `greylist` from the
/// score are a temporary refusal the sender retries, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_subject_soft_reject_and_greylist() {
    if !rspamd_installed() {
        return;
    }
    let rspamd = Rspamd::start().await;
    let Pod { app, smtp, _dir, .. } = pod(&rspamd.url(), |_| {}).await;

    let (code, text) = send(smtp, &message("rewrite-test offer", "rewrite", "")).await;
    assert_eq!(code, 250, "{text}");
    let junk = mailbox(&app, "Junk").await;
    assert_eq!(junk.len(), 1, "in Junk");
    let header = header_of(&junk[0]);
    assert!(header.contains("\r\nX-Spam: Yes\r\n"), "{header}");
    let subjects: Vec<&str> =
        header.split("\r\n").filter(|l| l.to_ascii_lowercase().starts_with("subject:")).collect();
    assert_eq!(subjects, ["Subject: [SPAM] rewrite-test offer"], "{header}");
    assert!(mailbox(&app, "INBOX").await.is_empty());

    for (subject, action) in [("tempfail-test", "soft_reject"), ("grey-test offer", "greylist")] {
        let (code, text) = send(smtp, &message(subject, "later", "")).await;
        assert_eq!(code, 451, "{subject}: {text}");
        assert!(text.starts_with("4.7.1"), "{subject}: {text}");
        assert_eq!(app.metrics.filter.checks.with_label_values(&[action]).get(), 1, "{subject}");
    }
    assert_eq!(
        mailbox(&app, "INBOX").await.len() + mailbox(&app, "Junk").await.len(),
        1,
        "nothing more stored"
    );
    assert_eq!(app.metrics.filter.checks.with_label_values(&["rewrite_subject"]).get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_into_and_out_of_junk_teaches_rspamd() {
    if !rspamd_installed() {
        return;
    }
    let rspamd = Rspamd::start().await;
    let Pod { app, smtp, imap, _dir, .. } = pod(&rspamd.url(), |_| {}).await;
    let (code, text) = send(smtp, &message("newsletter", "learn-me", "")).await;
    assert_eq!(code, 250, "{text}");
    let before = rspamd.learned().await;

    let mut c = Client::new(tokio::net::TcpStream::connect(imap).await.expect("imap connects"));
    c.line().await;
    let r = c.cmd("a", "LOGIN bob@example.org pw").await;
    assert!(r.last().unwrap().starts_with("a OK"), "{r:?}");
    let r = c.cmd("b", "SELECT INBOX").await;
    assert!(r.last().unwrap().starts_with("b OK"), "{r:?}");
    let started = Instant::now();
    let r = c.cmd("c", "UID MOVE 1 Junk").await;
    assert!(r.last().unwrap().starts_with("c OK"), "{r:?}");
    // The reply does not wait for rspamd (generous bound: a loaded machine).
    assert!(started.elapsed() < Duration::from_secs(5));

    let learned = |spam: bool| {
        app.metrics.filter.learns.with_label_values(&[if spam { "spam" } else { "ham" }, "sent"]).get()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while learned(true) < 1 {
        assert!(Instant::now() < deadline, "learnt as spam within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rspamd.learned().await, before + 1, "rspamd counts the message it learnt");

    // Out of Junk again: ham (rspamd relearns a message it had as spam).
    let r = c.cmd("d", "SELECT Junk").await;
    assert!(r.last().unwrap().starts_with("d OK"), "{r:?}");
    let r = c.cmd("e", "UID COPY 1 INBOX").await;
    assert!(r.last().unwrap().starts_with("e OK"), "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while learned(false) < 1 {
        assert!(Instant::now() < deadline, "learnt as ham within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Junk thrown away (into Trash) is no judgement of ham; between two
    // ordinary mailboxes there is nothing to learn either.
    let r = c.cmd("f", "UID MOVE 1 Trash").await;
    assert!(r.last().unwrap().starts_with("f OK"), "{r:?}");
    let r = c.cmd("g", "SELECT INBOX").await;
    assert!(r.last().unwrap().starts_with("g OK"), "{r:?}");
    let r = c.cmd("h", "COPY 1:* Archive").await;
    assert!(r.last().unwrap().starts_with("h OK"), "{r:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((learned(true), learned(false)), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_rspamd_fails_open_and_the_breaker_stops_asking() {
    if !rspamd_installed() {
        return;
    }
    let mut rspamd = Rspamd::start().await;
    let Pod { app, smtp, _dir, .. } = pod(&rspamd.url(), |c| {
        c.filter.rspamd.breaker_failures = 2;
        c.filter.rspamd.breaker_retry_secs = 3600;
    })
    .await;
    let (code, _) = send(smtp, &message("before", "before", "")).await;
    assert_eq!(code, 250);
    assert_eq!(app.metrics.filter.up.get(), 1);
    rspamd.stop();

    for i in 0..3 {
        let (code, text) = send(smtp, &message("after", &format!("after{i}"), "")).await;
        assert_eq!(code, 250, "fail-open delivers: {text}");
    }
    let inbox = mailbox(&app, "INBOX").await;
    assert_eq!(inbox.len(), 4);
    for m in &inbox[1..] {
        let header = header_of(m);
        assert!(header.contains("\r\nX-Spam-Status: unchecked\r\n"), "{header}");
        assert!(!header.contains("X-Spam-Score"), "{header}");
    }
    let failures = &app.metrics.filter.failures;
    assert_eq!(failures.with_label_values(&["connect"]).get(), 2, "two attempts");
    assert_eq!(failures.with_label_values(&["breaker_open"]).get(), 1, "then not asked");
    assert_eq!(app.metrics.filter.up.get(), 0);
}

/// A peer that takes connections and never answers: rspamd hung.
async fn silent_listener() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_defers_when_rspamd_hangs() {
    let (addr, _peer) = silent_listener().await;
    let Pod { app, smtp, _dir, .. } = pod(&format!("http://{addr}"), |c| {
        c.filter.rspamd.fail_mode = FailMode::Closed;
        c.filter.rspamd.timeout_ms = 300;
    })
    .await;
    let started = Instant::now();
    let (code, text) = send(smtp, &message("hello", "closed", "")).await;
    assert_eq!(code, 451, "{text}");
    assert!(text.starts_with("4.7.1"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(30), "the scan's time is bounded");
    assert!(mailbox(&app, "INBOX").await.is_empty(), "nothing stored");
    assert_eq!(app.metrics.filter.failures.with_label_values(&["timeout"]).get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_cut_at_its_cap() {
    // A peer that answers 200 with a body that never ends: the client stops
    // reading at its cap (256 KiB) instead of holding it all.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = s.read(&mut request).await;
                let head =
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 64 * 1024];
                while s.write_all(&chunk).await.is_ok() {
                    counter.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let Pod { app, smtp, _dir, .. } =
        pod(&format!("http://{addr}"), |c| c.filter.rspamd.timeout_ms = 20_000).await;
    let started = Instant::now();
    let (code, text) = send(smtp, &message("hello", "endless", "")).await;
    assert_eq!(code, 250, "fail-open: {text}");
    assert!(started.elapsed() < Duration::from_secs(15), "cut at the cap, not at the timeout");
    assert_eq!(app.metrics.filter.failures.with_label_values(&["answer"]).get(), 1);
    let inbox = mailbox(&app, "INBOX").await;
    assert!(header_of(&inbox[0]).contains("X-Spam-Status: unchecked"));
    // What the peer got out is bounded by the cap plus the socket buffers.
    assert!(sent.load(std::sync::atomic::Ordering::Relaxed) < 64 * 1024 * 1024);
}

/// rspamd's score reaches the recipient's Sieve script as RFC 5235's
/// `spamtest` value, and the script's `fileinto` decides over Junk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sieve_spamtest_sees_rspamds_score() {
    if !rspamd_installed() {
        return;
    }
    let rspamd = Rspamd::start().await;
    let Pod { app, smtp, _dir, .. } = pod(&rspamd.url(), |_| {}).await;
    let bob = app.store.account_get("bob@example.org").await.expect("lookup").expect("bob").id;
    let script = br#"require ["spamtest", "relational", "comparator-i;ascii-numeric", "fileinto", "mailbox"];
        if spamtest :value "ge" :comparator "i;ascii-numeric" "3" { fileinto :create "Suspect"; stop; }
        if not spamtest :value "ge" :comparator "i;ascii-numeric" "1" { fileinto :create "Unscanned"; }"#;
    let quota = mailcluster_server::store::SieveQuota { max_scripts: 16, max_bytes: 65536 };
    app.store.sieve_put(bob, "spam", script, quota).await.expect("stored");
    app.store.sieve_activate(bob, Some("spam")).await.expect("active");
    app.sieve.forget(bob);

    let (code, text) = send(smtp, &message("spammy-test offer", "spammy", "")).await;
    assert_eq!(code, 250, "{text}");
    let (code, text) = send(smtp, &message("lunch", "clean", "")).await;
    assert_eq!(code, 250, "{text}");
    let suspect = mailbox(&app, "Suspect").await;
    assert_eq!(suspect.len(), 1, "the spammy one, filed by the script rather than Junk");
    assert!(suspect[0].contains("spammy"));
    assert!(mailbox(&app, "Junk").await.is_empty());
    let inbox = mailbox(&app, "INBOX").await;
    assert_eq!(inbox.len(), 1, "the clean one, scanned (spamtest 1)");
    assert!(inbox[0].contains("clean"));
}
