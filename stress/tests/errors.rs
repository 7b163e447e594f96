//! Error paths are counted by kind / reply code, against small in-test servers.

mod common;

use std::time::Duration;

use common::*;
use mailcluster_api::stress::{ScenarioKind, TlsMode};
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn refused_connections_are_counted() {
    let addr = closed_port().await;
    let r = run(closed_loop_deliveries(addr, 2, 20, "2s")).await;
    let d = op(&r, "deliver");
    assert_eq!(d.ok, 0);
    assert_eq!(d.errors_by_kind.get("refused").copied(), Some(20), "{:?}", d.errors_by_kind);
    assert_eq!(r.verdict, "Fail");
    assert_eq!(r.exit_code(), 3);
}

#[tokio::test]
async fn tls_failures_are_counted() {
    // Speaks plaintext where a TLS ServerHello is expected.
    let addr = serve(|mut s| async move {
        let _ = s.write_all(b"220 not tls at all\r\n").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    })
    .await;
    let mut a = args(&[ScenarioKind::ConnectFlood]);
    a.smtp = Some(addr.to_string());
    a.smtp_tls = Some(TlsMode::Implicit);
    a.insecure = true;
    a.concurrency = Some(5);
    a.duration = Some("0s".into());
    a.ramp_up = Some("0s".into());
    let r = run(a).await;
    let c = op(&r, "connect");
    assert_eq!(c.errors_by_kind.get("tls").copied(), Some(5), "{:?}", c.errors_by_kind);
    assert!(!r.passed());
}

#[tokio::test]
async fn smtp_reply_codes_are_counted_by_code() {
    // RCPT replies cycle 250, 451, 550: a third of the messages each.
    let addr = smtp_server(|n| match n % 3 {
        0 => "250 ok\r\n",
        1 => "451 4.3.0 try later\r\n",
        _ => "550 5.1.1 no such user\r\n",
    })
    .await;
    let r = run(closed_loop_deliveries(addr, 1, 30, "10s")).await;
    let d = op(&r, "deliver");
    assert_eq!(d.ok, 10, "{d:?}");
    assert_eq!(d.errors_by_kind.get("smtp-451").copied(), Some(10), "{:?}", d.errors_by_kind);
    assert_eq!(d.errors_by_kind.get("smtp-550").copied(), Some(10), "{:?}", d.errors_by_kind);
    // The session survived reply errors: one connection for all 30 transactions.
    assert_eq!(op(&r, "smtp-connect").ok, 1);
}

/// A server that is shutting down answers the pipelined MAIL with 421 and closes
/// (RFC 5321 §3.8): that is the error, not the end of stream that follows it.
#[tokio::test]
async fn a_421_to_pipelined_commands_is_counted_as_421() {
    let addr = serve(|s| async move {
        let mut c = Lines::new(s);
        c.send("220 test ESMTP\r\n").await;
        while let Some(l) = c.line().await {
            if l.to_ascii_uppercase().starts_with("EHLO") {
                c.send("250-test\r\n250 PIPELINING\r\n").await;
            } else if l.to_ascii_uppercase().starts_with("MAIL") {
                c.send("421 4.3.2 shutting down\r\n").await;
                return;
            }
        }
    })
    .await;
    let r = run(closed_loop_deliveries(addr, 1, 5, "10s")).await;
    let d = op(&r, "deliver");
    assert_eq!(d.errors_by_kind.get("smtp-421").copied(), Some(5), "{:?}", d.errors_by_kind);
}

/// A draining server sends its 421 between transactions, unasked, and closes
/// (RFC 5321 §3.8). Whichever transaction reads that 421, the session is not used
/// again: the next transaction opens a new connection instead of being written
/// into one whose end of stream is still on its way (a broken connection, never
/// told to come back later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_421_between_transactions_ends_the_session() {
    let addr = serve(|s| async move {
        let mut c = Lines::new(s);
        c.send("220 test ESMTP\r\n").await;
        while let Some(l) = c.line().await {
            let up = l.to_ascii_uppercase();
            if up.starts_with("EHLO") {
                c.send("250-test\r\n250 PIPELINING\r\n").await;
            } else if up.starts_with("DATA") {
                c.send("354 go\r\n").await;
                if c.data().await.is_none() {
                    return;
                }
                c.send("250 ok\r\n").await;
                // The drain starts just after the message: the client may already
                // be writing its next transaction.
                tokio::time::sleep(Duration::from_micros(200)).await;
                c.send("421 4.3.2 shutting down\r\n").await;
                let _ = c.w.shutdown().await;
                while c.line().await.is_some() {}
                return;
            } else {
                c.send("250 ok\r\n").await;
            }
        }
    })
    .await;
    let r = run(closed_loop_deliveries(addr, 8, 600, "20s")).await;
    let d = op(&r, "deliver");
    let kinds: Vec<&String> = d.errors_by_kind.keys().filter(|k| *k != "smtp-421").collect();
    assert!(kinds.is_empty(), "only 421s may fail: {:?}", d.errors_by_kind);
    assert!(d.ok >= 250, "{d:?}");
}

