//! DATA and BDAT (RFC 5321 §4.1.1.4, RFC 3030), and delivery of the finished
//! message.
//!
//! Content is streamed into one buffer that already starts with the trace headers
//! (Return-Path, Received), so the stored message is built without a second copy.
//! The buffer never grows past the size limit: beyond it content is read and
//! dropped (up to `max_discard_size`, then the connection is closed), so a 100 MB
//! upload against a 10 MB limit costs 10 MB of memory at most.
//!
//! A message gets its `250` only after the store reports it durable (group commit
//! through [`crate::delivery::Deliverer`]); any store failure answers 451 and
//! nothing is acknowledged.

use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use chrono::Utc;

use super::envelope::Envelope;
use super::session::{Session, Step};
use crate::accept::{self, return_path_end};
use crate::net::budget::Reservation;
use crate::proto::frame::take_octets;
use crate::proto::smtp::{DataDecoder, Reply, replies, trace_name};

/// Octets the first read of DATA content may bring, reserved before the `354`.
const FIRST_READ: usize = 64 * 1024;

/// A message being assembled from BDAT chunks.
pub(super) struct BdatBody {
    /// Trace headers followed by the content received so far.
    buf: Vec<u8>,
    /// Content octets received (kept or not).
    seen: usize,
    too_big: bool,
    /// The pod's transfer budget taken by `buf`.
    held: Reservation,
    /// When the last chunk must have arrived (`data_deadline_secs`).
    deadline: Instant,
}

/// The temporary refusal of a transfer the pod has no memory for now: the
/// client tries again later, as after Postfix's "insufficient system storage".
fn no_room() -> Reply {
    Reply::new(452, "4.3.1", "Insufficient system storage, try again later")
}

impl Session {
    pub(super) async fn cmd_data(&mut self, stream: &mut crate::net::SessionStream) -> Step {
        if self.bdat.is_some() {
            self.reply(replies::bad_sequence("DATA not allowed after BDAT"));
            return Step::Continue;
        }
        let Some(envelope) = self.envelope.as_ref() else {
            self.reply(replies::bad_sequence("Need MAIL command"));
            return Step::Continue;
        };
        if envelope.rcpts.is_empty() {
            self.reply(Reply::new(554, "5.5.1", "No valid recipients"));
            return Step::Continue;
        }
        let mut body = self.trace_headers(envelope);
        // The content is held as it arrives: what the first read may bring is
        // reserved before the client is told to send, the rest as it comes.
        let mut held = self.app.budget.start("smtp");
        if !held.grow_to(body.len() + FIRST_READ) {
            self.reply(no_room());
            self.count_delivery("tempfail");
            return Step::Continue;
        }
        body.reserve_exact(FIRST_READ);
        self.reply(Reply::new(354, "", "Start mail input; end with <CRLF>.<CRLF>"));
        self.data_deadline = Some(Instant::now() + Duration::from_secs(self.config().data_deadline_secs));
        let limit = self.config().max_message_size;
        let discard_bound = limit.saturating_add(self.config().max_discard_size);
        let mut base = body.len();
        let mut decoder = DataDecoder::new(limit);
        // The budget ran out on the way: the rest is read and dropped, and the
        // message refused with a temporary error at its end.
        let mut no_budget = false;
        loop {
            // Room for what is buffered (content never grows in decoding) before
            // the decoder writes it, so that the buffer grows within the
            // reservation, by an eighth rather than by doubling.
            let need = body.len() + self.rbuf.len();
            if !no_budget && need > body.capacity() {
                // Never past the size limit: the decoder keeps nothing beyond it.
                let target = need.max(body.capacity() + body.capacity() / 8).min(base + limit);
                if held.grow_to(target) {
                    body.reserve_exact(target.saturating_sub(body.len()));
                } else {
                    no_budget = true;
                    body = Vec::new();
                    base = 0;
                    held.clear();
                }
            }
            let n = decoder.decode(&self.rbuf, &mut body, base);
            self.rbuf.advance(n);
            if no_budget {
                body.clear();
            }
            if decoder.is_done() {
                break;
            }
            if decoder.seen() > discard_bound {
                self.envelope = None;
                self.reply(replies::message_too_big());
                self.count_delivery("rejected");
                return Step::Close;
            }
            if let Err(step) = self.fill(stream, true).await {
                self.envelope = None;
                return step;
            }
        }
        self.cmd_started = Instant::now();
        let flaws = decoder.flaws();
        if no_budget && decoder.seen() <= limit {
            self.envelope = None;
            self.reply(no_room());
            self.count_delivery("tempfail");
            return Step::Continue;
        }
        if flaws.too_big || decoder.seen() > limit {
            self.envelope = None;
            self.reply(replies::message_too_big());
            self.count_delivery("rejected");
            return Step::Continue;
        }
        if flaws.bare_line_ending {
            self.envelope = None;
            self.reply(Reply::new(
                550,
                "5.6.0",
                "Message contains bare CR or LF line endings (RFC 5321 section 2.3.8)",
            ));
            self.count_delivery("rejected");
            return Step::Continue;
        }
        let reply = self.finish_message(body, decoder.seen()).await;
        drop(held);
        self.reply(reply);
        Step::Continue
    }

