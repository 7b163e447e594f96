//! A message a user files themselves (IMAP APPEND): the acceptance rules that
//! apply to it. The mailbox's storage quota holds for the whole command (RFC
//! 9208 §5.2: every message of a MULTIAPPEND fits, or none is stored); each
//! message's metadata is parsed once, as for mail that arrives; one message
//! goes through the group commit like SMTP mail, several in one batch so that
//! MULTIAPPEND is all or nothing (RFC 3502). The content filter, Sieve, Junk
//! routing and reports do not apply: the user chose where it goes.

use bytes::Bytes;
use chrono::{DateTime, FixedOffset, Utc};
use mailcluster_model::message::parse_meta;
use mailcluster_model::{DeliveredTo, FlagSet, NewDelivery, Quota};

use crate::app::App;
use crate::store::StoreError;

/// One message of an APPEND.
pub struct Filed {
    pub raw: Bytes,
    pub flags: FlagSet,
    /// The internal date asked for, in the zone the client wrote it in.
    pub date: Option<DateTime<FixedOffset>>,
}

#[derive(Debug)]
pub enum Refused {
    /// The messages together do not fit the mailbox's quota: nothing stored.
    OverQuota,
    Store(StoreError),
}

/// Stores `messages` into mailbox `mailbox_id` (whose account's quota is
/// `quota`); for each message, in order, where it was stored.
pub async fn append(
    app: &App,
    mailbox_id: i64,
    quota: &Quota,
    messages: Vec<Filed>,
) -> Result<Vec<Vec<DeliveredTo>>, Refused> {
    let octets: u64 = messages.iter().map(|m| m.raw.len() as u64).sum();
    if !quota.fits(octets) {
        return Err(Refused::OverQuota);
    }
    let now = Utc::now();
    let deliveries: Vec<NewDelivery> = messages
        .into_iter()
        .map(|m| {
            let mut meta = parse_meta(&m.raw);
            meta.internal_offset_minutes = m.date.map(|d| d.offset().local_minus_utc() / 60);
            NewDelivery {
                raw: m.raw,
                meta,
                internal_date: m.date.map(|d| d.to_utc()).unwrap_or(now),
                targets: vec![mailbox_id],
                flags: m.flags,
            }
        })
        .collect();
    let result = match <[NewDelivery; 1]>::try_from(deliveries) {
        Ok([one]) => app.deliverer.deliver(one).await.map(|to| vec![to]),
        Err(several) => app.store.deliver_batch(&several).await,
    };
    result.map_err(Refused::Store)
}
