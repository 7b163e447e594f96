//! Real clients (Python smtplib, swaks, curl) against the SMTP protocol served on
//! 127.0.0.1 over real sockets and real TLS (rustls with a generated certificate).

mod smtp_support;

use mailcluster_server::store::Directory;
use mailcluster_server::store::Queue;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use smtp_support::sockets::{listen, tls_provider};
use smtp_support::{Backend, Harness, PASSWORD, config};

/// Runs a client program off the runtime's threads, bounded in time.
async fn run(mut cmd: Command) -> std::process::Output {
    let out =
        tokio::time::timeout(Duration::from_secs(120), tokio::task::spawn_blocking(move || cmd.output()))
            .await
            .expect("client finished in time")
            .expect("join")
            .expect("client runs");
    if !out.status.success() {
        panic!(
            "client failed: {}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// What every Python client script starts with: its imports, a TLS context for
/// the test's self-signed certificate (encrypting, not verifying), and `reply(f)`,
/// which reads one reply, all its lines, from the socket file `f`.
const PY_PRELUDE: &str = r#"
import smtplib, socket, ssl, sys
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
def reply(f):
    lines = []
    while True:
        l = f.readline().decode()
        lines.append(l)
        if l[3:4] != "-":
            return lines
"#;

/// Runs the Python client `script`, after [`PY_PRELUDE`], with `args`.
async fn python(script: &str, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(format!("{PY_PRELUDE}{script}")).args(args);
    run(cmd).await
}

const SMTPLIB_STARTTLS: &str = r#"
from email.message import EmailMessage
port = int(sys.argv[1])
msg = EmailMessage()
msg["From"] = "sender@remote.test"
msg["To"] = "jörg@example.test"
msg["Subject"] = "Grüße mit Anhang"
msg.set_content("Hallo Jörg,\n.\nhier ist die Datei.\n")
msg.add_attachment(bytes(range(256)) * (3 * 1024 * 1024 // 256), maintype="application", subtype="octet-stream", filename="data.bin")
with smtplib.SMTP("127.0.0.1", port, timeout=60) as s:
    s.ehlo("py.test")
    assert s.has_extn("starttls"), s.esmtp_features
    s.starttls(context=ctx)
    s.ehlo("py.test")
    assert s.has_extn("smtputf8") and s.has_extn("8bitmime")
    refused = s.send_message(msg, mail_options=["SMTPUTF8", "BODY=8BITMIME"])
    assert not refused, refused
print("OK")
"#;

async fn python_smtplib_starttls_smtputf8_attachment(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    h.add_account("jörg@example.test").await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let out = python(SMTPLIB_STARTTLS, &[&addr.port().to_string()]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
    let msgs = h.messages("jörg@example.test").await;
    assert_eq!(msgs.len(), 1);
    let raw = &msgs[0];
    assert!(raw.len() > 4 * 1024 * 1024, "attachment arrived whole: {} octets", raw.len());
    let head = String::from_utf8_lossy(&raw[..600]);
    assert!(head.contains("with UTF8SMTPS id"), "TLS and SMTPUTF8 recorded: {head}");
    // The body line "." was dot-stuffed by smtplib and unstuffed by us.
    let text = String::from_utf8_lossy(raw);
    assert!(text.contains("Hallo J") && text.contains("\r\n.\r\nhier ist"), "dot line preserved");
}

const SMTPLIB_QUOTA: &str = r#"
port = int(sys.argv[1])
body = "Subject: big\r\n\r\n" + "x" * 6000 + "\r\n"
with smtplib.SMTP("127.0.0.1", port, timeout=60) as s:
    s.ehlo("py.test")
    assert s.has_extn("size"), s.esmtp_features
    # smtplib declares SIZE= itself: alice's 4 KiB can never take 6 KB.
    refused = s.sendmail("sender@remote.test", ["alice@example.test", "bob@example.test"], body)
    assert refused == {"alice@example.test": (552, b"5.2.2 Message too large for the mailbox's quota")}, refused
    try:
        s.sendmail("sender@remote.test", ["alice@example.test"], body)
        raise AssertionError("alice alone must be refused")
    except smtplib.SMTPRecipientsRefused as e:
        assert e.recipients["alice@example.test"][0] == 552, e.recipients
print("OK")
"#;

/// RFC 9208 at delivery through smtplib, which declares SIZE= on its own.
async fn python_smtplib_over_quota(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    h.store.account_set_quota("alice@example.test", Some(4096)).await.expect("quota");
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let out = python(SMTPLIB_QUOTA, &[&addr.port().to_string()]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
    assert_eq!(h.messages("alice@example.test").await.len(), 0);
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
}

const SMTPLIB_DSN: &str = r#"
port = int(sys.argv[1])
with smtplib.SMTP("127.0.0.1", port, timeout=60) as s:
    s.ehlo("py.test")
    assert s.has_extn("dsn"), s.esmtp_features
    refused = s.sendmail(
        "alice@example.test", ["bob@example.test"], "Subject: dsn test\r\n\r\nhello\r\n",
        mail_options=["RET=HDRS", "ENVID=py-1"],
        rcpt_options=["NOTIFY=SUCCESS,FAILURE", "ORCPT=rfc822;Bob@example.test"])
    assert not refused, refused
    try:
        s.sendmail("alice@example.test", ["bob@example.test"], "x", rcpt_options=["NOTIFY=NEVER,DELAY"])
        raise AssertionError("NEVER with DELAY must be refused")
    except smtplib.SMTPRecipientsRefused as e:
        assert e.recipients["bob@example.test"][0] == 501, e.recipients
print("OK")
"#;

/// The DSN extension (RFC 3461) through smtplib's mail and rcpt options: the
/// local sender finds the report of delivery in its INBOX.
async fn python_smtplib_dsn_success(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let out = python(SMTPLIB_DSN, &[&addr.port().to_string()]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
    let reports = h.messages("alice@example.test").await;
    assert_eq!(reports.len(), 1, "one report of delivery");
    let r = String::from_utf8_lossy(&reports[0]);
    assert!(r.starts_with("Return-Path: <>\r\n"), "{r}");
    assert!(r.contains("Original-Envelope-Id: py-1\r\n"), "{r}");
    assert!(r.contains("Original-Recipient: rfc822; Bob@example.test\r\nFinal-Recipient: rfc822; bob@example.test\r\nAction: delivered"), "{r}");
    assert!(r.contains("Subject: dsn test"), "{r}");
}

async fn swaks_pipelining_over_starttls(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let mut cmd = Command::new("swaks");
    cmd.args(["--server", "127.0.0.1", "--port", &addr.port().to_string()])
        .args(["--from", "sender@remote.test", "--to", "alice@example.test,bob@example.test"])
        .args(["--helo", "swaks.test", "--pipeline", "--tls", "--timeout", "30"])
        .args(["--header", "Subject: via swaks", "--body", "line one\n.\nline three"]);
    let out = run(cmd).await;
    let transcript = String::from_utf8_lossy(&out.stdout);
    assert!(transcript.contains("PIPELINING"), "{transcript}");
    assert!(transcript.contains("250 2.0.0 OK: queued as"), "{transcript}");
    for who in ["alice@example.test", "bob@example.test"] {
        let msgs = h.messages(who).await;
        assert_eq!(msgs.len(), 1, "{who}");
        let text = String::from_utf8_lossy(&msgs[0]);
        assert!(text.contains("Subject: via swaks") && text.contains("with ESMTPS id"), "{text}");
    }
}

async fn swaks_relay_and_unknown_user_refused(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    for (to, code) in [("someone@elsewhere.test", "550 5.7.1"), ("nobody@example.test", "550 5.1.1")] {
        let mut cmd = Command::new("swaks");
        cmd.args(["--server", "127.0.0.1", "--port", &addr.port().to_string()]).args([
            "--from",
            "sender@remote.test",
            "--to",
            to,
            "--timeout",
            "30",
        ]);
        let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
        assert!(!out.status.success());
        let transcript = String::from_utf8_lossy(&out.stdout);
        assert!(transcript.contains(code), "{transcript}");
    }
    assert_eq!(h.total_messages().await, 0);
}

async fn curl_smtp_upload(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("msg.eml");
    std::fs::write(
        &file,
        "From: c@remote.test\r\nTo: alice@example.test\r\nSubject: curl\r\n\r\n.dot first\r\nend\r\n",
    )
    .unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", &format!("smtp://127.0.0.1:{}/curl.test", addr.port())])
        .args(["--mail-from", "c@remote.test", "--mail-rcpt", "alice@example.test"])
        .arg("--upload-file")
        .arg(&file);
    run(cmd).await;
    let msgs = h.messages("alice@example.test").await;
    assert_eq!(msgs.len(), 1);
    assert!(
        msgs[0].ends_with(b"Subject: curl\r\n\r\n.dot first\r\nend\r\n"),
        "{:?}",
        String::from_utf8_lossy(&msgs[0])
    );
}

const CHUNKING: &str = r#"
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
f = s.makefile("rb")
assert reply(f)[0].startswith("220")
s.sendall(b"EHLO py.test\r\n")
assert any("CHUNKING" in l for l in reply(f))
body1 = b"Subject: chunked\r\n\r\n.\r\n"
body2 = b"end of message\r\n"
# Everything pipelined in one write.
s.sendall(b"MAIL FROM:<c@remote.test>\r\nRCPT TO:<alice@example.test>\r\n" + b"BDAT %d\r\n" % len(body1) + body1 + b"BDAT %d LAST\r\n" % len(body2) + body2 + b"QUIT\r\n")
codes = [reply(f)[-1][:3] for _ in range(5)]
assert codes == ["250", "250", "250", "250", "221"], codes
print("OK")
"#;

async fn chunking_over_a_socket(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    python(CHUNKING, &[&addr.port().to_string()]).await;
    let msgs = h.messages("alice@example.test").await;
    assert_eq!(msgs.len(), 1);
    assert!(msgs[0].ends_with(b"Subject: chunked\r\n\r\n.\r\nend of message\r\n"));
}

fn vm_hwm_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// 100 MB of DATA against a 10 MB limit: refused with 552, and this process
/// (server and client both) never holds anywhere near 100 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_megabytes_against_ten_megabyte_limit() {
    let b = Backend::Sqlite;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let h = Harness::new(
        b,
        config(|c| {
            c.smtp.max_message_size = 10 * 1024 * 1024;
            c.smtp.max_discard_size = 200 * 1024 * 1024;
        }),
    )
    .await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let before = vm_hwm_kb();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (r, mut w) = tcp.into_split();
    let mut r = BufReader::new(r);
    let mut line = String::new();
    async fn next(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>, line: &mut String) -> String {
        loop {
            line.clear();
            r.read_line(line).await.unwrap();
            if line.as_bytes().get(3) != Some(&b'-') {
                return line.clone();
            }
        }
    }
    assert!(next(&mut r, &mut line).await.starts_with("220"));
    w.write_all(b"EHLO big.test\r\nMAIL FROM:<b@remote.test>\r\nRCPT TO:<alice@example.test>\r\nDATA\r\n")
        .await
        .unwrap();
    for expect in ["250", "250", "250", "354"] {
        let got = next(&mut r, &mut line).await;
        assert!(got.starts_with(expect), "{got}");
    }
    let chunk = {
        let line = [b'z'; 998];
        let mut c = Vec::with_capacity(1000 * 1024);
        for _ in 0..1024 {
            c.extend_from_slice(&line);
            c.extend_from_slice(b"\r\n");
        }
        c
    };
    let mut sent = 0usize;
    while sent < 100 * 1024 * 1024 {
        w.write_all(&chunk).await.unwrap();
        sent += chunk.len();
    }
    w.write_all(b".\r\nQUIT\r\n").await.unwrap();
    let got = next(&mut r, &mut line).await;
    assert!(got.starts_with("552 5.3.4"), "{got}");
    assert!(next(&mut r, &mut line).await.starts_with("221"));
    let grown_mb = (vm_hwm_kb().saturating_sub(before)) / 1024;
    assert!(grown_mb < 40, "peak memory grew by {grown_mb} MB for a 100 MB upload");
    assert_eq!(h.total_messages().await, 0);
}

const STARTTLS_INJECTION: &str = r#"
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
f = s.makefile("rb")
assert reply(f)[0].startswith("220")
s.sendall(b"EHLO py.test\r\n")
reply(f)
# A man in the middle appends a command to STARTTLS in the same segment.
s.sendall(b"STARTTLS\r\nMAIL FROM:<injected@remote.test>\r\n")
assert reply(f)[0].startswith("220 2.0.0")
t = ctx.wrap_socket(s, server_hostname="localhost")
tf = t.makefile("rb")
t.sendall(b"EHLO py.test\r\n")
ehlo = reply(tf)
# The first reply inside TLS answers EHLO: the injected MAIL was dropped.
assert ehlo[0].startswith("250-"), ehlo
assert not any("STARTTLS" in l for l in ehlo), ehlo
t.sendall(b"RCPT TO:<alice@example.test>\r\n")
r = reply(tf)
assert r[0].startswith("503"), r
t.sendall(b"QUIT\r\n")
assert reply(tf)[0].startswith("221")
print("OK")
"#;

async fn starttls_discards_pipelined_plaintext(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.mx.clone(), tls_provider(), false, h.shutdown.clone()).await;
    python(STARTTLS_INJECTION, &[&addr.port().to_string()]).await;
}

const SUBMISSIONS_NO_AUTH: &str = r#"
with smtplib.SMTP_SSL("127.0.0.1", int(sys.argv[1]), context=ctx, timeout=30) as s:
    s.ehlo("py.test")
    assert "PLAIN" in s.esmtp_features.get("auth", ""), s.esmtp_features
    assert not s.has_extn("starttls")
    code, msg = s.mail("alice@example.test")
    assert code == 530, (code, msg)
    try:
        s.login("alice@example.test", "wrong-password")
        raise SystemExit("login with a wrong password succeeded")
    except smtplib.SMTPAuthenticationError as e:
        assert e.smtp_code in (535, 454), e
print("OK")
"#;

/// Port 465 style, both ways the listener may hand over the connection: already
/// wrapped in TLS, or plain (the protocol then does the handshake itself).
async fn submissions_implicit_tls(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let proto = Arc::new(mailcluster_server::smtp::SmtpProtocol::new(
        h.app.clone(),
        mailcluster_server::smtp::SmtpKind::Submissions,
    ));
    for wrapped in [true, false] {
        let addr = listen(proto.clone(), tls_provider(), wrapped, h.shutdown.clone()).await;
        python(SUBMISSIONS_NO_AUTH, &[&addr.port().to_string()]).await;
    }
}

const SMTPLIB_SUBMISSION: &str = r#"
from email.message import EmailMessage
port, password = int(sys.argv[1]), sys.argv[2]
msg = EmailMessage()
msg["From"] = "alice@example.test"
msg["To"] = "bob@example.test, friend@elsewhere.test"
msg["Subject"] = "submitted"
msg.set_content("via submission\n")
msg.add_attachment(b"\x00\x01" * (2 * 1024 * 1024), maintype="application", subtype="octet-stream", filename="a.bin")
with smtplib.SMTP("127.0.0.1", port, timeout=60) as s:
    s.ehlo("py.test")
    assert not s.has_extn("auth"), "no AUTH before TLS"
    code, _ = s.mail("alice@example.test")
    assert code == 530, code
    s.rset()
    s.starttls(context=ctx)
    s.ehlo("py.test")
    assert "PLAIN" in s.esmtp_features["auth"]
    s.login("alice@example.test", password)
    refused = s.send_message(msg)
    assert not refused, refused
print("OK")
"#;

async fn python_smtplib_submission_starttls_auth(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.submission.clone(), tls_provider(), false, h.shutdown.clone()).await;
    python(SMTPLIB_SUBMISSION, &[&addr.port().to_string(), PASSWORD]).await;
    let msgs = h.messages("bob@example.test").await;
    assert_eq!(msgs.len(), 1);
    assert!(msgs[0].len() > 5 * 1024 * 1024);
    assert!(String::from_utf8_lossy(&msgs[0][..400]).contains("with ESMTPSA id"));
    let queued = h.store.queue_claim("test", 10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].recipients, vec!["friend@elsewhere.test".to_string()]);
}

async fn swaks_auth_login_submission(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    let addr = listen(h.submission.clone(), tls_provider(), false, h.shutdown.clone()).await;
    let mut cmd = Command::new("swaks");
    cmd.args(["--server", "127.0.0.1", "--port", &addr.port().to_string()])
        .args(["--from", "alice@example.test", "--to", "bob@example.test"])
        .args(["--tls", "--auth", "LOGIN", "--auth-user", "alice@example.test", "--auth-password", PASSWORD])
        .args(["--pipeline", "--timeout", "30", "--header", "Subject: swaks auth"]);
    let out = run(cmd).await;
    let transcript = String::from_utf8_lossy(&out.stdout);
    assert!(transcript.contains("235 2.7.0"), "{transcript}");
    let msgs = h.messages("bob@example.test").await;
    assert_eq!(msgs.len(), 1);
    assert!(String::from_utf8_lossy(&msgs[0]).contains("Subject: swaks auth"));
    // Wrong password: 535 and nothing sent.
    let mut cmd = Command::new("swaks");
    cmd.args(["--server", "127.0.0.1", "--port", &addr.port().to_string()])
        .args(["--from", "alice@example.test", "--to", "bob@example.test"])
        .args(["--tls", "--auth", "LOGIN", "--auth-user", "alice@example.test", "--auth-password", "wrong"])
        .args(["--timeout", "30"]);
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("535 5.7.8"));
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
}

both_backends!(
    python_smtplib_dsn_success,
    python_smtplib_over_quota,
    python_smtplib_starttls_smtputf8_attachment,
    swaks_pipelining_over_starttls,
    swaks_relay_and_unknown_user_refused,
    curl_smtp_upload,
    chunking_over_a_socket,
    starttls_discards_pipelined_plaintext,
    submissions_implicit_tls,
    python_smtplib_submission_starttls_auth,
    swaks_auth_login_submission,
);
