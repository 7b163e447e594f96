//! Durability: deliver continuously over many sessions, SIGKILL the server at a
//! random moment, restart it, repeat; afterwards every message that got a 250 is
//! in its recipient's INBOX exactly once. Run against PostgreSQL and SQLite.
//!
//! The server runs in a child process: this same test binary re-executed with
//! `MC_SMTP_DURABILITY_CHILD` set runs [`child_server`] (the SMTP MX over the real
//! store, group commit on) instead of the tests, so a kill is a real process kill
//! with nothing flushed on the way out.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod smtp_support;

use mailcluster_model::UidSet;
use smtp_support::Backend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const CHILD_ENV: &str = "MC_SMTP_DURABILITY_CHILD";
const RECIPIENTS: [&str; 3] = ["r0@dur.test", "r1@dur.test", "r2@dur.test"];

/// Not a test of its own: the server side when re-executed as a child process by
/// the tests below (`--ignored --exact child_server`), so it never runs, and passes,
/// in a plain `cargo test`.
#[test]
#[ignore = "the server side of the durability tests, started by them as a child process"]
fn child_server() {
    let url =
        std::env::var(CHILD_ENV).expect("child_server runs only as the durability tests' child process");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let dir = std::env::temp_dir();
        let store = mailcluster_server::store::open(Some(&url), &dir, 8, Duration::from_secs(5))
            .await
            .expect("store");
        let cache: Arc<dyn mailcluster_server::cache::Cache> =
            Arc::new(mailcluster_server::cache::local::LocalCache::new());
        let mut config =
            mailcluster_server::config::Config { hostname: "dur.test".into(), ..Default::default() };
        config.smtp.max_connections_per_ip = 0;
        let deliverer = Arc::new(mailcluster_server::delivery::Deliverer::with_options(
            store.clone(),
            mailcluster_server::smtp::delivery_options(&config.smtp),
        ));
        let auth = Arc::new(mailcluster_server::auth::Authenticator::new(
            store.clone(),
            cache.clone(),
            Default::default(),
        ));
        let metrics = Arc::new(mailcluster_server::metrics::Metrics::new());
        let app = mailcluster_server::app::App::new(Arc::new(config), store, cache, metrics, auth, deliverer);
        let proto = Arc::new(mailcluster_server::smtp::SmtpProtocol::new(
            app,
            mailcluster_server::smtp::SmtpKind::Mx,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        println!("LISTENING {}", addr.port());
        let (_tx, shutdown) = mailcluster_server::net::Shutdown::new();
        loop {
            let (tcp, remote) = listener.accept().await.unwrap();
            let proto = proto.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                use mailcluster_server::net::Protocol;
                let ctx = mailcluster_server::net::SessionCtx {
                    conn: mailcluster_server::net::ConnInfo { remote, local: addr, listener: "smtp" },
                    tls: None,
                    shutdown,
                };
                proto.handle(mailcluster_server::net::SessionStream::Plain(tcp), ctx).await;
            });
        }
    });
}

fn spawn_child(url: &str) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_server", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("child starts");
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("child without stdout");
    };
    let mut lines = BufReader::new(stdout).lines();
    let port = loop {
        match lines.next() {
            // The test harness may print "test child_server ... " before it on the line.
            Some(Ok(line)) => {
                if let Some(port) = line.split_once("LISTENING ").and_then(|(_, p)| p.trim().parse().ok()) {
                    break Some(port);
                }
            }
            _ => break None,
        }
    };
    let Some(port) = port else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("child exited before listening");
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, port)
}

/// Starts the child off the runtime threads (it blocks reading the child's output).
async fn start_child(url: &str) -> (Child, u16) {
    let url = url.to_string();
    tokio::time::timeout(Duration::from_secs(90), tokio::task::spawn_blocking(move || spawn_child(&url)))
        .await
        .expect("child started in time")
        .expect("spawn task")
}

