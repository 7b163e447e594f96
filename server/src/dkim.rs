//! DKIM signing (RFC 6376) of mail from local domains: ed25519-sha256 (RFC 8463)
//! and rsa-sha256, one selector per domain, keys from PEM files (mounted
//! Secrets) and from the store (where the operator puts the keys it makes).
//!
//! Messages are signed once, when submitted, before they enter the outbound
//! queue: retries send the same bytes and never sign twice.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::Context;
use mail_auth::common::crypto::{Ed25519Key, RsaKey, Sha256};
use mail_auth::common::headers::HeaderWriter;
use mail_auth::dkim::generate::DkimKeyPair;
use mail_auth::dkim::{DkimSigner, Done};
use rustls::pki_types::PrivateKeyDer;

use mailcluster_api::config::{DkimConfig, DkimKey};
use mailcluster_model::DomainKey;

use crate::store::Domains;

/// The header fields signed: the ones RFC 6376 §5.4.1 recommends that exist in
/// ordinary mail. Each is also "over-signed" by the library's rules where absent.
const SIGNED_HEADERS: [&str; 11] = [
    "From",
    "To",
    "Cc",
    "Subject",
    "Date",
    "Message-ID",
    "Reply-To",
    "In-Reply-To",
    "References",
    "MIME-Version",
    "Content-Type",
];

enum Key {
    Ed25519(Ed25519Key),
    Rsa(RsaKey<Sha256>),
}

/// One domain's signer.
enum KeySigner {
    Ed25519(DkimSigner<Ed25519Key, Done>),
    Rsa(DkimSigner<RsaKey<Sha256>, Done>),
}

impl KeySigner {
    fn new(key: Key, domain: &str, selector: &str) -> KeySigner {
        match key {
            Key::Ed25519(key) => KeySigner::Ed25519(
                DkimSigner::from_key(key).domain(domain).selector(selector).headers(SIGNED_HEADERS),
            ),
            Key::Rsa(key) => KeySigner::Rsa(
                DkimSigner::from_key(key).domain(domain).selector(selector).headers(SIGNED_HEADERS),
            ),
        }
    }
}

/// The keys the store holds, as last read, with the signers made of them.
#[derive(Default)]
struct StoredKeys {
    rows: Vec<DomainKey>,
    signers: HashMap<String, KeySigner>,
}

/// How often a process reads the store's keys again: a key the operator
/// activates signs on every pod within this long, without a restart.
pub const STORED_KEYS_REFRESH: Duration = Duration::from_secs(10);

/// The signing keys of this pod, by domain (lowercase): the key files of
/// `dkim.keys`, read once at start, and the keys in the store (made and
/// rotated by the operator), read again every [`STORED_KEYS_REFRESH`]. A key
/// file wins over the store's key for the same domain.
#[derive(Default)]
pub struct Signer {
    configured: HashMap<String, KeySigner>,
    stored: RwLock<Arc<StoredKeys>>,
}

impl Signer {
    /// Reads every configured key; a missing or malformed key file fails the
    /// start with its path rather than sending unsigned mail.
    pub fn load(config: &DkimConfig) -> anyhow::Result<Signer> {
        let mut configured = HashMap::new();
        for k in &config.keys {
            let key = load_key(k).with_context(|| {
                format!("DKIM key of {} (selector {}) in {}", k.domain, k.selector, k.key_file.display())
            })?;
            let domain = k.domain.to_ascii_lowercase();
            configured.insert(domain.clone(), KeySigner::new(key, &domain, &k.selector));
        }
        Ok(Signer { configured, stored: RwLock::default() })
    }

    pub fn is_empty(&self) -> bool {
        self.configured.is_empty() && self.stored_keys().signers.is_empty()
    }

