//! Redis as people run it: behind Sentinel, and over TLS.
//!
//! - A master, a replica and a Sentinel of this test's own; `mailcluster serve` is
//!   given only the Sentinel (`redis+sentinel://…/mymaster`). The master is killed
//!   under an open-loop SMTP deliver and an IMAP login storm; the Sentinel promotes
//!   the replica and the pod follows it: nothing acknowledged is lost, no login
//!   fails, readiness stays 200, and the pod ends on the new master.
//! - A Redis speaking only TLS (`rediss://`, a certificate of the test's own CA):
//!   the pod connects, verifies it and uses it for shared state.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestDatabase;
use common::cluster::{ServeProcess, block_on, ephemeral_ports};
use common::redis::{RedisProcess, data_node, free_port};
use common::wire::{http_get, imap_exchange, smtp_try};
use common::{run, run_with};
use sqlx::Connection;

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out =
        Command::new("redis-cli").args(["-p", &port.to_string()]).args(args).output().expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn deliver(addr: SocketAddr, n: usize) -> Result<String, String> {
    smtp_try(addr, "user@example.test", n).map(|(verdict, _)| verdict)
}

fn imap_login(addr: SocketAddr) -> Result<String, String> {
    imap_exchange(addr, "user@example.test", "secret", &[]).map(|r| r[0].clone())
}

/// Migrates a fresh database and adds user@example.test (password "secret").
fn prepare(env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), &["migrate"], env).ok();
    run(dir.path(), &["domain", "add", "example.test"], env).ok();
    run_with(dir.path(), &["user", "add", "user@example.test"], env, "secret\n", Duration::from_secs(120))
        .ok();
}

fn base_env<'a>(db: &'a str, redis: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_DATABASE_URL", db),
        ("MAILCLUSTER_REDIS_URL", redis),
        ("MAILCLUSTER_PROTOCOLS", "smtp,imap"),
        ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
        ("MAILCLUSTER_NET__MAX_CONNECTIONS_PER_IP", "0"),
        ("MAILCLUSTER_SMTP__MAX_CONNECTIONS_PER_IP", "0"),
        ("MAILCLUSTER_REDIS__RETRY_AFTER_SECS", "1"),
    ]);
    env
}

