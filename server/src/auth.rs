//! Password verification for every protocol: argon2id hashes, a verified-credential
//! cache in front of them (so login storms cost a hash lookup, not an argon2 run),
//! and failed-login limits per (user, client) and per client held in the cache so
//! they apply across pods.
//!
//! One login, in order:
//! 1. normalise the user name (lower-case; a bare local part means the only domain);
//! 2. reserve the attempt: one atomic increment of the counter of this user from
//!    this client network and one of the client network itself. An attempt
//!    whose increment passes a limit is refused (`RateLimited`) before any
//!    expensive work — once no other attempt of that client is still being
//!    checked: until then it waits (at most 5 s), since those may be right
//!    passwords that give their reservations back (a client opening many
//!    connections at once). Counting before checking is what makes the limit hold
//!    under parallel attempts: checking first and counting after let every
//!    attempt in flight through (60 parallel guesses were all evaluated against
//!    a limit of 10). An attempt over a limit whose password is a credential
//!    verified before (step 3's cache hit, which only the right password makes)
//!    is let in without waiting: the limits slow guessers, not the owner, and a
//!    storm of returning users behind one address is not held back by them;
//! 3. look the credential up in the cache under HMAC-SHA256(key, secret ‖ user ‖
//!    0 ‖ password ‖ 0 ‖ stored hash): the secret is shared by all pods through
//!    the cache and rotated there, the key is the pod's cache MAC key
//!    (`cache.mac_key`), which the cache never sees, so whoever can write the cache
//!    cannot make an entry that matches a password of their choosing. A hit skips
//!    argon2;
//! 4. otherwise run argon2id on the blocking pool, bounded by a semaphore (each run
//!    holds 19 MiB), and cache the credential on success;
//! 5. a success (or a store or cache failure) gives its reservation back, so a
//!    client that logs in often with the right password never runs into a limit;
//!    a failure keeps it and is answered after a delay that doubles with each
//!    failure counted (`auth.failure_delay_ms` up to `max_failure_delay_ms`, as
//!    Dovecot's auth penalty), holding no lock and no argon2 permit.
//!
//! The limits are per (user, client network) and per client network, never per
//! user alone: a limit on the user alone would let anyone lock any user out by
//! failing on purpose. A guesser is slowed and stopped; the owner, from an
//! address that has not failed, logs in.
//!
//! While Redis is away the counters are the pod's own: each pod then allows its
//! share of each limit (the limit divided by the pods that announced themselves
//! in the lease set `auth:pods`), so the cluster does not allow one limit per pod.
//!
//! Any store or cache error yields `Unavailable` (a temporary failure reply), never
//! success and never a counted failure.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::password_hash::PasswordHasher;
use argon2::{Algorithm, Argon2, Params, Version};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::sync::Semaphore;

use crate::cache::sealed::MacKey;
use crate::cache::{Cache, RotatingSecret};
use crate::store::Accounts;
use mailcluster_model::Account;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    Ok(Account),
    /// Wrong user or password (never says which).
    Failed,
    /// Too many failures for this user or IP; retry later.
    RateLimited,
    /// Store or cache trouble: a temporary failure.
    Unavailable,
}

impl AuthOutcome {
    /// Label for `mail_auth_total{result}` and logs.
    pub fn label(&self) -> &'static str {
        match self {
            AuthOutcome::Ok(_) => "ok",
            AuthOutcome::Failed => "failed",
            AuthOutcome::RateLimited => "rate_limited",
            AuthOutcome::Unavailable => "unavailable",
        }
    }
}

pub use mailcluster_api::config::AuthConfig;

