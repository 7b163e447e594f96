//! Accounts' Sieve scripts: the process's [`Filters`] (`App::sieve`: the
//! scripts it compiled, which accounts have an active one, and the check a
//! script passes before it is stored: the interpreter's compiler, so a
//! script is stored only when delivery could run it), and the admin
//! operations of `mailcluster sieve`, by address, over the store's
//! [`Scripts`] role. Running scripts on mail is `accept::sieve`'s.
//!
//! - Scripts are compiled once per process and kept by the hash of their
//!   source; which accounts have an active script (and its hash) is read from
//!   the store every [`REFRESH`], so a delivery to an account without one asks
//!   nothing. A change made on this pod (ManageSieve, the CLI) takes effect
//!   here at once ([`Filters::forget`]), on other pods within [`REFRESH`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use mailcluster_sieve::{self as sieve, Script};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::store::{Accounts, Scripts, SieveEntry, SieveQuota, Store, StoreError, StoreResult};

/// Whether a script may be stored, and what scripts may use.
pub trait SieveChecker: Send + Sync + 'static {
    /// `Err` with the reason, for the user ("line L: message"), when delivery
    /// could not run `source`.
    fn check(&self, source: &[u8]) -> Result<(), String>;
    /// The Sieve extensions a script may require (the SIEVE capability).
    fn extensions(&self) -> &[&'static str];
}

/// The store limits of every account's scripts.
pub fn quota_of(config: &Config) -> SieveQuota {
    SieveQuota { max_scripts: config.sieve.max_scripts, max_bytes: config.sieve.max_script_bytes }
}

/// An account's id by address; `NotFound` without one.
async fn account_id<S: Accounts + ?Sized>(store: &S, email: &str) -> StoreResult<i64> {
    match store.account_get(email).await? {
        Some(account) => Ok(account.id),
        None => Err(StoreError::NotFound(format!("account {email}"))),
    }
}

/// Stores the script `name` of the account `email` once `checker` accepts it
/// (`Invalid` with its reason otherwise), and makes it the active one when
/// `activate`.
pub async fn put<S: Accounts + Scripts + ?Sized>(
    store: &S,
    checker: &dyn SieveChecker,
    quota: SieveQuota,
    email: &str,
    name: &str,
    source: &[u8],
    activate: bool,
) -> StoreResult<()> {
    let id = account_id(store, email).await?;
    put_by_id(store, checker, quota, id, name, source, activate).await
}

/// [`put`] for the account `account_id` (the operator knows it already).
pub async fn put_by_id<S: Scripts + ?Sized>(
    store: &S,
    checker: &dyn SieveChecker,
    quota: SieveQuota,
    account_id: i64,
    name: &str,
    source: &[u8],
    activate: bool,
) -> StoreResult<()> {
    if let Some(why) = crate::store::sieve_name_problem(name) {
        return Err(StoreError::Invalid(why.into()));
    }
    checker.check(source).map_err(StoreError::Invalid)?;
    store.sieve_put(account_id, name, source, quota).await?;
    if activate {
        store.sieve_activate(account_id, Some(name)).await?;
    }
    Ok(())
}

pub async fn list<S: Accounts + Scripts + ?Sized>(store: &S, email: &str) -> StoreResult<Vec<SieveEntry>> {
    store.sieve_list(account_id(store, email).await?).await
}

/// The script's source; `NotFound` without it.
pub async fn get<S: Accounts + Scripts + ?Sized>(store: &S, email: &str, name: &str) -> StoreResult<Vec<u8>> {
    let id = account_id(store, email).await?;
    store.sieve_get(id, name).await?.ok_or_else(|| StoreError::NotFound(format!("script {name}")))
}

/// Makes `name` active, or none with `None`.
pub async fn activate<S: Accounts + Scripts + ?Sized>(
    store: &S,
    email: &str,
    name: Option<&str>,
) -> StoreResult<()> {
    store.sieve_activate(account_id(store, email).await?, name).await
}

/// Deletes the script; the active one is refused (`Invalid`), as over
/// ManageSieve.
pub async fn delete<S: Accounts + Scripts + ?Sized>(store: &S, email: &str, name: &str) -> StoreResult<()> {
    store.sieve_delete(account_id(store, email).await?, name).await
}

/// The identity of a script's source.
pub type Digest32 = [u8; 32];

/// How often a pod re-reads which accounts have an active script.
pub const REFRESH: Duration = Duration::from_secs(5);

/// Compiled scripts a process keeps (an account's is compiled again after
/// eviction; nothing is lost).
const COMPILED_KEPT: usize = 4096;

pub fn digest(source: &[u8]) -> Digest32 {
    Sha256::digest(source).into()
}