    fn stored_keys(&self) -> Arc<StoredKeys> {
        self.stored.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Takes the store's keys as they are now: unchanged keys keep their
    /// signers; a key that does not parse is skipped with a warning (that
    /// domain's mail goes unsigned rather than not at all).
    pub fn refresh(&self, rows: Vec<DomainKey>) {
        if self.stored_keys().rows == rows {
            return;
        }
        let mut signers = HashMap::new();
        for row in &rows {
            let domain = row.domain.to_ascii_lowercase();
            match parse_key(row.private_pem.as_bytes(), &row.algorithm) {
                Ok(key) => {
                    signers.insert(domain.clone(), KeySigner::new(key, &domain, &row.selector));
                }
                Err(e) => {
                    tracing::warn!(domain, selector = row.selector, error = %e, "stored DKIM key unusable")
                }
            }
        }
        tracing::info!(keys = signers.len(), "DKIM keys from the store");
        *self.stored.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(StoredKeys { rows, signers });
    }

    /// Reads the store's keys now and every [`STORED_KEYS_REFRESH`] after, for
    /// the life of the process. A failed read keeps the keys there were.
    pub async fn keep_fresh(self: Arc<Self>, store: Arc<dyn Domains>) {
        let mut every = tokio::time::interval(STORED_KEYS_REFRESH);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match store.domain_keys().await {
                Ok(rows) => self.refresh(rows),
                Err(e) => tracing::debug!(error = %e, "cannot read the DKIM keys of the store"),
            }
        }
    }

    /// The `DKIM-Signature` header field (with its CRLF) for `message`, signed
    /// by the key of `domain` (or of its closest parent domain with a key);
    /// None when no key covers it. The caller names the domain: the one of a
    /// `From:` address the sender was found entitled to, never whatever the
    /// message's header says.
    pub fn sign(&self, domain: &str, message: &[u8]) -> Option<String> {
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        let stored = self.stored_keys();
        let (d, key) = key_for(&self.configured, &stored.signers, &domain)?;
        let signature = match key {
            KeySigner::Ed25519(signer) => signer.sign(message),
            KeySigner::Rsa(signer) => signer.sign(message),
        };
        match signature {
            Ok(sig) => Some(sig.to_header()),
            Err(e) => {
                tracing::warn!(error = %e, domain = d, "DKIM signing failed; sending unsigned");
                None
            }
        }
    }
}

/// The signer of `domain` or of its closest parent with one; at the same
/// name a key file's before the store's.
fn key_for<'a>(
    configured: &'a HashMap<String, KeySigner>,
    stored: &'a HashMap<String, KeySigner>,
    domain: &str,
) -> Option<(&'a str, &'a KeySigner)> {
    let mut d = domain;
    loop {
        if let Some((name, key)) = configured.get_key_value(d).or_else(|| stored.get_key_value(d)) {
            return Some((name.as_str(), key));
        }
        d = d.split_once('.')?.1;
    }
}

fn load_key(k: &DkimKey) -> anyhow::Result<Key> {
    let pem = std::fs::read(&k.key_file).context("cannot read the key file")?;
    parse_key(&pem, &k.algorithm)
}

fn parse_key(pem: &[u8], algorithm: &str) -> anyhow::Result<Key> {
    let der = parse_pem_key(pem)?;
    match algorithm {
        "ed25519" => match der {
            PrivateKeyDer::Pkcs8(d) => Ed25519Key::from_pkcs8_der(d.secret_pkcs8_der())
                .map(Key::Ed25519)
                .map_err(|e| anyhow::anyhow!("not an Ed25519 PKCS#8 key: {e}")),
            _ => anyhow::bail!("an Ed25519 key must be PKCS#8 (BEGIN PRIVATE KEY)"),
        },
        "rsa" => RsaKey::<Sha256>::from_key_der(der)
            .map(Key::Rsa)
            .map_err(|e| anyhow::anyhow!("not an RSA key: {e}")),
        other => anyhow::bail!("unknown algorithm {other:?} (ed25519 or rsa)"),
    }
}