    pub(super) async fn cmd_bdat(
        &mut self,
        size: usize,
        last: bool,
        stream: &mut crate::net::SessionStream,
    ) -> Step {
        // RFC 3030 §3: the chunk follows the command whatever the answer, so it is
        // always consumed (or the connection closed) to stay in sync.
        let refusal = match self.envelope.as_ref() {
            None => Some(replies::bad_sequence("Need MAIL command")),
            Some(e) if e.rcpts.is_empty() => Some(Reply::new(554, "5.5.1", "No valid recipients")),
            Some(_) => None,
        };
        if let Some(refusal) = refusal {
            if let Err(step) = self.discard(stream, size).await {
                return step;
            }
            self.reply(refusal);
            return Step::Continue;
        }
        let limit = self.config().max_message_size;
        let discard_bound = limit.saturating_add(self.config().max_discard_size);
        let mut body = match self.bdat.take() {
            Some(b) => b,
            None => {
                let buf = match self.envelope.as_ref() {
                    Some(e) => self.trace_headers(e),
                    None => Vec::new(),
                };
                let deadline = Instant::now() + Duration::from_secs(self.config().data_deadline_secs);
                BdatBody { buf, seen: 0, too_big: false, held: self.app.budget.start("smtp"), deadline }
            }
        };
        self.data_deadline = Some(body.deadline);
        if body.seen.saturating_add(size) > discard_bound {
            self.envelope = None;
            self.reply(replies::message_too_big());
            self.count_delivery("rejected");
            return Step::Close;
        }
        if body.seen.saturating_add(size) > limit {
            body.too_big = true;
            // Release what was kept: it will not be stored.
            body.buf = Vec::new();
            body.held.clear();
        }
        // The chunk's announced size is reserved before any of it is kept (with
        // the CRLF a last chunk may need); without room the chunk is read and
        // dropped, and the transaction ends with a temporary error.
        let room = body.buf.len().saturating_add(size).saturating_add(2);
        if !body.too_big && !body.held.grow_to(room) {
            self.envelope = None;
            drop(body);
            if let Err(step) = self.discard(stream, size).await {
                return step;
            }
            self.reply(no_room());
            self.count_delivery("tempfail");
            return Step::Continue;
        }
        if !body.too_big {
            body.buf.reserve_exact(room - body.buf.len());
        }
        let mut left = size;
        while left > 0 {
            if self.rbuf.is_empty()
                && let Err(step) = self.fill(stream, true).await
            {
                self.envelope = None;
                return step;
            }
            let chunk = take_octets(&mut self.rbuf, &mut left);
            if !body.too_big {
                body.buf.extend_from_slice(&chunk);
            }
        }
        body.seen += size;
        self.cmd_started = Instant::now();
        if body.too_big {
            // The transaction is over (RFC 3030 §2: the client must not send more
            // chunks after an error); later BDATs get 503 and are consumed.
            self.envelope = None;
            self.reply(replies::message_too_big());
            self.count_delivery("rejected");
            return Step::Continue;
        }
        if !last {
            self.reply(Reply::new(250, "2.0.0", format!("{size} octets received")));
            self.bdat = Some(body);
            return Step::Continue;
        }
        // A message ends with CRLF (RFC 5322 §2.1); DATA's terminator guarantees
        // one, a last chunk may not. Added here, so that every reader (POP3's
        // exact LIST size, IMAP's RFC822.SIZE) sees the octets it will send.
        if !body.buf.ends_with(b"\r\n") && body.seen > 0 {
            body.buf.extend_from_slice(b"\r\n");
        }
        let BdatBody { buf, seen, held, .. } = body;
        let reply = self.finish_message(buf, seen).await;
        drop(held);
        self.reply(reply);
        Step::Continue
    }

