//! SMTP transcripts: client lines in, server replies out, over an in-memory
//! stream, for every command and error path.

mod smtp_support;

use mailcluster_server::store::Addresses;
use mailcluster_server::store::Directory;
use mailcluster_server::store::Queue;
use std::sync::atomic::Ordering;

use std::time::Duration;

use smtp_support::{Backend, Harness, PASSWORD, config};

const MSG: &str = "From: a@remote.test\r\nTo: alice@example.test\r\nSubject: hi\r\n\r\nHello\r\n";

async fn harness(b: Backend) -> Harness {
    Harness::new(b, config(|_| {})).await
}

async fn ehlo_lists_extensions_for_mx(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect(&h.mx);
    let greeting = c.expect("220 mx.test ESMTP").await;
    assert_eq!(greeting.len(), 1);
    let ehlo = c.cmd("EHLO client.test", "250 HELP").await;
    assert_eq!(ehlo[0], "250-mx.test Hello client.test [192.0.2.10]");
    for ext in
        ["PIPELINING", "SIZE 26214400", "8BITMIME", "SMTPUTF8", "ENHANCEDSTATUSCODES", "CHUNKING", "DSN"]
    {
        assert!(ehlo.iter().any(|l| l[4..] == *ext), "{ext} missing from {ehlo:?}");
    }
    // No TLS configured and MX: neither STARTTLS nor AUTH.
    assert!(!ehlo.iter().any(|l| l.contains("STARTTLS") || l.contains("AUTH")), "{ehlo:?}");
    c.cmd("HELO other.test", "250 mx.test").await;
    c.cmd("QUIT", "221 2.0.0").await;
    c.expect_closed().await;
}

async fn mx_delivery_stores_once_with_trace_headers(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<sender@remote.test> BODY=8BITMIME SIZE=100", "250 2.1.0").await;
    c.cmd("RCPT TO:<alice@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<Bob@Example.TEST>", "250 2.1.5").await;
    c.cmd("RCPT TO:<alice@example.test>", "250 2.1.5").await; // duplicate: once
    c.cmd("DATA", "354 ").await;
    c.send("Subject: dots\r\n\r\n..leading dot\r\n.\r\n").await;
    let r = c.expect("250 2.0.0 OK: queued as ").await;
    c.cmd("QUIT", "221 ").await;

    let alice = h.messages("alice@example.test").await;
    let bob = h.messages("bob@example.test").await;
    assert_eq!(alice.len(), 1);
    assert_eq!(bob.len(), 1);
    let raw = String::from_utf8(alice[0].to_vec()).unwrap();
    assert!(
        raw.starts_with(
            "Return-Path: <sender@remote.test>\r\nReceived: from client.test ([192.0.2.10])\r\n\tby mx.test"
        ),
        "{raw}"
    );
    let id = r[0].rsplit(' ').next().unwrap();
    assert!(raw.contains(&format!("with ESMTP id {id};")), "{raw}");
    assert!(!raw.contains("for <"), "several recipients are not listed: {raw}");
    assert!(raw.ends_with("Subject: dots\r\n\r\n.leading dot\r\n"), "{raw}");
    // One body, both mailboxes, one batch.
    assert_eq!(*h.store.batches.lock().unwrap(), vec![1]);
}

/// IDLE sessions learn about a delivery through the cache.
async fn delivery_publishes_mailbox_event(b: Backend) {
    use futures::StreamExt;
    let h = harness(b).await;
    let (account, inbox) = h.inbox_of("alice@example.test").await;
    let mut events = h.cache.subscribe(account).await.unwrap();
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("sender@remote.test", "alice@example.test").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap();
    assert_eq!((event.account_id, event.mailbox_id), (account, inbox));
}

async fn recipient_errors_and_cache(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("RCPT TO:<alice@example.test>", "503 5.5.1").await;
    c.cmd("MAIL FROM:<>", "250 2.1.0").await;
    c.cmd("MAIL FROM:<x@remote.test>", "503 5.5.1").await;
    c.cmd("RCPT TO:<nobody@example.test>", "550 5.1.1").await;
    c.cmd("RCPT TO:<someone@elsewhere.test>", "550 5.7.1 Relaying denied").await;
    c.cmd("RCPT TO:<nobody>", "501 5.1.3").await;
    c.cmd("RCPT TO:<>", "501 5.1.3").await;
    c.cmd("RCPT TO:alice@example.test", "501 5.5.4").await;
    c.cmd("DATA", "554 5.5.1").await;
    let before = h.store.lookups.load(Ordering::SeqCst);
    c.cmd("RCPT TO:<alice@example.test>", "250 2.1.5").await;
    c.cmd("RSET", "250 2.0.0").await;
    c.cmd("MAIL FROM:<>", "250 2.1.0").await;
    c.cmd("RCPT TO:<ALICE@example.test>", "250 2.1.5").await;
    assert_eq!(h.store.lookups.load(Ordering::SeqCst), before + 1, "second lookup served by the cache");
    c.cmd("RSET", "250 2.0.0").await;
    c.cmd("DATA", "503 5.5.1").await;
    c.cmd("BDAT 0 LAST", "503 5.5.1").await;
}

