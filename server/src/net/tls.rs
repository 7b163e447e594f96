//! rustls server configuration: certificates from PEM files, reloaded when the files
//! change; a self-signed certificate for the embedded default; session tickets whose
//! keys are shared through the cache so a client resumes on any pod.
//!
//! Reload compares file *content* (a SHA-256 over certificate and key), not mtimes:
//! Kubernetes projects Secret files through a `..data` symlink that is swapped
//! atomically, so the mtime of the path we open can stay the same while the bytes
//! behind it change. A new pair that does not parse or whose key does not match the
//! certificate keeps the old configuration in service and is logged once.
//!
//! Ticket keys: rustls' default ticketer keeps its keys in process memory, so a
//! ticket issued by one pod is useless on another and every reconnect through the
//! load balancer pays a full handshake. [`SharedTicketer`] takes its key from
//! `Cache::secret_get` instead; every pod derives the same AEAD key from the same
//! generation, and tickets sealed under the previous generation stay valid for one
//! more rotation period. The AEAD key is derived from that secret together with
//! the pod's cache MAC key (`cache.mac_key`), which is not in the cache: a TLS 1.2
//! ticket carries its session's master secret, so a key readable from Redis would
//! let whoever reads Redis decrypt recorded sessions.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use anyhow::Context as _;
use prometheus::IntCounterVec;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ProducesTickets;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::cache::Cache;
use crate::config::Config;
use crate::metrics::Metrics;

/// Name of the shared secret that seeds session-ticket keys (`Cache::secret_get`).
pub const TICKET_SECRET_NAME: &str = "tls-ticket-key";
/// Bytes of secret asked from the cache; the AEAD key is derived from it.
const TICKET_SECRET_LEN: usize = 32;

/// Hands out a `TlsAcceptor` built from the current certificate. Cheap to clone; all
/// clones see a reload.
#[derive(Clone)]
pub struct TlsProvider {
    inner: Arc<Inner>,
}

struct Inner {
    config: RwLock<Arc<rustls::ServerConfig>>,
    /// Where the certificate came from, for reloads; `None` for a fixed config.
    files: Option<CertFiles>,
    ticketer: Arc<dyn ProducesTickets>,
    handshakes: OnceLock<HandshakeCounters>,
    handshake_timeout_ms: AtomicU64,
}

struct HandshakeCounters {
    done: IntCounterVec,
    failed: IntCounterVec,
}

/// Default for how long a client gets to complete a TLS handshake (implicit TLS and STARTTLS):
/// a peer that opens a connection and stalls must not hold a session slot for ever.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    /// Content hash of the pair last tried (loaded or rejected): unchanged bytes are
    /// neither re-parsed nor re-logged on every poll.
    last_seen: Mutex<[u8; 32]>,
}

impl TlsProvider {
    /// A fixed configuration (no reload, tickets as configured in `config`).
    pub fn from_config(config: Arc<rustls::ServerConfig>) -> Self {
        let ticketer = config.ticketer.clone();
        TlsProvider {
            inner: Arc::new(Inner {
                config: RwLock::new(config),
                files: None,
                ticketer,
                handshakes: OnceLock::new(),
                handshake_timeout_ms: AtomicU64::new(TLS_HANDSHAKE_TIMEOUT.as_millis() as u64),
            }),
        }
    }

    /// Certificate chain and private key from PEM files, with process-local session
    /// tickets. Call [`TlsProvider::spawn_reload`] to follow file changes.
    pub fn from_files(cert: &Path, key: &Path) -> anyhow::Result<Self> {
        let ticketer = rustls::crypto::ring::Ticketer::new().context("creating TLS session ticketer")?;
        Self::from_files_with_ticketer(cert, key, ticketer)
    }

    /// Like [`TlsProvider::from_files`], with session-ticket keys shared through the
    /// cache (see [`SharedTicketer`]).
    pub async fn from_files_shared(
        cert: &Path,
        key: &Path,
        cache: Arc<dyn Cache>,
        rotation: Duration,
        pepper: [u8; 32],
    ) -> anyhow::Result<Self> {
        let ticketer = SharedTicketer::start(cache, rotation, pepper).await;
        Self::from_files_with_ticketer(cert, key, ticketer)
    }

    pub fn from_files_with_ticketer(
        cert: &Path,
        key: &Path,
        ticketer: Arc<dyn ProducesTickets>,
    ) -> anyhow::Result<Self> {
        let (cert_pem, key_pem) = read_pair(cert, key)?;
        let config = build_config(&cert_pem, &key_pem, ticketer.clone())
            .with_context(|| format!("loading TLS certificate {} / key {}", cert.display(), key.display()))?;
        Ok(TlsProvider {
            inner: Arc::new(Inner {
                config: RwLock::new(config),
                files: Some(CertFiles {
                    cert: cert.to_path_buf(),
                    key: key.to_path_buf(),
                    last_seen: Mutex::new(pair_hash(&cert_pem, &key_pem)),
                }),
                ticketer,
                handshakes: OnceLock::new(),
                handshake_timeout_ms: AtomicU64::new(TLS_HANDSHAKE_TIMEOUT.as_millis() as u64),
            }),
        })
    }

