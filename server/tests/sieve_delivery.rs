//! Accounts' Sieve scripts at delivery, through the MX as mail arrives:
//! filing and flags (RFC 5228 §4.1, RFC 5232, RFC 5490 `:create`), reject at
//! the protocol level or by a report (RFC 5429), discard, redirect (RFC 5228
//! §4.2) within the owner's sending limit and without loops, vacation once
//! per sender per period across pods and never to lists (RFC 5230 §4.5/§4.6),
//! and a broken script that loses nothing and tells its owner.

mod smtp_support;

use mailcluster_model::{Flags, UidSet};
use mailcluster_server::store::{Directory, Mailboxes, Messages, Queue, Scripts, SieveQuota};
use smtp_support::{Backend, Client, Harness, config};

const QUOTA: SieveQuota = SieveQuota { max_scripts: 16, max_bytes: 64 * 1024 };

/// Stores `source` as the account's active script (as ManageSieve does on
/// this pod).
async fn activate(h: &Harness, email: &str, source: &str) {
    let id = h.store.account_get(email).await.unwrap().unwrap().id;
    h.store.sieve_put(id, "main", source.as_bytes(), QUOTA).await.expect("stored");
    h.store.sieve_activate(id, Some("main")).await.expect("activated");
    h.app.sieve.forget(id);
}

/// One message over the MX; the reply to the end of DATA.
async fn send(c: &mut Client, from: &str, to: &[&str], message: &str) -> Vec<String> {
    c.cmd(&format!("MAIL FROM:<{from}>"), "250").await;
    for rcpt in to {
        c.cmd(&format!("RCPT TO:<{rcpt}>"), "250").await;
    }
    c.cmd("DATA", "354").await;
    c.send(&format!("{message}\r\n.\r\n")).await;
    c.reply().await
}

/// `(flags, raw)` of each message in `email`'s mailbox `name`, in UID order.
async fn mailbox(h: &Harness, email: &str, name: &str) -> Option<Vec<(Flags, Vec<String>, String)>> {
    let account = h.store.account_get(email).await.unwrap().unwrap();
    let mailbox = h.store.mailbox_get(account.id, name).await.unwrap()?;
    let rows = h.store.messages_by_uid(mailbox.id, &UidSet::all()).await.unwrap();
    let mut out = Vec::new();
    for row in rows {
        let body = h.store.message_body(row.message_id).await.unwrap();
        out.push((row.flags.system, row.flags.keywords.clone(), String::from_utf8_lossy(&body).into_owned()));
    }
    Some(out)
}

fn message(from: &str, to: &str, subject: &str, extra: &str) -> String {
    format!(
        "From: <{from}>\r\nTo: <{to}>\r\nSubject: {subject}\r\nMessage-ID: <{}@remote.example>\r\n{extra}\r\nbody\r\n",
        subject.replace(' ', "."),
    )
}

async fn list_mail_is_filed_and_flagged(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    activate(
        &h,
        "alice@example.test",
        r#"require ["fileinto", "imap4flags", "mailbox"];
           if header :contains "List-Id" "dev.example.org" { fileinto :create "Lists/dev"; stop; }
           if address :is "from" "boss@example.org" { addflag ["\\Flagged", "$Important"]; }
           keep;"#,
    )
    .await;
    let mut c = h.connect_ehlo(&h.mx).await;
    let to = ["alice@example.test"];
    let list = message("dev@example.org", to[0], "release", "List-Id: Developers <dev.example.org>\r\n");
    assert!(send(&mut c, "dev-bounces@example.org", &to, &list).await[0].starts_with("250"));
    let boss = message("boss@example.org", to[0], "numbers", "");
    assert!(send(&mut c, "boss@example.org", &to, &boss).await[0].starts_with("250"));
    let plain = message("friend@example.org", to[0], "hello", "");
    assert!(send(&mut c, "friend@example.org", &to, &plain).await[0].starts_with("250"));

    let lists = mailbox(&h, "alice@example.test", "Lists/dev").await.expect(":create made the mailbox");
    assert_eq!(lists.len(), 1, "the list message, only");
    assert!(lists[0].2.contains("Subject: release"));
    let inbox = mailbox(&h, "alice@example.test", "INBOX").await.unwrap();
    assert_eq!(inbox.len(), 2, "the other two: {inbox:?}");
    assert!(inbox[0].2.contains("Subject: numbers"));
    assert!(inbox[0].0.contains(Flags::FLAGGED), "addflag stored with the message");
    assert_eq!(inbox[0].1, vec!["$Important".to_string()]);
    assert_eq!(inbox[1].0, Flags::NONE, "no flags for other mail");
    // Bob has no script: his mail is untouched by Alice's.
    let to_bob = message("dev@example.org", "bob@example.test", "release", "List-Id: <dev.example.org>\r\n");
    assert!(send(&mut c, "x@example.org", &["bob@example.test"], &to_bob).await[0].starts_with("250"));
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
}