/// A recipient's entry read in the last quarter of its TTL is looked up again
/// in the background: mail that keeps coming does not wait for the store when
/// the entry would have expired. An entry nobody reads then still expires.
async fn recipient_entries_are_refreshed_before_they_expire(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.recipient_cache_ttl_secs = 4)).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    let lookups = || h.store.lookups.load(Ordering::SeqCst);
    let start = tokio::time::Instant::now();
    let mut rcpt_at = async |secs: f64| {
        tokio::time::sleep_until(start + Duration::from_secs_f64(secs)).await;
        c.cmd("RSET", "250 2.0.0").await;
        c.cmd("MAIL FROM:<>", "250 2.1.0").await;
        c.cmd("RCPT TO:<alice@example.test>", "250 2.1.5").await;
    };
    let before = lookups();
    rcpt_at(0.0).await;
    assert_eq!(lookups(), before + 1, "the first RCPT reads the store");
    rcpt_at(1.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(lookups(), before + 1, "a young entry is only read");
    rcpt_at(3.3).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while lookups() < before + 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lookups(), before + 2, "an entry in its last quarter is read again");
    rcpt_at(5.0).await;
    assert_eq!(lookups(), before + 2, "the entry refreshed at 3.3 s serves past the first one's expiry");
    rcpt_at(7.8).await;
    assert_eq!(lookups(), before + 3, "an entry nobody read in its last quarter expired");
    c.cmd("QUIT", "221").await;
}

/// RFC 5321 §4.5.1: `<postmaster>` without a domain, and postmaster at every local
/// domain, must be accepted; both go to the configured postmaster address.
async fn postmaster_is_always_accepted(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.postmaster = "bob@example.test".into())).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("reporter@remote.test", "Postmaster").await;
    c.cmd("RCPT TO:<POSTMASTER@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<postmaster@elsewhere.test>", "550 5.7.1").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    // both recipients resolve to one mailbox: delivered once
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
    assert!(h.messages("alice@example.test").await.is_empty());
}

/// With no `smtp.postmaster` and no postmaster account, postmaster mail is still
/// accepted (RFC 5321 §4.5.1 MUST): it goes to `postmaster@` the domain, created
/// for it, and every form of the name reaches that one mailbox.
async fn postmaster_gets_a_mailbox_of_its_own(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("reporter@remote.test", "postmaster").await;
    c.cmd("RCPT TO:<PostMaster@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<postmaster@elsewhere.test>", "550 5.7.1").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    assert_eq!(h.messages("postmaster@example.test").await.len(), 1, "delivered once");
    // A second message finds the account made for the first.
    c.envelope("reporter@remote.test", "POSTMASTER@EXAMPLE.TEST").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    assert_eq!(h.messages("postmaster@example.test").await.len(), 2);
}

/// Subaddressing (RFC 5233): `alice+detail@` reaches alice when no account has
/// the full address; an account that does keeps its mail; a leading delimiter
/// is part of the user; `smtp.recipient_delimiter = ""` turns it off.
async fn subaddresses_reach_their_user(b: Backend) {
    let h = harness(b).await;
    h.add_account("bob+lists@example.test").await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("sender@remote.test", "alice+news@example.test").await;
    c.cmd("RCPT TO:<Alice+Other+Tag@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<alice+@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<+alice@example.test>", "550 5.1.1").await;
    c.cmd("RCPT TO:<nobody+news@example.test>", "550 5.1.1").await;
    c.cmd("RCPT TO:<bob+lists@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<someone+x@elsewhere.test>", "550 5.7.1").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    assert_eq!(h.messages("alice@example.test").await.len(), 1, "three forms, one mailbox, once");
    assert_eq!(h.messages("bob+lists@example.test").await.len(), 1);
    assert!(h.messages("bob@example.test").await.is_empty(), "the exact account wins");

    let h = Harness::new(b, config(|c| c.smtp.recipient_delimiter = String::new())).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<sender@remote.test>", "250 2.1.0").await;
    c.cmd("RCPT TO:<alice+news@example.test>", "550 5.1.1").await;
}

/// An alias delivers to each of its accounts, once per mailbox whatever else
/// the envelope names; its subaddresses too; an account deleted since is passed
/// over, and an alias with none left is unknown.
async fn aliases_reach_their_accounts(b: Backend) {
    let h = harness(b).await;
    h.add_account("carol@example.test").await;
    h.store.alias_add("team@example.test", "alice@example.test").await.expect("alias");
    h.store.alias_add("team@example.test", "bob@example.test").await.expect("alias");
    h.store.alias_add("gone@example.test", "carol@example.test").await.expect("alias");
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("sender@remote.test", "team@example.test").await;
    c.cmd("RCPT TO:<alice@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<Team+Plans@example.test>", "250 2.1.5").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    assert_eq!(h.messages("alice@example.test").await.len(), 1, "once, named three ways");
    assert_eq!(h.messages("bob@example.test").await.len(), 1);

    h.store.account_delete("carol@example.test").await.expect("delete");
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<sender@remote.test>", "250 2.1.0").await;
    c.cmd("RCPT TO:<gone@example.test>", "550 5.1.1").await;
}

