//! The shared state every session holds a handle to.

use std::sync::Arc;

use crate::auth::Authenticator;
use crate::cache::Cache;
use crate::config::Config;
use crate::delivery::Deliverer;
use crate::filter::Filter;
use crate::metrics::Metrics;
use crate::net::budget::TransferBudget;
use crate::store::Store;
use crate::view::View;

#[derive(Clone)]
pub struct App {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub cache: Arc<dyn Cache>,
    pub metrics: Arc<Metrics>,
    pub auth: Arc<Authenticator>,
    pub deliverer: Arc<Deliverer>,
    /// The process's read layer, one for all IMAP and POP3 sessions.
    pub view: Arc<View>,
    /// The process's IMAP sessions per account (`imap.max_connections_per_user`),
    /// one count for all IMAP listeners.
    pub imap_leases: Arc<crate::imap::limit::Leases>,
    /// Mail exchange with other domains (resolver, DKIM keys, relay wake-up).
    pub mail: Arc<MailExchange>,
    /// Client input held in flight, for the whole process (`net::budget`).
    pub budget: Arc<TransferBudget>,
    /// Accounts' Sieve scripts: the check one must pass to be stored, and
    /// the compiled scripts delivery runs (`accept::sieve`).
    pub sieve: Arc<crate::scripts::Filters>,
    /// The content filter (`[filter]`) the acceptance rules ask.
    pub filter: Arc<Filter>,
    /// The cached recipient entries being read again before they expire, so
    /// that one read per entry runs at a time in the process.
    pub(crate) refreshing_recipients: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// What exchanging mail with other domains needs.
pub struct MailExchange {
    /// None: no resolver, so no sender authentication on the MX (a process built
    /// for one job, like the admin commands and unit harnesses).
    pub dns: Option<Arc<crate::dns::Dns>>,
    pub signer: Arc<crate::dkim::Signer>,
    /// Wakes the relay workers when mail is queued.
    pub relay_wake: Arc<tokio::sync::Notify>,
}

impl MailExchange {
    pub fn disabled() -> MailExchange {
        MailExchange {
            dns: None,
            signer: Arc::new(crate::dkim::Signer::default()),
            relay_wake: Arc::new(tokio::sync::Notify::new()),
        }
    }
}

impl App {
    /// The App of one process; its IMAP state is built here, once.
    pub fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        cache: Arc<dyn Cache>,
        metrics: Arc<Metrics>,
        auth: Arc<Authenticator>,
        deliverer: Arc<Deliverer>,
    ) -> App {
        let view = View::new(&config, &store, cache.clone(), &metrics);
        let budget = TransferBudget::new(crate::net::budget::budget_bytes(&config), &metrics);
        let sieve = Arc::new(crate::scripts::Filters::from_config(&config));
        let filter = Arc::new(Filter::new(&config.filter.rspamd, &store, metrics.filter.clone()));
        App {
            config,
            store,
            cache,
            metrics,
            auth,
            deliverer,
            view,
            imap_leases: Arc::default(),
            mail: Arc::new(MailExchange::disabled()),
            budget,
            sieve,
            filter,
            refreshing_recipients: Arc::default(),
        }
    }

    pub fn with_mail(mut self, mail: MailExchange) -> App {
        self.mail = Arc::new(mail);
        self
    }
}