    /// Everything `serve` needs from the `[tls]` section: the configured PEM files
    /// (or a generated self-signed pair in `<data_dir>/tls/`), session tickets shared
    /// through `cache`, the handshake counter, and a reload task polling every
    /// `tls.reload_interval_secs`.
    pub async fn from_app_config(
        config: &Config,
        cache: Arc<dyn Cache>,
        metrics: &Metrics,
    ) -> anyhow::Result<Self> {
        let (cert, key) = match (&config.tls.cert, &config.tls.key) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (None, None) => ensure_self_signed(&config.data_dir, &config.hostname)?,
            _ => anyhow::bail!("tls.cert and tls.key must be set together"),
        };
        let rotation = Duration::from_secs(config.tls.ticket_rotation_secs.max(60));
        let pepper = crate::cache::sealed::MacKey::for_config(config).0.subkey("tls-ticket");
        let provider = Self::from_files_shared(&cert, &key, cache, rotation, pepper).await?;
        provider.set_metrics(metrics);
        provider.spawn_reload(Duration::from_secs(config.tls.reload_interval_secs.max(1)));
        Ok(provider)
    }

    /// Count handshakes into `mail_tls_handshakes_total{resumed}` and
    /// `mail_tls_handshake_failures_total{reason}`. The first call wins.
    pub fn set_metrics(&self, metrics: &Metrics) {
        // Zero-valued series from the start, so rate() over them works before the
        // first handshake of each kind.
        for resumed in ["true", "false"] {
            metrics.tls_handshakes_total.with_label_values(&[resumed]);
        }
        let _ = self.inner.handshakes.set(HandshakeCounters {
            done: metrics.tls_handshakes_total.clone(),
            failed: metrics.tls_handshake_failures_total.clone(),
        });
    }

    /// Bound on each handshake [`TlsProvider::accept`] performs.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.handshake_timeout_ms.load(Ordering::Relaxed))
    }

    pub fn set_handshake_timeout(&self, timeout: Duration) {
        self.inner.handshake_timeout_ms.store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current())
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.inner.config.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    pub fn replace(&self, config: Arc<rustls::ServerConfig>) {
        *self.inner.config.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = config;
    }

    /// Server side of a handshake on `tcp` with the current certificate, bounded by
    /// [`TlsProvider::handshake_timeout`] and counted (resumed or not; failures by
    /// reason).
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let counters = self.inner.handshakes.get();
        let timeout = self.handshake_timeout();
        let result = match tokio::time::timeout(timeout, self.acceptor().accept(tcp)).await {
            Ok(result) => result,
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")),
        };
        match (&result, counters) {
            (Ok(stream), Some(c)) => {
                let resumed = stream.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                c.done.with_label_values(&[if resumed { "true" } else { "false" }]).inc();
            }
            (Err(e), Some(c)) => {
                let reason = if e.kind() == std::io::ErrorKind::TimedOut { "timeout" } else { "error" };
                c.failed.with_label_values(&[reason]).inc();
            }
            (_, None) => {}
        }
        result
    }

    /// Re-reads the certificate files; swaps the configuration when their content
    /// changed and the new pair is valid. `Ok(true)` when a new certificate is now in
    /// service, `Ok(false)` when nothing changed (or this provider has no files).
    pub async fn reload(&self) -> anyhow::Result<bool> {
        let Some(files) = &self.inner.files else { return Ok(false) };
        let (cert_pem, key_pem) = {
            let (cert, key) = (files.cert.clone(), files.key.clone());
            tokio::task::spawn_blocking(move || read_pair(&cert, &key)).await??
        };
        let hash = pair_hash(&cert_pem, &key_pem);
        {
            let mut last = files.last_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if *last == hash {
                return Ok(false);
            }
            *last = hash;
        }
        let config = build_config(&cert_pem, &key_pem, self.inner.ticketer.clone()).with_context(|| {
            format!(
                "new TLS certificate {} / key {} rejected, keeping the previous one",
                files.cert.display(),
                files.key.display()
            )
        })?;
        self.replace(config);
        Ok(true)
    }

    /// Polls the certificate files every `every` and swaps in changed ones. The task
    /// ends by itself once every clone of this provider is dropped.
    pub fn spawn_reload(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let provider = TlsProvider { inner };
                match provider.reload().await {
                    Ok(true) => tracing::info!("TLS certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => tracing::error!(error = format!("{e:#}"), "TLS certificate reload failed"),
                }
            }
        })
    }
}

