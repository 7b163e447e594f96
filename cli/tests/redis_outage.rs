//! Redis killed and restarted under load: `mailcluster serve` over PostgreSQL and a
//! Redis of this test's own (started on a free port, so the shared one stays up)
//! takes an open-loop SMTP deliver and an IMAP login storm while Redis dies for a
//! few seconds and comes back. Nothing acknowledged is lost, no client waits until
//! its timeout, logins keep succeeding (verified against the store), readiness stays
//! 200 throughout, POP3 keeps its maildrop lock in the store, and the pod returns to
//! Redis when it is back.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestDatabase;
use common::cluster::{ServeProcess, block_on, ephemeral_ports};
use common::redis::{RedisProcess, data_node, free_port};
use common::wire::{http_get, imap_exchange, smtp_try};
use common::{run, run_with};
use sqlx::Connection;

/// The test's Redis: killed (as in a crash) and started again on the same port.
struct Redis {
    process: RedisProcess,
    port: u16,
    dir: Option<tempfile::TempDir>,
}

impl Redis {
    fn start_on(port: u16, dir: tempfile::TempDir) -> Redis {
        Redis { process: data_node(port, dir.path(), &[]), port, dir: Some(dir) }
    }

    fn start() -> Redis {
        Redis::start_on(free_port(), tempfile::tempdir().unwrap())
    }

    /// SIGKILL: a crashed Redis, no goodbye to its clients.
    fn kill(mut self) -> (u16, tempfile::TempDir) {
        self.process.kill();
        (self.port, self.dir.take().expect("a running Redis has its directory"))
    }
}

/// One delivery to one of the four users, and its time to the verdict.
fn deliver(addr: SocketAddr, n: usize) -> Result<(String, Duration), String> {
    smtp_try(addr, &format!("user{}@example.test", n % 4), n)
}

fn imap_login(addr: SocketAddr, user: &str) -> Result<String, String> {
    imap_exchange(addr, user, "secret", &[]).map(|r| r[0].clone())
}

fn p95(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get((v.len() * 95 / 100).min(v.len().saturating_sub(1))).copied().unwrap_or_default()
}

#[derive(Default)]
struct Phase {
    latencies: Vec<Duration>,
    acknowledged: Vec<usize>,
    failures: Vec<String>,
}