async fn reject_refuses_at_data_or_reports(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    activate(
        &h,
        "alice@example.test",
        r#"require "reject"; if header :contains "subject" "offer" { reject "No offers, thank you"; }"#,
    )
    .await;
    let mut c = h.connect_ehlo(&h.mx).await;
    // Alone, the refusal is the reply (RFC 5429 §2.1: at the protocol level).
    let offer = message("seller@remote.example", "alice@example.test", "great offer", "");
    let reply = send(&mut c, "seller@remote.example", &["alice@example.test"], &offer).await;
    assert_eq!(reply, vec!["550 5.7.1 No offers, thank you".to_string()]);
    assert!(h.messages("alice@example.test").await.is_empty(), "nothing stored");
    assert!(h.store.queue_list(10).await.unwrap().is_empty(), "and nothing sent");
    // With another recipient that takes it, the transaction succeeds and the
    // sender gets a failure report for Alice (RFC 5429 §2.1.1).
    let reply =
        send(&mut c, "seller@remote.example", &["alice@example.test", "bob@example.test"], &offer).await;
    assert!(reply[0].starts_with("250"), "{reply:?}");
    assert_eq!(h.messages("bob@example.test").await.len(), 1);
    assert!(h.messages("alice@example.test").await.is_empty());
    let queue = h.store.queue_list(10).await.unwrap();
    assert_eq!(queue.len(), 1, "one report: {queue:?}");
    assert_eq!(
        (queue[0].sender.as_str(), queue[0].recipients.clone()),
        ("", vec!["seller@remote.example".into()])
    );
    let (_, raw) = h.store.queue_get(queue[0].id).await.unwrap().unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.contains("Status: 5.7.1") && raw.contains("No offers, thank you"), "{raw}");
    // Mail the script does not refuse is kept.
    let plain = message("seller@remote.example", "alice@example.test", "question", "");
    assert!(
        send(&mut c, "seller@remote.example", &["alice@example.test"], &plain).await[0].starts_with("250")
    );
    assert_eq!(h.messages("alice@example.test").await.len(), 1);
}

