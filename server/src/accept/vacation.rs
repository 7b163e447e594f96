//! Vacation replies (RFC 5230) and the rules that keep an automatic answer
//! from answering lists, robots, bounces or the owner (RFC 3834 §2).
//!
//! The decision whether a message deserves an answer and the reply itself are
//! pure functions of the message and the account; whether this sender already
//! had one within the period is the store's (one row per account, handle and
//! sender, shared by every pod).

use mail_parser::{HeaderName, HeaderValue, MessageParser};

/// Why no reply goes out; `None` from [`refusal`] means one may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReply {
    /// The null reverse path: a bounce or another automatic message.
    NullSender,
    /// A sender that names a list or a mail robot (`owner-…`, `…-request`,
    /// `MAILER-DAEMON`, `LISTSERV`, `majordomo`).
    RobotSender,
    /// `Auto-Submitted:` other than `no` (RFC 3834 §5).
    AutoSubmitted,
    /// A mailing list's header fields (RFC 2369, RFC 2919) or a
    /// `Precedence: bulk|list|junk`.
    List,
    /// None of the account's addresses is in `To`, `Cc`, `Bcc` or their
    /// `Resent-` forms (RFC 5230 §4.5): a blind copy or list traffic.
    NotAddressed,
    /// The sender is the account itself.
    Own,
}

/// Whether a message from `sender` to an account with `addresses` may be
/// answered: the rules of RFC 5230 §4.5 and §4.6 and RFC 3834 §2.
pub fn refusal(sender: &str, addresses: &[String], raw: &[u8]) -> Option<NoReply> {
    if sender.is_empty() || sender == "<>" {
        return Some(NoReply::NullSender);
    }
    let local = sender.rsplit_once('@').map_or(sender, |(l, _)| l).to_ascii_lowercase();
    if local.starts_with("owner-")
        || local.ends_with("-request")
        || ["mailer-daemon", "listserv", "majordomo", "postmaster"].contains(&local.as_str())
    {
        return Some(NoReply::RobotSender);
    }
    if addresses.iter().any(|a| a.eq_ignore_ascii_case(sender)) {
        return Some(NoReply::Own);
    }
    let Some(message) = MessageParser::new().parse_headers(raw) else {
        return Some(NoReply::NotAddressed);
    };
    let mut addressed = false;
    for header in message.headers() {
        match &header.name {
            HeaderName::ListId
            | HeaderName::ListArchive
            | HeaderName::ListHelp
            | HeaderName::ListOwner
            | HeaderName::ListPost
            | HeaderName::ListSubscribe
            | HeaderName::ListUnsubscribe => return Some(NoReply::List),
            HeaderName::To
            | HeaderName::Cc
            | HeaderName::Bcc
            | HeaderName::ResentTo
            | HeaderName::ResentCc
            | HeaderName::ResentBcc => {
                if let HeaderValue::Address(list) = &header.value {
                    addressed |= list
                        .iter()
                        .filter_map(|a| a.address())
                        .any(|a| addresses.iter().any(|own| own.eq_ignore_ascii_case(a)));
                }
            }
            name => {
                // Known to the parser or not, these are matched by name.
                let name = name.as_str();
                if name.eq_ignore_ascii_case("auto-submitted") {
                    let value = header.value.as_text().unwrap_or("").trim();
                    let keyword = value.split(';').next().unwrap_or("").trim();
                    if !keyword.eq_ignore_ascii_case("no") {
                        return Some(NoReply::AutoSubmitted);
                    }
                } else if name.eq_ignore_ascii_case("precedence") {
                    let value = header.value.as_text().unwrap_or("").trim().to_ascii_lowercase();
                    if ["bulk", "list", "junk"].contains(&value.as_str()) {
                        return Some(NoReply::List);
                    }
                } else if name.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("list-"))
                    || name.eq_ignore_ascii_case("x-mailing-list")
                {
                    return Some(NoReply::List);
                }
            }
        }
    }
    (!addressed).then_some(NoReply::NotAddressed)
}

