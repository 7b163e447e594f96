//! Delivery status notifications (RFC 3464 in a multipart/report, RFC 6522) to
//! the sender of a message that failed or is late, or that was delivered or
//! relayed when the sender asked for that (RFC 3461 NOTIFY=SUCCESS). The
//! original header section goes along as text/rfc822-headers; the whole message
//! only in a failure report the sender asked to get it back in (RET=FULL).

use chrono::{DateTime, Utc};

/// One recipient's line of the report.
#[derive(Debug, Clone)]
pub struct RecipientReport {
    pub recipient: String,
    /// RFC 3463 status, e.g. "5.1.1".
    pub status: String,
    /// The remote server that answered, if one did.
    pub remote_mta: Option<String>,
    /// The reply (an SMTP diagnostic) or why there was none.
    pub diagnostic: String,
    /// The address as the original sender gave it (RFC 3461 ORCPT), with its
    /// type: `rfc822; a@b.example`.
    pub original_recipient: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Failed,
    Delayed,
    /// Put into the recipient's mailbox here.
    Delivered,
    /// Handed to a server that does not report on it (no DSN extension).
    Relayed,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Failed => "failed",
            Action::Delayed => "delayed",
            Action::Delivered => "delivered",
            Action::Relayed => "relayed",
        }
    }
}

pub struct Report<'a> {
    pub action: Action,
    pub reporting_mta: &'a str,
    pub sender: &'a str,
    pub arrival: DateTime<Utc>,
    pub expires: DateTime<Utc>,
    pub recipients: &'a [RecipientReport],
    /// The queued message (its header section is quoted).
    pub original: &'a [u8],
    /// The sender's ENVID (RFC 3461 §4.4), returned as Original-Envelope-Id.
    pub envid: Option<&'a str>,
    /// RET=FULL: a failure report returns the whole message (RFC 3461 §4.3;
    /// other reports return the header section whatever RET said).
    pub return_full: bool,
}

/// The complete DSN message (header and body, CRLF line endings).
pub fn build(report: &Report<'_>) -> Vec<u8> {
    let now = Utc::now();
    let date = now.to_rfc2822();
    let boundary = format!("dsn-{}-{}", now.timestamp_micros(), rand::random::<u32>());
    let host = clean(report.reporting_mta);
    let (subject, intro) = match report.action {
        Action::Failed => (
            "Undelivered Mail Returned to Sender",
            "Your message could not be delivered to one or more recipients.\r\n\
             It will not be tried again for them.",
        ),
        Action::Delayed => (
            "Delayed Mail (still being retried)",
            "Your message has not been delivered yet to one or more recipients.\r\n\
             Delivery is still being tried; you do not need to send it again.",
        ),
        Action::Delivered => (
            "Successful Mail Delivery Report",
            "Your message was delivered to the mailbox of the recipients below.",
        ),
        Action::Relayed => (
            "Successful Mail Delivery Report",
            "Your message was passed on to the recipients' mail servers below.\r\n\
             They do not report deliveries, so no further notice will come from them.",
        ),
    };
    let mut out = String::with_capacity(2048 + report.original.len().min(64 * 1024));
    out.push_str(&format!("From: Mail Delivery System <MAILER-DAEMON@{host}>\r\n"));
    out.push_str(&format!("To: <{}>\r\n", clean(report.sender)));
    out.push_str(&format!("Subject: {subject}\r\n"));
    out.push_str(&format!("Date: {date}\r\n"));
    out.push_str(&format!("Message-ID: <{boundary}@{host}>\r\n"));
    // RFC 3834: an automatic reply, which other auto-responders must not answer.
    out.push_str("Auto-Submitted: auto-replied\r\n");
    out.push_str("MIME-Version: 1.0\r\n");
    out.push_str(&format!(
        "Content-Type: multipart/report; report-type=delivery-status;\r\n\tboundary=\"{boundary}\"\r\n\r\n"
    ));
    out.push_str("This is a MIME-encapsulated delivery status notification.\r\n\r\n");

    out.push_str(&format!("--{boundary}\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"));
    out.push_str(&format!("This is the mail system at {host}.\r\n\r\n{intro}\r\n\r\n"));
    for r in report.recipients {
        out.push_str(&format!("<{}>: {}\r\n", clean(&r.recipient), clean(&r.diagnostic)));
    }
    if report.action == Action::Delayed {
        out.push_str(&format!("\r\nDelivery will be tried until {}.\r\n", report.expires.to_rfc2822()));
    }
    out.push_str("\r\n");

    out.push_str(&format!("--{boundary}\r\nContent-Type: message/delivery-status\r\n\r\n"));
    out.push_str(&format!("Reporting-MTA: dns; {host}\r\n"));
    if let Some(envid) = report.envid {
        out.push_str(&format!("Original-Envelope-Id: {}\r\n", clean(envid)));
    }
    out.push_str(&format!("Arrival-Date: {}\r\n", report.arrival.to_rfc2822()));
    for r in report.recipients {
        out.push_str("\r\n");
        if let Some(orcpt) = &r.original_recipient {
            out.push_str(&format!("Original-Recipient: {}\r\n", clean(orcpt)));
        }
        out.push_str(&format!("Final-Recipient: rfc822; {}\r\n", clean(&r.recipient)));
        out.push_str(&format!("Action: {}\r\n", report.action.name()));
        out.push_str(&format!("Status: {}\r\n", clean(&r.status)));
        if let Some(mta) = &r.remote_mta {
            out.push_str(&format!("Remote-MTA: dns; {}\r\n", clean(mta)));
        }
        out.push_str(&format!("Diagnostic-Code: smtp; {}\r\n", clean(&r.diagnostic)));
        out.push_str(&format!("Last-Attempt-Date: {date}\r\n"));
        if report.action == Action::Delayed {
            out.push_str(&format!("Will-Retry-Until: {}\r\n", report.expires.to_rfc2822()));
        }
    }
    out.push_str("\r\n");

    let full = report.return_full && report.action == Action::Failed;
    let returned = if full { "message/rfc822" } else { "text/rfc822-headers" };
    out.push_str(&format!("--{boundary}\r\nContent-Type: {returned}\r\n\r\n"));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(if full { report.original } else { header_section(report.original) });
    if !bytes.ends_with(b"\r\n") {
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    bytes
}

/// The header section of a message, without the blank line (bounded: a message
/// that never ends its header section gives its first 64 KiB).
pub fn header_section(message: &[u8]) -> &[u8] {
    let end = memchr::memmem::find(message, b"\r\n\r\n").map(|p| p + 2).unwrap_or(message.len());
    &message[..end.min(64 * 1024)]
}

/// Text safe on one header or report line.
fn clean(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).take(1000).collect()
}

