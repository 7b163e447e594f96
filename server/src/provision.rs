//! Domains and accounts brought to a wanted state: the one code path behind the
//! `mailcluster domain`/`user`/`alias` commands and the operator's `MailDomain`
//! and `MailAccount` reconcilers, so that both mean the same by "add a user" and
//! both can run again without harm.
//!
//! Every function here is idempotent: what is already as wanted is left alone,
//! and the result says what changed, which callers use to drop cached entries
//! (`changed_recipients`) and to report.

use crate::store::{Store, StoreError};
use mailcluster_model::{Account, DomainKey};

/// Why a wanted state cannot be reached. `Invalid` is the caller's input (an
/// address, a hash format): retrying does not help. `Store` is anything else.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Other(#[from] anyhow::Error),
}

pub type ProvisionResult<T> = Result<T, ProvisionError>;

/// The domain, trimmed and lower-cased, or why it is not a domain name.
pub fn checked_domain(domain: &str) -> ProvisionResult<String> {
    let domain = domain.trim().to_ascii_lowercase();
    if domain.is_empty() || domain.contains(['@', ' ']) {
        return Err(ProvisionError::Invalid(format!("{domain:?} is not a domain name")));
    }
    Ok(domain)
}

/// Checks `user@domain` (no whitespace, both parts present).
pub fn check_email(email: &str) -> ProvisionResult<()> {
    match email.split_once('@') {
        Some((local, domain))
            if !local.is_empty() && !domain.is_empty() && !email.contains(char::is_whitespace) =>
        {
            Ok(())
        }
        _ => Err(ProvisionError::Invalid(format!("{email:?} is not an address of the form user@domain"))),
    }
}

/// Addresses as stored: trimmed and lower-cased.
pub fn normalized(address: &str) -> String {
    address.trim().to_lowercase()
}

