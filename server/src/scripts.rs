//! Accounts' Sieve scripts: the check a script passes before it is stored
//! (one [`SieveChecker`] per process, `App::sieve`), and the admin operations
//! of `mailcluster sieve`, by address, over the store's [`Scripts`] role.
//!
//! The check is the interpreter's compiler (`accept::sieve::Filters`, which
//! keeps what it compiled for delivery): a script is stored only when the
//! delivery side could run it.

use crate::config::Config;
use crate::store::{Accounts, Scripts, SieveEntry, SieveQuota, StoreError, StoreResult};

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
