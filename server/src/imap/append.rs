//! APPEND, with LITERAL+ and MULTIAPPEND (RFC 3502: all messages or none).

use super::mailbox::name_from_bytes;
use super::session::{Outcome, Session, store_error};
use crate::message::parse_meta;
use crate::proto::imap::encode;
use crate::proto::imap::parse::AppendMessage;
use crate::store::NewDelivery;

impl Session {
    pub(crate) async fn cmd_append(&mut self, mailbox: &[u8], messages: Vec<AppendMessage<'_>>) -> Outcome {
        let name = match name_from_bytes(mailbox) {
            Ok(n) => n,
            Err(o) => return o,
        };
        let account = self.account().map(|a| a.id).unwrap_or_default();
        let mb = match self.app.store.mailbox_get(account, &name).await {
            Ok(Some(mb)) => mb,
            // TRYCREATE tells the client to CREATE and retry (RFC 3501 §6.3.11).
            Ok(None) => return Outcome::no("[TRYCREATE] No such mailbox"),
            Err(e) => return store_error(e),
        };
        // RFC 9208 §5.2: the whole APPEND (every message of a MULTIAPPEND) fits, or
        // none of it is stored.
        let octets: u64 = messages.iter().map(|m| m.data.len() as u64).sum();
        if let Some(refusal) = self.quota_refusal(octets).await {
            return refusal;
        }
        let now = chrono::Utc::now();
        let deliveries: Vec<NewDelivery> = messages
            .into_iter()
            .map(|m| NewDelivery {
                raw: bytes::Bytes::copy_from_slice(m.data),
                meta: parse_meta(m.data),
                internal_date: m.date.unwrap_or(now),
                targets: vec![mb.id],
                flags: m.flags,
            })
            .collect();
        // One message goes through the group-committing deliverer like SMTP mail;
        // several go in one batch so that MULTIAPPEND is all-or-nothing.
        let result = if deliveries.len() == 1 {
            let d = deliveries.into_iter().next().map(|d| (d, ()));
            match d {
                Some((d, ())) => self.app.deliverer.deliver(d).await.map(|v| vec![v]),
                None => Ok(Vec::new()),
            }
        } else {
            self.app.store.deliver_batch(&deliveries).await
        };
        let delivered = match result {
            Ok(d) => d,
            Err(e) => return store_error(e),
        };
        let uids: Vec<u32> =
            delivered.iter().flatten().filter(|d| d.mailbox_id == mb.id).map(|d| d.uid).collect();
        // As for SMTP deliveries, the store does not report the new modseq, and a
        // status read only to learn it would be a round trip per APPEND (see
        // `MailboxEvent::modseq`).
        self.notify(mb.id, 0).await;
        if self.selected.as_ref().is_some_and(|s| s.mailbox.id == mb.id)
            && let Err(e) = self.sync(true).await
        {
            return store_error(e);
        }
        Outcome::ok(format!(
            "[APPENDUID {} {}] APPEND completed",
            mb.uid_validity,
            encode::sequence_set(&uids)
        ))
    }
}