/// Name of the shared secret keying the credential cache.
const CREDENTIAL_SECRET: &str = "credential-key";
/// Rotating it invalidates every cached credential (one argon2 run per user), so
/// rarely: it only needs to outlive a leaked Redis dump being useful.
const CREDENTIAL_SECRET_ROTATION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a pod reuses the secret before asking the cache again. After a
/// rotation pods briefly disagree, which costs cache misses, never wrong answers.
const SECRET_REFRESH: Duration = Duration::from_secs(60);
/// How long an attempt over a limit waits for the client's attempts in flight
/// (which may succeed and give their reservations back) before it is refused.
const ADMISSION_WAIT: Duration = Duration::from_secs(5);
const ADMISSION_POLL: Duration = Duration::from_millis(20);
/// Lifetime of a client's in-flight counter: far longer than one check, so it
/// only ages out what a pod that died mid-check left behind.
const FLIGHT_WINDOW: Duration = Duration::from_secs(120);
/// Longer names and passwords are refused outright: no legitimate client sends
/// them, and they would only make every later step more expensive.
const MAX_USER_LEN: usize = 320;
const MAX_PASSWORD_LEN: usize = 1024;
/// The lease set in which every pod announces itself, and how often and for how
/// long: a pod gone stops counting after `POD_LEASE`.
const POD_SET: &str = "auth:pods";
const POD_HEARTBEAT: Duration = Duration::from_secs(10);
const POD_LEASE: Duration = Duration::from_secs(30);
/// Failed logins waiting out their delay on this pod, at most. Past it failures
/// are answered at once: the limits still bound the guesses, and a flood of
/// failing connections cannot make the pod hold more timers than this.
const MAX_DELAYED: usize = 4096;
/// A process records an account's login in the store at most this often (what
/// a MailAccount's status shows is that coarse): a mail client logging in every
/// few seconds costs no write each time.
pub const LOGIN_RECORD_INTERVAL: Duration = Duration::from_secs(300);
/// Accounts whose last recorded login the process remembers before it forgets
/// the ones written longer than [`LOGIN_RECORD_INTERVAL`] ago.
const LOGINS_REMEMBERED: usize = 10_000;

/// The argon2id instance for new hashes: m = 19 MiB, t = 2, p = 1, the first of
/// OWASP's recommended argon2id configurations (Password Storage Cheat Sheet);
/// about 20-50 ms of one core. Verification reads the parameters from the stored
/// PHC string, so raising these later still verifies older hashes.
fn hasher() -> Argon2<'static> {
    // These constants are valid argon2 parameters; `Params::DEFAULT` is the
    // fallback only to avoid a panic path.
    let params = Params::new(19 * 1024, 2, 1, None).unwrap_or(Params::DEFAULT);
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Hashes a password with argon2id and a random salt (PHC string).
pub fn hash_password(password: &str) -> anyhow::Result<String> {
    let hash = hasher()
        .hash_password(password.as_bytes())
        .map_err(|e| anyhow::anyhow!("argon2 hashing failed: {e}"))?;
    Ok(hash.to_string())
}

/// Checks `password` against a stored hash: argon2, or an imported bcrypt or
/// SHA-crypt hash (`crate::password`). `Err` means the stored hash itself is
/// unusable (corrupt, an unknown format, or over a cost bound), which is not the
/// user's fault.
pub fn verify_password(password: &str, hash: &str) -> anyhow::Result<bool> {
    crate::password::verify(password, hash).map_err(|e| anyhow::anyhow!("stored password hash unusable: {e}"))
}

/// A hash of nothing anybody knows, verified when the user does not exist so that
/// an unknown user costs the same time as a wrong password (no user enumeration
/// by timing).
fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let mut random = [0u8; 16];
        rand::fill(&mut random);
        hash_password(&crate::cache::hex(&random)).unwrap_or_default()
    })
}

struct Cached<T> {
    value: T,
    fetched: Instant,
}

pub struct Authenticator {
    /// Logins read accounts and domains only.
    pub store: Arc<dyn Accounts>,
    pub cache: Arc<dyn Cache>,
    pub config: AuthConfig,
    domains: Mutex<Option<Cached<Vec<String>>>>,
    secret: Mutex<Option<Cached<RotatingSecret>>>,
    hashing: Arc<Semaphore>,
    argon2_runs: AtomicU64,
    /// Keys the credential cache (see the module documentation).
    mac_key: MacKey,
    /// Pods of the cluster as last counted (at least 1), and the count last
    /// seen while the counters were shared, which outlasts a Redis outage.
    pods: AtomicU64,
    pods_when_shared: AtomicU64,
    delayed: Arc<std::sync::atomic::AtomicUsize>,
    /// `mail_auth_total{result}`; registered by whoever owns the registry
    /// ([`Authenticator::register_metrics`]).
    auth_total: prometheus::IntCounterVec,
    /// `mail_auth_delayed`: failed logins waiting out their delay.
    delayed_gauge: prometheus::IntGauge,
    /// `mail_auth_hash_waiting`: logins whose password waits for an argon2
    /// permit (a burst of cold credentials queues here, not in the sessions).
    hash_waiting: prometheus::IntGauge,
    /// `mail_auth_hash_wait_seconds`: how long they waited for it.
    hash_wait: prometheus::Histogram,
    /// When this process last recorded each account's login.
    logins_recorded: Mutex<std::collections::HashMap<i64, Instant>>,
}