fn read_pair(cert: &Path, key: &Path) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let cert_pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
    let key_pem = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
    Ok((cert_pem, key_pem))
}

fn pair_hash(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((cert_pem.len() as u64).to_be_bytes());
    h.update(cert_pem);
    h.update(key_pem);
    h.finalize().into()
}

/// A TLS 1.2 + 1.3 server configuration (ring provider, no client auth, no ALPN)
/// from PEM bytes. Fails when the key does not belong to the certificate.
pub fn build_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    ticketer: Arc<dyn ProducesTickets>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("certificate PEM: {e}"))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in the certificate file");
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| anyhow::anyhow!("private key PEM: {e}"))?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
    config.ticketer = ticketer;
    Ok(Arc::new(config))
}

/// Returns `<data_dir>/tls/{cert,key}.pem`, generating a self-signed pair (SANs
/// localhost, 127.0.0.1, ::1 and `hostname`) when it does not exist yet. Reusing it
/// on later starts keeps clients that pinned it working.
pub fn ensure_self_signed(data_dir: &Path, hostname: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = data_dir.join("tls");
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if cert.exists() && key.exists() {
        tracing::warn!(cert = %cert.display(), "no TLS certificate configured; using the self-signed one");
        return Ok((cert, key));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if !names.iter().any(|n| n == hostname) && !hostname.is_empty() {
        names.push(hostname.to_string());
    }
    let generated = rcgen::generate_simple_self_signed(names).context("generating a certificate")?;
    write_private(&key, generated.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&cert, generated.cert.pem()).with_context(|| format!("writing {}", cert.display()))?;
    tracing::warn!(
        cert = %cert.display(),
        "no TLS certificate configured; generated a self-signed one (clients will not trust it)"
    );
    Ok((cert, key))
}

/// Writes a private key readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Session-ticket sealing with a key every pod shares (`Cache::secret_get`).
///
/// Ticket layout: `key id (4) || nonce (12) || AES-256-GCM(ticket state) || tag (16)`.
/// The key id (a hash of the secret, not the secret) picks the current or previous
/// generation's key without trial decryption; nonces are random, which is safe for
/// the number of tickets one key seals in a rotation period.
pub struct SharedTicketer {
    keys: RwLock<TicketKeys>,
    /// Mixed into every key: the part of it that is not in the cache.
    pepper: [u8; 32],
    lifetime: u32,
    rng: SystemRandom,
}

#[derive(Default)]
struct TicketKeys {
    generation: Option<u64>,
    current: Option<TicketKey>,
    previous: Option<TicketKey>,
}

struct TicketKey {
    id: [u8; 4],
    key: LessSafeKey,
}

const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 12;

impl TicketKey {
    fn derive(secret: &[u8], pepper: &[u8; 32]) -> Option<TicketKey> {
        // Domain-separated hashes: the AEAD key and the public id never reveal each
        // other or the raw secret (which other code might also derive from).
        let key_bytes: [u8; 32] = Sha256::new()
            .chain_update(b"mailcluster tls ticket key v2\0")
            .chain_update(pepper)
            .chain_update(secret)
            .finalize()
            .into();
        let id_hash =
            Sha256::new().chain_update(b"mailcluster tls ticket id v1\0").chain_update(secret).finalize();
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&id_hash[..KEY_ID_LEN]);
        let key = UnboundKey::new(&aead::AES_256_GCM, &key_bytes).ok()?;
        Some(TicketKey { id, key: LessSafeKey::new(key) })
    }
}