    /// `Return-Path` and `Received` (RFC 5321 §4.4), prepended to the content.
    fn trace_headers(&self, envelope: &Envelope) -> Vec<u8> {
        let helo = self.helo.as_deref().unwrap_or("unknown");
        // RFC 3848 / RFC 6531 protocol names.
        let base = if envelope.smtputf8 {
            "UTF8SMTP"
        } else if self.esmtp || self.is_tls || self.account.is_some() {
            "ESMTP"
        } else {
            "SMTP"
        };
        let with = format!(
            "{base}{}{}",
            if self.is_tls { "S" } else { "" },
            if self.account.is_some() { "A" } else { "" }
        );
        let mut out = String::with_capacity(256);
        out.push_str("Return-Path: <");
        out.push_str(&header_safe(&envelope.from));
        out.push_str(">\r\n");
        out.push_str(&format!(
            "Received: from {} ([{}])\r\n\tby {} (Mailcluster) with {} id {}",
            trace_name(helo),
            self.conn.remote.ip(),
            self.hostname(),
            with,
            envelope.id
        ));
        if let [only] = envelope.rcpts.as_slice() {
            // Only for a single recipient: listing several would disclose Bcc.
            out.push_str(&format!("\r\n\tfor <{}>", header_safe(&only.address)));
        }
        out.push_str(&format!("; {}\r\n", Utc::now().format("%a, %d %b %Y %H:%M:%S +0000")));
        out.into_bytes()
    }

