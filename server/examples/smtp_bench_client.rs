//! SMTP load generator for bench/smtp.sh: N messages of a given size over S
//! persistent sessions, each transaction pipelined (MAIL, RCPT, DATA in one write),
//! optionally at a fixed offered rate, recipients spread over a set of users.
//!
//! Latency is measured from the moment a message was *scheduled* (at a fixed rate)
//! or started (unlimited rate) to its 250, so a stalled server shows up as latency
//! instead of silently lowering the offered rate (coordinated omission).
//!
//! ADDR may list several servers (`a:25,b:25`): sessions are spread over them in
//! turn, as a Service spreads connections over its pods.
//!
//! Usage: smtp_bench_client ADDR[,ADDR…] [--sessions 50] [--messages 20000] [--size 4096]
//!        [--rate 0] [--rcpt user{n}@example.test] [--rcpt-count 1] [--rcpt-first 1]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

struct Opts {
    addr: String,
    sessions: usize,
    messages: u64,
    size: usize,
    rate: f64,
    rcpt: String,
    rcpt_count: u64,
    rcpt_first: u64,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Opts {
        addr: "127.0.0.1:12525".into(),
        sessions: 50,
        messages: 20_000,
        size: 4096,
        rate: 0.0,
        rcpt: "user{n}@example.test".into(),
        rcpt_count: 1,
        rcpt_first: 911,
    };
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--sessions" => o.sessions = v.parse().expect("sessions"),
            "--messages" => o.messages = v.parse().expect("messages"),
            "--size" => o.size = v.parse().expect("size"),
            "--rate" => o.rate = v.parse().expect("rate"),
            "--rcpt" => o.rcpt = v,
            "--rcpt-count" => o.rcpt_count = v.parse().expect("rcpt-count"),
            "--rcpt-first" => o.rcpt_first = v.parse().expect("rcpt-first"),
            a => {
                o.addr = a.to_string();
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

fn body(size: usize) -> Vec<u8> {
    let mut b = b"From: bench@remote.test\r\nTo: user@example.test\r\nSubject: bench\r\n\r\n".to_vec();
    while b.len() + 80 < size {
        b.extend_from_slice(&[b'x'; 76]);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(b".\r\n");
    b
}

async fn reply(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>, line: &mut String) -> Option<u16> {
    loop {
        line.clear();
        if r.read_line(line).await.ok()? == 0 {
            return None;
        }
        if line.as_bytes().get(3) != Some(&b'-') {
            return line.get(..3)?.parse().ok();
        }
    }
}

#[tokio::main]
async fn main() {
    let o = Arc::new(opts());
    let next = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(std::sync::Mutex::new(
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram"),
    ));
    let body = Arc::new(body(o.size));
    let start = Instant::now();
    let mut tasks = Vec::new();
    let addrs: Vec<String> = o.addr.split(',').map(str::to_string).collect();
    for s in 0..o.sessions {
        let (o, next, ok, failed, hist, body) =
            (o.clone(), next.clone(), ok.clone(), failed.clone(), hist.clone(), body.clone());
        let addr = addrs[s % addrs.len()].clone();
        tasks.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(&addr).await.expect("connect");
            tcp.set_nodelay(true).ok();
            let (r, mut w) = tcp.into_split();
            let mut r = BufReader::new(r);
            let mut line = String::new();
            assert_eq!(reply(&mut r, &mut line).await, Some(220));
            w.write_all(b"EHLO bench.client\r\n").await.expect("write");
            assert_eq!(reply(&mut r, &mut line).await, Some(250));
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= o.messages {
                    break;
                }
                let t0 = if o.rate > 0.0 {
                    let at = start + Duration::from_secs_f64(i as f64 / o.rate);
                    tokio::time::sleep_until(at.into()).await;
                    at
                } else {
                    Instant::now()
                };
                let n = o.rcpt_first + (i % o.rcpt_count);
                let rcpt = o.rcpt.replace("{n}", &format!("{n:04}"));
                let head = format!("MAIL FROM:<bench@remote.test>\r\nRCPT TO:<{rcpt}>\r\nDATA\r\n");
                w.write_all(head.as_bytes()).await.expect("write");
                let a = reply(&mut r, &mut line).await;
                let b = reply(&mut r, &mut line).await;
                let c = reply(&mut r, &mut line).await;
                if (a, b, c) != (Some(250), Some(250), Some(354)) {
                    failed.fetch_add(1, Ordering::SeqCst);
                    if c == Some(354) {
                        w.write_all(b".\r\n").await.expect("write");
                        reply(&mut r, &mut line).await;
                    }
                    w.write_all(b"RSET\r\n").await.expect("write");
                    reply(&mut r, &mut line).await;
                    continue;
                }
                w.write_all(&body).await.expect("write");
                match reply(&mut r, &mut line).await {
                    Some(250) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                        let us = t0.elapsed().as_micros() as u64;
                        hist.lock().unwrap().saturating_record(us.max(1));
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            let _ = w.write_all(b"QUIT\r\n").await;
        }));
    }
    for t in tasks {
        t.await.expect("session");
    }
    let secs = start.elapsed().as_secs_f64();
    let h = hist.lock().unwrap();
    let okn = ok.load(Ordering::SeqCst);
    println!(
        "messages_ok={} failed={} seconds={:.2} msg_per_s={:.0} p50_ms={:.2} p95_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        okn,
        failed.load(Ordering::SeqCst),
        secs,
        okn as f64 / secs,
        h.value_at_quantile(0.50) as f64 / 1000.0,
        h.value_at_quantile(0.95) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
}
