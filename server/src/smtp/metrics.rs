//! SMTP metrics: the contract ones (`mail_command_duration_seconds`,
//! `mail_commands_total`, `mail_deliveries_total`, shared through
//! [`crate::metrics::Metrics`]) and SMTP's own, registered here into the shared
//! registry.
//!
//! Each listener (smtp, submission, submissions) registers its own series with a
//! constant `listener` label: the registry accepts the same metric name several
//! times when the constant labels differ, so three `SmtpProtocol`s in one process
//! need no shared static.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};

use super::SmtpKind;
use crate::app::App;

pub struct SmtpMetrics {
    pub command_duration: HistogramVec,
    pub commands_total: IntCounterVec,
    pub deliveries_total: IntCounterVec,
    /// `mail_smtp_delivery_seconds{listener}`: end of data → durable → reply.
    pub delivery_seconds: Histogram,
    /// `mail_smtp_messages_total{listener}`: messages accepted (250 after data).
    pub messages_total: IntCounter,
    /// `mail_smtp_bytes_total{listener}`: message octets accepted.
    pub bytes_total: IntCounter,
}

impl SmtpMetrics {
    pub fn register(app: &App, kind: SmtpKind) -> SmtpMetrics {
        let listener = kind.listener_name();
        let delivery_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "mail_smtp_delivery_seconds",
                "Time from the end of message data to the reply, including the durable commit",
            )
            .const_label("listener", listener)
            .buckets(crate::metrics::LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let messages_total = IntCounter::with_opts(
            Opts::new("mail_smtp_messages_total", "Messages accepted over SMTP")
                .const_label("listener", listener),
        )
        .expect("valid metric");
        let bytes_total = IntCounter::with_opts(
            Opts::new("mail_smtp_bytes_total", "Message octets accepted over SMTP")
                .const_label("listener", listener),
        )
        .expect("valid metric");
        let registry = &app.metrics.registry;
        for c in [
            Box::new(delivery_seconds.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(messages_total.clone()),
            Box::new(bytes_total.clone()),
        ] {
            if let Err(err) = registry.register(c) {
                // Only a second protocol object for the same listener gets here (tests);
                // its series then simply stay unexported.
                tracing::debug!(error = %err, "SMTP metric already registered");
            }
        }
        // The group-commit histogram belongs to the one Deliverer of the App; every
        // SMTP listener tries to register it, the first one wins.
        let _ = registry.register(Box::new(app.deliverer.batch_size_histogram().clone()));
        SmtpMetrics {
            command_duration: app.metrics.command_duration.clone(),
            commands_total: app.metrics.commands_total.clone(),
            deliveries_total: app.metrics.deliveries_total.clone(),
            delivery_seconds,
            messages_total,
            bytes_total,
        }
    }
}
