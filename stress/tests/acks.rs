//! Every delivery carries a Message-ID of its own, and `--ack-log` lists exactly the
//! ones the server acknowledged: what an exactly-once check compares the store with.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::*;

/// Message-IDs of the transactions the server saw, by the reply it gave.
#[derive(Default)]
struct Seen {
    accepted: Vec<String>,
    refused: Vec<String>,
    headers_per_message: Vec<usize>,
}

/// Answers every third end of DATA with 451, every other with 250.
async fn picky_server(seen: Arc<Mutex<Seen>>) -> std::net::SocketAddr {
    serve(move |s| {
        let seen = Arc::clone(&seen);
        async move {
            let mut c = Lines::new(s);
            c.send("220 test ESMTP\r\n").await;
            while let Some(l) = c.line().await {
                let up = l.to_ascii_uppercase();
                let reply = if up.starts_with("EHLO") {
                    "250-test\r\n250 PIPELINING\r\n".to_string()
                } else if up.starts_with("DATA") {
                    c.send("354 go\r\n").await;
                    let Some(lines) = c.body().await else { return };
                    let ids: Vec<String> = lines
                        .iter()
                        .take_while(|line| *line != "\r\n")
                        .filter(|line| line.to_ascii_lowercase().starts_with("message-id:"))
                        .map(|line| line[11..].trim().trim_matches(['<', '>']).to_string())
                        .collect();
                    let mut seen = seen.lock().unwrap();
                    seen.headers_per_message.push(ids.len());
                    let id = ids.first().cloned().unwrap_or_default();
                    let n = seen.accepted.len() + seen.refused.len();
                    if n % 3 == 2 {
                        seen.refused.push(id);
                        "451 4.3.0 try again\r\n".into()
                    } else {
                        seen.accepted.push(id);
                        "250 2.0.0 ok\r\n".into()
                    }
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

#[tokio::test]
async fn the_ack_log_lists_exactly_the_acknowledged_messages() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let addr = picky_server(Arc::clone(&seen)).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("acked");
    let mut a = closed_loop_deliveries(addr, 4, 60, "5s");
    a.ack_log = Some(log.clone());
    let r = run(a).await;
    let d = op(&r, "deliver");
    assert_eq!((d.ok, d.errors), (40, 20), "{:?}", d.errors_by_kind);

    let seen = seen.lock().unwrap();
    assert!(
        seen.headers_per_message.iter().all(|n| *n == 1),
        "one Message-ID each: {:?}",
        seen.headers_per_message
    );
    let all: BTreeSet<&String> = seen.accepted.iter().chain(&seen.refused).collect();
    assert_eq!(all.len(), 60, "every message has its own Message-ID");
    let logged: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(String::from).collect();
    let logged_set: BTreeSet<&String> = logged.iter().collect();
    assert_eq!(logged.len(), logged_set.len(), "no id logged twice");
    assert_eq!(logged_set, seen.accepted.iter().collect::<BTreeSet<_>>());
}