impl SharedTicketer {
    /// Fetches the current key and spawns a task that refreshes it (a fraction of the
    /// rotation period, so all pods switch generation within about a minute). When
    /// the cache is unreachable the ticketer starts disabled — clients then do full
    /// handshakes — and enables itself on the first successful refresh.
    pub async fn start(cache: Arc<dyn Cache>, rotation: Duration, pepper: [u8; 32]) -> Arc<SharedTicketer> {
        let mut ticketer = SharedTicketer::new(rotation);
        ticketer.pepper = pepper;
        let ticketer = Arc::new(ticketer);
        if let Err(e) = ticketer.refresh(cache.as_ref(), rotation).await {
            tracing::warn!(error = %e, "TLS ticket key unavailable; session resumption off until it is");
        }
        let weak = Arc::downgrade(&ticketer);
        let every = (rotation / 8).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(ticketer) = weak.upgrade() else { return };
                if let Err(e) = ticketer.refresh(cache.as_ref(), rotation).await {
                    tracing::warn!(error = %e, "TLS ticket key refresh failed");
                }
            }
        });
        ticketer
    }

    /// A ticketer with no key yet (disabled until [`SharedTicketer::refresh`]).
    pub fn new(rotation: Duration) -> SharedTicketer {
        // TLS 1.3 caps ticket lifetime at 7 days (RFC 8446 §4.6.1).
        let lifetime = rotation.as_secs().clamp(1, 7 * 24 * 3600) as u32;
        SharedTicketer {
            keys: RwLock::new(TicketKeys::default()),
            pepper: [0; 32],
            lifetime,
            rng: SystemRandom::new(),
        }
    }

    /// Reads the shared secret and installs its keys when the generation changed.
    pub async fn refresh(&self, cache: &dyn Cache, rotation: Duration) -> anyhow::Result<()> {
        let secret = cache.secret_get(TICKET_SECRET_NAME, TICKET_SECRET_LEN, rotation).await?;
        self.install(secret.generation, &secret.current, secret.previous.as_deref());
        Ok(())
    }

    /// Installs the keys of one generation of the shared secret.
    pub fn install(&self, generation: u64, current: &[u8], previous: Option<&[u8]>) {
        let mut keys = self.keys.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if keys.generation == Some(generation) && keys.current.is_some() {
            return;
        }
        *keys = TicketKeys {
            generation: Some(generation),
            current: TicketKey::derive(current, &self.pepper),
            previous: previous.and_then(|p| TicketKey::derive(p, &self.pepper)),
        };
    }
}

impl std::fmt::Debug for SharedTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = self.keys.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        f.debug_struct("SharedTicketer")
            .field("generation", &keys.generation)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl ProducesTickets for SharedTicketer {
    fn enabled(&self) -> bool {
        self.keys.read().unwrap_or_else(|poisoned| poisoned.into_inner()).current.is_some()
    }

    fn lifetime(&self) -> u32 {
        self.lifetime
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = keys.current.as_ref()?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(KEY_ID_LEN + NONCE_LEN + plain.len() + aead::MAX_TAG_LEN);
        out.extend_from_slice(&key.id);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&key.id), &mut body)
            .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        // `cipher` comes from the client: every length is checked before slicing.
        if cipher.len() < KEY_ID_LEN + NONCE_LEN + aead::AES_256_GCM.tag_len() {
            return None;
        }
        let (id, rest) = cipher.split_at(KEY_ID_LEN);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let keys = self.keys.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = [keys.current.as_ref(), keys.previous.as_ref()]
            .into_iter()
            .flatten()
            .find(|k| k.id.as_slice() == id)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut body = sealed.to_vec();
        let plain = key.key.open_in_place(nonce, Aad::from(&key.id), &mut body).ok()?;
        let len = plain.len();
        body.truncate(len);
        Some(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip_across_instances_and_one_rotation() {
        let a = SharedTicketer::new(Duration::from_secs(3600));
        let b = SharedTicketer::new(Duration::from_secs(3600));
        assert!(!a.enabled());
        assert!(a.encrypt(b"state").is_none());
        a.install(1, &[7u8; 32], None);
        b.install(1, &[7u8; 32], None);
        let t = a.encrypt(b"session state").expect("sealed");
        assert_eq!(b.decrypt(&t).as_deref(), Some(&b"session state"[..]));

        // After one rotation the old ticket still opens; after two it does not.
        b.install(2, &[8u8; 32], Some(&[7u8; 32]));
        assert_eq!(b.decrypt(&t).as_deref(), Some(&b"session state"[..]));
        b.install(3, &[9u8; 32], Some(&[8u8; 32]));
        assert!(b.decrypt(&t).is_none());
    }

    #[test]
    fn the_secret_in_the_cache_alone_opens_no_ticket() {
        // Same shared secret, different non-cache key: what someone who reads
        // Redis can compute does not open a pod's tickets.
        let pod = SharedTicketer { pepper: [3u8; 32], ..SharedTicketer::new(Duration::from_secs(3600)) };
        let reader = SharedTicketer::new(Duration::from_secs(3600));
        pod.install(1, &[7u8; 32], None);
        reader.install(1, &[7u8; 32], None);
        let t = pod.encrypt(b"master secret").expect("sealed");
        assert!(reader.decrypt(&t).is_none());
        let peer = SharedTicketer { pepper: [3u8; 32], ..SharedTicketer::new(Duration::from_secs(3600)) };
        peer.install(1, &[7u8; 32], None);
        assert_eq!(peer.decrypt(&t).as_deref(), Some(&b"master secret"[..]));
    }

    #[test]
    fn hostile_tickets_are_rejected() {
        let a = SharedTicketer::new(Duration::from_secs(60));
        a.install(1, &[1u8; 32], None);
        let mut t = a.encrypt(b"x").expect("sealed");
        for len in 0..t.len() {
            assert!(a.decrypt(&t[..len]).is_none());
        }
        let last = t.len() - 1;
        t[last] ^= 1;
        assert!(a.decrypt(&t).is_none());
    }
}