/// RFC 5321 §4.1.3: a sender at an address literal is accepted and kept as sent;
/// a recipient at one is refused as a policy (5.1.2), never as a syntax error.
async fn address_literals(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<monitor@[192.0.2.7]>", "250 2.1.0").await;
    c.cmd("RCPT TO:<alice@[127.0.0.1]>", "550 5.1.2").await;
    c.cmd("RCPT TO:<alice@[IPv6:::1]>", "550 5.1.2").await;
    c.cmd("RCPT TO:<alice@example.test>", "250 2.1.5").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    let stored = h.messages("alice@example.test").await;
    assert!(stored[0].starts_with(b"Return-Path: <monitor@[192.0.2.7]>\r\n"), "{:?}", stored[0]);
    // Not an address literal: still a syntax error.
    c.cmd("MAIL FROM:<a@[999.0.0.1]>", "501 5.1.7").await;
}

/// The group-commit linger applies only while other commits are in flight: a lone
/// message on an idle server is acknowledged without waiting for company.
async fn lone_message_does_not_linger(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.group_commit_max_wait_ms = 2_000)).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("a@remote.test", "alice@example.test").await;
    c.cmd("DATA", "354").await;
    let started = std::time::Instant::now();
    c.send(&format!("{MSG}.\r\n")).await;
    c.expect("250 2.0.0").await;
    assert!(started.elapsed() < Duration::from_millis(1_500), "lingered {:?}", started.elapsed());
}

async fn sequence_errors_before_greeting(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect(&h.mx);
    c.expect("220 ").await;
    c.cmd("MAIL FROM:<a@remote.test>", "503 5.5.1 Send EHLO/HELO first").await;
    c.cmd("EHLO", "501 5.5.4").await;
    c.cmd("FOO bar", "500 5.5.2").await;
    c.cmd("ETRN example.test", "502 5.5.1").await;
    c.cmd("NOOP", "250 2.0.0").await;
    c.cmd("HELP", "214 2.0.0").await;
    c.cmd("VRFY alice@example.test", "252 2.5.0").await;
    c.cmd("EXPN staff", "502 5.5.1").await;
    c.cmd("STARTTLS", "454 4.7.0").await;
    // RFC 3207 §4: no parameters.
    c.cmd("STARTTLS now", "501 5.5.4").await;
    c.cmd("AUTH PLAIN AGFsaWNlAHB3", "502 5.5.1").await;
}

async fn too_many_recipients(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.max_recipients = 2)).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("a@remote.test", "alice@example.test").await;
    c.cmd("RCPT TO:<bob@example.test>", "250 ").await;
    c.cmd("RCPT TO:<carol@example.test>", "452 4.5.3").await;
}

async fn unsupported_parameters(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<a@remote.test> REQUIRETLS", "555 5.5.4").await;
    c.cmd("MAIL FROM:<a@remote.test> BODY=BINARYMIME", "555 5.5.4").await;
    c.cmd("MAIL FROM:<a@remote.test> FOO=BAR", "555 5.5.4").await;
    c.cmd("MAIL FROM:<a@remote.test> SIZE=99999999999", "552 5.3.4").await;
    c.cmd("MAIL FROM:<a@remote.test>", "250 ").await;
    c.cmd("RCPT TO:<alice@example.test> RRVS=2030-01-01T00:00:00Z", "555 5.5.4").await;
}