/// What the reply says and who sends it.
pub struct Reply<'a> {
    /// The `From:` of the reply: the account's address the mail came to (or
    /// `:from`, when it is one of the account's).
    pub from: &'a str,
    /// The original message's reverse path: the reply goes there (RFC 5230 §4.3).
    pub to: &'a str,
    /// `:subject`; without it, `Auto: ` and the original subject (§5.3).
    pub subject: Option<&'a str>,
    /// The text, or with `mime` a whole MIME entity (header and body).
    pub reason: &'a str,
    pub mime: bool,
    /// Names the reply's `Message-ID`.
    pub hostname: &'a str,
}

/// The reply to `original` (RFC 5230 §5): `Auto-Submitted: auto-replied`,
/// `In-Reply-To` and `References` for the client's threading, and no
/// `Return-Path` (the caller sends it with the null reverse path, §5.1).
pub fn build(reply: &Reply<'_>, original: &[u8]) -> Vec<u8> {
    let parsed = MessageParser::new().parse_headers(original);
    let original_subject = parsed.as_ref().and_then(|m| m.subject()).unwrap_or("");
    let message_id = parsed.as_ref().and_then(|m| m.message_id()).map(str::to_string);
    let mut references: Vec<String> = parsed
        .as_ref()
        .map(|m| match m.references() {
            HeaderValue::Text(id) => vec![id.to_string()],
            HeaderValue::TextList(ids) => ids.iter().map(|s| s.to_string()).collect(),
            _ => Vec::new(),
        })
        .unwrap_or_default();
    // A reference list is the thread's history; a long one is cut at its
    // start, as RFC 5322 §3.6.4 lets a reply do, so the reply stays small.
    if references.len() > 20 {
        references.drain(..references.len() - 20);
    }
    if let Some(id) = &message_id {
        references.push(id.clone());
    }
    let subject = match reply.subject {
        Some(s) => s.to_string(),
        None => format!("Auto: {original_subject}"),
    };
    let mut out = Vec::with_capacity(512 + reply.reason.len());
    let mut field = |name: &str, value: &str| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    field("From", &angle(reply.from));
    field("To", &angle(reply.to));
    // One line of at most 900 octets, RFC 2047-encoded when not ASCII: the
    // content filter's rule for the subjects it rewrites.
    field("Subject", &crate::filter::encoded_subject(&subject));
    field("Date", &chrono::Utc::now().to_rfc2822());
    let mut id = Vec::new();
    mail_builder::headers::message_id::generate_message_id_header(&mut id, reply.hostname);
    field("Message-ID", &String::from_utf8_lossy(&id));
    if let Some(id) = &message_id {
        field("In-Reply-To", &format!("<{id}>"));
    }
    if !references.is_empty() {
        let list: Vec<String> = references.iter().map(|r| format!("<{r}>")).collect();
        field("References", &list.join("\r\n "));
    }
    field("Auto-Submitted", "auto-replied (vacation)");
    field("MIME-Version", "1.0");
    if reply.mime {
        // The entity brings its own Content-Type and body.
        out.extend_from_slice(&crlf(reply.reason.as_bytes()));
    } else {
        out.extend_from_slice(b"Content-Type: text/plain; charset=utf-8\r\n");
        out.extend_from_slice(b"Content-Transfer-Encoding: 8bit\r\n\r\n");
        out.extend_from_slice(&crlf(reply.reason.as_bytes()));
        if !out.ends_with(b"\r\n") {
            out.extend_from_slice(b"\r\n");
        }
    }
    out
}

fn angle(address: &str) -> String {
    format!("<{}>", address.trim_matches(['<', '>']))
}

