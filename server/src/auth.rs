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
    let _ = password;
    anyhow::bail!("hash_password: not implemented yet")
}

impl Authenticator {
    /// Verifies `user` (full address, or local part when the server has one domain)
    /// with `password` for a client at `remote`.
    pub async fn verify(&self, user: &str, password: &str, remote: IpAddr) -> AuthOutcome {
        let _ = (user, password, remote, &self.store, &self.cache);
        AuthOutcome::Unavailable
    }
}
