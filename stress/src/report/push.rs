//! Push summary metrics to a Prometheus Pushgateway.
//!
//! `PUT <url>/metrics/job/<job>/cluster/<cluster>/run/<run>` with a text-format body
//! (PUT replaces the group, so a re-run with the same id does not leave stale
//! series). Plain HTTP/1.1 over a tokio socket: the gateway lives inside the
//! cluster, and one request per run does not justify an HTTP client stack.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Report;

/// Prometheus text exposition of the report.
pub fn metrics_text(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# TYPE mailcluster_stress_verdict_pass gauge");
    let _ = writeln!(o, "mailcluster_stress_verdict_pass {}", u8::from(r.passed()));
    let _ = writeln!(o, "# TYPE mailcluster_stress_success_ratio gauge");
    let _ = writeln!(o, "mailcluster_stress_success_ratio {}", r.success_rate / 100.0);
    let _ = writeln!(o, "# TYPE mailcluster_stress_generator_saturated gauge");
    let _ = writeln!(o, "mailcluster_stress_generator_saturated {}", u8::from(r.generator.saturated));
    let _ = writeln!(o, "# TYPE mailcluster_stress_generator_cpu_seconds gauge");
    let _ = writeln!(o, "mailcluster_stress_generator_cpu_seconds {}", r.generator.cpu_seconds);
    let _ = writeln!(o, "# TYPE mailcluster_stress_operations_total gauge");
    for (op, s) in &r.totals {
        let op = label(op);
        let _ = writeln!(o, "mailcluster_stress_operations_total{{op=\"{op}\",result=\"ok\"}} {}", s.ok);
        let _ =
            writeln!(o, "mailcluster_stress_operations_total{{op=\"{op}\",result=\"error\"}} {}", s.errors);
    }
    let _ = writeln!(o, "# TYPE mailcluster_stress_errors_total gauge");
    for (op, s) in &r.totals {
        for (kind, n) in &s.errors_by_kind {
            let _ = writeln!(
                o,
                "mailcluster_stress_errors_total{{op=\"{}\",kind=\"{}\"}} {n}",
                label(op),
                label(kind)
            );
        }
    }
    let _ = writeln!(o, "# TYPE mailcluster_stress_latency_seconds gauge");
    for (op, s) in &r.totals {
        for (q, v) in [
            ("0.5", s.p50_ms),
            ("0.9", s.p90_ms),
            ("0.95", s.p95_ms),
            ("0.99", s.p99_ms),
            ("0.999", s.p999_ms),
            ("1", s.max_ms),
        ] {
            let _ = writeln!(
                o,
                "mailcluster_stress_latency_seconds{{op=\"{}\",quantile=\"{q}\"}} {}",
                label(op),
                v / 1000.0
            );
        }
    }
    let _ = writeln!(o, "# TYPE mailcluster_stress_throughput_per_second gauge");
    for (op, s) in &r.totals {
        let _ =
            writeln!(o, "mailcluster_stress_throughput_per_second{{op=\"{}\"}} {}", label(op), s.throughput);
    }
    let _ = writeln!(o, "# TYPE mailcluster_stress_slo_pass gauge");
    for res in &r.slo {
        if let Some(p) = res.pass {
            let _ = writeln!(
                o,
                "mailcluster_stress_slo_pass{{scope=\"{}\",threshold=\"{}\"}} {}",
                label(&res.scope),
                label(&res.threshold),
                u8::from(p)
            );
        }
    }
    o
}

/// Label values escaped per the text format.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Path segments are percent-encoded so a run id like `2026-01-01T00:00Z` is safe.
fn segment(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            o.push(b as char);
        } else {
            let _ = write!(o, "%{b:02X}");
        }
    }
    o
}

pub async fn push(url: &str, job: &str, cluster: &str, run: &str, r: &Report) -> anyhow::Result<()> {
    let rest = url.strip_prefix("http://").context("Pushgateway URL must start with http://")?;
    let (authority, prefix) = match rest.split_once('/') {
        Some((a, p)) => (a, format!("/{}", p.trim_end_matches('/'))),
        None => (rest, String::new()),
    };
    let prefix = if prefix == "/" { String::new() } else { prefix };
    let addr = if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
    let path =
        format!("{prefix}/metrics/job/{}/cluster/{}/run/{}", segment(job), segment(cluster), segment(run));
    let body = metrics_text(r);
    let req = format!(
        "PUT {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let io = async {
        let mut s = TcpStream::connect(&addr).await?;
        s.write_all(req.as_bytes()).await?;
        let mut resp = Vec::new();
        (&mut s).take(64 * 1024).read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .context("Pushgateway timed out")?
        .with_context(|| format!("pushing to {addr}"))?;
    let status_line =
        String::from_utf8_lossy(resp.split(|&b| b == b'\n').next().unwrap_or_default()).to_string();
    let code: u16 = status_line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    if !(200..300).contains(&code) {
        bail!("Pushgateway answered {:?}", status_line.trim());
    }
    Ok(())
}