/// The process's Sieve state: compiled scripts and who has one.
pub struct Filters {
    limits: sieve::Limits,
    compiled: Mutex<hashlink::LruCache<Digest32, Arc<Script>>>,
    /// Accounts with an active script; `None` until the store was read.
    index: RwLock<Option<Arc<HashMap<i64, Indexed>>>>,
    /// A script changed on this pod since the index was read: the next
    /// delivery that looks reads it again first.
    stale: AtomicBool,
    /// One read of the index at a time.
    reading: tokio::sync::Mutex<()>,
}

/// An account with an active script.
#[derive(Debug, Clone)]
pub struct Indexed {
    pub email: Arc<str>,
    pub digest: Digest32,
}

impl Filters {
    /// With the limits of `[sieve]`: the largest script, and the redirects a
    /// run may take (ManageSieve's MAXREDIRECTS).
    pub fn from_config(config: &crate::config::Config) -> Filters {
        Filters::new(sieve::Limits {
            max_script_bytes: config.sieve.max_script_bytes,
            max_redirects: config.sieve.max_redirects as usize,
            ..sieve::Limits::default()
        })
    }

    pub fn new(limits: sieve::Limits) -> Filters {
        Filters {
            limits,
            compiled: Mutex::new(hashlink::LruCache::new(COMPILED_KEPT)),
            index: RwLock::new(None),
            stale: AtomicBool::new(false),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    pub fn limits(&self) -> &sieve::Limits {
        &self.limits
    }

    /// The compiled form of `source`, compiled at most once while it is kept.
    pub fn compile(&self, source: &[u8]) -> Result<Arc<Script>, sieve::CompileError> {
        let key = digest(source);
        if let Some(script) = self.compiled.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(script.clone());
        }
        let script = Arc::new(Script::compile(source, &self.limits)?);
        self.compiled.lock().unwrap_or_else(|e| e.into_inner()).insert(key, script.clone());
        Ok(script)
    }

    /// A script changed here (stored, activated): this pod's next delivery
    /// reads the index again before it looks.
    pub fn forget(&self, _account_id: i64) {
        self.stale.store(true, Ordering::Release);
    }

    /// Reads which accounts have an active script.
    pub async fn refresh(&self, store: &dyn Store) -> crate::store::StoreResult<()> {
        // Cleared before the read: a change made while it runs marks it
        // stale again.
        self.stale.store(false, Ordering::Release);
        let index: HashMap<i64, Indexed> = match store.sieve_active_digests().await {
            Ok(rows) => rows
                .into_iter()
                .map(|a| (a.account_id, Indexed { email: a.email.into(), digest: a.digest }))
                .collect(),
            Err(err) => {
                self.stale.store(true, Ordering::Release);
                return Err(err);
            }
        };
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(index));
        Ok(())
    }

    /// Keeps the index fresh for the life of the process (spawned by `serve`).
    pub async fn keep_fresh(self: Arc<Self>, store: Arc<dyn Store>) {
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let _one = self.reading.lock().await;
            if let Err(err) = self.refresh(store.as_ref()).await {
                // The last index stays in use.
                tracing::warn!(error = %err, "sieve script index not read");
            }
        }
    }

    fn current(&self) -> Option<Arc<HashMap<i64, Indexed>>> {
        self.index.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The account's entry in the index, read first when it is stale or
    /// was never read. A store that cannot be read leaves the last index
    /// (none: no account is filtered, and mail is delivered as without).
    pub async fn indexed(&self, store: &dyn Store, account_id: i64) -> Option<Indexed> {
        let index = match self.current() {
            Some(index) if !self.stale.load(Ordering::Acquire) => index,
            _ => {
                let _one = self.reading.lock().await;
                if (self.stale.load(Ordering::Acquire) || self.current().is_none())
                    && let Err(err) = self.refresh(store).await
                {
                    tracing::warn!(error = %err, "sieve script index not read");
                }
                self.current()?
            }
        };
        index.get(&account_id).cloned()
    }

    /// The account's active script, compiled; `Err` with the compiler's
    /// message when the stored script no longer compiles.
    pub(crate) async fn script_of(
        &self,
        store: &dyn Store,
        account_id: i64,
        digest: &Digest32,
    ) -> Result<Option<Arc<Script>>, String> {
        if let Some(s) = self.compiled.lock().unwrap_or_else(|e| e.into_inner()).get(digest) {
            return Ok(Some(s.clone()));
        }
        match store.sieve_active(account_id).await {
            Ok(None) => Ok(None),
            Ok(Some((name, source))) => {
                self.compile(&source).map(Some).map_err(|e| format!("script \"{name}\": {e}"))
            }
            Err(err) => Err(format!("script not read: {err}")),
        }
    }
}

impl SieveChecker for Filters {
    fn check(&self, source: &[u8]) -> Result<(), String> {
        if source.len() > self.limits.max_script_bytes {
            return Err(format!("the script is over the limit of {} octets", self.limits.max_script_bytes));
        }
        // Compiled here, it is ready when its first message comes.
        self.compile(source).map(|_| ()).map_err(|e| e.to_string())
    }

    fn extensions(&self) -> &[&'static str] {
        sieve::EXTENSIONS
    }
}
