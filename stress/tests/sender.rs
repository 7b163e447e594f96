//! Who a delivery says it is from. With authentication the envelope sender and the
//! `From:` header are the authenticated user, as a mail client sends them; a
//! scenario's `sender` overrides both, and a submission server that refuses a sender
//! the login does not own (553) is counted as such.

mod common;

use std::sync::{Arc, Mutex};

use base64::Engine;
use common::*;
use mailcluster_api::stress::AuthMechanism;

/// One transaction as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    login: Option<String>,
    mail_from: String,
    from_header: Option<String>,
}

/// A submission-like server: AUTH PLAIN accepts any password; MAIL FROM must be the
/// authenticated user when there is one (otherwise 553 5.7.1), like Mailcluster's
/// submission listeners.
async fn submission_server(seen: Arc<Mutex<Vec<Seen>>>) -> std::net::SocketAddr {
    serve(move |s| {
        let seen = Arc::clone(&seen);
        async move {
            let mut c = Lines::new(s);
            c.send("220 test ESMTP\r\n").await;
            let mut login: Option<String> = None;
            let mut mail_from: Option<String> = None;
            // AUTH LOGIN: 1 waits for the user name, 2 for the password.
            let mut login_step = 0;
            let b64 = base64::engine::general_purpose::STANDARD;
            while let Some(l) = c.line().await {
                let up = l.to_ascii_uppercase();
                let reply = if login_step == 1 {
                    login = b64.decode(l.trim()).ok().map(|u| String::from_utf8_lossy(&u).into_owned());
                    login_step = 2;
                    "334 UGFzc3dvcmQ6\r\n".to_string()
                } else if login_step == 2 {
                    login_step = 0;
                    "235 2.7.0 ok\r\n".into()
                } else if up.starts_with("AUTH LOGIN") {
                    login_step = 1;
                    "334 VXNlcm5hbWU6\r\n".into()
                } else if up.starts_with("EHLO") {
                    "250-test\r\n250-PIPELINING\r\n250 AUTH PLAIN LOGIN\r\n".to_string()
                } else if up.starts_with("AUTH PLAIN ") {
                    let token = l[11..].trim();
                    let raw = b64.decode(token).unwrap_or_default();
                    let parts: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
                    login = parts.get(1).map(|u| String::from_utf8_lossy(u).into_owned());
                    "235 2.7.0 ok\r\n".into()
                } else if up.starts_with("MAIL FROM:<") {
                    let addr = l[11..].split('>').next().unwrap_or_default().to_string();
                    if login.as_ref().is_some_and(|u| !u.eq_ignore_ascii_case(&addr)) {
                        mail_from = None;
                        "553 5.7.1 Sender address not owned by the authenticated user\r\n".into()
                    } else {
                        mail_from = Some(addr);
                        "250 ok\r\n".into()
                    }
                } else if up.starts_with("RCPT") {
                    if mail_from.is_some() { "250 ok\r\n" } else { "503 need MAIL\r\n" }.into()
                } else if up.starts_with("DATA") {
                    let Some(from) = mail_from.take() else {
                        c.send("503 no valid sender\r\n").await;
                        continue;
                    };
                    c.send("354 go\r\n").await;
                    let Some(lines) = c.body().await else { return };
                    let from_header =
                        lines.iter().find_map(|l| l.strip_prefix("From:")).map(|v| v.trim().to_string());
                    seen.lock().unwrap().push(Seen { login: login.clone(), mail_from: from, from_header });
                    "250 ok\r\n".into()
                } else if up.starts_with("QUIT") {
                    c.send("221 bye\r\n").await;
                    return;
                } else {
                    "250 ok\r\n".into()
                };
                if !c.send(&reply).await {
                    return;
                }
            }
        }
    })
    .await
}

fn deliver_args(addr: std::net::SocketAddr) -> mailcluster_stress::StressArgs {
    closed_loop_deliveries(addr, 3, 30, "5s")
}

#[tokio::test]
async fn authenticated_sessions_send_as_their_user() {
    for mech in [AuthMechanism::Plain, AuthMechanism::Login] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let addr = submission_server(Arc::clone(&seen)).await;
        let mut a = deliver_args(addr);
        a.auth = Some(mech);
        let r = run(a).await;
        let d = op(&r, "deliver");
        assert_eq!((d.ok, d.errors), (30, 0), "{mech:?}: {:?}", d.errors_by_kind);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 30);
        let logins: std::collections::BTreeSet<_> = seen.iter().filter_map(|s| s.login.clone()).collect();
        // Three sessions, three users: the sender varies with the login.
        assert_eq!(logins.len(), 3, "{mech:?}: {seen:?}");
        for s in &seen {
            assert_eq!(s.login.as_deref(), Some(s.mail_from.as_str()), "{s:?}");
            assert!(s.mail_from.ends_with("@example.test"), "{s:?}");
            assert_eq!(
                s.from_header.as_deref(),
                Some(s.mail_from.as_str()),
                "From: follows the envelope: {s:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_scenario_sender_overrides_and_a_refusal_is_counted_as_553() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr = submission_server(Arc::clone(&seen)).await;
    let mut a = deliver_args(addr);
    a.auth = Some(AuthMechanism::Plain);
    a.sender = Some("someone-else@example.test".into());
    let r = run(a).await;
    let d = op(&r, "deliver");
    assert_eq!(d.ok, 0);
    assert_eq!(d.errors_by_kind.get("smtp-553").copied(), Some(30), "{:?}", d.errors_by_kind);
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(r.exit_code(), 3);
}

#[tokio::test]
async fn without_authentication_from_matches_the_envelope() {
    for sender in [None, Some("newsletter@example.test")] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let addr = submission_server(Arc::clone(&seen)).await;
        let mut a = deliver_args(addr);
        a.sender = sender.map(String::from);
        let r = run(a).await;
        assert_eq!(op(&r, "deliver").ok, 30);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 30);
        for s in &seen {
            assert_eq!(s.login, None);
            if let Some(want) = sender {
                assert_eq!(s.mail_from, want);
            }
            assert!(s.mail_from.ends_with("@example.test"), "{s:?}");
            assert_eq!(s.from_header.as_deref(), Some(s.mail_from.as_str()), "{s:?}");
        }
    }
}