/// The TXT record value (`v=DKIM1; k=…; p=…`) of a private key in PEM, as
/// `mailcluster dkim generate` prints it for a new key: the operator lists it
/// among a MailDomain's DNS records from the key the MailCluster signs with.
pub fn public_txt(pem: &[u8], algorithm: &str) -> anyhow::Result<String> {
    use base64::Engine;
    let der = parse_pem_key(pem)?;
    let public = match algorithm {
        "ed25519" => match der {
            PrivateKeyDer::Pkcs8(d) => Ed25519Key::from_pkcs8_der(d.secret_pkcs8_der())
                .map_err(|e| anyhow::anyhow!("not an Ed25519 PKCS#8 key: {e}"))?
                .public_key(),
            _ => anyhow::bail!("an Ed25519 key must be PKCS#8 (BEGIN PRIVATE KEY)"),
        },
        "rsa" => RsaKey::<Sha256>::from_key_der(der)
            .map_err(|e| anyhow::anyhow!("not an RSA key: {e}"))?
            .public_key(),
        other => anyhow::bail!("unknown algorithm {other:?} (ed25519 or rsa)"),
    };
    let p = base64::engine::general_purpose::STANDARD.encode(public);
    Ok(format!("v=DKIM1; k={algorithm}; p={p}"))
}

fn parse_pem_key(pem: &[u8]) -> anyhow::Result<PrivateKeyDer<'static>> {
    let mut reader = std::io::BufReader::new(pem);
    match rustls_pemfile::private_key(&mut reader) {
        Ok(Some(key)) => Ok(key),
        Ok(None) => anyhow::bail!("no private key in the file (expected PEM)"),
        Err(e) => anyhow::bail!("malformed PEM: {e}"),
    }
}

/// A new key as `mailcluster dkim generate` writes it.
pub struct GeneratedKey {
    /// PEM: PKCS#8 for Ed25519, PKCS#1 for RSA.
    pub private_pem: String,
    /// The TXT record value to publish at `SELECTOR._domainkey.DOMAIN`.
    pub dns_txt: String,
}

impl GeneratedKey {
    /// The TXT record's value as zone files and DNS consoles take it: quoted
    /// strings of at most 255 characters each (RFC 1035 §3.3.14; an RSA key is
    /// longer than one), which resolvers join back together.
    pub fn zone_value(&self) -> String {
        let chunks: Vec<String> = self
            .dns_txt
            .as_bytes()
            .chunks(255)
            .map(|c| format!("\"{}\"", String::from_utf8_lossy(c)))
            .collect();
        chunks.join(" ")
    }
}