/// What the store and the credential cache say of a login before any argon2.
enum Lookup {
    /// No such account, or a disabled one.
    Unknown,
    /// The password is a credential verified before.
    Verified(Account),
    /// The account, and the cache key its credential would have.
    Unverified(Account, [u8; 32]),
}

/// Why a login attempt stopped early with `Unavailable`.
struct Trouble(String);

impl<E: std::fmt::Display> From<E> for Trouble {
    fn from(e: E) -> Self {
        Trouble(e.to_string())
    }
}

impl Authenticator {
    pub fn new(store: Arc<dyn Accounts>, cache: Arc<dyn Cache>, config: AuthConfig) -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let permits = hash_permits(config.max_concurrent_hashes, cpus);
        let auth_total = prometheus::IntCounterVec::new(
            prometheus::Opts::new("mail_auth_total", "Login attempts by outcome"),
            &["result"],
        )
        .expect("static metric definition is valid");
        let delayed_gauge =
            prometheus::IntGauge::new("mail_auth_delayed", "Failed logins waiting out their delay")
                .expect("static metric definition is valid");
        let hash_waiting = prometheus::IntGauge::new(
            "mail_auth_hash_waiting",
            "Logins waiting for an argon2 permit (auth.max_concurrent_hashes)",
        )
        .expect("static metric definition is valid");
        let hash_wait = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "mail_auth_hash_wait_seconds",
                "Time a login waited for an argon2 permit before its password was hashed",
            )
            .buckets(vec![0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
        )
        .expect("static metric definition is valid");
        Authenticator {
            store,
            cache,
            config,
            domains: Mutex::new(None),
            secret: Mutex::new(None),
            hashing: Arc::new(Semaphore::new(permits)),
            argon2_runs: AtomicU64::new(0),
            mac_key: MacKey::process(),
            pods: AtomicU64::new(1),
            pods_when_shared: AtomicU64::new(1),
            delayed: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            auth_total,
            delayed_gauge,
            hash_waiting,
            hash_wait,
            logins_recorded: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Keys the credential cache with `key` (by default a key of this process
    /// alone, which only one pod can use).
    pub fn with_mac_key(mut self, key: MacKey) -> Self {
        self.mac_key = key;
        self
    }

    /// Registers `mail_auth_total{result}` and `mail_auth_delayed` into the
    /// server's registry.
    pub fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.auth_total.clone()))?;
        registry.register(Box::new(self.hash_waiting.clone()))?;
        registry.register(Box::new(self.hash_wait.clone()))?;
        registry.register(Box::new(self.delayed_gauge.clone()))
    }

    /// Announces this pod in the pod set and counts the pods there, every
    /// [`POD_HEARTBEAT`], for as long as the authenticator lives (`serve` spawns
    /// it). The count divides the limits while the counters are per pod.
    pub fn count_pods(self: &Arc<Self>, instance: String) -> impl Future<Output = ()> + Send + 'static {
        let weak = Arc::downgrade(self);
        async move {
            loop {
                let Some(auth) = weak.upgrade() else { return };
                if auth.cache.shared_across_processes() {
                    auth.heartbeat(&instance).await;
                }
                drop(auth);
                tokio::time::sleep(POD_HEARTBEAT).await;
            }
        }
    }

    async fn heartbeat(&self, instance: &str) {
        let shared = self.cache.counters_shared();
        let counted = match self.cache.lease_acquire(POD_SET, instance, u64::MAX, POD_LEASE).await {
            Ok(_) => self.cache.lease_count(POD_SET).await,
            Err(e) => Err(e),
        };
        match counted {
            Ok(n) => {
                let n = n.max(1);
                self.pods.store(n, Ordering::Relaxed);
                if shared {
                    self.pods_when_shared.store(n, Ordering::Relaxed);
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not count the pods"),
        }
    }

    /// This pod's share of `max`: all of it while the counters are the
    /// cluster's, else `max` divided by the pods (rounded up: never 0).
    fn share(&self, max: u64) -> u64 {
        if self.cache.counters_shared() {
            return max;
        }
        let pods =
            self.pods.load(Ordering::Relaxed).max(self.pods_when_shared.load(Ordering::Relaxed)).max(1);
        max.div_ceil(pods)
    }

    /// argon2 verifications run by this authenticator so far (cache misses and
    /// unknown users); lets tests and benchmarks see the credential cache work.
    pub fn argon2_runs(&self) -> u64 {
        self.argon2_runs.load(Ordering::Relaxed)
    }

    /// Verifies `user` (full address, or local part when the server has one domain)
    /// with `password` for a client at `remote`.
    pub async fn verify(&self, user: &str, password: &str, remote: IpAddr) -> AuthOutcome {
        let outcome = match self.verify_inner(user, password, remote).await {
            Ok(outcome) => outcome,
            Err(Trouble(reason)) => {
                tracing::warn!(%remote, %reason, "login could not be checked");
                AuthOutcome::Unavailable
            }
        };
        self.auth_total.with_label_values(&[outcome.label()]).inc();
        if let AuthOutcome::Ok(account) = &outcome {
            self.record_login(account.id);
        }
        outcome
    }

    /// Writes the login's time to the store in the background, unless this
    /// process did for the account within [`LOGIN_RECORD_INTERVAL`]; a failed
    /// write is only logged (the login stands).
    fn record_login(&self, account_id: i64) {
        let now = Instant::now();
        {
            let mut recorded = self.logins_recorded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if recorded.get(&account_id).is_some_and(|at| now.duration_since(*at) < LOGIN_RECORD_INTERVAL) {
                return;
            }
            if recorded.len() >= LOGINS_REMEMBERED {
                recorded.retain(|_, at| now.duration_since(*at) < LOGIN_RECORD_INTERVAL);
            }
            recorded.insert(account_id, now);
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.account_record_login(account_id, chrono::Utc::now()).await {
                tracing::debug!(account_id, error = %e, "cannot record the login");
            }
        });
    }

    async fn verify_inner(&self, user: &str, password: &str, remote: IpAddr) -> Result<AuthOutcome, Trouble> {
        let lowered = user.trim().to_lowercase();
        let email = if lowered.is_empty() || lowered.len() > MAX_USER_LEN {
            None
        } else {
            self.normalise(&lowered).await?
        };
        // Failures count against the name as the server understands it, so "bob"
        // and "bob@example.com" share one limit.
        let who = email.clone().unwrap_or_else(|| lowered.chars().take(MAX_USER_LEN).collect());
        let network = network_of(remote);
        let pair_key = format!("authfail:user:{network}:{who}");
        let net_key = format!("authfail:net:{network}");
        let user_window = Duration::from_secs(self.config.user_window_secs);
        let ip_window = Duration::from_secs(self.config.ip_window_secs);
        let flight_key = format!("authflight:{network}");
        let over = |count: u64, max: u64| max > 0 && count > self.share(max);
        let waiting_until = Instant::now() + ADMISSION_WAIT;
        let mut looked_up = false;
        let (pair_count, net_count) = loop {
            // The attempt is marked in flight in the same round trip as its
            // reservations: a login costs no extra wait on the cache for it.
            let (pair_count, net_count, _) = tokio::try_join!(
                self.cache.counter_incr(&pair_key, user_window),
                self.cache.counter_incr(&net_key, ip_window),
                self.cache.counter_incr(&flight_key, FLIGHT_WINDOW)
            )?;
            if !over(pair_count, self.config.max_failures_per_user)
                && !over(net_count, self.config.max_failures_per_ip)
            {
                break (pair_count, net_count);
            }
            // Over a limit, but this may be a credential verified before: only
            // the right password matches one, so it is no guess to hold back,
            // and a storm of returning users behind one address (a NAT, a
            // proxy) goes through without waiting on the others' checks. Asked
            // once per attempt: no argon2, one account row and one cache read.
            // The check after any wait reads the row again: a password changed
            // meanwhile must not be verified against the old hash.
            if !looked_up
                && let Some(email) = &email
                && !password.is_empty()
                && password.len() <= MAX_PASSWORD_LEN
            {
                looked_up = true;
                if let Lookup::Verified(account) = self.lookup(email, password).await? {
                    self.release(&[&pair_key, &net_key, &flight_key]).await;
                    return Ok(AuthOutcome::Ok(account));
                }
            }
            // Reservations of this client's attempts still being checked may
            // be right passwords, which give theirs back: a mail client that
            // opens many connections at once must not be refused for its own
            // logins. Wait for those; refuse once only failures hold the
            // limit. (An attempt between its increments and this release
            // counts as in flight: one more wait, never a refusal.)
            self.release(&[&pair_key, &net_key, &flight_key]).await;
            let in_flight = self.cache.counter_get(&flight_key).await.unwrap_or(0);
            if in_flight == 0 || Instant::now() >= waiting_until {
                tracing::info!(user = %who, %remote, pair_count, net_count, "login refused: too many failures");
                return Ok(AuthOutcome::RateLimited);
            }
            tokio::time::sleep(ADMISSION_POLL).await;
        };

        let account = match email {
            Some(email) if !password.is_empty() && password.len() <= MAX_PASSWORD_LEN => {
                self.check(&email, password).await
            }
            _ => Ok(None),
        };
        match account {
            Ok(Some(account)) => {
                self.release(&[&flight_key, &pair_key, &net_key]).await;
                Ok(AuthOutcome::Ok(account))
            }
            Ok(None) => {
                // Before the penalty delay: waiters learn the outcome as soon as it is known.
                self.release(&[&flight_key]).await;
                // Who and from where, never the password: what fail2ban-style
                // tooling and an operator investigating need.
                tracing::info!(user = %who, %remote, "login failed");
                self.penalty(pair_count.max(net_count)).await;
                Ok(AuthOutcome::Failed)
            }
            Err(trouble) => {
                self.release(&[&flight_key, &pair_key, &net_key]).await;
                Err(trouble)
            }
        }
    }

    /// Gives back reservations of an attempt that was not a failure; one that
    /// cannot be given back only ages out with its window.
    async fn release(&self, keys: &[&str]) {
        let given_back = futures::future::join_all(keys.iter().map(|key| self.cache.counter_decr(key))).await;
        for result in given_back {
            if let Err(e) = result {
                tracing::debug!(error = %e, "could not give a login reservation back");
            }
        }
    }

    /// Waits before a failure is answered: `failure_delay_ms` for the first
    /// failure counted, doubling up to `max_failure_delay_ms`. At most
    /// [`MAX_DELAYED`] wait at once on a pod.
    async fn penalty(&self, failures: u64) {
        let delay = failure_delay(self.config.failure_delay_ms, self.config.max_failure_delay_ms, failures);
        if delay.is_zero() {
            return;
        }
        if self.delayed.fetch_add(1, Ordering::AcqRel) >= MAX_DELAYED {
            self.delayed.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        self.delayed_gauge.inc();
        tokio::time::sleep(delay).await;
        self.delayed_gauge.dec();
        self.delayed.fetch_sub(1, Ordering::AcqRel);
    }

    /// The account of `email` and whether `password` is a credential verified
    /// before (a hit in the credential cache, which only the right password can
    /// produce).
    async fn lookup(&self, email: &str, password: &str) -> Result<Lookup, Trouble> {
        // The account row first (one indexed lookup): sessions get a current
        // `Account`, and the cache key covers the stored hash, so an entry can only
        // ever match the hash it was verified against. A password change thus ends
        // every cached login at once, on every pod, even one whose purge did not
        // reach Redis; a deleted or recreated account never matches either. A
        // disabled account answers as an unknown one, cached credentials included.
        let Some(account) = self.store.account_get(email).await?.filter(|a| a.enabled) else {
            return Ok(Lookup::Unknown);
        };
        let key = self.credential_key(email, password, &account.password_hash).await?;
        if self.cache.credential_get(&key).await? != Some(account.id) {
            return Ok(Lookup::Unverified(account, key));
        }
        // The lifetime runs from the last use, not from the argon2 run: a fixed
        // one sent every user who logged in during the same minute back to
        // argon2 together when it ran out (a pod's cores full for two minutes
        // of the soak, five minutes after start). Safe because the key is bound
        // to the hash. A touch that fails costs only a later argon2 run, so it
        // does not fail the login.
        let ttl = Duration::from_secs(self.config.credential_cache_secs);
        if let Err(e) = self.cache.credential_touch(&key, account.id, ttl).await {
            tracing::debug!(error = %e, "credential touch failed");
        }
        Ok(Lookup::Verified(account))
    }

    /// The account if `email`/`password` are right, `None` if not.
    async fn check(&self, email: &str, password: &str) -> Result<Option<Account>, Trouble> {
        let (account, key) = match self.lookup(email, password).await? {
            Lookup::Unknown => {
                // Same work as a wrong password, so timing does not tell which it was.
                let _ = self.argon2_verify(password, dummy_hash()).await;
                return Ok(None);
            }
            Lookup::Verified(account) => return Ok(Some(account)),
            Lookup::Unverified(account, key) => (account, key),
        };
        let ttl = Duration::from_secs(self.config.credential_cache_secs);
        match self.argon2_verify(password, &account.password_hash).await {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) if e.is::<StoredHashError>() => {
                tracing::error!(account = %account.email, error = %e, "unusable password hash");
                return Ok(None);
            }
            Err(e) => return Err(Trouble(e.to_string())),
        }
        // A password change racing this login leaves an entry under the old hash's
        // key, which no later login can match.
        self.cache.credential_put(&key, account.id, ttl).await?;
        Ok(Some(account))
    }

    /// Lower-cases `user` and completes a bare local part with the server's only
    /// domain. `None` when a bare local part is ambiguous (several domains).
    async fn normalise(&self, user: &str) -> Result<Option<String>, Trouble> {
        let user = user.trim().to_lowercase();
        if user.contains('@') {
            return Ok(Some(user));
        }
        let domains = self.domains().await?;
        Ok(match domains.as_slice() {
            [only] => Some(format!("{user}@{only}")),
            _ => None,
        })
    }

    async fn domains(&self) -> Result<Vec<String>, Trouble> {
        let ttl = Duration::from_secs(self.config.domain_cache_secs);
        {
            let cached = self.domains.lock().map_err(|_| Trouble("domain cache poisoned".into()))?;
            if let Some(c) = cached.as_ref().filter(|c| c.fetched.elapsed() < ttl) {
                return Ok(c.value.clone());
            }
        }
        let list: Vec<String> =
            self.store.domain_list().await?.into_iter().map(|d| d.to_lowercase()).collect();
        let mut cached = self.domains.lock().map_err(|_| Trouble("domain cache poisoned".into()))?;
        *cached = Some(Cached { value: list.clone(), fetched: Instant::now() });
        Ok(list)
    }

    async fn secret(&self) -> Result<Vec<u8>, Trouble> {
        {
            let cached = self.secret.lock().map_err(|_| Trouble("secret cache poisoned".into()))?;
            if let Some(c) = cached.as_ref().filter(|c| c.fetched.elapsed() < SECRET_REFRESH) {
                return Ok(c.value.current.clone());
            }
        }
        let secret = self.cache.secret_get(CREDENTIAL_SECRET, 32, CREDENTIAL_SECRET_ROTATION).await?;
        let current = secret.current.clone();
        let mut cached = self.secret.lock().map_err(|_| Trouble("secret cache poisoned".into()))?;
        *cached = Some(Cached { value: secret, fetched: Instant::now() });
        Ok(current)
    }

    /// HMAC-SHA256(MAC key, secret ‖ user ‖ 0 ‖ password ‖ 0 ‖ stored hash): the
    /// secret has a fixed length, and the NULs keep ("ab", "c") and ("a", "bc")
    /// apart (a user name and a password hold no NUL, and the stored hash is not
    /// the client's to choose). The MAC key never goes to the cache.
    async fn credential_key(&self, email: &str, password: &str, hash: &str) -> Result<[u8; 32], Trouble> {
        let secret = self.secret().await?;
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.mac_key.subkey("credential"))
            .map_err(|e| Trouble(format!("HMAC key: {e}")))?;
        mac.update(&secret);
        mac.update(email.as_bytes());
        mac.update(&[0]);
        mac.update(password.as_bytes());
        mac.update(&[0]);
        mac.update(hash.as_bytes());
        Ok(mac.finalize().into_bytes().into())
    }

    /// argon2 on the blocking pool (it is 20-50 ms of CPU that would otherwise
    /// stall this runtime worker), at most `max_concurrent_hashes` at once.
    async fn argon2_verify(&self, password: &str, phc: &str) -> anyhow::Result<bool> {
        let asked = Instant::now();
        self.hash_waiting.inc();
        let permit = self.hashing.clone().acquire_owned().await;
        self.hash_waiting.dec();
        let _permit = permit?;
        self.hash_wait.observe(asked.elapsed().as_secs_f64());
        self.argon2_runs.fetch_add(1, Ordering::Relaxed);
        let (password, phc) = (password.to_owned(), phc.to_owned());
        tokio::task::spawn_blocking(move || {
            verify_password(&password, &phc).map_err(|e| StoredHashError(e).into())
        })
        .await?
    }

    /// Sets a new password (hashed here) and forgets every cached credential of
    /// the account on every pod. Entries the purge misses (Redis unreachable, a
    /// login racing it) are bound to the old hash and can no longer match; the
    /// purge frees their memory.
    pub async fn set_password(&self, email: &str, password: &str) -> anyhow::Result<()> {
        let email = email.trim().to_lowercase();
        let account = self
            .store
            .account_get(&email)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no such account: {email}"))?;
        let password = password.to_owned();
        let hash = tokio::task::spawn_blocking(move || hash_password(&password)).await??;
        self.store.account_set_password(&email, &hash).await?;
        self.cache.credential_purge_account(account.id).await?;
        Ok(())
    }
}

