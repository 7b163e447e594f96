//! JSON, CSV, HTML and Pushgateway outputs, from a real run against the sink.

mod common;

use common::*;
use mailcluster_api::stress::ScenarioKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

async fn sink() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(mailcluster_stress::sink::serve(l, None));
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_csv_html_contain_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = sink().await;
    let mut a = args(&[ScenarioKind::Deliver, ScenarioKind::SmtpNoop]);
    a.smtp = Some(addr.to_string());
    a.rate = Some(100.0);
    a.duration = Some("2s".into());
    a.concurrency = Some(4);
    a.slo = vec!["deliver.p99 < 1ms".into()];
    a.run_id = Some("run-42".into());
    let (json, csv, html) = (dir.path().join("r.json"), dir.path().join("r.csv"), dir.path().join("r.html"));
    a.json = Some(json.clone());
    a.csv = Some(csv.clone());
    a.html = Some(html.clone());
    let r = run(a).await;
    // 1 ms P99 is out of reach over TCP for a debug build: the extra SLO fails.
    assert_eq!(r.verdict, "Fail");

    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("valid JSON");
    assert_eq!(j["run_id"], "run-42");
    assert_eq!(j["verdict"], "Fail");
    let delivered = j["scenarios"][0]["ops"]["deliver"]["ok"].as_u64().expect("deliver ok");
    assert!((180..=202).contains(&delivered), "{delivered}");
    assert!(j["scenarios"][0]["ops"]["deliver"]["p95_ms"].as_f64().expect("p95") > 0.0);
    assert!(j["totals"]["noop"]["count"].as_u64().expect("noop") >= 180);
    let slo = j["slo"].as_array().expect("slo");
    let failed = slo.iter().find(|s| s["threshold"] == "deliver.p99 < 1ms").expect("extra slo");
    assert_eq!(failed["pass"], false);
    assert!(j["generator"]["worker_threads"].as_u64().expect("threads") >= 1);

    let c = std::fs::read_to_string(&csv).expect("csv");
    let mut lines = c.lines();
    assert_eq!(
        lines.next(),
        Some(
            "scenario,second,op,primary,ok,errors,p50_ms,p95_ms,p99_ms,max_ms,generator_cpu_percent,generator_lag_ms"
        )
    );
    let deliver_rows: Vec<&str> =
        c.lines().filter(|l| l.starts_with("deliver,") && l.contains(",deliver,")).collect();
    assert!(deliver_rows.len() >= 2, "{c}");
    let per_second: u64 = deliver_rows
        .iter()
        .map(|l| l.split(',').nth(4).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0))
        .sum();
    assert_eq!(per_second, delivered, "per-second series adds up to the total");

    let h = std::fs::read_to_string(&html).expect("html");
    assert!(h.starts_with("<!DOCTYPE html>"));
    assert!(h.contains("Verdict: Fail"));
    assert!(h.contains("deliver.p99 &lt; 1ms"));
    assert!(h.matches("<svg").count() >= 4, "latency + throughput plots per scenario");
    assert!(h.contains("<polyline"));
    assert!(!h.contains("<script") && !h.contains("src=") && !h.contains("href="), "self-contained");
}

#[tokio::test]
async fn pushgateway_receives_a_put() {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let gw = l.local_addr().expect("addr");
    let got = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.expect("accept");
        let mut buf = Vec::new();
        // Read until the announced body is complete.
        loop {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.expect("read");
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    break;
                }
            }
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await.expect("write");
        String::from_utf8(buf).expect("utf8")
    });
    let addr = sink().await;
    let mut a = args(&[ScenarioKind::Deliver]);
    a.smtp = Some(addr.to_string());
    a.rate = Some(50.0);
    a.duration = Some("1s".into());
    a.pushgateway = Some(format!("http://{gw}"));
    a.cluster = "prod".into();
    a.run_id = Some("r 1".into());
    let r = run(a).await;
    let req = got.await.expect("request");
    assert!(
        req.starts_with("PUT /metrics/job/mailcluster-stress/cluster/prod/run/r%201 HTTP/1.1\r\n"),
        "{req}"
    );
    assert!(req.contains("mailcluster_stress_latency_seconds{op=\"deliver\",quantile=\"0.95\"}"));
    assert!(req.contains(&format!("mailcluster_stress_verdict_pass {}", u8::from(r.passed()))));
    assert!(req.contains("mailcluster_stress_operations_total{op=\"deliver\",result=\"ok\"}"));
}

#[tokio::test]
async fn pushgateway_error_is_a_run_error() {
    let addr = sink().await;
    let mut a = args(&[ScenarioKind::Deliver]);
    a.smtp = Some(addr.to_string());
    a.rate = Some(20.0);
    a.duration = Some("1s".into());
    a.pushgateway = Some(format!("http://{}", closed_port().await));
    assert_eq!(mailcluster_stress::run(a).await, mailcluster_stress::EXIT_ERROR);
}
