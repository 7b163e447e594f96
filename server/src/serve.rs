//! `mailcluster serve`: turns a [`Config`] into a running pod.
//!
//! Order matters and is chosen so that a pod that cannot work fails before it
//! accepts anything: raise limits → store (retrying while the database comes up) →
//! migrations → cache → shared state → TLS → listeners and admin → wait for
//! SIGTERM/SIGINT → drain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::admin::{self, AdminState};
use crate::app::{App, MailExchange};
use crate::auth::Authenticator;
use crate::cache::{self, Cache};
use crate::config::{Config, redact_url};
use crate::delivery::Deliverer;
use crate::imap::ImapProtocol;
use crate::managesieve::ManageSieveProtocol;
use crate::metrics::Metrics;
use crate::net::{self, Listener, ListenerSpec, Protocol, ShutdownController, TlsMode, TlsProvider};
use crate::pop3::Pop3Protocol;
use crate::relay::Relay;
use crate::smtp::{SmtpKind, SmtpProtocol};
use crate::store::{self, Store, StoreError};
use mailcluster_api::Listener as ConfigListener;

/// Runs the server until SIGTERM or SIGINT, then drains and returns.
pub async fn run(config: Config) -> anyhow::Result<()> {
    // Open files and the listen backlog are the kernel's to give: each is
    // logged once with its figures, with a warning when it falls short.
    let open_files = match net::kernel::check_open_files(&config) {
        Ok(open_files) => Some(open_files),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE");
            None
        }
    };
    net::kernel::log_backlog(&config);
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data directory {}", config.data_dir.display()))?;
    let config = Arc::new(config);

    let store = open_store(&config).await?;
    if config.database.migrate_on_start {
        store.migrate().await.context("database migration failed")?;
    }
    let (cache, resilient) = open_serving_cache(&config, store.clone()).await?;
    let mac_key = cache_mac_key(&config);
    let sealed = Arc::new(cache::sealed::Sealed::new(cache, mac_key.clone()));
    let cache: Arc<dyn Cache> = sealed.clone();

    let metrics = Arc::new(Metrics::new());
    sealed.register_metrics(&metrics.registry).context("registering cache metrics")?;
    // What the runtime was given (`worker_threads`, or one per CPU): a pod whose
    // CPU request and thread count disagree shows it here.
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let worker_gauge = prometheus::IntGauge::new(
        "mail_runtime_worker_threads",
        "Threads of the async runtime that run sessions",
    )
    .context("worker gauge")?;
    worker_gauge.set(workers as i64);
    metrics.registry.register(Box::new(worker_gauge)).context("registering the worker gauge")?;
    if let Some(open_files) = &open_files {
        net::kernel::register_open_files_metrics(&metrics.registry, open_files)
            .context("registering the open-files gauges")?;
    }
    if let Some(r) = &resilient {
        r.register_metrics(&metrics.registry).context("registering cache metrics")?;
    }
    // Time spent waiting for a database connection: the early sign of a pool too
    // small for the load, before saturation shows in command latency.
    let acquire = metrics.db_pool_acquire.clone();
    store.set_acquire_observer(Arc::new(move |wait| acquire.observe(wait.as_secs_f64())));
    let auth =
        Arc::new(Authenticator::new(store.clone(), cache.clone(), config.auth.clone()).with_mac_key(mac_key));
    auth.register_metrics(&metrics.registry).context("registering authentication metrics")?;
    let mut deliverer = Deliverer::with_options(store.clone(), crate::smtp::delivery_options(&config.smtp));
    // Group commit across pods (delivery/forward/): every pod may both lead
    // and follow; which one leads is the lowest address of the leader's name.
    let smtp = &config.smtp;
    let group_key = if smtp.group_commit_leader.is_empty() && smtp.group_commit_port == 0 {
        None
    } else if let Some(secret) = &smtp.group_commit_secret {
        Some(secret.expose().as_bytes().to_vec())
    } else {
        // Leader and followers prove the shared key to each other; without one
        // this pod can do neither, and its mail is no worse off committed here.
        tracing::warn!(
            "group commit across pods is configured but smtp.group_commit_secret is not set: \
             this pod commits its own deliveries and takes none from other pods"
        );
        None
    };
    let instance = crate::delivery::forward::instance_id();
    tokio::spawn(auth.count_pods(instance.clone()));
    if let (Some(key), false) = (&group_key, smtp.group_commit_leader.is_empty()) {
        deliverer = deliverer.forwarding_to(smtp.group_commit_leader.clone(), key.clone(), instance.clone());
    }
    let deliverer = Arc::new(deliverer);
    deliverer.register_metrics(&metrics.registry).context("registering group-commit metrics")?;
    let group_listener = match (group_key, smtp.group_commit_port) {
        (Some(key), port) if port != 0 => {
            let addr = std::net::SocketAddr::new(config.listen_addr, port);
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for group commit on {addr}"))?;
            Some((listener, key))
        }
        _ => None,
    };
    // Looking the leader up may wait on DNS: the listeners do not. Started
    // once this pod's own port is bound, so that the leader's first attempt
    // finds itself there (its handshake waits in the backlog until accepted)
    // rather than a refused connection, which it would try again only at the
    // next delivery.
    let starting = deliverer.clone();
    tokio::spawn(async move { starting.start_forwarding().await });
    // Without nameservers configured and without a usable /etc/resolv.conf, the
    // pod still serves local mail; it only cannot send to other domains or check
    // senders, and says so.
    let dns = match crate::dns::Dns::from_config(&config.dns) {
        // Answers shared with the other pods through the cache (Redis in a cluster).
        Ok(dns) => Some(Arc::new(dns.with_shared(cache.clone()))),
        Err(e) if config.dns.nameservers.is_empty() => {
            tracing::warn!(error = %e, "no DNS resolver: outbound relay and sender authentication are off");
            None
        }
        Err(e) => return Err(e.context("DNS resolver setup failed")),
    };
    let signer = Arc::new(crate::dkim::Signer::load(&config.dkim).context("DKIM setup failed")?);
    tokio::spawn(signer.clone().keep_fresh(store.clone()));
    let relay_wake = Arc::new(tokio::sync::Notify::new());
    let app = App::new(config.clone(), store.clone(), cache.clone(), metrics.clone(), auth, deliverer)
        .with_mail(MailExchange { dns: dns.clone(), signer, relay_wake: relay_wake.clone() });
    // Which accounts' mail a Sieve script filters, read again every few seconds.
    tokio::spawn(app.sieve.clone().keep_fresh(store.clone()));
    // The read caches assume the database never goes back in time; they are
    // dropped when it does (restore, failover).
    tokio::spawn(app.view.watch_epoch());
    if config.imap.tombstone_retention_days > 0 {
        tokio::spawn(prune_tombstones(store.clone(), config.clone()));
    }
    tokio::spawn(prune_sieve_seen(store.clone(), config.clone()));

    let tls =
        TlsProvider::from_app_config(&config, cache.clone(), &metrics).await.context("TLS setup failed")?;
    let shutdown = ShutdownController::new(Duration::from_secs(config.shutdown_grace_secs));
    // From here on SIGTERM/SIGINT start a drain instead of killing the process.
    shutdown.spawn_signal_handler().context("cannot install the SIGTERM/SIGINT handler")?;
    let mut followers = None;
    if let Some((listener, key)) = group_listener {
        // Other pods' deliveries, declined once this pod drains.
        let taken = Arc::new(crate::delivery::forward::Followers::default());
        taken.register_metrics(&metrics.registry).context("registering group-commit leader metrics")?;
        tokio::spawn(crate::delivery::forward::accept(
            listener,
            app.deliverer.clone(),
            key,
            instance,
            config.smtp.max_message_size,
            shutdown.subscribe(),
            taken.clone(),
        ));
        followers = Some(taken);
    }

    // Bind everything before serving anything: a taken port fails the start with
    // its name instead of leaving a half-working pod.
    let admin_addr = config.admin_addr();
    let admin_listener =
        admin::bind(admin_addr).await.with_context(|| format!("cannot listen on {admin_addr} (admin)"))?;
    let mut bound = Vec::new();
    for (listener, addr) in config.listen_addrs() {
        let name = listener.name();
        let (tls_mode, protocol) = protocol_for(listener, &app);
        let spec = ListenerSpec::from_config(name, addr.port(), tls_mode, &config);
        let addr = spec.addr;
        let listener = Listener::bind(spec).with_context(|| format!("cannot listen on {addr} ({name})"))?;
        bound.push((listener, protocol));
    }

    let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin_state = AdminState::new(store.clone(), cache.clone(), metrics.clone(), shutdown.clone());
    let admin_task = tokio::spawn(admin::serve_admin(admin_listener, admin_state, async move {
        let _ = admin_stopped.await;
    }));

    // Relay workers run where SMTP is served: the pods that take mail in also
    // send it on.
    let serves_smtp = config.enabled_listeners().iter().any(|l| {
        matches!(l, ConfigListener::Smtp | ConfigListener::Submission | ConfigListener::Submissions)
    });
    let relay_task = if let Some(dns) = dns.filter(|_| config.relay.enabled && serves_smtp) {
        let relay = Relay::new(app.clone(), dns, relay_wake).context("relay setup failed")?;
        relay.register_metrics(&metrics.registry).context("registering relay metrics")?;
        Some(tokio::spawn(relay.run(shutdown.clone())))
    } else {
        None
    };

    tracing::info!(
        hostname = %config.hostname,
        store = store.backend(),
        cache = cache.backend(),
        workers,
        transfer_budget = app.budget.limit(),
        "mailcluster serving"
    );
    let drain_started = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.triggered().await;
            Instant::now()
        })
    };
    net::serve(bound, Some(tls), metrics, shutdown.clone()).await;
    if let Some(followers) = followers {
        // Pods that led others stay until those have moved on (their headless
        // Service drops this pod once `/readyz` fails), so that nothing they
        // send meets a closed port: what arrives meanwhile is declined, and
        // they commit it themselves. Within the drain's own grace.
        let started = match drain_started.is_finished() {
            true => drain_started.await.unwrap_or_else(|_| Instant::now()),
            false => Instant::now(),
        };
        followers.quiet(crate::delivery::forward::FOLLOWERS_QUIET, started + shutdown.grace()).await;
    }
    if let Some(task) = relay_task {
        // It began its drain with the listeners'; it has had the same grace.
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    tracing::info!("drained; stopping");

    // The admin port stays up during the drain so probes see `/readyz` fail.
    let _ = admin_stop.send(());
    match admin_task.await {
        Ok(result) => result.context("admin server failed")?,
        Err(e) => anyhow::bail!("admin server task failed: {e}"),
    }
    Ok(())
}

