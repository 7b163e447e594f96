//! rustls client configuration (ring provider) with optional certificate verification.
//!
//! Test clusters and the reference peers use self-signed certificates, so `verify:
//! false` installs [`NoVerify`], which accepts any certificate but still checks the
//! handshake signatures (the TLS work the server does is the same either way, which is
//! what a load test measures).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Shared TLS client settings for one endpoint.
#[derive(Clone)]
pub struct TlsSettings {
    pub config: Arc<ClientConfig>,
    pub server_name: ServerName<'static>,
}

impl TlsSettings {
    /// `verify = true` trusts the webpki roots plus `extra_ca` (PEM file), if given.
    pub fn new(server_name: &str, verify: bool, extra_ca: Option<&[u8]>) -> anyhow::Result<TlsSettings> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let config = if verify {
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            if let Some(pem) = extra_ca {
                for cert in rustls_pemfile::certs(&mut &pem[..]) {
                    roots.add(cert?)?;
                }
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(
                    provider.signature_verification_algorithms,
                )))
                .with_no_client_auth()
        };
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| anyhow::anyhow!("invalid TLS server name {server_name:?}: {e}"))?;
        Ok(TlsSettings { config: Arc::new(config), server_name })
    }
}

/// Accepts any server certificate; handshake signatures are still verified.
#[derive(Debug)]
pub struct NoVerify(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Provider used everywhere in this crate.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
