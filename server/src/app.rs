//! The shared state every session holds a handle to.

use std::sync::Arc;

use crate::auth::Authenticator;
use crate::cache::Cache;
use crate::config::Config;
use crate::delivery::Deliverer;
use crate::metrics::Metrics;
use crate::store::Store;

#[derive(Clone)]
pub struct App {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub cache: Arc<dyn Cache>,
    pub metrics: Arc<Metrics>,
    pub auth: Arc<Authenticator>,
    pub deliverer: Arc<Deliverer>,
}