/// The DSN extension (RFC 3461): its parameters are checked; a local delivery
/// whose sender asked for success is reported with the ENVID and ORCPT given,
/// to that sender (queued: it is remote) with the null sender; NOTIFY=NEVER
/// silences the report of a recipient without room.
async fn dsn_parameters_and_success_reports(b: Backend) {
    let h = harness(b).await;
    // Room for the first message, not for the second.
    h.store.account_set_quota("alice@example.test", Some(2500)).await.expect("quota");
    // From a trusted network: reports go only to senders known to be who they
    // say (smtp_senders.rs has the others).
    let mut c = h.connect_from(&h.mx, "127.0.0.1:40000".parse().expect("addr"));
    c.ehlo().await;
    c.cmd("MAIL FROM:<sender@remote.test> RET=FULL RET=HDRS", "501 5.5.4").await;
    c.cmd(&format!("MAIL FROM:<sender@remote.test> ENVID={}", "x".repeat(101)), "501 ").await;
    c.cmd("MAIL FROM:<sender@remote.test> RET=HDRS ENVID=QQ+2B1", "250 2.1.0").await;
    c.cmd("RCPT TO:<alice@example.test> NOTIFY=NEVER,SUCCESS", "501 5.5.4").await;
    c.cmd("RCPT TO:<alice@example.test> NOTIFY=SOMETIMES", "501 ").await;
    c.cmd(
        "RCPT TO:<alice@example.test> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;Alice+40example.test",
        "250 2.1.5",
    )
    .await;
    c.cmd("RCPT TO:<bob@example.test> NOTIFY=NEVER", "250 2.1.5").await;
    c.data("Subject: report me\r\n\r\nthe body\r\n.\r\n", "250 2.0.0").await;
    assert_eq!(h.messages("alice@example.test").await.len(), 1);
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
    let queued = h.store.queue_list(10).await.expect("queue");
    assert_eq!(queued.len(), 1, "one report: {queued:?}");
    assert_eq!(
        (queued[0].sender.as_str(), queued[0].recipients.as_slice()),
        ("", &["sender@remote.test".to_string()][..])
    );
    let (_, report) = h.store.queue_get(queued[0].id).await.expect("queue entry").expect("queued");
    let report = String::from_utf8_lossy(&report);
    assert!(report.contains("Subject: Successful Mail Delivery Report"), "{report}");
    assert!(report.contains("Original-Envelope-Id: QQ+1\r\n"), "{report}");
    assert!(
        report.contains("Original-Recipient: rfc822; Alice@example.test\r\nFinal-Recipient: rfc822; alice@example.test\r\nAction: delivered\r\nStatus: 2.0.0"),
        "{report}"
    );
    assert!(!report.contains("bob@example.test"), "bob asked for nothing: {report}");
    assert!(report.contains("Subject: report me") && !report.contains("the body"), "{report}");
    h.store.queue_delete(queued[0].id).await.expect("delete");

    // No room for alice, who asked to hear of nothing: no report at all.
    c.cmd("MAIL FROM:<sender@remote.test>", "250 2.1.0").await;
    c.cmd("RCPT TO:<bob@example.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<alice@example.test> NOTIFY=NEVER", "250 2.1.5").await;
    c.data(&data_of(3000), "250 2.0.0").await;
    assert_eq!(h.messages("alice@example.test").await.len(), 1, "no room for alice");
    assert!(h.store.queue_list(10).await.expect("queue").is_empty(), "NOTIFY=NEVER: no report");

    // An ORCPT of RFC 6533's utf-8 type (RFC 3461 §4.2 allows any type) is
    // taken and comes back in the report as it was given.
    c.cmd("MAIL FROM:<sender@remote.test>", "250 2.1.0").await;
    c.cmd("RCPT TO:<bob@example.test> ORCPT=utf-8;", "501 ").await;
    c.cmd("RCPT TO:<bob@example.test> NOTIFY=SUCCESS ORCPT=UTF-8;b\\x{F6}b@example.test", "250 2.1.5").await;
    c.data("Subject: utf-8 orcpt\r\n\r\nx\r\n.\r\n", "250 2.0.0").await;
    let queued = h.store.queue_list(10).await.expect("queue");
    assert_eq!(queued.len(), 1, "{queued:?}");
    let (_, report) = h.store.queue_get(queued[0].id).await.expect("queue entry").expect("queued");
    let report = String::from_utf8_lossy(&report);
    assert!(
        report.contains("Original-Recipient: utf-8; b\\x{F6}b@example.test\r\nFinal-Recipient: rfc822; bob@example.test\r\n"),
        "{report}"
    );
    c.cmd("QUIT", "221").await;
}

async fn smtputf8_addresses(b: Backend) {
    let h = harness(b).await;
    h.add_account("jörg@example.test").await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<jürgen@remote.test>", "553 5.6.7").await;
    c.cmd("MAIL FROM:<jürgen@remote.test> SMTPUTF8", "250 ").await;
    c.cmd("RCPT TO:<jörg@example.test>", "250 ").await;
    c.data("Subject: Grüße\r\n\r\nÄ\r\n.\r\n", "250 2.0.0").await;
    let msgs = h.messages("jörg@example.test").await;
    assert_eq!(msgs.len(), 1);
    let raw = String::from_utf8(msgs[0].to_vec()).unwrap();
    assert!(raw.contains("with UTF8SMTP id"), "{raw}");
    assert!(raw.starts_with("Return-Path: <jürgen@remote.test>"), "{raw}");
}

async fn smuggling_bare_lf_does_not_end_data(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("a@remote.test", "alice@example.test").await;
    c.cmd("DATA", "354").await;
    // The classic smuggling payload: "\n.\n" then a second transaction.
    c.send(
        "Subject: x\r\n\r\nbody\n.\nMAIL FROM:<admin@example.test>\r\nRCPT TO:<bob@example.test>\r\nDATA\r\n\
         Subject: smuggled\r\n\r\nevil\r\n.\r\n",
    )
    .await;
    // Only now does the data end, and the whole of it is refused.
    c.expect("550 5.6.0").await;
    c.cmd("NOOP", "250 2.0.0").await;
    assert_eq!(h.total_messages().await, 0);

    for payload in ["a\r.\r\nMAIL FROM:<x@y.test>\r\n", "a\r\n.\nRCPT TO:<bob@example.test>\r\n", "a\n.\r\n"]
    {
        c.envelope("a@remote.test", "alice@example.test").await;
        c.cmd("DATA", "354").await;
        c.send(payload).await;
        c.send("tail\r\n.\r\n").await;
        c.expect("550 5.6.0").await;
    }
    assert_eq!(h.total_messages().await, 0);

    // Commands end with CRLF too (RFC 5321 §2.3.8): one ended by a bare LF is
    // refused and not run; the session goes on.
    c.send("MAIL FROM:<a@remote.test>\nRCPT TO:<alice@example.test>\n").await;
    c.expect("500 5.5.2").await;
    c.expect("500 5.5.2").await;
    c.cmd("RCPT TO:<alice@example.test>", "503 5.5.1").await;
    c.cmd("NOOP", "250 2.0.0").await;
}