/// One client: sends messages one after another on one session, reconnecting
/// after errors, until `stop`. Records the tokens of messages that got 250.
async fn client(
    id: usize,
    port: Arc<Mutex<u16>>,
    acked: Arc<Mutex<Vec<(String, &'static str)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let p = *port.lock().unwrap();
        let Ok(Ok(tcp)) =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(("127.0.0.1", p)))
                .await
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (r, mut w) = tcp.into_split();
        let mut r = tokio::io::BufReader::new(r);
        async fn reply(r: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<String> {
            let mut line = String::new();
            loop {
                line.clear();
                let n =
                    tokio::time::timeout(Duration::from_secs(10), r.read_line(&mut line)).await.ok()?.ok()?;
                if n == 0 {
                    return None;
                }
                if line.as_bytes().get(3) != Some(&b'-') {
                    return Some(line);
                }
            }
        }
        if reply(&mut r).await.is_none_or(|l| !l.starts_with("220")) {
            continue;
        }
        if w.write_all(b"EHLO dur-client\r\n").await.is_err() || reply(&mut r).await.is_none() {
            continue;
        }
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let token = format!("tok-{id}-{n}");
            let rcpt = RECIPIENTS[(id + n as usize) % RECIPIENTS.len()];
            let msg = format!(
                "MAIL FROM:<c{id}@remote.test>\r\nRCPT TO:<{rcpt}>\r\nDATA\r\n\
                 Subject: {token}\r\nX-Token: {token}\r\n\r\nbody {token}\r\n.\r\n"
            );
            // Pipelined: MAIL, RCPT, DATA then the content once 354 arrived.
            let (head, body) = msg.split_at(msg.find("Subject:").unwrap());
            if w.write_all(head.as_bytes()).await.is_err() {
                break;
            }
            let ok = matches!(reply(&mut r).await, Some(l) if l.starts_with("250"))
                & matches!(reply(&mut r).await, Some(l) if l.starts_with("250"))
                & matches!(reply(&mut r).await, Some(l) if l.starts_with("354"));
            if !ok || w.write_all(body.as_bytes()).await.is_err() {
                break;
            }
            match reply(&mut r).await {
                Some(l) if l.starts_with("250") => acked.lock().unwrap().push((token, rcpt)),
                Some(_) => continue,
                None => break,
            }
        }
    }
}

async fn run_durability(url: String) {
    let store = mailcluster_server::store::open(Some(&url), &std::env::temp_dir(), 4, Duration::from_secs(5))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.domain_add("dur.test").await.unwrap();
    for r in RECIPIENTS {
        store.account_create(r, "x").await.unwrap();
    }

    let (mut child, p) = start_child(&url).await;
    let port = Arc::new(Mutex::new(p));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> =
        (0..16).map(|i| tokio::spawn(client(i, port.clone(), acked.clone(), stop.clone()))).collect();
    for round in 0..4 {
        // Let deliveries flow (at least 25 acknowledged this round, or 20 s), then
        // kill at a pseudo-random moment up to 700 ms later: mid-commit, mid-DATA,
        // mid-reply, wherever it falls.
        let at_start = acked.lock().unwrap().len();
        let round_deadline = Instant::now() + Duration::from_secs(20);
        while acked.lock().unwrap().len() < at_start + 25 && Instant::now() < round_deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        tokio::time::sleep(Duration::from_millis(u64::from(nanos % 700))).await;
        child.kill().expect("SIGKILL");
        child = tokio::task::spawn_blocking(move || {
            let _ = child.wait();
            child
        })
        .await
        .unwrap();
        if round < 3 {
            let (c, p) = start_child(&url).await;
            child = c;
            *port.lock().unwrap() = p;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for c in clients {
        let _ = tokio::time::timeout(Duration::from_secs(15), c).await;
    }

    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 100, "enough deliveries to mean something: {}", acked.len());
    // Count every stored token per recipient.
    let mut stored: HashMap<(String, String), usize> = HashMap::new();
    for r in RECIPIENTS {
        let account = store.account_get(r).await.unwrap().unwrap();
        let inbox = store.mailbox_get(account.id, "INBOX").await.unwrap().unwrap();
        let rows = store.messages_by_uid(inbox.id, &UidSet::all()).await.unwrap();
        for row in rows {
            let body = store.message_body(row.message_id).await.unwrap();
            let text = String::from_utf8_lossy(&body);
            let token = text
                .lines()
                .find_map(|l| l.strip_prefix("X-Token: "))
                .expect("token header")
                .trim()
                .to_string();
            *stored.entry((token, r.to_string())).or_default() += 1;
        }
    }
    for (token, rcpt) in &acked {
        let n = stored.get(&(token.clone(), rcpt.to_string())).copied().unwrap_or(0);
        assert_eq!(n, 1, "acknowledged {token} to {rcpt} stored {n} times");
    }
    for ((token, rcpt), n) in &stored {
        assert_eq!(*n, 1, "{token} to {rcpt} stored {n} times");
    }
    eprintln!("durability: {} acknowledged, {} stored", acked.len(), stored.len());
}

async fn durability(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, pg_db) = smtp_support::fresh_database(backend, dir.path()).await;
    let result = tokio::time::timeout(Duration::from_secs(240), run_durability(url)).await;
    drop(pg_db);
    result.expect("durability run finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_message_sqlite() {
    durability(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_message_postgres() {
    durability(Backend::Postgres).await;
}