#[test]
fn a_redis_outage_degrades_the_pod_but_never_takes_it_down() {
    let db = TestDatabase::create_blocking("mc_redis_outage");
    let redis = Redis::start();
    let redis_url = format!("redis://127.0.0.1:{}", redis.port);
    let dir = tempfile::tempdir().unwrap();
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_DATABASE_URL", db.url.as_str()),
        ("MAILCLUSTER_REDIS_URL", redis_url.as_str()),
        ("MAILCLUSTER_PROTOCOLS", "smtp,imap,pop3"),
        ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
        ("MAILCLUSTER_NET__MAX_CONNECTIONS_PER_IP", "0"),
        ("MAILCLUSTER_SMTP__MAX_CONNECTIONS_PER_IP", "0"),
        // The pod notices Redis is back within a second.
        ("MAILCLUSTER_REDIS__RETRY_AFTER_SECS", "1"),
    ]);
    run(dir.path(), &["migrate"], &env).ok();
    run(dir.path(), &["domain", "add", "example.test"], &env).ok();
    for i in 0..4 {
        let user = format!("user{i}@example.test");
        run_with(dir.path(), &["user", "add", &user], &env, "secret\n", Duration::from_secs(120)).ok();
    }
    let serve_dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(serve_dir.path(), &env, 3);
    let (smtp, imap, admin) = (server.addr("smtp"), server.addr("imap"), server.admin);
    assert_eq!(http_get(admin, "/readyz").0, 200);

    // Readiness is watched for the whole run.
    let stop = Arc::new(AtomicBool::new(false));
    let not_ready = Arc::new(Mutex::new(Vec::new()));
    let watcher = {
        let (stop, not_ready) = (stop.clone(), not_ready.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (status, body) = http_get(admin, "/readyz");
                if status != 200 {
                    not_ready.lock().unwrap().push(format!("{status} {body}"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // IMAP login storm: 2 clients in a loop; every answer must be OK.
    let logins = Arc::new(Mutex::new((0usize, Vec::<String>::new())));
    let stormers: Vec<_> = (0..2)
        .map(|c| {
            let (stop, logins) = (stop.clone(), logins.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = imap_login(imap, &format!("user{}@example.test", (c + i) % 4));
                    let mut l = logins.lock().unwrap();
                    match r {
                        Ok(line) if line.starts_with("a OK") => l.0 += 1,
                        Ok(line) => l.1.push(line),
                        Err(e) => l.1.push(e),
                    }
                    i += 1;
                }
            })
        })
        .collect();

    // Open-loop deliveries, 40/s, in three phases: before, during, after the outage.
    let rate = Duration::from_millis(25);
    let mut next = 0usize;
    let mut run_phase = |secs: u64| -> Phase {
        let phase = Arc::new(Mutex::new(Phase::default()));
        let end = Instant::now() + Duration::from_secs(secs);
        let mut workers = Vec::new();
        let mut tick = Instant::now();
        while Instant::now() < end {
            let n = next;
            next += 1;
            let phase = phase.clone();
            workers.push(std::thread::spawn(move || {
                let r = deliver(smtp, n);
                let mut p = phase.lock().unwrap();
                match r {
                    Ok((line, took)) if line.starts_with("250") => {
                        p.latencies.push(took);
                        p.acknowledged.push(n);
                    }
                    Ok((line, _)) => p.failures.push(format!("message {n}: {}", line.trim_end())),
                    Err(e) => p.failures.push(format!("message {n}: {e}")),
                }
            }));
            tick += rate;
            std::thread::sleep(tick.saturating_duration_since(Instant::now()));
        }
        for w in workers {
            w.join().unwrap();
        }
        Arc::try_unwrap(phase).ok().unwrap().into_inner().unwrap()
    };

    let mut before = run_phase(3);
    let (port, redis_dir) = redis.kill();
    let mut during = run_phase(5);
    assert!(
        http_get(admin, "/healthz").1.contains("cache (redis): down"),
        "{}",
        http_get(admin, "/healthz").1
    );
    // POP3 while Redis is away: the maildrop lock is taken in the store.
    let pop = pop3_session(server.addr("pop3"));
    let redis = Redis::start_on(port, redis_dir);
    server.wait_for_cache_up(Duration::from_secs(15));
    let mut after = run_phase(3);
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    for s in stormers {
        s.join().unwrap();
    }

    let metrics = http_get(admin, "/metrics").1;
    let (p_before, p_during, p_after) =
        (p95(&mut before.latencies), p95(&mut during.latencies), p95(&mut after.latencies));
    let (ok_logins, failed_logins) = logins.lock().unwrap().clone();
    eprintln!(
        "deliveries before/during/after: {}/{}/{} acknowledged, P95 {p_before:?} / {p_during:?} / {p_after:?}; \
         {ok_logins} IMAP logins OK",
        before.acknowledged.len(),
        during.acknowledged.len(),
        after.acknowledged.len()
    );
    for p in [&before, &during, &after] {
        assert!(p.failures.is_empty(), "deliveries failed: {:?}", &p.failures[..p.failures.len().min(10)]);
    }
    assert!(during.acknowledged.len() >= 150, "the outage phase delivered: {}", during.acknowledged.len());
    // Delivery never waits on Redis: the outage does not stretch the latency (a
    // floor keeps a very fast baseline from making scheduling noise a failure).
    assert!(
        p_during <= (p_before * 2).max(Duration::from_millis(100)),
        "P95 {p_during:?} during the outage against {p_before:?} before"
    );
    assert!(failed_logins.is_empty(), "logins failed: {:?}", &failed_logins[..failed_logins.len().min(10)]);
    assert!(ok_logins > 20, "logins: {ok_logins}");
    assert!(not_ready.lock().unwrap().is_empty(), "readiness failed: {:?}", not_ready.lock().unwrap());
    assert!(pop.starts_with("+OK"), "POP3 during the outage: {pop}");
    assert!(metrics.contains("mail_cache_up 1"), "back on Redis");
    assert!(
        metrics.lines().any(|l| l.starts_with("mail_cache_fallbacks_total{op=\"credential_get\"}")),
        "{metrics}"
    );
    // Back on Redis, recipient lookups are read from the pod's copies again
    // (four recipients, about 120 deliveries since the reconnect).
    let copies = |result: &str| -> u64 {
        let name = format!("mail_cache_client_copies_total{{result=\"{result}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(name.as_str())?.parse().ok()).unwrap_or(0)
    };
    assert!(copies("hit") > 50, "copies hit {} times: {metrics}", copies("hit"));
    assert!(copies("miss") >= 4, "{metrics}");

    // Every acknowledged message is stored, once.
    let acknowledged: usize =
        before.acknowledged.len() + during.acknowledged.len() + after.acknowledged.len();
    let stored: i64 = block_on(async {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM mailbox_messages").fetch_one(&mut c).await.unwrap()
    });
    assert_eq!(stored as usize, acknowledged, "stored exactly what was acknowledged");
    drop(redis);
    drop(server);
}

/// An SMTP pod's setting-up: a database and a Redis of the test's own (started
/// with `redis_args`), migrated, with example.test and `users` (password
/// "secret"); `env()` configures `mailcluster` for them.
struct OwnBackends {
    db: TestDatabase,
    _redis: RedisProcess,
    _redis_dir: tempfile::TempDir,
    redis_url: String,
    dir: tempfile::TempDir,
}

impl OwnBackends {
    fn start(name: &str, redis_args: &[&str], users: &[&str]) -> OwnBackends {
        let port = free_port();
        let redis_dir = tempfile::tempdir().unwrap();
        let backends = OwnBackends {
            db: TestDatabase::create_blocking(name),
            _redis: data_node(port, redis_dir.path(), redis_args),
            _redis_dir: redis_dir,
            redis_url: format!("redis://127.0.0.1:{port}"),
            dir: tempfile::tempdir().unwrap(),
        };
        let (dir, env) = (backends.dir.path(), backends.env());
        run(dir, &["migrate"], &env).ok();
        run(dir, &["domain", "add", "example.test"], &env).ok();
        for user in users {
            run_with(dir, &["user", "add", user], &env, "secret\n", Duration::from_secs(120)).ok();
        }
        backends
    }

    fn env(&self) -> Vec<(&str, &str)> {
        let mut env = ephemeral_ports();
        env.extend([
            ("MAILCLUSTER_DATABASE_URL", self.db.url.as_str()),
            ("MAILCLUSTER_REDIS_URL", self.redis_url.as_str()),
            ("MAILCLUSTER_PROTOCOLS", "smtp"),
        ]);
        env
    }
}

/// A Redis that does not speak RESP3 (HELLO renamed away: what a server older
/// than Redis 6 answers) is used all the same, without client-side copies.
#[test]
fn a_redis_without_resp3_is_used_without_client_copies() {
    let backends =
        OwnBackends::start("mc_redis_resp2", &["--rename-command", "HELLO", ""], &["user0@example.test"]);
    let (dir, env) = (backends.dir.path(), backends.env());
    let server = ServeProcess::start(dir, &env, 1);
    for n in 0..5 {
        let (reply, _) = smtp_try(server.addr("smtp"), "user0@example.test", n).unwrap();
        assert!(reply.starts_with("250"), "message {n}: {reply}");
    }
    server.wait_for_cache_up(Duration::from_secs(20));
    assert!(server.log_contains("Redis refused RESP3 or client tracking"), "{}", server.log_text());
    let metrics = http_get(server.admin, "/metrics").1;
    assert!(metrics.contains("mail_cache_up 1"), "{metrics}");
    assert!(!metrics.contains("mail_cache_client_copies_total"), "no copies without tracking: {metrics}");
}

/// Polls deliveries to `rcpt` until the verdict starts with one of `want`, for at most
/// 2 s (the recipient entry lives 30 s): a change made by an admin command
/// reaches the pod's copy at once.
fn verdict_becomes(smtp: SocketAddr, rcpt: &str, want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (reply, _) = smtp_try(smtp, rcpt, 0).unwrap();
        if want.iter().any(|w| reply.starts_with(w)) {
            return;
        }
        assert!(Instant::now() < deadline, "{rcpt}: still {reply}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn admin_changes_reach_the_pods_copies_of_recipient_lookups_at_once() {
    let users = ["gone@example.test", "full@example.test", "target@example.test"];
    let backends = OwnBackends::start("mc_redis_rcpt", &[], &users);
    let (dir, env) = (backends.dir.path(), backends.env());
    run(dir, &["alias", "add", "team@example.test", "target@example.test"], &env).ok();
    let server = ServeProcess::start(dir, &env, 1);
    let smtp = server.addr("smtp");
    // Each lookup is made in the store once, then read from Redis (the pod's
    // own write dropped its copy of "nothing there") and from then on from the
    // pod's copy.
    for rcpt in ["gone", "full", "team"].repeat(3) {
        let (reply, _) = smtp_try(smtp, &format!("{rcpt}@example.test"), 0).unwrap();
        assert!(reply.starts_with("250"), "{rcpt}: {reply}");
    }
    let metrics = http_get(server.admin, "/metrics").1;
    let hits = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mail_cache_client_copies_total{result=\"hit\"} ")?.parse::<u64>().ok());
    assert!(hits >= Some(3), "{metrics}");

    run(dir, &["user", "del", "gone@example.test"], &env).ok();
    verdict_becomes(smtp, "gone@example.test", &["550"]);
    run(dir, &["user", "quota", "full@example.test", "1"], &env).ok();
    // Full: 452 at RCPT (RFC 3463 X.2.2), or 552 after DATA.
    verdict_becomes(smtp, "full@example.test", &["452 4.2.2", "552 5.2.2"]);
    run(dir, &["alias", "del", "team@example.test"], &env).ok();
    verdict_becomes(smtp, "team@example.test", &["550"]);
    // Refused while nobody had the address (the answer is kept 5 s), then
    // accepted as soon as the user is added.
    let (reply, _) = smtp_try(smtp, "new@example.test", 0).unwrap();
    assert!(reply.starts_with("550"), "new: {reply}");
    run(dir, &["user", "add", "new@example.test", "--password", "pw"], &env).ok();
    verdict_becomes(smtp, "new@example.test", &["250"]);
}

/// USER/PASS/STAT/QUIT on `addr`; the PASS reply.
fn pop3_session(addr: SocketAddr) -> String {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("pop3");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    let mut say = |cmd: &str, r: &mut BufReader<TcpStream>| {
        if !cmd.is_empty() {
            write!(w, "{cmd}\r\n").unwrap();
        }
        line.clear();
        r.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    };
    say("", &mut r);
    say("USER user0@example.test", &mut r);
    let pass = say("PASS secret", &mut r);
    say("QUIT", &mut r);
    pass
}
