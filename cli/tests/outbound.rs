//! Two `mailcluster serve` processes as two organisations, org-a.test and
//! org-b.test, on loopback, with a real DNS server (hickory-server) holding their
//! MX, SPF, DKIM and DMARC records. Mail submitted at one leaves through its relay
//! workers, DKIM-signed, and arrives at the other with `Authentication-Results`
//! showing dkim, spf and dmarc pass; a forgery from outside org-a's SPF is refused
//! by its DMARC p=reject; a recipient the far side refuses comes back as a DSN in
//! the sender's INBOX. Clients are real: swaks submits, curl reads over IMAP.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{ServeProcess, ephemeral_ports};
use common::redis::free_port;
use mailcluster_testkit::dns::TestDns;

struct Org {
    domain: &'static str,
    dir: tempfile::TempDir,
    smtp_port: u16,
    dkim_txt: String,
}

fn org(domain: &'static str) -> Org {
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(
        dir.path(),
        &["dkim", "generate", domain, "--selector", "mail", "--out", "dkim.key"],
        &[],
    );
    out.ok();
    let txt = out
        .stdout
        .lines()
        .find_map(|l| l.split_once("IN TXT ").map(|(_, v)| v.to_string()))
        .unwrap_or_else(|| panic!("no TXT record printed: {}", out.stdout));
    Org { domain, dir, smtp_port: free_port(), dkim_txt: txt }
}

fn zone(o: &Org) -> String {
    format!(
        "@ 60 IN MX 10 mx.{d}.\n\
         mx 60 IN A 127.0.0.1\n\
         @ 60 IN TXT \"v=spf1 ip4:127.0.0.1 -all\"\n\
         mail._domainkey 60 IN TXT {txt}\n\
         _dmarc 60 IN TXT \"v=DMARC1; p=reject\"\n",
        d = o.domain,
        txt = o.dkim_txt
    )
}

/// Config file plus one domain and one user, then the server.
fn start(o: &Org, peer_port: u16, dns: SocketAddr, user: &str) -> ServeProcess {
    start_with(o, peer_port, dns, user, "", "")
}

/// [`start`] with extra lines in the top-level table and the `[relay]` section.
fn start_with(o: &Org, peer_port: u16, dns: SocketAddr, user: &str, top: &str, relay: &str) -> ServeProcess {
    let key_file = format!(
        "[[dkim.keys]]\ndomain = \"{d}\"\nselector = \"mail\"\nkey_file = \"{dir}/dkim.key\"\nalgorithm = \"ed25519\"\n",
        d = o.domain,
        dir = o.dir.path().display(),
    );
    start_configured(o, peer_port, dns, user, top, relay, &key_file)
}

/// [`start_with`] with `dkim` as the configuration's DKIM section.
fn start_configured(
    o: &Org,
    peer_port: u16,
    dns: SocketAddr,
    user: &str,
    top: &str,
    relay: &str,
    dkim: &str,
) -> ServeProcess {
    let config = format!(
        "hostname = \"mx.{d}\"\n\
         data_dir = \"{dir}\"\n{top}\n\
         [dns]\nnameservers = [\"{dns}\"]\n\
         [relay]\nremote_port = {peer_port}\npoll_interval_ms = 200\nallowed_private_networks = [\"127.0.0.0/8\"]\n{relay}\n\
         [inbound]\ntrusted_networks = []\n{dkim}",
        d = o.domain,
        dir = o.dir.path().display(),
    );
    std::fs::write(o.dir.path().join("mail.toml"), config).unwrap();
    let cfg = o.dir.path().join("mail.toml");
    let cfg = cfg.to_str().unwrap();
    common::run(o.dir.path(), &["domain", "add", o.domain, "--config", cfg], &[]).ok();
    common::run(o.dir.path(), &["user", "add", user, "--password", "secret-pw", "--config", cfg], &[]).ok();
    let port = o.smtp_port.to_string();
    let mut env = ephemeral_ports();
    env.retain(|(k, _)| *k != "MAILCLUSTER_SMTP_PORT");
    env.push(("MAILCLUSTER_SMTP_PORT", Box::leak(port.into_boxed_str())));
    env.push(("MAILCLUSTER_CONFIG", Box::leak(cfg.to_string().into_boxed_str())));
    env.push(("MAILCLUSTER_LOG_LEVEL", "info,mailcluster_server::relay=debug"));
    ServeProcess::start(o.dir.path(), &env, 8)
}

