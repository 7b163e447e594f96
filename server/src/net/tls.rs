//! rustls server configuration, reloaded when the certificate files change.

use std::sync::Arc;

/// Hands out a `TlsAcceptor` built from the current certificate. Cheap to clone.
#[derive(Clone)]
pub struct TlsProvider {
    config: Arc<std::sync::RwLock<Arc<rustls::ServerConfig>>>,
}

impl TlsProvider {
    pub fn from_config(config: Arc<rustls::ServerConfig>) -> Self {
        TlsProvider { config: Arc::new(std::sync::RwLock::new(config)) }
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self.config.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        tokio_rustls::TlsAcceptor::from(config)
    }

    pub fn replace(&self, config: Arc<rustls::ServerConfig>) {
        *self.config.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = config;
    }
}