    /// Stores a complete message through the acceptance rules (`crate::accept`)
    /// and answers for it. Ends the transaction.
    async fn finish_message(&mut self, raw: Vec<u8>, content_octets: usize) -> Reply {
        let started = Instant::now();
        self.bdat = None;
        let Some(mut envelope) = self.envelope.take() else {
            return replies::bad_sequence("Need MAIL command");
        };
        let mut raw = raw;
        let mut junk = false;
        let mut authentication_results = None;
        let verified =
            match self.authenticate_sender(&envelope, &mut raw, &mut junk, &mut authentication_results).await
            {
                Ok(verified) => verified,
                Err(reply) => return reply,
            };
        if !verified {
            envelope.dsn.limit_to_unverified_sender();
        }
        let signing_domain = match self.header_senders(&raw[return_path_end(&raw)..]) {
            Ok(domain) => domain,
            Err(reply) => {
                self.count_refusal("header");
                self.count_delivery("rejected");
                return reply;
            }
        };
        if self.account.is_some() {
            // A message submission agent completes what a client left out
            // (RFC 6409 §8.2, §8.3): RFC 5322 §3.6 requires Date, and replies and
            // threading need a Message-ID.
            complete_submitted_header(&mut raw, self.hostname());
        }
        let incoming = accept::Incoming {
            id: &envelope.id,
            from: &envelope.from,
            recipients: &envelope.rcpts,
            dsn: &envelope.dsn,
            account_id: self.account.as_ref().map(|a| a.id),
            verified,
            junk,
            signing_domain: signing_domain.as_deref(),
            client_ip: Some(self.conn.remote.ip()),
            helo: self.helo.as_deref(),
            user: self.account.as_ref().map(|a| a.email.as_str()),
            authentication_results: authentication_results.as_deref(),
            bounces_dropped: &self.metrics.bounces_dropped,
        };
        match accept::accept(&self.app, &incoming, Bytes::from(raw)).await {
            accept::Outcome::Accepted => {}
            accept::Outcome::QuotaExceeded => {
                // Every recipient is over quota: one answer says it all (RFC 9208
                // at delivery; RFC 5321 §4.2.2's "exceeded storage allocation").
                self.count_delivery("rejected");
                return Reply::new(552, "5.2.2", "Quota exceeded");
            }
            accept::Outcome::TryLater => {
                self.count_delivery("tempfail");
                return replies::temp_failure();
            }
            accept::Outcome::Rejected(text) => {
                self.count_delivery("rejected");
                return Reply::new(550, "5.7.1", text);
            }
            accept::Outcome::Deferred(text) => {
                self.count_delivery("tempfail");
                return Reply::new(451, "4.7.1", text);
            }
        }
        self.count_delivery("ok");
        self.metrics.messages_total.inc();
        self.metrics.bytes_total.inc_by(content_octets as u64);
        self.metrics.delivery_seconds.observe(started.elapsed().as_secs_f64());
        Reply::new(250, "2.0.0", format!("OK: queued as {}", envelope.id))
    }

    /// SPF, DKIM, ARC and DMARC of mail arriving on the MX from outside
    /// (`inbound.*`): adds `Authentication-Results` below `Return-Path`, or
    /// answers with the refusal. Results that claim to be ours are removed
    /// from every message arriving on the MX first. `Ok(true)` when the sender
    /// is known: an authenticated user, a trusted network, or a MAIL FROM
    /// domain passing SPF or a message passing DMARC.
    async fn authenticate_sender(
        &self,
        envelope: &Envelope,
        raw: &mut Vec<u8>,
        junk: &mut bool,
        authentication_results: &mut Option<String>,
    ) -> Result<bool, Reply> {
        let inbound = &self.app.config.inbound;
        if self.kind != super::SmtpKind::Mx || self.account.is_some() {
            return Ok(true);
        }
        let authserv_id = if inbound.authserv_id.is_empty() { self.hostname() } else { &inbound.authserv_id };
        let trace_end = return_path_end(raw);
        crate::inbound::remove_our_results(raw, trace_end, authserv_id);
        let ip = self.conn.remote.ip();
        if inbound.trusted_networks.iter().any(|n| n.contains(&ip)) {
            return Ok(true);
        }
        let Some(dns) = self.app.mail.dns.as_ref().filter(|_| inbound.enabled) else { return Ok(false) };
        let verdict = crate::inbound::check(
            dns,
            inbound,
            authserv_id,
            &crate::inbound::Envelope {
                remote_ip: ip,
                helo: self.helo.as_deref().unwrap_or(""),
                mail_from: &envelope.from,
            },
            &raw[trace_end..],
        )
        .await;
        match verdict {
            crate::inbound::Verdict::Accept { header, junk: j, verified } => {
                // Exactly: a full buffer would otherwise double for one header.
                raw.reserve_exact(header.len());
                raw.splice(trace_end..trace_end, header.bytes());
                *authentication_results = Some(header);
                *junk = j;
                Ok(verified)
            }
            crate::inbound::Verdict::Reject(text) => {
                tracing::info!(id = %envelope.id, from = %envelope.from, "refused by DMARC policy");
                self.count_delivery("rejected");
                Err(Reply::new(550, "5.7.1", text))
            }
            crate::inbound::Verdict::Defer(status, text) => {
                self.count_delivery("tempfail");
                Err(Reply::new(451, status, text))
            }
        }
    }