/// The session type and TLS mode of each listener.
fn protocol_for(listener: ConfigListener, app: &App) -> (TlsMode, Arc<dyn Protocol>) {
    let app = app.clone();
    match listener {
        ConfigListener::Smtp => (TlsMode::Plain, Arc::new(SmtpProtocol::new(app, SmtpKind::Mx))),
        ConfigListener::Submission => {
            (TlsMode::Plain, Arc::new(SmtpProtocol::new(app, SmtpKind::Submission)))
        }
        ConfigListener::Submissions => {
            (TlsMode::Implicit, Arc::new(SmtpProtocol::new(app, SmtpKind::Submissions)))
        }
        ConfigListener::Imap => (TlsMode::Plain, Arc::new(ImapProtocol::new(app, false))),
        ConfigListener::Imaps => (TlsMode::Implicit, Arc::new(ImapProtocol::new(app, true))),
        ConfigListener::Pop3 => (TlsMode::Plain, Arc::new(Pop3Protocol::new(app, false))),
        ConfigListener::Pop3s => (TlsMode::Implicit, Arc::new(Pop3Protocol::new(app, true))),
        ConfigListener::ManageSieve => (TlsMode::Plain, Arc::new(ManageSieveProtocol::new(app))),
    }
}

/// The cache of a serving pod: with Redis configured, Redis behind its per-pod
/// stand-ins (`cache::resilient`), so that a Redis outage degrades the pod instead
/// of stopping it — and a Redis down at start does not keep the pod from starting.
/// Without Redis, the in-process cache.
pub async fn open_serving_cache(
    config: &Config,
    store: Arc<dyn crate::store::Store>,
) -> anyhow::Result<(Arc<dyn Cache>, Option<Arc<cache::resilient::ResilientCache>>)> {
    let Some(url) = config.redis.url.as_ref().map(|s| s.expose()) else {
        return Ok((open_cache(config).await?, None));
    };
    let opts = cache::resilient::ResilienceOptions {
        budget: Duration::from_millis(config.redis.request_budget_ms),
        retry_after: Duration::from_secs(config.redis.retry_after_secs),
        client_cache_keys: config.redis.client_cache_keys,
        ..Default::default()
    };
    let timeout = Duration::from_secs(config.redis.connect_timeout_secs);
    let resilient =
        cache::resilient::ResilientCache::start(url, &config.redis.key_prefix, timeout, store, opts)
            .await
            .map_err(|e| anyhow::anyhow!("cannot use Redis at {}: {e}", redact_url(url)))?;
    Ok((resilient.clone(), Some(resilient)))
}

