//! The Prometheus registry and the metrics named in the operational contract:
//! the operator's HPA rules and dashboards depend on these names.
//!
//! One pattern for every metric of a pod: the series of the sessions are created
//! and registered here, once per process; parts built on their own (the
//! authenticator, the resilient cache, the group-commit deliverer) have a
//! `register_metrics` that `serve` calls once at start, its error failing the
//! start. Nothing registers lazily, and no registration error is ignored.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

pub struct Metrics {
    pub registry: Registry,
    /// `mail_connections_active{protocol}`
    pub connections_active: IntGaugeVec,
    /// `mail_command_duration_seconds{protocol,command}`
    pub command_duration: HistogramVec,
    /// `mail_commands_total{protocol,command,result}`
    pub commands_total: IntCounterVec,
    /// `mail_deliveries_total{result}`
    pub deliveries_total: IntCounterVec,
    /// `mail_db_pool_connections{state}`
    pub db_pool_connections: IntGaugeVec,
    /// `mail_db_pool_max`
    pub db_pool_max: IntGauge,
    /// `mail_db_pool_acquire_seconds`
    pub db_pool_acquire: Histogram,
    /// `mail_cache_pool_connections{state}`
    pub cache_pool_connections: IntGaugeVec,
    /// `mail_pool_saturation`, scaled 0..1000 is avoided: a float gauge.
    pub pool_saturation: prometheus::Gauge,
    /// `mail_tls_handshakes_total{resumed}`
    pub tls_handshakes_total: IntCounterVec,
    /// `mail_tls_handshake_failures_total{reason}` (error|timeout): implicit TLS and
    /// STARTTLS handshakes that did not complete.
    pub tls_handshake_failures_total: IntCounterVec,
    /// `mail_connections_refused_total{protocol,reason}`: connections closed by the
    /// network layer before a session started (limits, PROXY header problems).
    pub connections_refused_total: IntCounterVec,
    /// `mail_transfer_budget_bytes`: client input held in flight now (see
    /// `net::budget`).
    pub transfer_budget_in_use: IntGauge,
    /// `mail_transfer_budget_limit_bytes`: what it may reach.
    pub transfer_budget_limit: IntGauge,
    /// `mail_transfer_refusals_total{protocol}`: transfers refused with a
    /// temporary error because the budget was spent.
    pub transfer_refusals_total: IntCounterVec,
    pub smtp: SmtpMetricVecs,
    pub imap: ImapMetrics,
    /// `mail_filter_rspamd_*`: the content filter's series.
    pub filter: crate::filter::FilterMetrics,
}

/// SMTP's own series, one per listener (`listener` label: smtp, submission,
/// submissions).
pub struct SmtpMetricVecs {
    /// `mail_smtp_delivery_seconds{listener}`: end of data → durable → reply.
    pub delivery_seconds: HistogramVec,
    /// `mail_smtp_messages_total{listener}`: messages accepted (250 after data).
    pub messages_total: IntCounterVec,
    /// `mail_smtp_bytes_total{listener}`: message octets accepted.
    pub bytes_total: IntCounterVec,
    /// `mail_smtp_sender_refusals_total{listener,reason}` (sender|header|
    /// message_rate|recipient_rate): submissions refused for a sender the
    /// account may not use, or past its hourly sending limits.
    pub sender_refusals: IntCounterVec,
    /// `mail_smtp_bounces_dropped_total{listener}`: failure reports to
    /// senders that passed neither SPF nor DMARC, dropped past their limits.
    pub bounces_dropped: IntCounterVec,
}