async fn discard_and_redirect(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    activate(
        &h,
        "alice@example.test",
        r#"require ["copy"];
           if header :contains "subject" "noise" { discard; stop; }
           if header :contains "subject" "away" { redirect "alice.elsewhere@remote.example"; stop; }
           if header :contains "subject" "share" { redirect :copy "bob@example.test"; }"#,
    )
    .await;
    let mut c = h.connect_ehlo(&h.mx).await;
    let to = ["alice@example.test"];
    let noise = message("x@remote.example", to[0], "noise", "");
    assert!(send(&mut c, "x@remote.example", &to, &noise).await[0].starts_with("250"), "discard is accepted");
    assert!(h.messages("alice@example.test").await.is_empty(), "and stores nothing");

    // To another domain: through the queue, with the original sender, and
    // no copy kept (the redirect cancels the implicit keep).
    let away = message("x@remote.example", to[0], "away", "");
    assert!(send(&mut c, "x@remote.example", &to, &away).await[0].starts_with("250"));
    assert!(h.messages("alice@example.test").await.is_empty());
    let queue = h.store.queue_list(10).await.unwrap();
    assert_eq!(queue.len(), 1, "{queue:?}");
    assert_eq!(queue[0].sender, "x@remote.example");
    assert_eq!(queue[0].recipients, vec!["alice.elsewhere@remote.example".to_string()]);
    let (_, raw) = h.store.queue_get(queue[0].id).await.unwrap().unwrap();
    assert!(raw.starts_with(b"X-Sieve-Redirected-From: <alice@example.test>\r\n"), "{raw:?}");
    assert!(!String::from_utf8_lossy(&raw).contains("Return-Path:"), "a copy in transit has no Return-Path");

    // To a local account, with :copy: both have it.
    let share = message("x@remote.example", to[0], "share", "");
    assert!(send(&mut c, "x@remote.example", &to, &share).await[0].starts_with("250"));
    assert_eq!(h.messages("alice@example.test").await.len(), 1, ":copy keeps it");
    let bobs = h.messages("bob@example.test").await;
    assert_eq!(bobs.len(), 1);
    assert!(bobs[0].starts_with(b"X-Sieve-Redirected-From: <alice@example.test>\r\n"));

    // A message Alice sent on already is kept when it comes back, whatever
    // her script says.
    let back = format!(
        "X-Sieve-Redirected-From: <alice@example.test>\r\n{}",
        message("x@remote.example", to[0], "away", "")
    );
    assert!(send(&mut c, "x@remote.example", &to, &back).await[0].starts_with("250"));
    assert_eq!(h.messages("alice@example.test").await.len(), 2, "kept, not redirected again");
    assert_eq!(h.store.queue_list(10).await.unwrap().len(), 1, "nothing more queued");
}

async fn redirects_stop_at_the_owners_sending_limit(b: Backend) {
    let h = Harness::new(b, config(|c| c.smtp.submission_recipients_per_hour = 2)).await;
    activate(&h, "alice@example.test", r#"redirect "elsewhere@remote.example";"#).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    for i in 0..4 {
        let m = message("x@remote.example", "alice@example.test", &format!("m{i}"), "");
        assert!(send(&mut c, "x@remote.example", &["alice@example.test"], &m).await[0].starts_with("250"));
    }
    let queued: usize = h.store.queue_list(10).await.unwrap().iter().map(|q| q.recipients.len()).sum();
    assert_eq!(queued, 2, "two redirects an hour");
    let inbox = h.messages("alice@example.test").await;
    // The two over the limit are kept, and the owner is told once.
    let notice = |m: &[u8]| String::from_utf8_lossy(m).contains("could not be followed");
    let kept = inbox.iter().filter(|m| !notice(m)).count();
    let notices = inbox.len() - kept;
    assert_eq!(
        (kept, notices),
        (2, 1),
        "{:?}",
        inbox.iter().map(|m| String::from_utf8_lossy(m)).collect::<Vec<_>>()
    );
}

