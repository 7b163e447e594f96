//! `mailcluster serve`: turns a [`Config`] into a running pod.
//!
//! Order matters and is chosen so that a pod that cannot work fails before it
//! accepts anything: raise limits → store (retrying while the database comes up) →
//! migrations → cache → shared state → TLS → listeners and admin → wait for
//! SIGTERM/SIGINT → drain.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::{Config, redact_url};
use crate::store::{Store, StoreError};

/// Runs the server until SIGTERM or SIGINT, then drains and returns.
pub async fn run(config: Config) -> anyhow::Result<()> {
    raise_nofile_limit();
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data directory {}", config.data_dir.display()))?;

    let store = open_store(&config).await?;
    if config.database.migrate_on_start {
        store.migrate().await.context("database migration failed")?;
    }
    let _ = store;
    anyhow::bail!("serving is not available in this build yet (listeners are not wired)")
}

/// Raises RLIMIT_NOFILE to the hard limit: every connection is a descriptor, and
/// the usual soft limit of 1024 would cap a pod far below what it can serve.
pub fn raise_nofile_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open file limit"),
    }
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
    let _ = (config, url);
    Err(StoreError::Internal("no store backend is built into this binary yet".into()))
}

/// Certificate and key for TLS: the configured files, or a self-signed pair kept in
/// the data directory (generated once, so clients that pinned it keep working across
/// restarts). Returns the PEM file paths.
pub fn tls_files(config: &Config) -> anyhow::Result<(PathBuf, PathBuf)> {
    match (&config.tls.cert, &config.tls.key) {
        (Some(cert), Some(key)) => Ok((cert.clone(), key.clone())),
        _ => ensure_dev_certificate(&config.data_dir, &config.hostname),
    }
}

/// Writes `dev-cert.pem` / `dev-key.pem` into `dir` unless both exist.
pub fn ensure_dev_certificate(dir: &Path, hostname: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let cert_path = dir.join("dev-cert.pem");
    let key_path = dir.join("dev-key.pem");
    if cert_path.exists() && key_path.exists() {
        return Ok((cert_path, key_path));
    }
    let mut names = vec![hostname.to_string(), "localhost".to_string()];
    names.dedup();
    let certified = rcgen::generate_simple_self_signed(names).context("cannot generate a certificate")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_private(&key_path, certified.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&cert_path, certified.cert.pem())
        .with_context(|| format!("cannot write {}", cert_path.display()))?;
    tracing::warn!(
        cert = %cert_path.display(),
        "no TLS certificate configured: generated a self-signed one (set MAILCLUSTER_TLS_CERT/MAILCLUSTER_TLS_KEY in production)"
    );
    Ok((cert_path, key_path))
}

/// Private keys are created readable by the owner only.
fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(data).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_certificate_is_generated_once() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = ensure_dev_certificate(dir.path(), "mx.example.com").unwrap();
        let pem = std::fs::read_to_string(&cert).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        assert!(std::fs::read_to_string(&key).unwrap().contains("PRIVATE KEY"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        let again = ensure_dev_certificate(dir.path(), "mx.example.com").unwrap();
        assert_eq!(again, (cert.clone(), key));
        assert_eq!(std::fs::read_to_string(&cert).unwrap(), pem, "not regenerated");
    }

    #[test]
    fn configured_files_win() {
        let mut config = Config::default();
        config.tls.cert = Some("/c.pem".into());
        config.tls.key = Some("/k.pem".into());
        assert_eq!(tls_files(&config).unwrap(), (PathBuf::from("/c.pem"), PathBuf::from("/k.pem")));
    }
}