/// Generates a key pair: "ed25519" or "rsa" (2048 bits).
pub fn generate(algorithm: &str) -> anyhow::Result<GeneratedKey> {
    let (pair, label, k) = match algorithm {
        "ed25519" => (DkimKeyPair::generate_ed25519(), "PRIVATE KEY", "ed25519"),
        "rsa" => (DkimKeyPair::generate_rsa(2048), "RSA PRIVATE KEY", "rsa"),
        other => anyhow::bail!("unknown algorithm {other:?} (ed25519 or rsa)"),
    };
    let pair = pair.map_err(|e| anyhow::anyhow!("key generation failed: {e}"))?;
    Ok(GeneratedKey {
        private_pem: pem_encode(label, pair.private_key()),
        dns_txt: format!("v=DKIM1; k={k}; p={}", pair.encoded_public_key()),
    })
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Writes a key file readable by its owner only.
pub fn write_key_file(path: &Path, pem: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(pem.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_public_record_of_a_key_is_what_generate_printed() {
        for algorithm in ["ed25519", "rsa"] {
            let key = super::generate(algorithm).unwrap();
            assert_eq!(
                super::public_txt(key.private_pem.as_bytes(), algorithm).unwrap(),
                key.dns_txt,
                "{algorithm}"
            );
        }
        assert!(super::public_txt(b"not a key", "ed25519").is_err());
    }

    use super::*;

    fn signer_with(algorithm: &str, dir: &Path) -> Signer {
        let key = generate(algorithm).unwrap();
        let path = dir.join(format!("{algorithm}.pem"));
        write_key_file(&path, &key.private_pem).unwrap();
        Signer::load(&DkimConfig {
            keys: vec![DkimKey {
                domain: "Example.org".into(),
                selector: "s1".into(),
                key_file: path,
                algorithm: algorithm.into(),
            }],
        })
        .unwrap()
    }

    #[test]
    fn signs_mail_from_the_domain_and_its_subdomains_only() {
        let dir = tempfile::tempdir().unwrap();
        for alg in ["ed25519", "rsa"] {
            let signer = signer_with(alg, dir.path());
            let msg = b"From: A <a@mail.example.org>\r\nTo: b@else.test\r\nSubject: hi\r\n\r\nbody\r\n";
            let header = signer.sign("mail.example.org", msg).expect("signed");
            assert!(header.starts_with("DKIM-Signature:"), "{header}");
            let want = if alg == "rsa" { "a=rsa-sha256" } else { "a=ed25519-sha256" };
            assert!(
                header.contains(want) && header.contains("d=example.org") && header.contains("s=s1"),
                "{header}"
            );
            assert!(header.ends_with("\r\n"));
            assert!(signer.sign("other.test", b"From: x@other.test\r\n\r\nbody\r\n").is_none());
            // the domain named, not the header's
            assert!(signer.sign("other.test", msg).is_none());
            assert!(signer.sign("notexample.org", msg).is_none());
        }
    }

    #[test]
    fn keys_from_the_store_sign_until_replaced_and_key_files_win() {
        let stored = |domain: &str, selector: &str, algorithm: &str, pem: &str| DomainKey {
            domain: domain.into(),
            selector: selector.into(),
            algorithm: algorithm.into(),
            private_pem: pem.into(),
        };
        let msg = b"From: a@example.org\r\nTo: b@else.test\r\nSubject: hi\r\n\r\nbody\r\n";
        let selector_of = |header: Option<String>| {
            let header = header?;
            let s = header.split(';').map(str::trim).find_map(|t| t.strip_prefix("s="))?;
            Some(s.to_string())
        };
        let signer = Signer::default();
        assert!(signer.is_empty() && signer.sign("example.org", msg).is_none());
        let first = generate("ed25519").unwrap();
        signer.refresh(vec![stored("example.org", "k1", "ed25519", &first.private_pem)]);
        assert_eq!(selector_of(signer.sign("mail.example.org", msg)), Some("k1".into()));
        let second = generate("rsa").unwrap();
        signer.refresh(vec![
            stored("example.org", "k2", "rsa", &second.private_pem),
            stored("broken.test", "x", "ed25519", "not a key"),
        ]);
        let header = signer.sign("example.org", msg).unwrap();
        assert!(header.contains("a=rsa-sha256"), "{header}");
        assert_eq!(selector_of(Some(header)), Some("k2".into()));
        assert!(signer.sign("broken.test", msg).is_none(), "an unusable key signs nothing");
        signer.refresh(Vec::new());
        assert!(signer.sign("example.org", msg).is_none(), "a removed key stops signing");

        // A key file for the same domain wins over the store's.
        let dir = tempfile::tempdir().unwrap();
        let files = signer_with("ed25519", dir.path());
        files.refresh(vec![stored("example.org", "k3", "ed25519", &first.private_pem)]);
        assert_eq!(selector_of(files.sign("example.org", msg)), Some("s1".into()));
        // and a closer name's stored key over a parent's file
        files.refresh(vec![stored("mail.example.org", "k3", "ed25519", &first.private_pem)]);
        assert_eq!(selector_of(files.sign("mail.example.org", msg)), Some("k3".into()));
    }

    #[test]
    fn malformed_key_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.pem");
        std::fs::write(&path, "-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n")
            .unwrap();
        let config = DkimConfig {
            keys: vec![DkimKey {
                domain: "example.org".into(),
                selector: "s1".into(),
                key_file: path.clone(),
                algorithm: "ed25519".into(),
            }],
        };
        let err = format!("{:#}", Signer::load(&config).err().expect("refused"));
        assert!(err.contains("example.org") && err.contains("bad.pem"), "{err}");
        std::fs::write(&path, "").unwrap();
        assert!(Signer::load(&config).is_err());
        let missing = DkimConfig {
            keys: vec![DkimKey { key_file: dir.path().join("none.pem"), ..config.keys[0].clone() }],
        };
        assert!(format!("{:#}", Signer::load(&missing).err().unwrap()).contains("cannot read"));
    }
}
