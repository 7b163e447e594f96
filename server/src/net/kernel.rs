//! What the kernel lets the listeners have, checked against the configuration at
//! start: the listen backlog (capped by `net.core.somaxconn`) and open files
//! (`RLIMIT_NOFILE`: every connection is a descriptor).
//!
//! Both limits fail quietly when too low: the kernel shortens a backlog without a
//! word, and a process out of descriptors refuses connections with EMFILE long
//! after start. So the start says it, with the figures, and `/metrics` shows the
//! open-files limit beside what the configuration needs.

use mailcluster_api::Listener;
use prometheus::{IntGauge, Registry};

use crate::config::Config;

/// Refused connections lingering at once per listener. Past this (a flood), refusals
/// are written and closed at once: lingering would pile up descriptors exactly when
/// the listener is already full.
pub(crate) const MAX_LINGERING: usize = 256;

/// `net.core.somaxconn`'s default since Linux 5.4, for when it cannot be read.
pub const DEFAULT_BACKLOG: u32 = 4096;

/// Where the pod's `net.core.somaxconn` is read: in a pod it is the pod's own
/// network namespace's value (`spec.tuning.somaxconn`).
const SOMAXCONN_PATH: &str = "/proc/sys/net/core/somaxconn";

/// Descriptors kept aside for what no limit counts: listening sockets, the admin
/// port, DNS queries, group commit between pods, TLS and DKIM files, logs.
const RESERVED_DESCRIPTORS: u64 = 256;

/// The listen backlog of the listeners and what the kernel makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// What `listen` is given.
    pub requested: u32,
    /// `net.core.somaxconn` when it is below `requested`: the kernel silently
    /// gives each listener this much instead.
    pub capped_at: Option<u32>,
}

/// The backlog for `net.backlog` (`configured`; 0: not set) under the pod's
/// `somaxconn`. Unset, it follows somaxconn, so that raising it (in a pod,
/// `spec.tuning.somaxconn`) lengthens the listeners' queues without a second
/// setting; a value of its own is kept, the kernel capping it at somaxconn.
pub fn choose_backlog(configured: u32, somaxconn: Option<u32>) -> Backlog {
    let requested = match (configured, somaxconn) {
        (0, Some(n)) if n > 0 => n,
        (0, _) => DEFAULT_BACKLOG,
        (n, _) => n,
    };
    Backlog { requested, capped_at: somaxconn.filter(|cap| *cap < requested) }
}

/// The pod's `net.core.somaxconn`, when it can be read (Linux).
pub fn read_somaxconn() -> Option<u32> {
    std::fs::read_to_string(SOMAXCONN_PATH).ok()?.trim().parse().ok()
}

/// The backlog of every listener of `config`, as [`choose_backlog`] picks it.
pub fn listen_backlog(config: &Config) -> Backlog {
    choose_backlog(config.net.backlog, read_somaxconn())
}

/// Logs the backlog once at start; a warning when the kernel caps it.
pub fn log_backlog(config: &Config) {
    let backlog = listen_backlog(config);
    match backlog.capped_at {
        Some(somaxconn) => tracing::warn!(
            backlog = backlog.requested,
            somaxconn,
            "net.backlog is above net.core.somaxconn: the kernel gives each listener a backlog of \
             somaxconn instead; raise it (spec.tuning.somaxconn) or lower net.backlog"
        ),
        None => tracing::info!(backlog = backlog.requested, "listen backlog"),
    }
}

/// Open files the configuration may need at once: per listener the connections
/// it admits and the refusals it may still be closing, the database and Redis
/// pools, the relay's deliveries where it runs, and a reserve.
pub fn descriptors_needed(config: &Config) -> u64 {
    let listeners = config.enabled_listeners();
    let per_listener = config.net.max_connections as u64 + MAX_LINGERING as u64;
    let relays = config.relay.enabled
        && listeners
            .iter()
            .any(|l| matches!(l, Listener::Smtp | Listener::Submission | Listener::Submissions));
    let relay = if relays { config.relay.concurrency as u64 } else { 0 };
    (listeners.len() as u64)
        .saturating_mul(per_listener)
        .saturating_add(u64::from(config.database.pool_size))
        .saturating_add(u64::from(config.redis.pool_size))
        .saturating_add(relay)
        .saturating_add(RESERVED_DESCRIPTORS)
}

/// `RLIMIT_NOFILE` after raising, against what the configuration needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit: what the process may open.
    pub limit: u64,
    /// The hard limit: as far as an unprivileged process may raise `limit`.
    pub hard: u64,
    pub needed: u64,
}

impl OpenFiles {
    /// The warning to log when the limit is below the need: connections past it
    /// fail to be accepted (EMFILE), not refused in protocol.
    pub fn shortfall(&self) -> Option<String> {
        (self.limit < self.needed).then(|| {
            format!(
                "RLIMIT_NOFILE is {} (hard {}) but the connection limits need about {}: connections past \
                 it fail to be accepted; raise the container runtime's limit or lower \
                 net.max_connections",
                self.limit, self.hard, self.needed
            )
        })
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit: every connection is a file
/// descriptor and distribution defaults (1024) are far below what one pod serves.
pub fn raise_nofile_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "RLIMIT_NOFILE"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
    }
}