async fn oversized_data_is_refused_and_not_buffered(b: Backend) {
    let h = Harness::new(
        b,
        config(|c| {
            c.smtp.max_message_size = 10_000;
            c.smtp.max_discard_size = 1_000_000;
        }),
    )
    .await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("a@remote.test", "alice@example.test").await;
    c.cmd("DATA", "354").await;
    let line = "x".repeat(998) + "\r\n";
    for _ in 0..100 {
        c.send(&line).await;
    }
    c.send(".\r\n").await;
    c.expect("552 5.3.4").await;
    // The session goes on.
    c.envelope("a@remote.test", "alice@example.test").await;
    c.cmd("DATA", "354").await;
    // Past the discard bound the server gives up on the connection.
    let chunk = "y".repeat(998) + "\r\n";
    let mut closed = false;
    for _ in 0..2000 {
        if tokio::io::AsyncWriteExt::write_all(&mut c.io, chunk.as_bytes()).await.is_err() {
            closed = true;
            break;
        }
    }
    if !closed {
        c.expect("552 5.3.4").await;
    }
    c.expect_closed().await;
    assert_eq!(h.total_messages().await, 0);
}

async fn bdat_chunks_exact_sizes(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("a@remote.test", "alice@example.test").await;
    // Chunk content that looks like commands and terminators is just content.
    let part1 = "Subject: b\r\n\r\n.\r\nQUIT\r\n";
    c.send(&format!("BDAT {}\r\n{part1}", part1.len())).await;
    c.expect(&format!("250 2.0.0 {} octets", part1.len())).await;
    c.cmd("DATA", "503 5.5.1").await;
    let part2 = "bare\nLF ok in BDAT\r\n";
    c.send(&format!("BDAT {} LAST\r\n{part2}", part2.len())).await;
    c.expect("250 2.0.0 OK: queued as").await;
    let msgs = h.messages("alice@example.test").await;
    assert_eq!(msgs.len(), 1);
    assert!(msgs[0].ends_with(format!("{part1}{part2}").as_bytes()));

    // BDAT 0 LAST ends an (empty-bodied) message; BDAT without MAIL is consumed.
    c.send("BDAT 5\r\nhello").await;
    c.expect("503 5.5.1").await;
    c.envelope("a@remote.test", "bob@example.test").await;
    c.send("BDAT 3\r\nabc").await;
    c.expect("250 2.0.0 3 octets").await;
    c.cmd("BDAT 0 LAST", "250 2.0.0 OK").await;
    // A last chunk without a final CRLF gets one: a message ends with a line.
    assert!(h.messages("bob@example.test").await[0].ends_with(b"\r\nabc\r\n"));
    c.cmd("BDAT x", "501 5.5.4").await;
}

async fn bdat_over_limit(b: Backend) {
    let h = Harness::new(
        b,
        config(|c| {
            c.smtp.max_message_size = 100;
            c.smtp.max_discard_size = 1000;
        }),
    )
    .await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("a@remote.test", "alice@example.test").await;
    c.send(&format!("BDAT 60\r\n{}", "a".repeat(60))).await;
    c.expect("250 ").await;
    c.send(&format!("BDAT 60\r\n{}", "b".repeat(60))).await;
    c.expect("552 5.3.4").await;
    // Transaction over: further chunks are consumed and refused.
    c.send(&format!("BDAT 10 LAST\r\n{}", "c".repeat(10))).await;
    c.expect("503 5.5.1").await;
    c.cmd("NOOP", "250 ").await;
    // A chunk announced beyond the discard bound closes the connection.
    c.envelope("a@remote.test", "alice@example.test").await;
    c.send("BDAT 100000 LAST\r\n").await;
    c.expect("552 5.3.4").await;
    c.expect_closed().await;
    assert_eq!(h.total_messages().await, 0);
}

async fn pipelined_commands_answered_in_one_flush(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.send("MAIL FROM:<a@remote.test>\r\nRCPT TO:<alice@example.test>\r\nRCPT TO:<nobody@example.test>\r\nRCPT TO:<bob@example.test>\r\nDATA\r\n").await;
    let first = String::from_utf8(c.read_once().await).unwrap();
    let codes: Vec<&str> = first.lines().map(|l| &l[..3]).collect();
    assert_eq!(codes, ["250", "250", "550", "250", "354"], "all replies in one write: {first:?}");
    c.send(&format!("{MSG}.\r\nMAIL FROM:<a@remote.test>\r\nRCPT TO:<bob@example.test>\r\nDATA\r\n")).await;
    let second = String::from_utf8(c.read_once().await).unwrap();
    let codes: Vec<&str> = second.lines().map(|l| &l[..3]).collect();
    assert_eq!(codes, ["250", "250", "250", "354"], "{second:?}");
    c.send(".\r\nQUIT\r\n").await;
    c.expect("250 ").await;
    c.expect("221 ").await;
    assert_eq!(h.messages("bob@example.test").await.len(), 2);
}

async fn long_lines_and_error_limit(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.max_errors = 5)).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.send(&"A".repeat(10_000)).await;
    c.expect("500 5.5.6").await;
    c.send("\r\n").await;
    c.cmd("NOOP", "250 ").await;
    c.send(&format!("NOOP {}\r\n", "x".repeat(5000))).await;
    c.expect("500 5.5.6").await;
    // Two errors so far; two more, then the fifth closes the session.
    for _ in 0..2 {
        c.cmd("BOGUS", "500 5.5.2").await;
    }
    c.send("BOGUS\r\n").await;
    c.expect("500 5.5.2").await;
    c.expect("421 4.7.0").await;
    c.expect_closed().await;
}