    pub(super) fn count_delivery(&self, result: &str) {
        self.metrics.deliveries_total.with_label_values(&[result]).inc();
    }
}

/// Text safe inside a header field: no control characters (no header injection).
fn header_safe(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(512).collect()
}

/// Adds `Date:` and `Message-ID:` to a submitted message's header when it has
/// none, as its last fields (the trace fields stay first); both written by
/// mail-builder.
fn complete_submitted_header(raw: &mut Vec<u8>, hostname: &str) {
    let header_end = mailcluster_model::message::find_header_end(raw);
    let header = &raw[..header_end.unwrap_or(raw.len())];
    let has = |name: &[u8]| {
        header.split(|&b| b == b'\n').any(|line| {
            line.len() > name.len()
                && line[..name.len()].eq_ignore_ascii_case(name)
                && line[name.len()] == b':'
        })
    };
    let mut added = Vec::new();
    if !has(b"Date") {
        added.extend_from_slice(b"Date: ");
        added.extend_from_slice(mail_builder::headers::date::Date::now().to_rfc822().as_bytes());
        added.extend_from_slice(b"\r\n");
    }
    if !has(b"Message-ID") {
        added.extend_from_slice(b"Message-ID: ");
        mail_builder::headers::message_id::generate_message_id_header(&mut added, hostname);
        added.extend_from_slice(b"\r\n");
    }
    if added.is_empty() {
        return;
    }
    // Before the blank line that ends the header, or after the last line of a
    // message that is all header.
    let at = match header_end {
        Some(end) if raw[..end].ends_with(b"\r\n") => end - 2,
        Some(end) => end - 1,
        None => {
            if !raw.is_empty() && !raw.ends_with(b"\n") {
                raw.extend_from_slice(b"\r\n");
            }
            raw.len()
        }
    };
    raw.reserve_exact(added.len());
    raw.splice(at..at, added);
}

#[cfg(test)]
mod tests {
    use super::complete_submitted_header;

    fn completed(raw: &str) -> String {
        let mut raw = raw.as_bytes().to_vec();
        complete_submitted_header(&mut raw, "mx.example.org");
        String::from_utf8(raw).unwrap()
    }

    #[test]
    fn submitted_mail_gets_date_and_message_id_when_missing() {
        let out = completed("Received: x\r\nSubject: hi\r\n\r\nbody\r\n");
        let (header, body) = out.split_once("\r\n\r\n").unwrap();
        assert_eq!(body, "body\r\n");
        let lines: Vec<&str> = header.split("\r\n").collect();
        assert_eq!(lines[..2], ["Received: x", "Subject: hi"]);
        assert!(lines[2].starts_with("Date: ") && lines[2].ends_with(" +0000"), "{out}");
        assert!(lines[3].starts_with("Message-ID: <") && lines[3].ends_with("@mx.example.org>"), "{out}");
        assert_eq!(lines.len(), 4);
        let parsed = mail_parser::MessageParser::default().parse(out.as_bytes()).unwrap();
        assert!(parsed.date().is_some() && parsed.message_id().is_some());
    }

    #[test]
    fn fields_the_client_wrote_are_left_alone() {
        let given = "DATE: Sat, 5 Dec 2026 10:00:00 +0100\r\nmessage-id: <a@b>\r\n\r\nbody\r\n";
        assert_eq!(completed(given), given);
        // A header field named like it (X-Date) is not it.
        assert!(completed("X-Date: 1\r\nMessage-ID: <a@b>\r\n\r\n").contains("\r\nDate: "));
    }

    #[test]
    fn messages_without_a_body_or_a_header() {
        let out = completed("Subject: only a header\r\n");
        assert!(out.starts_with("Subject: only a header\r\nDate: "), "{out}");
        assert!(out.ends_with(">\r\n"), "{out}");
        let out = completed("\r\nbody only\r\n");
        assert!(out.starts_with("Date: ") && out.ends_with(">\r\n\r\nbody only\r\n"), "{out}");
    }
}
