//! Measures what one login costs in the cache layer and in argon2.
//!
//! `cargo run -p mailcluster-server --example cache_bench [tasks] [logins_per_task]`
//!
//! For the in-process cache and for Redis (`REDIS_URL`, default
//! redis://127.0.0.1:6379; keys under a random prefix, deleted afterwards) it runs
//! `tasks` concurrent loops of the cache round trips of a cache-hit login (two
//! rate-limit `counter_get`s in parallel, then `credential_get`) and prints
//! throughput and latency percentiles. Then it times argon2id hashing and
//! verification with the production parameters — the work a cache hit saves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mailcluster_server::auth::{hash_password, verify_password};
use mailcluster_server::cache::{self, Cache};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest-rank: an index into the sorted samples, never past the end.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn hit_path(cache: Arc<dyn Cache>, tasks: usize, per_task: usize) -> anyhow::Result<()> {
    let key = [42u8; 32];
    cache.credential_put(&key, 1, Duration::from_secs(600)).await?;
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let cache = cache.clone();
        handles.push(tokio::spawn(async move {
            let user_key = format!("authfail:user:bench{t}@example.com");
            let mut samples = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t0 = Instant::now();
                let (u, ip) = tokio::try_join!(
                    cache.counter_get(&user_key),
                    cache.counter_get("authfail:net:192.0.2.1")
                )?;
                let hit = cache.credential_get(&key).await?;
                anyhow::ensure!(u == 0 && ip == 0 && hit == Some(1), "unexpected cache contents");
                samples.push(t0.elapsed());
            }
            anyhow::Ok(samples)
        }));
    }
    let mut all = Vec::with_capacity(tasks * per_task);
    for h in handles {
        all.extend(h.await??);
    }
    let elapsed = started.elapsed();
    all.sort_unstable();
    println!(
        "{:>6}: {} logins by {tasks} tasks in {:.2?}: {:.0} logins/s; latency p50 {:.2?} p99 {:.2?} max {:.2?}",
        cache.backend(),
        all.len(),
        elapsed,
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 50.0),
        percentile(&all, 99.0),
        all.last().copied().unwrap_or_default(),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let per_task: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);

    let local = cache::open(None, "", Duration::from_secs(1)).await?;
    hit_path(local, tasks, per_task).await?;

    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut raw = [0u8; 8];
    rand::fill(&mut raw);
    let prefix = format!("mcbench:{}:", raw.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let redis = cache::open(Some(&url), &prefix, Duration::from_secs(5)).await?;
    let result = hit_path(redis, tasks, per_task).await;
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut conn).await?;
    if !keys.is_empty() {
        redis::cmd("DEL").arg(&keys).query_async::<()>(&mut conn).await?;
    }
    result?;

    let rounds = 10;
    let t0 = Instant::now();
    let mut hash = String::new();
    for _ in 0..rounds {
        hash = hash_password("correct horse battery staple")?;
    }
    let hashing = t0.elapsed() / rounds;
    let t0 = Instant::now();
    for _ in 0..rounds {
        anyhow::ensure!(verify_password("correct horse battery staple", &hash)?, "verification failed");
    }
    let verifying = t0.elapsed() / rounds;
    println!("argon2id m=19MiB t=2 p=1: hash {hashing:.2?}, verify {verifying:.2?} (one core, per call)");
    Ok(())
}
