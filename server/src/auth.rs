//! Password verification for every protocol: argon2id hashes, a verified-credential
//! cache in front of them (so login storms cost a hash lookup, not an argon2 run),
//! and failed-login rate limits per user and per client IP held in the cache so they
//! apply across pods.

use std::net::IpAddr;
use std::sync::Arc;

use crate::cache::Cache;
use crate::store::{Account, Store};

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

pub struct Authenticator {
    pub store: Arc<dyn Store>,
    pub cache: Arc<dyn Cache>,
}

/// Hashes a password with argon2id and a random salt (PHC string).
pub fn hash_password(password: &str) -> anyhow::Result<String> {
    use argon2::PasswordHasher as _;
    argon2::Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))
}

impl Authenticator {
    /// Verifies `user` (full address, or local part when the server has one domain)
    /// with `password` for a client at `remote`.
    ///
    /// Minimal form (no credential cache, no rate limits yet): store lookup and an
    /// argon2 check of the stored PHC string.
    pub async fn verify(&self, user: &str, password: &str, remote: IpAddr) -> AuthOutcome {
        use argon2::PasswordVerifier as _;
        let _ = (remote, &self.cache);
        let account = match self.store.account_get(user).await {
            Ok(Some(a)) => a,
            Ok(None) => return AuthOutcome::Failed,
            Err(_) => return AuthOutcome::Unavailable,
        };
        let Ok(hash) = argon2::PasswordHash::new(&account.password_hash) else {
            return AuthOutcome::Failed;
        };
        match argon2::Argon2::default().verify_password(password.as_bytes(), &hash) {
            Ok(()) => AuthOutcome::Ok(account),
            Err(_) => AuthOutcome::Failed,
        }
    }
}