#[tokio::test]
async fn imap_no_replies_are_counted() {
    let addr = serve(|s| async move {
        let mut c = Lines::new(s);
        c.send("* OK [CAPABILITY IMAP4rev1 SASL-IR] ready\r\n").await;
        while let Some(l) = c.line().await {
            let tag = l.split_whitespace().next().unwrap_or("*").to_string();
            let up = l.to_ascii_uppercase();
            let reply = if up.contains(" LOGIN ") || up.contains(" AUTHENTICATE ") {
                format!("{tag} NO [AUTHENTICATIONFAILED] bad\r\n")
            } else if up.contains(" LOGOUT") {
                format!("* BYE\r\n{tag} OK bye\r\n")
            } else {
                format!("{tag} OK done\r\n")
            };
            if !c.send(&reply).await {
                return;
            }
        }
    })
    .await;
    let mut a = args(&[ScenarioKind::Auth]);
    a.imap = Some(addr.to_string());
    a.closed_loop = true;
    a.concurrency = Some(2);
    a.max_ops = Some(8);
    a.duration = Some("5s".into());
    let r = run(a).await;
    let failed: u64 = r
        .totals
        .iter()
        .filter(|(k, _)| k.starts_with("imap-login") || k.starts_with("imap-authenticate"))
        .map(|(_, s)| s.errors_by_kind.get("imap-NO").copied().unwrap_or(0))
        .sum();
    assert_eq!(failed, 8, "{:?}", r.totals);
    assert_eq!(r.success_rate, 0.0);
}

#[tokio::test]
async fn slow_server_times_out() {
    // Greets, then never answers EHLO.
    let addr = serve(|s| async move {
        let mut c = Lines::new(s);
        c.send("220 slow\r\n").await;
        while c.line().await.is_some() {}
    })
    .await;
    let mut a = closed_loop_deliveries(addr, 3, 6, "10s");
    a.timeout = Some("200ms".into());
    let started = std::time::Instant::now();
    let r = run(a).await;
    let d = op(&r, "deliver");
    assert_eq!(d.errors_by_kind.get("timeout").copied(), Some(6), "{:?}", d.errors_by_kind);
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the op timeout");
}

#[tokio::test]
async fn missing_target_is_a_run_error() {
    let a = args(&[ScenarioKind::Search]);
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let mut a2 = a.clone();
    a2.smtp = Some("127.0.0.1:1".into());
    let err = mailcluster_stress::run_with_cancel(a2, rx.clone()).await.expect_err("error");
    assert!(err.to_string().contains("IMAP"), "{err}");
    assert_eq!(mailcluster_stress::run(a).await, mailcluster_stress::EXIT_ERROR);
}

#[tokio::test]
async fn connect_flood_holds_imap_connections() {
    let addr = serve(|s| async move {
        let mut c = Lines::new(s);
        c.send("* OK ready\r\n").await;
        while let Some(l) = c.line().await {
            let tag = l.split_whitespace().next().unwrap_or("*").to_string();
            let bye = if l.to_ascii_uppercase().contains("LOGOUT") { "* BYE\r\n" } else { "" };
            if !c.send(&format!("{bye}{tag} OK done\r\n")).await {
                return;
            }
        }
    })
    .await;
    let mut a = args(&[ScenarioKind::ConnectFlood]);
    a.imap = Some(addr.to_string());
    a.concurrency = Some(20);
    a.duration = Some("300ms".into());
    a.ramp_up = Some("100ms".into());
    let r = run(a).await;
    assert_eq!(op(&r, "connect").ok, 20);
    assert_eq!(op(&r, "hold").ok, 20, "every connection survived the hold and answered NOOP");
    assert!(r.passed());
}