/// The key of the MACs on what the pod reads back from the shared cache
/// (`cache::sealed`): `cache.mac_key`, else derived from the database URL.
fn cache_mac_key(config: &Config) -> cache::sealed::MacKey {
    let (key, source) = cache::sealed::MacKey::for_config(config);
    if source == cache::sealed::MacKeySource::DatabaseUrl && config.redis.url.is_some() {
        tracing::warn!(
            "cache.mac_key is not set: the MACs on cached values are keyed from the database URL; \
             a key of its own (MAILCLUSTER_CACHE__MAC_KEY) is better"
        );
    }
    key
}

/// Opens the cache directly: Redis when configured (failing when it does not
/// answer), else the in-process one (single pod). For the admin commands, which
/// must reach the shared cache or say they cannot.
pub async fn open_cache(config: &Config) -> anyhow::Result<Arc<dyn Cache>> {
    let url = config.redis.url.as_ref().map(|s| s.expose());
    let timeout = Duration::from_secs(config.redis.connect_timeout_secs);
    let cache = cache::open(url, &config.redis.key_prefix, timeout).await.map_err(|e| match url {
        Some(url) => anyhow::anyhow!("cannot connect to Redis at {}: {e}", redact_url(url)),
        None => anyhow::anyhow!("cannot start the in-process cache: {e}"),
    })?;
    if url.is_none() {
        tracing::warn!("no MAILCLUSTER_REDIS_URL: using the in-process cache (one pod only)");
    }
    Ok(cache)
}