/// Raises the open-files limit as far as it goes and checks it against
/// `config`, logging a warning with the figures when it is short.
pub fn check_open_files(config: &Config) -> std::io::Result<OpenFiles> {
    raise_nofile_limit();
    let (limit, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    let open_files = OpenFiles { limit, hard, needed: descriptors_needed(config) };
    match open_files.shortfall() {
        Some(warning) => tracing::warn!(
            limit = open_files.limit,
            hard = open_files.hard,
            needed = open_files.needed,
            "{warning}"
        ),
        None => tracing::info!(limit = open_files.limit, needed = open_files.needed, "open files"),
    }
    Ok(open_files)
}

/// `mail_open_files_limit` and `mail_open_files_needed`: a pod whose limit is
/// below its need shows it on the dashboard, not only in its start-up log.
pub fn register_open_files_metrics(registry: &Registry, open_files: &OpenFiles) -> prometheus::Result<()> {
    // RLIM_INFINITY does not fit a gauge: shown as the largest value one holds.
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let limit = IntGauge::new("mail_open_files_limit", "RLIMIT_NOFILE of the process, after raising it")?;
    limit.set(clamp(open_files.limit));
    registry.register(Box::new(limit))?;
    let needed = IntGauge::new(
        "mail_open_files_needed",
        "Open files the configured connection limits and pools may need at once",
    )?;
    needed.set(clamp(open_files.needed));
    registry.register(Box::new(needed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_follows_somaxconn_unless_set_and_says_when_the_kernel_caps_it() {
        // Unset: whatever the pod's somaxconn is, that is the queue.
        assert_eq!(choose_backlog(0, Some(8192)), Backlog { requested: 8192, capped_at: None });
        assert_eq!(choose_backlog(0, Some(128)), Backlog { requested: 128, capped_at: None });
        // Unreadable (not Linux) or nonsense: Linux's own default.
        assert_eq!(choose_backlog(0, None), Backlog { requested: DEFAULT_BACKLOG, capped_at: None });
        assert_eq!(choose_backlog(0, Some(0)).requested, DEFAULT_BACKLOG);
        // Set: kept, smaller or larger; larger is capped by the kernel, and said.
        assert_eq!(choose_backlog(512, Some(4096)), Backlog { requested: 512, capped_at: None });
        assert_eq!(choose_backlog(16384, Some(4096)), Backlog { requested: 16384, capped_at: Some(4096) });
        assert_eq!(choose_backlog(16384, None), Backlog { requested: 16384, capped_at: None });
    }

    #[test]
    fn open_files_needed_count_every_listener_pool_and_the_relay() {
        let mut config = Config { protocols: vec![Listener::Imap, Listener::Imaps], ..Default::default() };
        config.net.max_connections = 5000;
        config.database.pool_size = 4;
        config.redis.pool_size = 8;
        let imap = 2 * (5000 + MAX_LINGERING as u64) + 4 + 8 + RESERVED_DESCRIPTORS;
        assert_eq!(descriptors_needed(&config), imap);
        // Pods that serve SMTP also relay, one connection per delivery.
        config.protocols = vec![Listener::Smtp];
        config.relay.concurrency = 50;
        let smtp = 5000 + MAX_LINGERING as u64 + 4 + 8 + 50 + RESERVED_DESCRIPTORS;
        assert_eq!(descriptors_needed(&config), smtp);
        config.relay.enabled = false;
        assert_eq!(descriptors_needed(&config), smtp - 50);
    }

    #[test]
    fn a_limit_below_the_need_is_a_warning_with_the_figures() {
        let fine = OpenFiles { limit: 1_048_576, hard: 1_048_576, needed: 10_768 };
        assert_eq!(fine.shortfall(), None);
        let short = OpenFiles { limit: 1024, hard: 4096, needed: 10_768 };
        let warning = short.shortfall().expect("short");
        assert!(warning.contains("RLIMIT_NOFILE is 1024 (hard 4096)"), "{warning}");
        assert!(warning.contains("need about 10768"), "{warning}");
    }

    #[test]
    fn the_gauges_show_the_limit_and_the_need() {
        let registry = Registry::new();
        let unlimited = OpenFiles { limit: u64::MAX, hard: u64::MAX, needed: 10_768 };
        register_open_files_metrics(&registry, &unlimited).expect("registered");
        let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).expect("encoded");
        // Unlimited reads as the largest gauge value, about 9.2e18.
        assert!(text.contains("\nmail_open_files_limit 92233720368547"), "{text}");
        assert!(text.contains("\nmail_open_files_needed 10768\n"), "{text}");
    }
}
