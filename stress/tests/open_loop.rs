//! Open-loop scheduling: latency counts from the intended send time, so a server
//! stall is charged to every request scheduled during it (no coordinated omission).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mailcluster_api::stress::ScenarioKind;
use tokio::sync::OnceCell;

/// SMTP server that holds every reply during one second, starting 500 ms after the
/// first connection.
async fn stalling_server() -> std::net::SocketAddr {
    let stall: Arc<OnceCell<Instant>> = Arc::new(OnceCell::new());
    serve(move |s| {
        let stall = stall.clone();
        async move {
            let start = *stall.get_or_init(|| async { Instant::now() + Duration::from_millis(500) }).await;
            let end = start + Duration::from_secs(1);
            let mut c = Lines::new(s);
            c.send("220 test\r\n").await;
            while let Some(l) = c.line().await {
                let now = Instant::now();
                if now >= start && now < end {
                    tokio::time::sleep_until(end.into()).await;
                }
                let up = l.to_ascii_uppercase();
                let reply = if up.starts_with("EHLO") {
                    "250-test\r\n250 PIPELINING\r\n"
                } else if up.starts_with("DATA") {
                    c.send("354 go\r\n").await;
                    if c.data().await.is_none() {
                        return;
                    }
                    let now = Instant::now();
                    if now >= start && now < end {
                        tokio::time::sleep_until(end.into()).await;
                    }
                    "250 ok\r\n"
                } else {
                    "250 ok\r\n"
                };
                if !c.send(reply).await {
                    return;
                }
            }
        }
    })
    .await
}

fn deliver_args(addr: std::net::SocketAddr) -> mailcluster_stress::StressArgs {
    let mut a = args(&[ScenarioKind::Deliver]);
    a.smtp = Some(addr.to_string());
    a.concurrency = Some(4);
    a.duration = Some("3s".into());
    a.message_sizes = vec!["1k".into()];
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_is_charged_to_every_scheduled_request() {
    let addr = stalling_server().await;
    let mut a = deliver_args(addr);
    a.rate = Some(200.0);
    let r = run(a).await;
    let d = op(&r, "deliver");
    // ~600 scheduled; ~200 of them fell into the stall and waited up to 1 s each.
    assert!(d.ok >= 550, "{d:?}");
    assert!(d.p99_ms >= 850.0, "open-loop p99 {} ms must include the stall", d.p99_ms);
    assert!(d.p90_ms >= 300.0, "a sixth of the requests were delayed: p90 {} ms", d.p90_ms);
    assert!(d.max_ms >= 950.0, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_hides_the_stall() {
    // The contrast that makes the test above meaningful: the same stall measured
    // closed-loop touches only the 4 requests in flight.
    let addr = stalling_server().await;
    let mut a = deliver_args(addr);
    a.closed_loop = true;
    let r = run(a).await;
    let d = op(&r, "deliver");
    assert!(d.ok > 400, "{d:?}");
    assert!(d.p99_ms < 850.0, "closed-loop p99 {} ms", d.p99_ms);
    assert!(d.max_ms >= 500.0, "the stalled requests are still there: {d:?}");
}

#[tokio::test]
async fn interrupt_yields_a_partial_report() {
    let addr = smtp_server(|_| "250 ok\r\n").await;
    let mut a = deliver_args(addr);
    a.duration = Some("30s".into());
    a.rate = Some(50.0);
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let _ = tx.send(true);
    });
    let started = Instant::now();
    let r = mailcluster_stress::run_with_cancel(a, rx).await.expect("report");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(r.interrupted);
    assert_eq!(r.exit_code(), mailcluster_stress::EXIT_ERROR);
    assert!(op(&r, "deliver").ok > 10);
}