/// Submits a message with swaks, authenticated as `from`; the submission must succeed.
fn swaks(server: SocketAddr, from: &str, to: &str, subject: &str) {
    let sent = Command::new("swaks")
        .args(["--server", &server.to_string(), "--tls", "--auth", "PLAIN"])
        .args(["--auth-user", from, "--auth-password", "secret-pw", "--from", from, "--to", to])
        .args(["--header", &format!("Subject: {subject}"), "--body", "hello across organisations"])
        .output()
        .expect("swaks runs");
    assert!(sent.status.success(), "swaks: {}", String::from_utf8_lossy(&sent.stdout));
}

/// Every message in the user's INBOX, read with curl over IMAP with STARTTLS.
fn inbox(imap: SocketAddr, user: &str) -> Vec<String> {
    let mut out = Vec::new();
    for n in 1..=20 {
        let r = Command::new("curl")
            .args(["-sk", "--ssl-reqd", "--max-time", "10", "--user", &format!("{user}:secret-pw")])
            .arg(format!("imap://{imap}/INBOX;MAILINDEX={n}"))
            .output()
            .expect("curl runs");
        if !r.status.success() || r.stdout.is_empty() {
            break;
        }
        out.push(String::from_utf8_lossy(&r.stdout).into_owned());
    }
    out
}