async fn store_failure_acknowledges_nothing(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    h.store.fail.store(true, Ordering::SeqCst);
    c.envelope("a@remote.test", "alice@example.test").await;
    c.data(&format!("{MSG}.\r\n"), "451 4.3.0").await;
    assert_eq!(h.total_messages().await, 0);
    h.store.fail.store(false, Ordering::SeqCst);
    c.envelope("a@remote.test", "alice@example.test").await;
    c.data(&format!("{MSG}.\r\n"), "250 2.0.0").await;
    assert_eq!(h.total_messages().await, 1);
}

async fn shutdown_says_421(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    h.shutdown_tx.send(true).unwrap();
    c.expect("421 4.3.2").await;
    c.expect_closed().await;
    // New sessions are told at once.
    let mut c = h.connect(&h.mx);
    c.expect("421 4.3.2").await;
}

/// A drain that begins while a message is on its way in lets it finish: the client
/// gets its 250 and the message is stored; the 421 comes after.
async fn shutdown_finishes_the_message_in_transfer(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.envelope("a@remote.test", "alice@example.test").await;
    c.cmd("DATA", "354").await;
    c.send("From: a@remote.test\r\nSubject: in flight\r\n\r\nfirst half\r\n").await;
    h.shutdown_tx.send(true).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    c.send("second half\r\n.\r\n").await;
    c.expect("250 2.0.0").await;
    assert_eq!(h.total_messages().await, 1);
    // Then the drain goes on: the session says 421 at once, unasked (RFC 5321 §3.8).
    c.expect("421 4.3.2").await;
    c.expect_closed().await;
}

async fn command_timeout_says_421(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.command_timeout_secs = 1)).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.expect("421 4.4.2").await;
    c.expect_closed().await;
}

async fn per_ip_connection_limit(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.max_connections_per_ip = 1)).await;
    let mut a = h.connect(&h.mx);
    a.expect("220 ").await;
    let mut b = h.connect(&h.mx);
    b.expect("421 4.7.0").await;
    let mut other = h.connect_from(&h.mx, "198.51.100.7:1".parse().unwrap());
    other.expect("220 ").await;
    a.cmd("QUIT", "221 ").await;
    a.expect_closed().await;
    let mut c = h.connect(&h.mx);
    c.expect("220 ").await;
}

async fn submission_requires_auth_and_tls(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect(&h.submission);
    let ehlo = c.ehlo().await;
    assert!(!ehlo.iter().any(|l| l.contains("AUTH")), "no AUTH over plaintext: {ehlo:?}");
    c.cmd("MAIL FROM:<alice@example.test>", "530 5.7.0").await;
    c.cmd("AUTH PLAIN AGFsaWNlQGV4YW1wbGUudGVzdABhbGljZS1wYXNzd29yZA==", "538 5.7.11").await;
}

async fn submission_auth_exchanges(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.require_tls_for_auth = false)).await;
    let mut c = h.connect(&h.submission);
    let ehlo = c.ehlo().await;
    assert!(ehlo.iter().any(|l| l[4..] == *"AUTH PLAIN LOGIN"), "{ehlo:?}");
    c.cmd("AUTH CRAM-MD5", "504 5.5.4").await;
    c.cmd("AUTH PLAIN", "334 ").await;
    c.cmd("*", "501 5.0.0").await;
    c.cmd("AUTH PLAIN", "334 ").await;
    c.cmd("not base64!", "501 5.5.2").await;
    c.cmd("AUTH PLAIN", "334 ").await;
    c.cmd("Zm9v", "501 5.5.2 Invalid PLAIN").await;
    // Well-formed, but acting for another identity: an authorization failure
    // (RFC 4954 §6), not a syntax error.
    c.cmd("AUTH PLAIN", "334 ").await;
    let other = base64_encode(&format!("bob@example.test\0alice@example.test\0{PASSWORD}"));
    c.cmd(&other, "535 5.7.8").await;
    c.cmd("AUTH LOGIN", "334 VXNlcm5hbWU6").await;
    c.cmd("YWxpY2VAZXhhbXBsZS50ZXN0", "334 UGFzc3dvcmQ6").await;
    c.cmd("d3Jvbmc=", "535 5.7.8").await;
    // PLAIN without initial response, then the PLAIN message.
    c.cmd("AUTH PLAIN", "334 ").await;
    let plain = base64_encode(&format!("\0alice@example.test\0{PASSWORD}"));
    c.cmd(&plain, "235 2.7.0").await;
    c.cmd("AUTH PLAIN", "503 5.5.1").await;
}