async fn vacation_answers_once_per_sender_across_pods(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    activate(
        &h,
        "alice@example.test",
        r#"require "vacation"; vacation :days 7 :subject "Away until Monday" "I am away; back on Monday.";"#,
    )
    .await;
    let mut c = h.connect_ehlo(&h.mx).await;
    let to = ["alice@example.test"];
    let first = message("bob@remote.example", to[0], "lunch", "");
    assert!(send(&mut c, "bob@remote.example", &to, &first).await[0].starts_with("250"));
    let queue = h.store.queue_list(10).await.unwrap();
    assert_eq!(queue.len(), 1, "one reply: {queue:?}");
    assert_eq!(queue[0].sender, "", "sent with the null reverse path (RFC 5230 §5.1)");
    assert_eq!(queue[0].recipients, vec!["bob@remote.example".to_string()]);
    let (_, raw) = h.store.queue_get(queue[0].id).await.unwrap().unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.contains("Subject: Away until Monday\r\n"), "{raw}");
    assert!(raw.contains("Auto-Submitted: auto-replied"), "{raw}");
    assert!(raw.contains("In-Reply-To: <lunch@remote.example>"), "{raw}");
    assert!(raw.contains("From: <alice@example.test>"), "{raw}");
    // The message itself is kept (vacation does not cancel the implicit keep).
    assert_eq!(h.messages("alice@example.test").await.len(), 1);

    // Again from Bob: no second reply within the period, on this pod…
    let second = message("bob@remote.example", to[0], "lunch again", "");
    assert!(send(&mut c, "bob@remote.example", &to, &second).await[0].starts_with("250"));
    assert_eq!(h.store.queue_list(10).await.unwrap().len(), 1);
    // …nor on another pod of the same store.
    if b == Backend::Postgres {
        let (_peer, peer_mx) = h.peer(config(|_| {})).await;
        let mut c2 = h.connect_ehlo(&peer_mx).await;
        let third = message("bob@remote.example", to[0], "lunch from the other pod", "");
        assert!(send(&mut c2, "bob@remote.example", &to, &third).await[0].starts_with("250"));
        assert_eq!(h.store.queue_list(10).await.unwrap().len(), 1, "one reply per sender across pods");
        assert_eq!(h.messages("alice@example.test").await.len(), 3);
    }
    // Lists and robots get none (RFC 5230 §4.6, RFC 3834 §2).
    let list = message("carol@remote.example", to[0], "digest", "List-Id: <news.remote.example>\r\n");
    assert!(send(&mut c, "news-bounces@remote.example", &to, &list).await[0].starts_with("250"));
    let robot = message("robot@remote.example", to[0], "report", "Auto-Submitted: auto-generated\r\n");
    assert!(send(&mut c, "robot@remote.example", &to, &robot).await[0].starts_with("250"));
    let bounce = message("MAILER-DAEMON@remote.example", to[0], "failure", "");
    assert!(send(&mut c, "", &to, &bounce).await[0].starts_with("250"));
    assert_eq!(h.store.queue_list(10).await.unwrap().len(), 1, "no reply to lists, robots or bounces");
    // Another sender is answered.
    let dave = message("dave@remote.example", to[0], "hi", "");
    assert!(send(&mut c, "dave@remote.example", &to, &dave).await[0].starts_with("250"));
    assert_eq!(h.store.queue_list(10).await.unwrap().len(), 2);
}

async fn a_broken_script_loses_nothing_and_tells_the_owner(b: Backend) {
    let h = Harness::new(b, config(|_| {})).await;
    // A run that takes more actions than a script may: stored past the
    // checker (as a script from an older release could be), run at delivery.
    let mut many = String::from("require [\"fileinto\", \"mailbox\"];\n");
    for i in 0..40 {
        many.push_str(&format!("fileinto :create \"f{i}\";\n"));
    }
    activate(&h, "alice@example.test", &many).await;
    let mut c = h.connect_ehlo(&h.mx).await;
    let to = ["alice@example.test"];
    for subject in ["one", "two"] {
        let m = message("x@remote.example", to[0], subject, "");
        assert!(send(&mut c, "x@remote.example", &to, &m).await[0].starts_with("250"));
    }
    let inbox = h.messages("alice@example.test").await;
    let texts: Vec<String> = inbox.iter().map(|m| String::from_utf8_lossy(m).into_owned()).collect();
    assert_eq!(
        texts.iter().filter(|t| t.contains("Subject: one") || t.contains("Subject: two")).count(),
        2,
        "both kept in INBOX: {texts:?}"
    );
    assert_eq!(
        texts.iter().filter(|t| t.contains("could not be followed")).count(),
        1,
        "told once: {texts:?}"
    );
    // A script that does not compile any more is treated the same way.
    let id = h.store.account_get("bob@example.test").await.unwrap().unwrap().id;
    h.store.sieve_put(id, "old", b"require \"no-such-extension\"; keep;", QUOTA).await.unwrap();
    h.store.sieve_activate(id, Some("old")).await.unwrap();
    h.app.sieve.forget(id);
    let m = message("x@remote.example", "bob@example.test", "three", "");
    assert!(send(&mut c, "x@remote.example", &["bob@example.test"], &m).await[0].starts_with("250"));
    let bobs = h.messages("bob@example.test").await;
    assert_eq!(bobs.len(), 2, "the message and the notice");
}

both_backends!(
    list_mail_is_filed_and_flagged,
    reject_refuses_at_data_or_reports,
    discard_and_redirect,
    redirects_stop_at_the_owners_sending_limit,
    vacation_answers_once_per_sender_across_pods,
    a_broken_script_loses_nothing_and_tells_the_owner,
);
