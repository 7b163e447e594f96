//! Small in-test servers on 127.0.0.1:0 and argument helpers.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use mailcluster_api::stress::ScenarioKind;
use mailcluster_stress::StressArgs;
use mailcluster_stress::report::Report;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Accept connections forever, one task per connection running `session`.
pub async fn serve<F, Fut>(session: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            // Without it, two small replies in a row wait for the client's delayed
            // ACK (Nagle): 40 ms per pipelined transaction.
            let _ = s.set_nodelay(true);
            let f = session.clone();
            tokio::spawn(f(s));
        }
    });
    addr
}

/// A port nothing listens on.
pub async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let a = l.local_addr().expect("addr");
    drop(l);
    a
}

pub struct Lines {
    pub r: BufReader<OwnedReadHalf>,
    pub w: OwnedWriteHalf,
}

impl Lines {
    pub fn new(s: TcpStream) -> Lines {
        let (r, w) = s.into_split();
        Lines { r: BufReader::new(r), w }
    }
    pub async fn line(&mut self) -> Option<String> {
        let mut l = String::new();
        match self.r.read_line(&mut l).await {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(l),
        }
    }
    pub async fn send(&mut self, s: &str) -> bool {
        self.w.write_all(s.as_bytes()).await.is_ok()
    }
    /// Read a DATA body up to the dot line.
    pub async fn data(&mut self) -> Option<()> {
        self.body().await.map(drop)
    }
    /// The lines of a DATA body, up to the dot line (not included).
    pub async fn body(&mut self) -> Option<Vec<String>> {
        let mut lines = Vec::new();
        loop {
            let l = self.line().await?;
            if l == ".\r\n" {
                return Some(lines);
            }
            lines.push(l);
        }
    }
}

/// A plain SMTP server whose RCPT reply comes from `rcpt(n)` (n counts RCPTs over
/// all sessions) and that otherwise accepts everything.
pub async fn smtp_server(rcpt: fn(u64) -> &'static str) -> SocketAddr {
    let counter = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    serve(move |s| {
        let counter = counter.clone();
        async move {
            let mut c = Lines::new(s);
            c.send("220 test ESMTP\r\n").await;
            // A transaction opened by MAIL ends only with RSET or the end of its
            // content (RFC 5321 §4.1.1): a second MAIL before that is out of sequence.
            let mut mail_open = false;
            let mut rcpt_ok = false;
            while let Some(l) = c.line().await {
                let up = l.to_ascii_uppercase();
                let reply = if up.starts_with("EHLO") {
                    "250-test\r\n250 PIPELINING\r\n".to_string()
                } else if up.starts_with("MAIL") {
                    if std::mem::replace(&mut mail_open, true) {
                        "503 5.5.1 nested MAIL command\r\n".into()
                    } else {
                        "250 ok\r\n".into()
                    }
                } else if up.starts_with("RSET") {
                    (mail_open, rcpt_ok) = (false, false);
                    "250 ok\r\n".into()
                } else if up.starts_with("RCPT") {
                    let r = rcpt(counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
                    rcpt_ok = r.starts_with('2');
                    r.to_string()
                } else if up.starts_with("DATA") {
                    if rcpt_ok {
                        c.send("354 go\r\n").await;
                        if c.data().await.is_none() {
                            return;
                        }
                        (mail_open, rcpt_ok) = (false, false);
                        "250 ok\r\n".into()
                    } else {
                        "554 no valid recipients\r\n".into()
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

pub fn args(kinds: &[ScenarioKind]) -> StressArgs {
    StressArgs {
        scenarios: kinds.to_vec(),
        quiet: true,
        no_progress: true,
        users_count: Some(5),
        push_job: "mailcluster-stress".into(),
        cluster: "default".into(),
        ..Default::default()
    }
}

/// Closed-loop deliveries to the SMTP server at `addr`: `concurrency` sessions send
/// `max_ops` messages in all, for `duration` at the most.
pub fn closed_loop_deliveries(
    addr: SocketAddr,
    concurrency: u32,
    max_ops: u64,
    duration: &str,
) -> StressArgs {
    let mut a = args(&[ScenarioKind::Deliver]);
    a.smtp = Some(addr.to_string());
    a.closed_loop = true;
    a.concurrency = Some(concurrency);
    a.max_ops = Some(max_ops);
    a.duration = Some(duration.into());
    a
}

/// Run to completion (bounded by the test's own timeout).
pub async fn run(args: StressArgs) -> Report {
    let (_tx, rx) = watch::channel(false);
    tokio::time::timeout(Duration::from_secs(60), mailcluster_stress::run_with_cancel(args, rx))
        .await
        .expect("run finished in time")
        .expect("run succeeded")
}

pub fn op<'a>(r: &'a Report, name: &str) -> &'a mailcluster_stress::measure::OpSummary {
    r.totals.get(name).unwrap_or_else(|| panic!("operation {name} missing: {:?}", r.totals.keys()))
}