/// Serves `domain`; true when it was added now, false when it already was.
pub async fn ensure_domain(store: &dyn Store, domain: &str) -> ProvisionResult<bool> {
    let domain = checked_domain(domain)?;
    match store.domain_add(&domain).await {
        Ok(()) => Ok(true),
        Err(StoreError::AlreadyExists(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A password as given in a Secret or on the command line.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordSource {
    /// Hashed here with the server's own parameters (`auth::hash_password`).
    Plain(String),
    /// A hash the server verifies (argon2 PHC), stored as given.
    Hash(String),
}

impl std::fmt::Debug for PasswordSource {
    // Never print a password or a hash, even in a debug log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PasswordSource::Plain(_) => f.write_str("Plain(..)"),
            PasswordSource::Hash(_) => f.write_str("Hash(..)"),
        }
    }
}

impl PasswordSource {
    /// Tells a plain password from a hash. A hash is checked here (it parses, its
    /// cost is within the server's bounds: `crate::password`), so that a damaged
    /// or costly one is reported now rather than as failed logins. A value in the
    /// shape of a crypt(3) or PHC hash the server cannot verify (`$1$`, `$2x$`, …)
    /// is refused rather than taken as a password that happens to start with `$`:
    /// stored as a plain password, it would lock its owner out without a word.
    pub fn from_secret(value: &str) -> ProvisionResult<PasswordSource> {
        let value = value.trim_end_matches(['\n', '\r']);
        if value.is_empty() {
            return Err(ProvisionError::Invalid("the password is empty".into()));
        }
        match crate::password::check(value) {
            Ok(_) => Ok(PasswordSource::Hash(value.to_string())),
            Err(crate::password::HashError::NotAHash) => Ok(PasswordSource::Plain(value.to_string())),
            Err(e) => Err(ProvisionError::Invalid(e.to_string())),
        }
    }

    /// The string to store: the hash itself, or a new argon2id hash of the password
    /// (run on the blocking pool: argon2 is slow by design).
    pub async fn stored_hash(&self) -> ProvisionResult<String> {
        match self {
            PasswordSource::Hash(hash) => Ok(hash.clone()),
            PasswordSource::Plain(password) => {
                let password = password.clone();
                let hash = tokio::task::spawn_blocking(move || crate::auth::hash_password(&password))
                    .await
                    .map_err(|e| anyhow::anyhow!("password hashing task failed: {e}"))??;
                Ok(hash)
            }
        }
    }

    /// Whether `stored` is what this source stands for: the same hash, or a hash
    /// of this password. Lets a reconciler leave an unchanged password alone.
    pub async fn matches(&self, stored: &str) -> bool {
        match self {
            PasswordSource::Hash(hash) => hash == stored,
            PasswordSource::Plain(password) => {
                let (password, stored) = (password.clone(), stored.to_string());
                tokio::task::spawn_blocking(move || crate::auth::verify_password(&password, &stored))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(false)
            }
        }
    }
}

/// What an account should be. `None` fields are left as they are, so the CLI's
/// narrow commands and the operator's whole-object reconcile share the path.
#[derive(Debug, Default, Clone)]
pub struct WantedAccount {
    pub email: String,
    /// Set the password when the stored one differs (and always on creation).
    pub password: Option<PasswordSource>,
    /// `Some(None)`: the domain's default; `Some(Some(n))`: n octets.
    pub quota: Option<Option<u64>>,
    pub enabled: Option<bool>,
    /// `Some(None)`: no display name.
    pub display_name: Option<Option<String>>,
    /// Exactly these addresses deliver to the account (aliases to it not listed
    /// are removed).
    pub aliases: Option<Vec<String>>,
    /// Exactly these addresses it may send as, besides its own and its aliases.
    pub send_as: Option<Vec<String>>,
}

/// What [`apply_account`] changed.
#[derive(Debug, Clone)]
pub struct AccountChange {
    pub account: Account,
    pub created: bool,
    pub password_changed: bool,
    /// Addresses whose cached SMTP recipient entries are stale now.
    pub changed_recipients: Vec<String>,
}

impl AccountChange {
    /// Anything at all changed.
    pub fn changed(&self) -> bool {
        self.created || self.password_changed || !self.changed_recipients.is_empty()
    }
}

/// Creates the account when missing (a password is then required), or brings
/// it to `wanted`.
pub async fn apply_account(store: &dyn Store, wanted: &WantedAccount) -> ProvisionResult<AccountChange> {
    check_email(&wanted.email)?;
    let mut changed_recipients = Vec::new();
    let (mut account, created, password_changed) = match store.account_get(&wanted.email).await? {
        Some(account) => {
            let mut changed = false;
            if let Some(password) = &wanted.password
                && !password.matches(&account.password_hash).await
            {
                store.account_set_password(&account.email, &password.stored_hash().await?).await?;
                changed = true;
            }
            (account, false, changed)
        }
        None => {
            let Some(password) = &wanted.password else {
                return Err(ProvisionError::Invalid(format!("no such user: {}", wanted.email)));
            };
            let account = store.account_create(&wanted.email, &password.stored_hash().await?).await?;
            // A lookup made before the account existed is cached as "no such
            // user" (550, a permanent refusal) for a few seconds.
            changed_recipients.push(account.email.clone());
            (account, true, true)
        }
    };
    let email = account.email.clone();
    if let Some(enabled) = wanted.enabled
        && enabled != account.enabled
    {
        store.account_set_enabled(&email, enabled).await?;
        account.enabled = enabled;
        changed_recipients.push(email.clone());
    }
    if let Some(name) = &wanted.display_name
        && *name != account.display_name
    {
        store.account_set_display_name(&email, name.as_deref()).await?;
        account.display_name = name.clone();
    }
    if let Some(limit) = wanted.quota {
        let current = store.quota(account.id).await?.account_limit;
        if current != limit {
            store.account_set_quota(&email, limit).await?;
            changed_recipients.push(email.clone());
        }
    }
    if wanted.aliases.is_some() || wanted.send_as.is_some() {
        let rights = store.sender_rights(&email).await?;
        if let Some(aliases) = &wanted.aliases {
            let wanted: Vec<String> = aliases.iter().map(|a| normalized(a)).collect();
            for alias in wanted.iter().filter(|a| !rights.aliases.contains(a)) {
                alias_add(store, alias, &email).await?;
                changed_recipients.push(alias.clone());
            }
            for alias in rights.aliases.iter().filter(|a| !wanted.contains(a)) {
                alias_del(store, alias, Some(&email)).await?;
                changed_recipients.push(alias.clone());
            }
        }
        if let Some(send_as) = &wanted.send_as {
            let wanted: Vec<String> = send_as.iter().map(|a| normalized(a)).collect();
            for address in wanted.iter().filter(|a| !rights.allowed.contains(a)) {
                sender_add(store, &email, address).await?;
            }
            for address in rights.allowed.iter().filter(|a| !wanted.contains(a)) {
                sender_del(store, &email, address).await?;
            }
        }
    }
    changed_recipients.dedup();
    Ok(AccountChange { account, created, password_changed, changed_recipients })
}

/// Routes `address` to `target` too: true when added now, false when it already
/// was (which the CLI reports as an error and a reconciler ignores).
pub async fn alias_add(store: &dyn Store, address: &str, target: &str) -> ProvisionResult<bool> {
    match store.alias_add(&normalized(address), &normalized(target)).await {
        Ok(()) => Ok(true),
        Err(StoreError::AlreadyExists(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Stops routing `address` to `target` (to every target with `None`); already
/// gone is fine.
pub async fn alias_del(store: &dyn Store, address: &str, target: Option<&str>) -> ProvisionResult<()> {
    let target = target.map(normalized);
    match store.alias_del(&normalized(address), target.as_deref()).await {
        Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sends the domain's mail for unknown local parts to `target` (an account),
/// or with `None` refuses it again; unchanged is no write. Pods that cached
/// an address as unknown see the change when the entry expires
/// (`smtp.recipient_cache_ttl_secs`).
pub async fn set_catch_all(store: &dyn Store, domain: &str, target: Option<&str>) -> ProvisionResult<()> {
    let domain = checked_domain(domain)?;
    let target = target.map(normalized);
    if store.domain_catch_all(&domain).await? == target {
        return Ok(());
    }
    store.domain_set_catch_all(&domain, target.as_deref()).await?;
    Ok(())
}

/// Signs the domain's mail with `key` from now on (every server reads the
/// store's keys within [`crate::dkim::STORED_KEYS_REFRESH`]), or with `None`
/// stops signing with a stored key. A key that does not parse is refused here
/// rather than skipped by every pod.
pub async fn set_domain_key(store: &dyn Store, domain: &str, key: Option<&DomainKey>) -> ProvisionResult<()> {
    let domain = checked_domain(domain)?;
    if let Some(key) = key {
        if key.selector.is_empty() || key.selector.contains(|c: char| c.is_whitespace() || c == ';') {
            return Err(ProvisionError::Invalid(format!("{:?} is not a DKIM selector", key.selector)));
        }
        crate::dkim::public_txt(key.private_pem.as_bytes(), &key.algorithm)
            .map_err(|e| ProvisionError::Invalid(format!("DKIM key of {domain}: {e:#}")))?;
    }
    store.domain_key_set(&domain, key).await?;
    Ok(())
}

/// Lets `email` send as `address`: true when allowed now, false when it already was.
pub async fn sender_add(store: &dyn Store, email: &str, address: &str) -> ProvisionResult<bool> {
    match store.account_sender_add(email, &normalized(address)).await {
        Ok(()) => Ok(true),
        Err(StoreError::AlreadyExists(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Withdraws `address` from what `email` may send as; already withdrawn is fine.
pub async fn sender_del(store: &dyn Store, email: &str, address: &str) -> ProvisionResult<()> {
    match store.account_sender_del(email, &normalized(address)).await {
        Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes the account with its mail, and the aliases that only reached it;
/// already gone is fine. Returns the account as it was, if it existed.
pub async fn delete_account(store: &dyn Store, email: &str) -> ProvisionResult<Option<Account>> {
    let Some(account) = store.account_get(email).await? else { return Ok(None) };
    let rights = store.sender_rights(&account.email).await?;
    for alias in &rights.aliases {
        alias_del(store, alias, Some(&account.email)).await?;
    }
    match store.account_delete(&account.email).await {
        Ok(()) | Err(StoreError::NotFound(_)) => Ok(Some(account)),
        Err(e) => Err(e.into()),
    }
}

/// Drops what the pods cache about changed accounts — their verified credentials
/// and the recipient entries of their addresses — so a changed password or a
/// disabled account takes effect at once rather than when the entries expire.
/// The CLI and the operator call it after a change is stored.
pub async fn forget_cached(
    cache: &dyn crate::cache::Cache,
    account_ids: &[i64],
    recipients: &[impl AsRef<str>],
) -> crate::cache::CacheResult<()> {
    for id in account_ids {
        cache.credential_purge_account(*id).await?;
    }
    for address in recipients {
        crate::directory::forget(cache, address.as_ref()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_told_apart() {
        assert_eq!(PasswordSource::from_secret("s3cret\n").unwrap(), PasswordSource::Plain("s3cret".into()));
        // A password may start with a dollar sign as long as it is not hash-shaped.
        assert_eq!(PasswordSource::from_secret("$money").unwrap(), PasswordSource::Plain("$money".into()));
        let hash = crate::auth::hash_password("pw").unwrap();
        assert_eq!(PasswordSource::from_secret(&hash).unwrap(), PasswordSource::Hash(hash.clone()));
        // Formats of other systems, stored as given (crate::password verifies them).
        for imported in [
            "$2y$10$abcdefghijklmnopqrstuuJQeXZmMqdj4iVd2C3ffc8H1v0iM5Yrm",
            "$2b$12$abcdefghijklmnopqrstuuJQeXZmMqdj4iVd2C3ffc8H1v0iM5Yrm",
            "$6$salt$IxDD3jeSOb5eB1CX5LBsqZFVkJdido3OUILO5Ifz5iwMuTS4XMS130MTSuDDl3aCI6WouIL9AjRbLCelDCy.g.",
        ] {
            assert_eq!(PasswordSource::from_secret(imported).unwrap(), PasswordSource::Hash(imported.into()));
        }
        for unsupported in [
            "$1$salt$abcdefghijklmnopqrstu.",
            "$2x$10$abcdefghijklmnopqrstuuJQeXZmMqdj4iVd2C3ffc8H1v0iM5Yrm",
            "$2b$15$abcdefghijklmnopqrstuuJQeXZmMqdj4iVd2C3ffc8H1v0iM5Yrm",
            "$argon2id$broken",
        ] {
            assert!(
                matches!(PasswordSource::from_secret(unsupported), Err(ProvisionError::Invalid(_))),
                "{unsupported}"
            );
        }
        assert!(PasswordSource::from_secret("").is_err());
        // A hash whose every check would take 4 GiB or a million passes is refused.
        for costly in [
            "$argon2id$v=19$m=4194304,t=2,p=1$c2FsdHNhbHRzYWx0$YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY",
            "$argon2id$v=19$m=19456,t=1000000,p=1$c2FsdHNhbHRzYWx0$YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY",
        ] {
            assert!(
                matches!(PasswordSource::from_secret(costly), Err(ProvisionError::Invalid(_))),
                "{costly}"
            );
        }
        let usual =
            "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHRzYWx0$YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY";
        assert!(matches!(PasswordSource::from_secret(usual), Ok(PasswordSource::Hash(_))));
    }

    #[test]
    fn addresses_are_checked() {
        assert!(check_email("a@b.c").is_ok());
        for bad in ["a", "@b", "a@", "a b@c", ""] {
            assert!(check_email(bad).is_err(), "{bad}");
        }
        assert_eq!(checked_domain(" Example.COM ").unwrap(), "example.com");
        assert!(checked_domain("a@b").is_err());
    }
}