/// Opens the configured store. While the database is unavailable it keeps trying,
/// with exponential backoff, for `database.startup_retry_secs` (a pod starting
/// together with its database should wait rather than crash-loop); other errors,
/// and unavailability after that time, fail with one line naming the database.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let url = config.database.url.as_ref().map(|s| s.expose());
    let target = match url {
        Some(url) => redact_url(url),
        None => format!("embedded SQLite in {}", config.data_dir.display()),
    };
    let deadline = Instant::now() + Duration::from_secs(config.database.startup_retry_secs);
    let mut delay = Duration::from_millis(250);
    loop {
        match open_store_once(config, url).await {
            Ok(store) => {
                tracing::info!(backend = store.backend(), database = %target, "store opened");
                return Ok(store);
            }
            Err(StoreError::Unavailable(e)) if Instant::now() + delay < deadline => {
                tracing::warn!(database = %target, error = %e, retry_in = ?delay, "database unavailable");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(anyhow::anyhow!("cannot open the database ({target}): {e}")),
        }
    }
}

async fn open_store_once(config: &Config, url: Option<&str>) -> Result<Arc<dyn Store>, StoreError> {
    let timeout = Duration::from_secs(config.database.connect_timeout_secs);
    store::open(url, &config.data_dir, config.database.pool_size, timeout).await
}

/// Every `imap.tombstone_prune_interval_secs`, the pod that holds the cluster-wide
/// lease deletes the expunge tombstones older than `imap.tombstone_retention_days`
/// (the expunged table would otherwise grow with every message ever deleted).
async fn prune_tombstones(store: Arc<dyn Store>, config: Arc<Config>) {
    let every = Duration::from_secs(config.imap.tombstone_prune_interval_secs);
    let retention =
        chrono::Duration::days(i64::try_from(config.imap.tombstone_retention_days).unwrap_or(i64::MAX));
    under_lease(store, &config, "tombstones", every, move |store| async move {
        let before = chrono::Utc::now() - retention;
        match store.prune_tombstones(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(pruned = n, %before, "expunge tombstones pruned"),
            Err(e) => tracing::warn!(error = %e, "tombstone prune failed"),
        }
    })
    .await
}

/// Every hour, the pod that holds the cluster-wide lease forgets the vacation
/// replies and duplicate ids of Sieve scripts whose period is over.
async fn prune_sieve_seen(store: Arc<dyn Store>, config: Arc<Config>) {
    under_lease(store, &config, "sieve", Duration::from_secs(3600), |store| async move {
        match store.sieve_seen_prune().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(pruned = n, "sieve vacation and duplicate records pruned"),
            Err(e) => tracing::warn!(error = %e, "sieve prune failed"),
        }
    })
    .await
}

/// Runs `job` every `every` on the one pod that holds the cluster-wide lease
/// `prune:<name>` for that round. Failures are logged and retried at the next
/// round.
async fn under_lease<F: std::future::Future<Output = ()>>(
    store: Arc<dyn Store>,
    config: &Config,
    name: &str,
    every: Duration,
    job: impl Fn(Arc<dyn Store>) -> F,
) {
    let member = format!("{}:{}", config.hostname, std::process::id());
    let key = format!("prune:{name}");
    loop {
        tokio::time::sleep(every).await;
        match store.lease_acquire(&key, &member, 1, every).await {
            Ok(true) => job(store.clone()).await,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, lease = %key, "cannot take the lease"),
        }
    }
}