/// The message containing `needle` in `user`'s INBOX at `imap`, waited for up to
/// 30 s; on timeout the test fails with both organisations' server logs and queues.
fn wait_for_mail(
    what: &str,
    orgs: [(&Org, &ServeProcess); 2],
    imap: SocketAddr,
    user: &str,
    needle: &str,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(m) = inbox(imap, user).into_iter().find(|m| m.contains(needle)) {
            return m;
        }
        if Instant::now() >= deadline {
            let mut logs: Vec<String> = orgs.iter().map(|(_, server)| server.log_text()).collect();
            for (org, _) in orgs {
                let dir = org.dir.path();
                let cfg = dir.join("mail.toml");
                logs.push(common::run(dir, &["queue", "list", "-c", cfg.to_str().unwrap()], &[]).stdout);
            }
            panic!("timed out waiting for {what}; server logs:\n{}", logs.join("\n-----\n"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Sends a message straight to `mx` from a socket bound to `source`.
fn smtp_from(source: &str, mx: SocketAddr, from: &str, to: &str, header_from: &str) -> String {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&format!("{source}:0").parse::<SocketAddr>().unwrap().into()).unwrap();
    socket.connect_timeout(&mx.into(), Duration::from_secs(5)).unwrap();
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let reply = |r: &mut BufReader<TcpStream>| {
        let mut all = String::new();
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            all.push_str(&line);
            if line.len() < 4 || line.as_bytes()[3] == b' ' {
                return all;
            }
        }
    };
    reply(&mut r);
    for cmd in [
        "EHLO forger.test".to_string(),
        format!("MAIL FROM:<{from}>"),
        format!("RCPT TO:<{to}>"),
        "DATA".into(),
    ] {
        write!(w, "{cmd}\r\n").unwrap();
        reply(&mut r);
    }
    write!(w, "From: <{header_from}>\r\nTo: <{to}>\r\nSubject: forged\r\n\r\npay this invoice\r\n.\r\n")
        .unwrap();
    let answer = reply(&mut r);
    let _ = write!(w, "QUIT\r\n");
    answer
}

/// The `Authentication-Results` field org-b's MX added, unfolded onto one line.
fn org_b_results(msg: &str) -> String {
    msg.lines()
        .skip_while(|l| !l.starts_with("Authentication-Results: mx.org-b.test"))
        .take_while(|l| l.starts_with("Authentication-Results") || l.starts_with('\t') || l.starts_with(' '))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn two_organisations_exchange_signed_mail_and_refuse_forgeries() {
    let a = org("org-a.test");
    let b = org("org-b.test");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dns = rt.block_on(TestDns::start(&[("org-a.test.", &zone(&a)), ("org-b.test.", &zone(&b))]));
    let server_a = start(&a, b.smtp_port, dns.addr(), "alice@org-a.test");
    let server_b = start(&b, a.smtp_port, dns.addr(), "bob@org-b.test");
    let orgs = [(&a, &server_a), (&b, &server_b)];

    // A → B: submitted at A, relayed to B's MX.
    swaks(server_a.addr("submission"), "alice@org-a.test", "bob@org-b.test", "hello bob");
    let msg =
        wait_for_mail("the message at org-b", orgs, server_b.addr("imap"), "bob@org-b.test", "hello bob");
    let ar = org_b_results(&msg);
    for want in ["dkim=pass", "spf=pass", "dmarc=pass", "header.d=org-a.test"] {
        assert!(ar.contains(want), "{want} missing in {ar:?}\nmessage:\n{msg}");
    }
    assert!(msg.contains("DKIM-Signature:") && msg.contains("d=org-a.test"), "{msg}");
    assert_eq!(msg.matches("Return-Path:").count(), 1, "one Return-Path, added at final delivery:\n{msg}");

    // B → A, the other way.
    swaks(server_b.addr("submission"), "bob@org-b.test", "alice@org-a.test", "hello alice");
    let msg =
        wait_for_mail("the reply at org-a", orgs, server_a.addr("imap"), "alice@org-a.test", "hello alice");
    assert!(msg.contains("dkim=pass") && msg.contains("dmarc=pass"), "{msg}");

    // A forgery of org-a from 127.0.0.2 (outside org-a's SPF, unsigned): DMARC
    // p=reject refuses it at the end of DATA.
    let answer =
        smtp_from("127.0.0.2", server_b.addr("smtp"), "ceo@org-a.test", "bob@org-b.test", "ceo@org-a.test");
    assert!(answer.starts_with("550 5.7.1"), "forgery answered {answer:?}");
    // The same sender domain from an address its SPF allows passes.
    let answer =
        smtp_from("127.0.0.1", server_b.addr("smtp"), "ceo@org-a.test", "bob@org-b.test", "ceo@org-a.test");
    assert!(answer.starts_with("250"), "SPF-aligned mail answered {answer:?}");

    // A recipient org-b does not have: refused at RCPT there, so a DSN with the
    // original headers arrives in alice's INBOX at org-a.
    swaks(server_a.addr("submission"), "alice@org-a.test", "nobody@org-b.test", "to nobody");
    let dsn = wait_for_mail(
        "the DSN at org-a",
        orgs,
        server_a.addr("imap"),
        "alice@org-a.test",
        "Undelivered Mail",
    );
    assert!(dsn.contains("Final-Recipient: rfc822; nobody@org-b.test"), "{dsn}");
    assert!(dsn.contains("Action: failed") && dsn.contains("Status: 5.1.1"), "{dsn}");
    assert!(dsn.contains("Subject: to nobody"), "original headers quoted:\n{dsn}");
    assert!(dsn.contains("Return-Path: <>"), "{dsn}");
    drop(dns);
}

/// The pod's side of keys the operator makes: a key put into the store while
/// the server runs (`mailcluster domain key`, the operator's code path) signs
/// the next mail without a restart, and the receiving side verifies it
/// against the published record; removing it stops the signing.
#[test]
fn a_key_put_into_the_store_signs_without_a_restart() {
    let a = org("org-a.test");
    let b = org("org-b.test");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dns = rt.block_on(TestDns::start(&[("org-a.test.", &zone(&a)), ("org-b.test.", &zone(&b))]));
    let server_a = start_configured(&a, b.smtp_port, dns.addr(), "alice@org-a.test", "", "", "");
    let server_b = start(&b, a.smtp_port, dns.addr(), "bob@org-b.test");
    let orgs = [(&a, &server_a), (&b, &server_b)];

    swaks(server_a.addr("submission"), "alice@org-a.test", "bob@org-b.test", "before the key");
    let msg = wait_for_mail("unsigned mail", orgs, server_b.addr("imap"), "bob@org-b.test", "before the key");
    assert!(!msg.contains("DKIM-Signature:"), "no key yet:\n{msg}");
    assert!(!org_b_results(&msg).contains("dkim=pass"), "{msg}");

    let cfg = a.dir.path().join("mail.toml");
    let cfg = cfg.to_str().unwrap();
    let set =
        ["domain", "key", "org-a.test", "--selector", "mail", "--key-file", "dkim.key", "--config", cfg];
    common::run(a.dir.path(), &set, &[]).ok();
    let shown = common::run(a.dir.path(), &["domain", "key", "org-a.test", "--config", cfg], &[]);
    assert!(
        shown.ok().stdout.contains(&format!("mail._domainkey.org-a.test. IN TXT {}", a.dkim_txt)),
        "{}",
        shown.stdout
    );
    // A key that is not one is refused before any server sees it.
    std::fs::write(a.dir.path().join("bad.key"), "not a key").unwrap();
    let bad = ["domain", "key", "org-a.test", "--selector", "x", "--key-file", "bad.key", "--config", cfg];
    assert_eq!(common::run(a.dir.path(), &bad, &[]).code, Some(2));
    std::thread::sleep(mailcluster_server::dkim::STORED_KEYS_REFRESH + Duration::from_secs(1));

    swaks(server_a.addr("submission"), "alice@org-a.test", "bob@org-b.test", "after the key");
    let msg = wait_for_mail("signed mail", orgs, server_b.addr("imap"), "bob@org-b.test", "after the key");
    let ar = org_b_results(&msg);
    for want in ["dkim=pass", "header.d=org-a.test", "header.s=mail", "dmarc=pass"] {
        assert!(ar.contains(want), "{want} missing in {ar:?}\nmessage:\n{msg}");
    }

    let none = ["domain", "key", "org-a.test", "--none", "--config", cfg];
    common::run(a.dir.path(), &none, &[]).ok();
    std::thread::sleep(mailcluster_server::dkim::STORED_KEYS_REFRESH + Duration::from_secs(1));
    swaks(server_a.addr("submission"), "alice@org-a.test", "bob@org-b.test", "key removed");
    let msg = wait_for_mail("unsigned again", orgs, server_b.addr("imap"), "bob@org-b.test", "key removed");
    assert!(!msg.contains("DKIM-Signature:"), "the key was removed:\n{msg}");
    drop(dns);
}

#[test]
fn smarthost_mode_authenticates_over_tls_and_delivers() {
    let a = org("org-a.test");
    let b = org("org-b.test");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dns = rt.block_on(TestDns::start(&[("org-a.test.", &zone(&a)), ("org-b.test.", &zone(&b))]));
    // org-b's submission service is org-a's smarthost: org-a authenticates there
    // as bob and sends for alice, which org-b allows for this test.
    let server_b = start_with(
        &b,
        a.smtp_port,
        dns.addr(),
        "bob@org-b.test",
        "[smtp]\nsender_must_match_auth = false",
        "",
    );
    let smarthost = server_b.addr("submission");
    let relay = format!(
        "smarthost = \"{smarthost}\"\nsmarthost_username = \"bob@org-b.test\"\n\
         smarthost_password = \"secret-pw\"\nsmarthost_tls_verify = false"
    );
    let server_a = start_with(&a, 1, dns.addr(), "alice@org-a.test", "", &relay);
    let orgs = [(&a, &server_a), (&b, &server_b)];
    swaks(server_a.addr("submission"), "alice@org-a.test", "bob@org-b.test", "via smarthost");
    let msg = wait_for_mail(
        "the message through the smarthost",
        orgs,
        server_b.addr("imap"),
        "bob@org-b.test",
        "via smarthost",
    );
    // Submitted at org-b by an authenticated client over TLS: "ESMTPSA".
    assert!(msg.contains("with ESMTPSA"), "{msg}");
    assert!(msg.contains("DKIM-Signature:") && msg.contains("d=org-a.test"), "{msg}");
}