/// argon2 runs allowed at once: `configured`, or with 0 half the CPUs (at least
/// one). A burst of first logins (every user's first after a rollout hashes) once
/// held both cores of a two-core pod for seconds, starving the sessions already
/// logged in (bench/RESULTS.md, soak run 2); half the cores keeps the others for
/// them while the burst is worked off.
fn hash_permits(configured: usize, cpus: usize) -> usize {
    match configured {
        0 => (cpus / 2).max(1),
        n => n,
    }
}

/// The delay before the answer to a failed login that is the `failures`-th
/// counted: `base`, doubled for each earlier one, at most `max` (milliseconds).
fn failure_delay(base: u64, max: u64, failures: u64) -> Duration {
    if base == 0 {
        return Duration::ZERO;
    }
    let doublings = u32::try_from(failures.saturating_sub(1)).unwrap_or(u32::MAX).min(32);
    Duration::from_millis(base.saturating_mul(1u64 << doublings).min(max.max(base)))
}

/// The stored hash could not be used (as opposed to a runtime failure).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct StoredHashError(anyhow::Error);

/// The rate-limit key of a client: the address itself for IPv4, the /64 for IPv6
/// (one host typically owns a whole /64, so per-address limits would be void).
/// IPv4-mapped IPv6 addresses count as the IPv4 address.
fn network_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_leaves_cores_to_the_sessions_unless_configured() {
        assert_eq!(hash_permits(0, 1), 1);
        assert_eq!(hash_permits(0, 2), 1);
        assert_eq!(hash_permits(0, 3), 1);
        assert_eq!(hash_permits(0, 8), 4);
        assert_eq!(hash_permits(6, 2), 6);
    }

    #[test]
    fn hashes_are_argon2id_with_owasp_parameters_and_salted() {
        let a = hash_password("correct horse").unwrap();
        let b = hash_password("correct horse").unwrap();
        assert!(a.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{a}");
        assert_ne!(a, b, "random salt");
        assert!(verify_password("correct horse", &a).unwrap());
        assert!(!verify_password("correct horsE", &a).unwrap());
        assert!(verify_password("x", "not a phc string").is_err());
    }

    #[test]
    fn failure_delays_double_up_to_their_ceiling() {
        let ms = |n| failure_delay(2_000, 15_000, n).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(4), ms(5), ms(500)],
            [2_000, 2_000, 4_000, 8_000, 15_000, 15_000, 15_000]
        );
        assert_eq!(failure_delay(0, 15_000, 9), Duration::ZERO);
    }

    #[test]
    fn ipv6_clients_are_limited_per_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(network_of(a), network_of(b));
        assert_ne!(network_of(a), network_of(c));
        assert_eq!(network_of("::ffff:192.0.2.1".parse().unwrap()), "192.0.2.1");
        assert_eq!(network_of("192.0.2.1".parse().unwrap()), "192.0.2.1");
    }
}
