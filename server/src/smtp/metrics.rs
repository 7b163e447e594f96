//! SMTP metrics of one listener: the contract ones (`mail_command_duration_seconds`,
//! `mail_commands_total`, `mail_deliveries_total`) and SMTP's own with this
//! listener's `listener` label, all created and registered once per process by
//! [`crate::metrics::Metrics`].

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

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
    /// `mail_smtp_sender_refusals_total{listener,reason}`: submissions refused
    /// for their sender or the account's sending limits.
    pub sender_refusals: IntCounterVec,
    /// `mail_smtp_bounces_dropped_total{listener}`: failure reports to senders
    /// that passed neither SPF nor DMARC, dropped past their hourly limits.
    pub bounces_dropped: IntCounter,
}

impl SmtpMetrics {
    /// The handles of one listener; the series are registered by [`crate::metrics::Metrics`].
    pub fn for_listener(app: &App, kind: SmtpKind) -> SmtpMetrics {
        let listener = [kind.listener_name()];
        let smtp = &app.metrics.smtp;
        SmtpMetrics {
            command_duration: app.metrics.command_duration.clone(),
            commands_total: app.metrics.commands_total.clone(),
            deliveries_total: app.metrics.deliveries_total.clone(),
            delivery_seconds: smtp.delivery_seconds.with_label_values(&listener),
            messages_total: smtp.messages_total.with_label_values(&listener),
            bytes_total: smtp.bytes_total.with_label_values(&listener),
            sender_refusals: smtp.sender_refusals.clone(),
            bounces_dropped: smtp.bounces_dropped.with_label_values(&listener),
        }
    }
}