fn base64_encode(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

async fn submission_login_and_send(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.require_tls_for_auth = false)).await;
    let mut c = h.connect_ehlo(&h.submission).await;
    c.cmd("AUTH LOGIN", "334 VXNlcm5hbWU6").await;
    c.cmd(&base64_encode("bob@example.test"), "334 UGFzc3dvcmQ6").await;
    c.cmd(&base64_encode(PASSWORD), "235 2.7.0").await;
    c.cmd("MAIL FROM:<alice@example.test>", "553 5.7.1").await;
    c.envelope("BOB@example.test", "alice@example.test").await;
    c.cmd("RCPT TO:<friend@elsewhere.test>", "250 2.1.5").await;
    c.cmd("RCPT TO:<nobody@example.test>", "550 5.1.1").await;
    c.data("Subject: out\r\n\r\nhello\r\n.\r\n", "250 2.0.0").await;
    let local = h.messages("alice@example.test").await;
    assert_eq!(local.len(), 1);
    assert!(String::from_utf8_lossy(&local[0]).contains("with ESMTPA id"), "authenticated: {:?}", local[0]);
    let queued = h.store.queue_claim("test", 10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].recipients, vec!["friend@elsewhere.test".to_string()]);
    assert_eq!(queued[0].sender, "BOB@example.test");
    // The submission agent completed the header (RFC 6409 §8.2, §8.3): the
    // client's fields first, then Date and Message-ID; the body as sent.
    let out = String::from_utf8_lossy(&queued[0].raw).into_owned();
    let (header, body) = out.split_once("\r\n\r\n").expect("header and body");
    assert_eq!(body, "hello\r\n");
    let fields: Vec<&str> = header.split("\r\n").collect();
    assert!(fields.iter().rev().nth(2) == Some(&"Subject: out"), "{out}");
    assert!(fields.iter().rev().nth(1).is_some_and(|f| f.starts_with("Date: ")), "{out}");
    assert!(
        fields.last().is_some_and(|f| f.starts_with("Message-ID: <") && f.ends_with("@mx.test>")),
        "{out}"
    );
    assert_eq!(
        local[0].as_ref().windows(12).filter(|w| w == b"Message-ID: ").count(),
        1,
        "the local copy too"
    );
}

/// Local and remote recipients in one message: when the local delivery fails, the
/// remote copy queued just before is withdrawn, so the client's retry after the 4xx
/// leaves exactly one copy of each.
async fn failed_local_delivery_withdraws_the_queued_copy(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.require_tls_for_auth = false)).await;
    let mut c = h.connect_ehlo(&h.submission).await;
    c.cmd(&format!("AUTH PLAIN {}", base64_encode(&format!("\0bob@example.test\0{PASSWORD}"))), "235").await;
    h.store.fail_deliveries.store(true, Ordering::SeqCst);
    for attempt in ["451 4.3.0", "250 2.0.0"] {
        c.envelope("bob@example.test", "alice@example.test").await;
        c.cmd("RCPT TO:<friend@elsewhere.test>", "250").await;
        c.data("Subject: both\r\n\r\nhello\r\n.\r\n", attempt).await;
        h.store.fail_deliveries.store(false, Ordering::SeqCst);
    }
    assert_eq!(h.messages("alice@example.test").await.len(), 1);
    let queued = h.store.queue_claim("test", 10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(queued.len(), 1, "one remote copy after the retry");
}

async fn submission_initial_response(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.require_tls_for_auth = false)).await;
    let mut c = h.connect_ehlo(&h.submission).await;
    let wrong = base64_encode("\0alice@example.test\0nope");
    c.cmd(&format!("AUTH PLAIN {wrong}"), "535 5.7.8").await;
    let right = base64_encode(&format!("alice@example.test\0alice@example.test\0{PASSWORD}"));
    c.cmd(&format!("AUTH PLAIN {right}"), "235 2.7.0").await;
    c.cmd("MAIL FROM:<alice@example.test>", "250 ").await;
    c.cmd("AUTH LOGIN", "503 5.5.1").await;
}