/// IMAP's own series, shared by the `imap` and `imaps` listeners of a process.
pub struct ImapMetrics {
    /// `mail_imap_idle_sessions`
    pub idle_sessions: IntGauge,
    /// `mail_imap_select_cache_total{result}` (hit|miss|shared: missed the pod's
    /// cache, found in the shared one)
    pub select_cache: IntCounterVec,
    /// `mail_imap_change_checks_total{kind}` (question|query)
    pub change_checks: IntCounterVec,
    /// `mail_imap_body_cache_total{result}` (hit|miss)
    pub body_cache: IntCounterVec,
    /// `mail_imap_body_cache_bytes`
    pub body_cache_bytes: IntGauge,
    /// `mail_imap_fetch_reads_total{read,kind}` (link|body, question|query)
    pub fetch_reads: IntCounterVec,
    /// `mail_imap_meta_cache_total{result}` (hit|miss)
    pub meta_cache: IntCounterVec,
    /// `mail_imap_meta_cache_bytes`
    pub meta_cache_bytes: IntGauge,
    /// `mail_pop3_listings_total{source}` (local|shared|store)
    pub pop3_listings: IntCounterVec,
}

/// Latency buckets from 0.5 ms to 10 s: mail commands span both ends.
pub const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let connections_active =
            IntGaugeVec::new(Opts::new("mail_connections_active", "Open client connections"), &["protocol"])
                .expect("valid metric");
        let command_duration = HistogramVec::new(
            HistogramOpts::new("mail_command_duration_seconds", "Time to answer a command")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["protocol", "command"],
        )
        .expect("valid metric");
        let commands_total = IntCounterVec::new(
            Opts::new("mail_commands_total", "Commands answered"),
            &["protocol", "command", "result"],
        )
        .expect("valid metric");
        let deliveries_total =
            IntCounterVec::new(Opts::new("mail_deliveries_total", "Message deliveries"), &["result"])
                .expect("valid metric");
        let db_pool_connections = IntGaugeVec::new(
            Opts::new("mail_db_pool_connections", "Database pool connections by state"),
            &["state"],
        )
        .expect("valid metric");
        let db_pool_max =
            IntGauge::new("mail_db_pool_max", "Database pool size limit").expect("valid metric");
        let db_pool_acquire = Histogram::with_opts(
            HistogramOpts::new("mail_db_pool_acquire_seconds", "Time to get a database connection")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let cache_pool_connections = IntGaugeVec::new(
            Opts::new("mail_cache_pool_connections", "Cache connections by state"),
            &["state"],
        )
        .expect("valid metric");
        let pool_saturation =
            prometheus::Gauge::new("mail_pool_saturation", "in_use/max of the busiest pool (0..1)")
                .expect("valid metric");
        let tls_handshakes_total = IntCounterVec::new(
            Opts::new("mail_tls_handshakes_total", "Completed TLS handshakes"),
            &["resumed"],
        )
        .expect("valid metric");
        let tls_handshake_failures_total = IntCounterVec::new(
            Opts::new("mail_tls_handshake_failures_total", "TLS handshakes that failed or timed out"),
            &["reason"],
        )
        .expect("valid metric");
        let connections_refused_total = IntCounterVec::new(
            Opts::new("mail_connections_refused_total", "Connections refused before a session started"),
            &["protocol", "reason"],
        )
        .expect("valid metric");
        let transfer_budget_in_use = IntGauge::new(
            "mail_transfer_budget_bytes",
            "Bytes of client input held in flight (literals, message content)",
        )
        .expect("valid metric");
        let transfer_budget_limit = IntGauge::new(
            "mail_transfer_budget_limit_bytes",
            "Most bytes of client input held in flight at once",
        )
        .expect("valid metric");
        let transfer_refusals_total = IntCounterVec::new(
            Opts::new(
                "mail_transfer_refusals_total",
                "Transfers refused with a temporary error: the pod's transfer budget was spent",
            ),
            &["protocol"],
        )
        .expect("valid metric");
        let counters = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        let smtp = SmtpMetricVecs {
            delivery_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "mail_smtp_delivery_seconds",
                    "Time from the end of message data to the reply, including the durable commit",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["listener"],
            )
            .expect("valid metric"),
            messages_total: counters(
                "mail_smtp_messages_total",
                "Messages accepted over SMTP",
                &["listener"],
            ),
            bytes_total: counters(
                "mail_smtp_bytes_total",
                "Message octets accepted over SMTP",
                &["listener"],
            ),
            sender_refusals: counters(
                "mail_smtp_sender_refusals_total",
                "Submissions refused for a sender the account may not use (sender: MAIL FROM; header: From, Sender, Resent-*) or past its hourly sending limits (message_rate, recipient_rate)",
                &["listener", "reason"],
            ),
            bounces_dropped: counters(
                "mail_smtp_bounces_dropped_total",
                "Failure reports to senders that passed neither SPF nor DMARC, dropped past the hourly limits of their address or domain",
                &["listener"],
            ),
        };
        let imap = ImapMetrics {
            idle_sessions: gauge("mail_imap_idle_sessions", "IMAP sessions in IDLE"),
            select_cache: counters(
                "mail_imap_select_cache_total",
                "SELECT/EXAMINE served from the cached message list (hit) or a full read (miss)",
                &["result"],
            ),
            change_checks: counters(
                "mail_imap_change_checks_total",
                "'Has the mailbox changed?' questions of IMAP commands, and the store queries that answered them",
                &["kind"],
            ),
            body_cache: counters(
                "mail_imap_body_cache_total",
                "Message bodies FETCH found in the process's body cache (hit) or not (miss: read from the store, once for all sessions missing it at the same time)",
                &["result"],
            ),
            body_cache_bytes: gauge(
                "mail_imap_body_cache_bytes",
                "Bytes of message bodies held in the process's body cache",
            ),
            fetch_reads: counters(
                "mail_imap_fetch_reads_total",
                "FETCH reads of message links and bodies (questions), and the store queries that answered them",
                &["read", "kind"],
            ),
            meta_cache: counters(
                "mail_imap_meta_cache_total",
                "Messages whose metadata (ENVELOPE, BODYSTRUCTURE, sizes) FETCH found in the process's metadata cache (hit) or read from the store (miss)",
                &["result"],
            ),
            meta_cache_bytes: gauge(
                "mail_imap_meta_cache_bytes",
                "Bytes of message metadata held in the process's metadata cache",
            ),
            pop3_listings: counters(
                "mail_pop3_listings_total",
                "POP3 logins by where the maildrop's listing came from: the process's cache (local), the shared cache (shared) or a full read of the store (store)",
                &["source"],
            ),
        };
        // Every series of the process is registered here, once: a clash is a bug in
        // this list, and fails every test that builds a pod.
        for c in [
            Box::new(smtp.delivery_seconds.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(smtp.messages_total.clone()),
            Box::new(smtp.bytes_total.clone()),
            Box::new(smtp.sender_refusals.clone()),
            Box::new(smtp.bounces_dropped.clone()),
            Box::new(imap.idle_sessions.clone()),
            Box::new(imap.select_cache.clone()),
            Box::new(imap.change_checks.clone()),
            Box::new(imap.body_cache.clone()),
            Box::new(imap.body_cache_bytes.clone()),
            Box::new(imap.fetch_reads.clone()),
            Box::new(imap.meta_cache.clone()),
            Box::new(imap.meta_cache_bytes.clone()),
            Box::new(imap.pop3_listings.clone()),
            Box::new(connections_active.clone()),
            Box::new(command_duration.clone()),
            Box::new(commands_total.clone()),
            Box::new(deliveries_total.clone()),
            Box::new(db_pool_connections.clone()),
            Box::new(db_pool_max.clone()),
            Box::new(db_pool_acquire.clone()),
            Box::new(cache_pool_connections.clone()),
            Box::new(pool_saturation.clone()),
            Box::new(tls_handshakes_total.clone()),
            Box::new(tls_handshake_failures_total.clone()),
            Box::new(connections_refused_total.clone()),
            Box::new(transfer_budget_in_use.clone()),
            Box::new(transfer_budget_limit.clone()),
            Box::new(transfer_refusals_total.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        let filter = crate::filter::FilterMetrics::new();
        filter.register(&registry).expect("metric names are unique");
        Metrics {
            registry,
            connections_active,
            command_duration,
            commands_total,
            deliveries_total,
            db_pool_connections,
            db_pool_max,
            db_pool_acquire,
            cache_pool_connections,
            pool_saturation,
            tls_handshakes_total,
            tls_handshake_failures_total,
            connections_refused_total,
            transfer_budget_in_use,
            transfer_budget_limit,
            transfer_refusals_total,
            smtp,
            imap,
            filter,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