#[test]
fn a_sentinel_failover_moves_the_pod_to_the_new_master_without_losing_mail() {
    let dir = tempfile::tempdir().unwrap();
    let (master_port, replica_port, sentinel_port) = (free_port(), free_port(), free_port());
    let (master_dir, replica_dir) = (dir.path().join("m"), dir.path().join("r"));
    std::fs::create_dir_all(&master_dir).unwrap();
    std::fs::create_dir_all(&replica_dir).unwrap();
    let mut master = data_node(master_port, &master_dir, &[]);
    let replica_of = format!("127.0.0.1 {master_port}");
    let _replica = data_node(replica_port, &replica_dir, &["--replicaof", &replica_of]);
    // Sentinel rewrites its configuration file: it must be a writable file.
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let _sentinel = RedisProcess::start(&[conf.to_str().unwrap(), "--sentinel"], sentinel_port);

    let db = TestDatabase::create_blocking("mc_sentinel");
    let url = format!("redis+sentinel://127.0.0.1:{sentinel_port}/mymaster");
    let env = base_env(&db.url, &url);
    prepare(&env);
    let serve_dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(serve_dir.path(), &env, 2);
    let (smtp, imap, admin) = (server.addr("smtp"), server.addr("imap"), server.admin);
    server.wait_for_cache_up(Duration::from_secs(20));
    assert!(imap_login(imap).unwrap().starts_with("a OK"));

    let stop = Arc::new(AtomicBool::new(false));
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));
    let acknowledged = Arc::new(Mutex::new(0usize));
    let mut workers = Vec::new();
    {
        let (stop, problems) = (stop.clone(), problems.clone());
        workers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match imap_login(imap) {
                    Ok(l) if l.starts_with("a OK") => {}
                    Ok(l) => problems.lock().unwrap().push(format!("login: {l}")),
                    Err(e) => problems.lock().unwrap().push(format!("login: {e}")),
                }
                let (status, body) = http_get(admin, "/readyz");
                if status != 200 {
                    problems.lock().unwrap().push(format!("readyz {status}: {body}"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    {
        let (stop, problems, acknowledged) = (stop.clone(), problems.clone(), acknowledged.clone());
        workers.push(std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                match deliver(smtp, n) {
                    Ok(l) if l.starts_with("250") => *acknowledged.lock().unwrap() += 1,
                    Ok(l) => problems.lock().unwrap().push(format!("message {n}: {l}")),
                    Err(e) => problems.lock().unwrap().push(format!("message {n}: {e}")),
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(30));
            }
        }));
    }
    // Counts, not durations: a loaded machine delivers slower, never less.
    let wait_for_acks = |at_least: usize, when: &str| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while *acknowledged.lock().unwrap() < at_least {
            assert!(Instant::now() < deadline, "fewer than {at_least} messages acknowledged {when}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for_acks(10, "before the failover");
    master.kill();
    // The Sentinel promotes the replica; the pod finds it by itself.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let promoted = redis_cli(replica_port, &["ROLE"]).starts_with("master");
        let moved = server.log_contains(&format!("127.0.0.1:{replica_port}"));
        if promoted && moved && http_get(admin, "/healthz").1.contains("cache (redis): up") {
            break;
        }
        assert!(Instant::now() < deadline, "no failover to the replica: {}", server.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Shared state goes to the new master now.
    let before = redis_cli(replica_port, &["DBSIZE"]).parse::<u64>().unwrap_or(0);
    let at_failover = *acknowledged.lock().unwrap();
    wait_for_acks(at_failover + 10, "after the failover");
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    redis_cli(replica_port, &["FLUSHALL"]);
    assert!(imap_login(imap).unwrap().starts_with("a OK"));
    let after = redis_cli(replica_port, &["DBSIZE"]).parse::<u64>().unwrap_or(0);
    assert!(
        after > 0,
        "the login's credential was cached on the new master ({before} keys before the flush)"
    );

    let problems = problems.lock().unwrap();
    assert!(problems.is_empty(), "{:?}", &problems[..problems.len().min(10)]);
    let stored: i64 = block_on(async {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM mailbox_messages").fetch_one(&mut c).await.unwrap()
    });
    assert_eq!(stored as usize, *acknowledged.lock().unwrap(), "stored exactly what was acknowledged");
    drop(server);
}

#[test]
fn a_tls_only_redis_is_verified_and_used() {
    let dir = tempfile::tempdir().unwrap();
    // A CA and a server certificate for 127.0.0.1.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "mailcluster test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (ca_path, cert_path, key_path) =
        (dir.path().join("ca.pem"), dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();

    let port = free_port();
    let port_s = port.to_string();
    let _redis = RedisProcess::start(
        &[
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-port",
            &port_s,
            "--save",
            "",
            "--appendonly",
            "no",
            "--tls-cert-file",
            cert_path.to_str().unwrap(),
            "--tls-key-file",
            key_path.to_str().unwrap(),
            "--tls-ca-cert-file",
            ca_path.to_str().unwrap(),
            "--tls-auth-clients",
            "no",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        port,
    );
    let db = TestDatabase::create_blocking("mc_redis_tls");
    let url = format!("rediss://127.0.0.1:{port}");
    let mut env = base_env(&db.url, &url);
    // The pod trusts the Redis CA through the system's trust store settings.
    let ca_file = ca_path.to_str().unwrap().to_string();
    env.push(("SSL_CERT_FILE", ca_file.as_str()));
    prepare(&env);
    let serve_dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(serve_dir.path(), &env, 2);
    server.wait_for_cache_up(Duration::from_secs(20));
    assert!(imap_login(server.addr("imap")).unwrap().starts_with("a OK"));
    let keys = Command::new("redis-cli")
        .args(["--tls", "--cacert", &ca_file, "-p", &port_s, "DBSIZE"])
        .output()
        .expect("redis-cli");
    let n: u64 = String::from_utf8_lossy(&keys.stdout).trim().parse().unwrap_or(0);
    assert!(n > 0, "the credential cached in the TLS Redis: {}", String::from_utf8_lossy(&keys.stderr));
    drop(server);
}