/// The RFC 3463 status of a reply, or a generic one of its class.
pub fn status_of(code: u16, enhanced: Option<&str>) -> String {
    match enhanced {
        Some(e) => e.to_string(),
        None if code >= 500 => "5.0.0".into(),
        None => "4.0.0".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_report_parses_as_multipart_report_with_original_headers() {
        let original = b"Received: x\r\nFrom: a@org-a.test\r\nSubject: hello\r\n\r\nsecret body\r\n";
        let rcpts = vec![RecipientReport {
            recipient: "nobody@org-b.test".into(),
            status: "5.1.1".into(),
            remote_mta: Some("mx.org-b.test".into()),
            diagnostic: "550 5.1.1 no such user".into(),
            original_recipient: None,
        }];
        let msg = build(&Report {
            action: Action::Failed,
            reporting_mta: "mx.org-a.test",
            sender: "a@org-a.test",
            arrival: Utc::now(),
            expires: Utc::now(),
            recipients: &rcpts,
            original,
            envid: None,
            return_full: false,
        });
        use mail_parser::MimeHeaders;
        let parsed = mail_parser::MessageParser::new().parse(&msg).expect("parses");
        assert_eq!(parsed.subject(), Some("Undelivered Mail Returned to Sender"));
        let ct = parsed.content_type().unwrap();
        assert_eq!(ct.ctype(), "multipart");
        assert_eq!(ct.subtype(), Some("report"));
        assert_eq!(ct.attribute("report-type"), Some("delivery-status"));
        let text = String::from_utf8_lossy(&msg);
        assert!(
            text.contains("Final-Recipient: rfc822; nobody@org-b.test\r\nAction: failed\r\nStatus: 5.1.1")
        );
        assert!(text.contains("Subject: hello"), "original headers quoted");
        assert!(!text.contains("secret body"), "never the content");
        assert!(text.contains("Auto-Submitted: auto-replied"));
    }

    /// RFC 3461: ENVID and ORCPT come back in the report; RET=FULL returns the
    /// whole message in a failure report and only the header section in others.
    #[test]
    fn report_carries_envid_orcpt_and_the_message_when_asked() {
        let original = b"From: a@org-a.test\r\nSubject: hello\r\n\r\nthe body\r\n";
        let rcpts = vec![RecipientReport {
            recipient: "b@org-b.test".into(),
            status: "5.1.1".into(),
            remote_mta: None,
            diagnostic: "550 5.1.1 no such user".into(),
            original_recipient: Some("rfc822; B@Org-B.test".into()),
        }];
        let report = |action| {
            let msg = build(&Report {
                action,
                reporting_mta: "mx.org-a.test",
                sender: "a@org-a.test",
                arrival: Utc::now(),
                expires: Utc::now(),
                recipients: &rcpts,
                original,
                envid: Some("QQ314159"),
                return_full: true,
            });
            String::from_utf8(msg).expect("utf-8")
        };
        let failed = report(Action::Failed);
        assert!(failed.contains("Reporting-MTA: dns; mx.org-a.test\r\nOriginal-Envelope-Id: QQ314159\r\n"));
        assert!(failed.contains(
            "Original-Recipient: rfc822; B@Org-B.test\r\nFinal-Recipient: rfc822; b@org-b.test\r\nAction: failed"
        ));
        assert!(failed.contains("Content-Type: message/rfc822\r\n\r\nFrom: a@org-a.test"));
        assert!(failed.contains("the body"));
        let delivered = report(Action::Delivered);
        assert!(delivered.contains("Subject: Successful Mail Delivery Report"));
        assert!(delivered.contains("Action: delivered"));
        assert!(delivered.contains("Content-Type: text/rfc822-headers"));
        assert!(!delivered.contains("the body"), "only failures return the content");
        let parsed = mail_parser::MessageParser::new().parse(delivered.as_bytes()).expect("parses");
        assert_eq!(parsed.parts.len(), 4, "multipart/report with its three parts");
    }
}
