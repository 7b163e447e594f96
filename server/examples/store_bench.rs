//! Store micro-benchmark: does delivery (and the per-command reads IMAP runs in
//! loops) stay flat as a mailbox grows? Fills one INBOX to `--fill` messages, then
//! times single deliveries and group-commit batches into it against an empty
//! mailbox, plus STATUS, UID SEARCH UNSEEN and a session's sync (what changed in
//! the last 20 modseqs).
//!
//! `cargo run --release -p mailcluster-server --example store_bench -- <database-url> [fill]`
//! (`sqlite:///tmp/bench.db` or `postgres://…/<an empty database>`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mailcluster_model::{FlagOp, FlagSet, Flags, MessageMeta, NewDelivery, UidSet};
use mailcluster_server::store::{self, Store};

fn delivery(i: usize, targets: &[i64]) -> NewDelivery {
    let raw = Bytes::from(format!(
        "From: a@example.com\r\nTo: b@example.com\r\nSubject: message {i}\r\n\r\n{}\r\n",
        "Some body text that is typical of short mail. ".repeat(20)
    ));
    NewDelivery {
        meta: MessageMeta { size: raw.len() as u32, subject: format!("message {i}"), ..Default::default() },
        raw,
        internal_date: chrono::Utc::now(),
        targets: targets.to_vec(),
        flags: FlagSet::default(),
    }
}

async fn time<F: std::future::Future<Output = T>, T>(runs: usize, mut f: impl FnMut(usize) -> F) -> Duration {
    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs {
        let t = Instant::now();
        f(i).await;
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

async fn report(s: &Arc<dyn Store>, label: &str, inbox: i64) {
    let base = 1_000_000 * (label.len() + 1);
    let one = time(50, |i| {
        let s = s.clone();
        async move { s.deliver_batch(&[delivery(base + i, &[inbox])]).await.expect("deliver") }
    })
    .await;
    let batch = time(10, |i| {
        let s = s.clone();
        async move {
            let b: Vec<NewDelivery> = (0..50).map(|k| delivery(base + 1000 + i * 50 + k, &[inbox])).collect();
            s.deliver_batch(&b).await.expect("deliver")
        }
    })
    .await;
    let status = time(50, |_| {
        let s = s.clone();
        async move { s.mailbox_status(inbox).await.expect("status") }
    })
    .await;
    let unseen = time(20, |_| {
        let s = s.clone();
        async move { s.uids_by_flags(inbox, Flags::NONE, Flags::SEEN).await.expect("search") }
    })
    .await;
    let tail_changes = time(20, |_| {
        let s = s.clone();
        async move {
            let highest = s.mailbox_status(inbox).await.expect("status").highest_modseq;
            s.changes_since(inbox, highest.saturating_sub(20)).await.expect("changes")
        }
    })
    .await;
    let count = s.mailbox_status(inbox).await.expect("status").messages;
    println!(
        "{label:>8} ({count:>6} msgs): deliver 1 msg p50 {one:?} | batch of 50 p50 {batch:?} | STATUS {status:?} | \
         UID SEARCH UNSEEN {unseen:?} | changes in the last 20 modseqs {tail_changes:?}"
    );
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: store_bench <database-url> [fill]");
    let fill: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let dir = std::env::temp_dir();
    let s = store::open(Some(&url), &dir, 8, Duration::from_secs(10)).await.expect("open");
    s.migrate().await.expect("migrate");
    let _ = s.domain_add("bench.example").await;
    let tag = chrono::Utc::now().timestamp_micros();
    let empty = s.account_create(&format!("empty{tag}@bench.example"), "x").await.expect("account");
    let full = s.account_create(&format!("full{tag}@bench.example"), "x").await.expect("account");
    let empty_inbox = s.mailbox_get(empty.id, "INBOX").await.expect("get").expect("inbox").id;
    let full_inbox = s.mailbox_get(full.id, "INBOX").await.expect("get").expect("inbox").id;

    let t = Instant::now();
    for chunk in (0..fill).collect::<Vec<_>>().chunks(500) {
        let b: Vec<NewDelivery> = chunk.iter().map(|&i| delivery(i, &[full_inbox])).collect();
        s.deliver_batch(&b).await.expect("fill");
    }
    // most mail read: a realistic UNSEEN search returns a handful
    s.store_flags(
        full_inbox,
        &UidSet::all(),
        FlagOp::Add,
        &FlagSet { system: Flags::SEEN, keywords: vec![] },
    )
    .await
    .expect("mark seen");
    println!("filled {fill} messages in {:?}", t.elapsed());

    report(&s, "empty", empty_inbox).await;
    report(&s, "full", full_inbox).await;
}