async fn metrics_are_counted(b: Backend) {
    let h = harness(b).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<a@remote.test>", "250 ").await;
    c.cmd("RCPT TO:<nobody@example.test>", "550 ").await;
    c.cmd("RCPT TO:<alice@example.test>", "250 ").await;
    c.data(&format!("{MSG}.\r\n"), "250 ").await;
    let text = {
        let mut out = Vec::new();
        let enc = prometheus::TextEncoder::new();
        prometheus::Encoder::encode(&enc, &h.app.metrics.registry.gather(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    for needle in [
        r#"mail_commands_total{command="RCPT",protocol="smtp",result="5xx"} 1"#,
        r#"mail_commands_total{command="RCPT",protocol="smtp",result="2xx"} 1"#,
        r#"mail_commands_total{command="DATA",protocol="smtp",result="2xx"} 1"#,
        r#"mail_deliveries_total{result="ok"} 1"#,
        r#"mail_smtp_messages_total{listener="smtp"} 1"#,
        r#"mail_group_commit_batch_size_count 1"#,
        r#"mail_command_duration_seconds_count{command="MAIL",protocol="smtp"} 1"#,
        r#"mail_smtp_delivery_seconds_count{listener="smtp"} 1"#,
    ] {
        assert!(text.contains(needle), "{needle} missing in\n{text}");
    }
    assert!(text.contains(&format!(r#"mail_smtp_bytes_total{{listener="smtp"}} {}"#, MSG.len())), "{text}");
}

async fn concurrent_deliveries_share_commits(b: Backend) {
    let h = harness(b).await;
    h.store.commit_delay_ms.store(20, Ordering::SeqCst);
    let mut tasks = Vec::new();
    for i in 0..40u32 {
        let mut c = h.connect_from(&h.mx, format!("203.0.113.{}:1000", i + 1).parse().unwrap());
        tasks.push(tokio::spawn(async move {
            c.ehlo().await;
            c.envelope("a@remote.test", "alice@example.test").await;
            c.data(&format!("Subject: {i}\r\n\r\nx\r\n.\r\n"), "250 2.0.0").await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let batches = h.store.batches.lock().unwrap().clone();
    assert_eq!(batches.iter().sum::<usize>(), 40);
    assert!(batches.len() < 40, "deliveries were grouped: {batches:?}");
    assert_eq!(h.messages("alice@example.test").await.len(), 40);
}

/// A body of `octets` octets, dot-stuffing free, ending the DATA.
fn data_of(octets: usize) -> String {
    let head = "Subject: sized\r\n\r\n";
    format!("{head}{}\r\n.\r\n", "x".repeat(octets - head.len() - 2))
}

/// RFC 9208 at delivery: a full account is refused at RCPT for now (452 4.2.2), a
/// declared SIZE that cannot fit for good (552 5.2.2); a message that does not
/// fit is refused after DATA when it was for that account alone, and otherwise
/// delivered to the others with a DSN to the sender for the account without room.
async fn quota_at_delivery(b: Backend) {
    let h = harness(b).await;
    h.store.account_set_quota("alice@example.test", Some(4096)).await.expect("quota");
    let (alice, _) = h.inbox_of("alice@example.test").await;
    let mut c = h.connect_ehlo(&h.mx).await;
    c.cmd("MAIL FROM:<sender@remote.test> SIZE=5000", "250 2.1.0").await;
    c.cmd("RCPT TO:<alice@example.test>", "552 5.2.2").await;
    c.cmd("RCPT TO:<bob@example.test>", "250 2.1.5").await;
    c.cmd("RSET", "250").await;

    // Fits: stored, trace headers included in the usage.
    c.cmd("MAIL FROM:<sender@remote.test> SIZE=2000", "250 2.1.0").await;
    c.cmd("RCPT TO:<alice@example.test>", "250 2.1.5").await;
    c.data(&data_of(2000), "250 2.0.0").await;
    let used = h.store.quota(alice).await.expect("quota").used;
    assert!(used > 2000, "the stored message is the one counted: {used}");

    // Does not fit, alice alone: refused, nothing stored, nothing queued.
    c.envelope("sender@remote.test", "alice@example.test").await;
    c.data(&data_of(3000), "552 5.2.2").await;
    assert_eq!(h.messages("alice@example.test").await.len(), 1);
    assert!(h.store.queue_list(10).await.expect("queue").is_empty());

    // Alice and Bob: Bob gets it, the sender gets a DSN naming Alice.
    c.envelope("sender@remote.test", "alice@example.test").await;
    c.cmd("RCPT TO:<bob@example.test>", "250 2.1.5").await;
    c.data(&data_of(3000), "250 2.0.0").await;
    assert_eq!(h.messages("alice@example.test").await.len(), 1, "no room for alice");
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
    let queued = h.store.queue_list(10).await.expect("queue");
    assert_eq!(queued.len(), 1, "one DSN: {queued:?}");
    assert_eq!(queued[0].sender, "", "a DSN has the null sender");
    assert_eq!(queued[0].recipients, ["sender@remote.test"]);
    let (_, dsn) = h.store.queue_get(queued[0].id).await.expect("queue entry").expect("queued");
    let dsn = String::from_utf8_lossy(&dsn);
    assert!(dsn.contains("Final-Recipient: rfc822; alice@example.test"), "{dsn}");
    assert!(dsn.contains("Status: 5.2.2"), "{dsn}");
    assert!(!dsn.contains("bob@example.test"), "bob got it: {dsn}");

    // Full to the octet: refused at RCPT, temporarily.
    h.store.account_set_quota("alice@example.test", Some(used)).await.expect("quota");
    c.cmd("MAIL FROM:<sender@remote.test>", "250 2.1.0").await;
    c.cmd("RCPT TO:<alice@example.test>", "452 4.2.2").await;
    c.cmd("QUIT", "221").await;
}

both_backends!(
    dsn_parameters_and_success_reports,
    quota_at_delivery,
    submission_login_and_send,
    submission_initial_response,
    failed_local_delivery_withdraws_the_queued_copy,
    delivery_publishes_mailbox_event,
    ehlo_lists_extensions_for_mx,
    mx_delivery_stores_once_with_trace_headers,
    recipient_errors_and_cache,
    recipient_entries_are_refreshed_before_they_expire,
    postmaster_is_always_accepted,
    postmaster_gets_a_mailbox_of_its_own,
    subaddresses_reach_their_user,
    aliases_reach_their_accounts,
    address_literals,
    lone_message_does_not_linger,
    sequence_errors_before_greeting,
    too_many_recipients,
    unsupported_parameters,
    smtputf8_addresses,
    smuggling_bare_lf_does_not_end_data,
    oversized_data_is_refused_and_not_buffered,
    bdat_chunks_exact_sizes,
    bdat_over_limit,
    pipelined_commands_answered_in_one_flush,
    long_lines_and_error_limit,
    store_failure_acknowledges_nothing,
    shutdown_says_421,
    shutdown_finishes_the_message_in_transfer,
    command_timeout_says_421,
    per_ip_connection_limit,
    submission_requires_auth_and_tls,
    submission_auth_exchanges,
    metrics_are_counted,
    concurrent_deliveries_share_commits,
);