/// Bare LFs as CRLF, so a reason typed on any system is a valid message.
fn crlf(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + text.len() / 32);
    let mut previous = 0u8;
    for &b in text {
        if b == b'\n' && previous != b'\r' {
            out.push(b'\r');
        }
        out.push(b);
        previous = b;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> Vec<String> {
        vec!["alice@example.com".into(), "sales@example.com".into()]
    }

    const PLAIN: &str = "From: Bob <bob@example.org>\r\nTo: Alice <alice@example.com>\r\n\
        Subject: lunch?\r\nMessage-ID: <m1@example.org>\r\n\r\nhi\r\n";

    #[test]
    fn a_personal_message_is_answered() {
        assert_eq!(refusal("bob@example.org", &own(), PLAIN.as_bytes()), None);
        // Through an alias in Cc (RFC 5230 §4.5: any of the user's addresses).
        let cc = "From: bob@example.org\r\nTo: team@example.org\r\nCc: sales@example.com\r\n\r\nx\r\n";
        assert_eq!(refusal("bob@example.org", &own(), cc.as_bytes()), None);
    }

    #[test]
    fn robots_lists_bounces_and_blind_copies_are_not_answered() {
        let msg = PLAIN.as_bytes();
        // RFC 5230 §4.6 / RFC 3834 §2: never to the null sender or robots.
        assert_eq!(refusal("", &own(), msg), Some(NoReply::NullSender));
        assert_eq!(refusal("MAILER-DAEMON@example.org", &own(), msg), Some(NoReply::RobotSender));
        assert_eq!(refusal("owner-list@example.org", &own(), msg), Some(NoReply::RobotSender));
        assert_eq!(refusal("list-request@example.org", &own(), msg), Some(NoReply::RobotSender));
        // Not to oneself.
        assert_eq!(refusal("Alice@Example.com", &own(), msg), Some(NoReply::Own));
        let with = |extra: &str| format!("{extra}\r\n{PLAIN}");
        for (header, why) in [
            ("Auto-Submitted: auto-replied", NoReply::AutoSubmitted),
            ("Auto-Submitted: auto-generated; type=dsn", NoReply::AutoSubmitted),
            ("List-Id: <dev.example.org>", NoReply::List),
            ("List-Unsubscribe: <mailto:leave@example.org>", NoReply::List),
            ("Precedence: bulk", NoReply::List),
            ("Precedence: junk", NoReply::List),
        ] {
            assert_eq!(refusal("bob@example.org", &own(), with(header).as_bytes()), Some(why), "{header}");
        }
        // `Auto-Submitted: no` is a person's message (RFC 3834 §5).
        assert_eq!(refusal("bob@example.org", &own(), with("Auto-Submitted: no").as_bytes()), None);
        // Bcc'd: none of the account's addresses in the visible recipients.
        let blind = "From: bob@example.org\r\nTo: carol@example.org\r\n\r\nx\r\n";
        assert_eq!(refusal("bob@example.org", &own(), blind.as_bytes()), Some(NoReply::NotAddressed));
    }

    #[test]
    fn the_reply_threads_and_says_it_is_automatic() {
        let reply = Reply {
            from: "alice@example.com",
            to: "bob@example.org",
            subject: None,
            reason: "I am away\nback on Monday",
            mime: false,
            hostname: "mx.example.com",
        };
        let out = String::from_utf8(build(&reply, PLAIN.as_bytes())).unwrap();
        assert!(out.contains("Subject: Auto: lunch?\r\n"), "{out}");
        assert!(out.contains("In-Reply-To: <m1@example.org>\r\n"), "{out}");
        assert!(out.contains("References: <m1@example.org>\r\n"), "{out}");
        assert!(out.contains("Auto-Submitted: auto-replied"), "{out}");
        assert!(out.contains("To: <bob@example.org>\r\n"), "{out}");
        assert!(out.contains("\r\n\r\nI am away\r\nback on Monday\r\n"), "{out}");
        assert!(!out.contains("Return-Path"), "{out}");
        let parsed = MessageParser::new().parse(out.as_bytes()).unwrap();
        assert_eq!(parsed.subject(), Some("Auto: lunch?"));
    }

    #[test]
    fn a_non_ascii_subject_is_encoded_and_decodes_back() {
        let reply = Reply {
            from: "alice@example.com",
            to: "bob@example.org",
            subject: Some("Abwesenheitsnotiz: ich bin bis Montag nicht im Büro, danke für Ihre Geduld"),
            reason: "x",
            mime: false,
            hostname: "mx.example.com",
        };
        let out = build(&reply, PLAIN.as_bytes());
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.lines().all(|l| l.len() <= 998), "{text}");
        let parsed = MessageParser::new().parse(&out[..]).unwrap();
        assert_eq!(parsed.subject(), reply.subject);
    }
}
