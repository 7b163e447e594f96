//! Parse a message once, at delivery or APPEND, into the [`MessageMeta`] the store
//! keeps beside the body.
//!
//! Everything IMAP FETCH needs that would otherwise require re-parsing the body is
//! rendered here, in IMAP response syntax (RFC 3501 §7.4.2): ENVELOPE, BODY and
//! BODYSTRUCTURE are stored as finished strings, and every MIME part's byte offsets
//! are recorded so that `BODY[1.2]`, `BODY[1.MIME]` and `BODY[2.HEADER]` become
//! slices of the stored bytes.
//!
//! MIME parsing is `mail-parser`'s; this module only walks its part tree. Two of its
//! conventions matter here:
//! - A `message/rfc822` part that is not transfer-encoded is parsed in place, so its
//!   inner parts carry offsets into the outer raw bytes (usable as sections). An
//!   encoded one (base64/QP, which RFC 2046 forbids but happens) is parsed from the
//!   decoded bytes; we describe it as an opaque leaf so no section ever points at the
//!   wrong bytes.
//! - Part `offset_end` excludes the CRLF that belongs to the following boundary
//!   delimiter (RFC 2046 §5.1.1), which is exactly the IMAP body size.

use std::borrow::Cow;
use std::fmt::Write as _;

use base64::Engine as _;
use mail_parser::{Address, HeaderName, HeaderValue, Message, MessageParser, MessagePart, PartType};

use crate::{MessageMeta, PartInfo};

/// Nesting bound for the part walk: mail-parser already limits nesting, this keeps
/// our own recursion bounded whatever the parser decides.
const MAX_DEPTH: usize = 32;

/// Computes the stored metadata of a raw RFC 5322 message. Never fails: a message
/// the MIME parser cannot make sense of is described as one `text/plain` part.
pub fn parse_meta(raw: &[u8]) -> MessageMeta {
    let size = raw.len() as u32;
    let Some(message) = MessageParser::default().parse(raw) else {
        return fallback_meta(raw);
    };
    if message.parts.is_empty() {
        return fallback_meta(raw);
    }
    let root = &message.parts[0];
    let header_size = root.offset_body.min(size);

    let mut parts = Vec::new();
    let mut walker = Walker { raw, message: &message, parts: &mut parts };
    let (body, body_structure) = walker.message_body(&message, &[], 0);
    let envelope = envelope(raw, &message);

    MessageMeta {
        size,
        header_size,
        envelope,
        body_structure,
        body,
        parts,
        subject: message.subject().unwrap_or_default().to_string(),
        from: address_summary(message.from()),
        to: address_summary(message.to()),
        cc: address_summary(message.cc()),
        bcc: address_summary(message.bcc()),
        message_id: message.message_id().unwrap_or_default().to_string(),
        sent_date: message.date().and_then(|d| chrono::DateTime::from_timestamp(d.to_timestamp(), 0)),
        sent_offset_minutes: message.date().map(|d| {
            let minutes = i32::from(d.tz_hour) * 60 + i32::from(d.tz_minute);
            if d.tz_before_gmt { -minutes } else { minutes }
        }),
        internal_offset_minutes: None,
    }
}

/// The description of a message mail-parser refused: one text part, no envelope
/// fields beyond NIL.
fn fallback_meta(raw: &[u8]) -> MessageMeta {
    let header_size = find_header_end(raw).unwrap_or(raw.len());
    let body = &raw[header_size..];
    let basic = format!(
        "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"us-ascii\") NIL NIL \"7BIT\" {} {}",
        body.len(),
        count_lines(body)
    );
    MessageMeta {
        size: raw.len() as u32,
        header_size: header_size as u32,
        envelope: "(NIL NIL NIL NIL NIL NIL NIL NIL NIL NIL)".into(),
        body: format!("{basic})"),
        body_structure: format!("{basic} NIL NIL NIL NIL)"),
        parts: vec![PartInfo {
            path: vec![1],
            header_start: 0,
            body_start: header_size as u32,
            body_end: raw.len() as u32,
            is_message: false,
        }],
        ..MessageMeta::default()
    }
}

/// Offset just past the blank line ending the header block (`\r\n\r\n` or bare `\n\n`).
pub fn find_header_end(raw: &[u8]) -> Option<usize> {
    if raw.starts_with(b"\r\n") {
        return Some(2);
    }
    if raw.starts_with(b"\n") {
        return Some(1);
    }
    let mut i = 0;
    while let Some(pos) = raw[i..].iter().position(|&b| b == b'\n') {
        let at = i + pos + 1;
        match raw.get(at) {
            Some(b'\n') => return Some(at + 1),
            Some(b'\r') if raw.get(at + 1) == Some(&b'\n') => return Some(at + 2),
            None => return None,
            _ => i = at,
        }
    }
    None
}

struct Walker<'a, 'x> {
    raw: &'a [u8],
    #[allow(dead_code)]
    message: &'a Message<'x>,
    parts: &'a mut Vec<PartInfo>,
}

impl Walker<'_, '_> {
    /// BODY and BODYSTRUCTURE of a (top-level or embedded) message whose parts use
    /// absolute offsets. `path` is the section of the message itself (empty at top).
    fn message_body(&mut self, message: &Message<'_>, path: &[u32], depth: usize) -> (String, String) {
        let root = &message.parts[0];
        if root.sub_parts().is_some() {
            self.part(message, 0, path, depth, None)
        } else {
            // A non-multipart message's only part is numbered 1 (RFC 3501 §6.4.5).
            let mut child = path.to_vec();
            child.push(1);
            self.part(message, 0, &child, depth, None)
        }
    }

    /// Renders part `id` of `message` at section `path`; records its offsets.
    fn part(
        &mut self,
        message: &Message<'_>,
        id: usize,
        path: &[u32],
        depth: usize,
        default_type: Option<(&str, &str)>,
    ) -> (String, String) {
        let Some(part) = message.parts.get(id) else {
            return ("NIL".into(), "NIL".into());
        };
        let ctype = content_type(part);
        let (ty, subty) = match (&ctype, default_type) {
            (Some(ct), _) => (
                ct.c_type.to_string(),
                ct.c_subtype.as_deref().map(str::to_string).unwrap_or_else(|| default_subtype(&ct.c_type)),
            ),
            (None, Some((t, s))) => (t.to_string(), s.to_string()),
            (None, None) => ("text".to_string(), "plain".to_string()),
        };

        if let (Some(children), true) = (part.sub_parts(), depth < MAX_DEPTH) {
            if !path.is_empty() {
                self.record(path, part, false);
            }
            // multipart/digest children default to message/rfc822 (RFC 2046 §5.1.5).
            let child_default =
                if subty.eq_ignore_ascii_case("digest") { Some(("message", "rfc822")) } else { None };
            let mut body = String::from("(");
            let mut structure = String::from("(");
            for (n, &child_id) in children.iter().enumerate() {
                let mut child_path = path.to_vec();
                child_path.push(n as u32 + 1);
                let (b, s) = self.part(message, child_id as usize, &child_path, depth + 1, child_default);
                body.push_str(&b);
                structure.push_str(&s);
            }
            if children.is_empty() {
                // RFC 3501 requires at least one body; an empty multipart is shown
                // as an empty text part so clients still parse the response.
                body.push_str("(\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 0 0)");
                structure.push_str("(\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 0 0 NIL NIL NIL NIL)");
            }
            let sub = quoted_upper(&subty);
            let _ = write!(body, " {sub})");
            let _ = write!(
                structure,
                " {sub} {} {} {} {})",
                params(ctype),
                disposition(part),
                language(part),
                location(part)
            );
            return (body, structure);
        }

        let body_len = part.offset_end.saturating_sub(part.offset_body);
        let body_bytes =
            self.raw.get(part.offset_body as usize..part.offset_end as usize).unwrap_or_default();
        let mut fields = format!(
            "{} {} {} {} {} {} {}",
            quoted_upper(&ty),
            quoted_upper(&subty),
            params(ctype),
            nstring(header_raw(self.raw, part, HeaderName::ContentId).as_deref()),
            nstring(header_raw(self.raw, part, HeaderName::ContentDescription).as_deref()),
            encoding(self.raw, part),
            body_len
        );

        let embedded = match &part.body {
            PartType::Message(inner)
                if matches!(inner.raw_message, Cow::Borrowed(_)) && !inner.parts.is_empty() =>
            {
                Some(inner)
            }
            _ => None,
        };
        let is_message = embedded.is_some();
        if !path.is_empty() {
            self.record(path, part, is_message);
        }
        if let (Some(inner), true) = (embedded, depth < MAX_DEPTH) {
            let env = envelope(self.raw, inner);
            let (b, s) = self.message_body(inner, path, depth + 1);
            let lines = count_lines(body_bytes);
            let body = format!("({fields} {env} {b} {lines})");
            let structure = format!(
                "({fields} {env} {s} {lines} {} {} {} {})",
                nstring(header_raw(self.raw, part, HeaderName::ContentMd5).as_deref()),
                disposition(part),
                language(part),
                location(part)
            );
            return (body, structure);
        }
        if ty.eq_ignore_ascii_case("text") {
            let _ = write!(fields, " {}", count_lines(body_bytes));
        }
        let body = format!("({fields})");
        let structure = format!(
            "({fields} {} {} {} {})",
            nstring(header_raw(self.raw, part, HeaderName::ContentMd5).as_deref()),
            disposition(part),
            language(part),
            location(part)
        );
        (body, structure)
    }

    fn record(&mut self, path: &[u32], part: &MessagePart<'_>, is_message: bool) {
        // The multipart root of an embedded message shares the section number of
        // the message/rfc822 part that holds it; the outer part (recorded first)
        // is the one `BODY[n]`/`BODY[n.MIME]` address.
        if self.parts.last().is_some_and(|p| p.path == path) {
            return;
        }
        self.parts.push(PartInfo {
            path: path.to_vec(),
            header_start: part.offset_header,
            body_start: part.offset_body,
            body_end: part.offset_end.max(part.offset_body),
            is_message,
        });
    }
}

fn default_subtype(ty: &str) -> String {
    match ty.to_ascii_lowercase().as_str() {
        "text" => "plain".into(),
        "message" => "rfc822".into(),
        "multipart" => "mixed".into(),
        _ => "octet-stream".into(),
    }
}

fn content_type<'p>(part: &'p MessagePart<'_>) -> Option<&'p mail_parser::ContentType<'p>> {
    header_value(part, HeaderName::ContentType).and_then(|v| v.as_content_type())
}

fn header_value<'p>(part: &'p MessagePart<'_>, name: HeaderName<'static>) -> Option<&'p HeaderValue<'p>> {
    part.headers.iter().find(|h| h.name == name).map(|h| &h.value)
}

/// The raw (undecoded, unfolded, trimmed) value of the first `name` header of a part.
fn header_raw<'r>(raw: &'r [u8], part: &MessagePart<'_>, name: HeaderName<'static>) -> Option<Cow<'r, [u8]>> {
    let h = part.headers.iter().find(|h| h.name == name)?;
    raw_value(raw, h.offset_start, h.offset_end)
}

fn raw_value(raw: &[u8], start: u32, end: u32) -> Option<Cow<'_, [u8]>> {
    let bytes = raw.get(start as usize..end as usize)?;
    let trimmed = trim(bytes);
    if trimmed.contains(&b'\n') || trimmed.contains(&b'\r') {
        // Unfold: a line break followed by white space is just the white space.
        Some(Cow::Owned(trimmed.iter().copied().filter(|&b| b != b'\r' && b != b'\n').collect()))
    } else {
        Some(Cow::Borrowed(trimmed))
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |p| p + 1);
    &bytes[start..end]
}

fn encoding(raw: &[u8], part: &MessagePart<'_>) -> String {
    match header_raw(raw, part, HeaderName::ContentTransferEncoding) {
        Some(v) if !v.is_empty() => quoted_upper(&String::from_utf8_lossy(&v)),
        _ => "\"7BIT\"".into(),
    }
}

/// `body-fld-param`: `("NAME" "value" ...)` or NIL. Names upper-cased as most
/// servers do; values verbatim (mail-parser has already joined RFC 2231 pieces).
fn params(ct: Option<&mail_parser::ContentType<'_>>) -> String {
    match ct.and_then(|c| c.attributes.as_deref()) {
        Some(attrs) if !attrs.is_empty() => {
            let mut out = String::from("(");
            for (i, a) in attrs.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(out, "{} {}", quoted_upper(&a.name), string(a.value.as_bytes()));
            }
            out.push(')');
            out
        }
        _ => "NIL".into(),
    }
}

fn disposition(part: &MessagePart<'_>) -> String {
    match header_value(part, HeaderName::ContentDisposition).and_then(|v| v.as_content_type()) {
        Some(d) => format!("({} {})", quoted_upper(&d.c_type), params(Some(d))),
        None => "NIL".into(),
    }
}

fn language(part: &MessagePart<'_>) -> String {
    match header_value(part, HeaderName::ContentLanguage) {
        Some(HeaderValue::Text(t)) => string(t.as_bytes()),
        Some(HeaderValue::TextList(list)) if !list.is_empty() => {
            let items: Vec<String> = list.iter().map(|t| string(t.as_bytes())).collect();
            format!("({})", items.join(" "))
        }
        _ => "NIL".into(),
    }
}

fn location(part: &MessagePart<'_>) -> String {
    match header_value(part, HeaderName::ContentLocation) {
        Some(HeaderValue::Text(t)) => string(t.as_bytes()),
        _ => "NIL".into(),
    }
}

/// Number of lines of a body as IMAP counts them (`body-fld-lines`).
fn count_lines(body: &[u8]) -> usize {
    let newlines = memchr_count(body, b'\n');
    if body.last().is_some_and(|&b| b != b'\n') { newlines + 1 } else { newlines }
}

fn memchr_count(hay: &[u8], needle: u8) -> usize {
    hay.iter().filter(|&&b| b == needle).count()
}

/// The ENVELOPE of a message (RFC 3501 §7.4.2): date, subject, from, sender,
/// reply-to, to, cc, bcc, in-reply-to, message-id. Date, subject and ids are the raw
/// header text (clients decode RFC 2047 themselves); addresses are structured.
fn envelope(raw: &[u8], message: &Message<'_>) -> String {
    let root = &message.parts[0];
    let text = |name: HeaderName<'static>| nstring(header_raw(raw, root, name).as_deref());
    // The raw display names are read only where one can differ from the
    // decoded one: a header holding an encoded word (rare; delivery is hot).
    let field = |name: HeaderName<'static>| {
        let phrases = header_raw(raw, root, name.clone())
            .filter(|v| memchr::memmem::find(v, b"=?").is_some())
            .map(|v| raw_phrases(&v))
            .unwrap_or_default();
        addresses(header_value(root, name), &phrases)
    };
    let from = field(HeaderName::From);
    let sender = match field(HeaderName::Sender) {
        s if s == "NIL" => from.clone(),
        s => s,
    };
    let reply_to = match field(HeaderName::ReplyTo) {
        s if s == "NIL" => from.clone(),
        s => s,
    };
    format!(
        "({} {} {} {} {} {} {} {} {} {})",
        text(HeaderName::Date),
        text(HeaderName::Subject),
        from,
        sender,
        reply_to,
        field(HeaderName::To),
        field(HeaderName::Cc),
        field(HeaderName::Bcc),
        text(HeaderName::InReplyTo),
        text(HeaderName::MessageId),
    )
}

/// The ENVELOPE address list of a header. `phrases`: the display names as the
/// header writes them (see [`raw_phrases`]); a name written as RFC 2047 encoded
/// words is sent in that form, as the header has it, rather than decoded and
/// encoded again (RFC 3501 §7.4.2: the envelope carries the header's text).
fn addresses(value: Option<&HeaderValue<'_>>, phrases: &[Option<String>]) -> String {
    let Some(HeaderValue::Address(addr)) = value else {
        return "NIL".into();
    };
    let mut out = String::from("(");
    match addr {
        Address::List(list) => {
            let raw_names = phrases.len() == list.len();
            for (i, a) in list.iter().enumerate() {
                let written =
                    phrases.get(i).and_then(Option::as_deref).filter(|p| raw_names && p.contains("=?"));
                match (written, a.name.as_deref()) {
                    (Some(phrase), Some(_)) => {
                        push_addr_as(&mut out, Some(string(phrase.as_bytes())), a.address.as_deref())
                    }
                    _ => push_addr(&mut out, a.name.as_deref(), a.address.as_deref()),
                }
            }
        }
        Address::Group(groups) => {
            for g in groups {
                match &g.name {
                    // RFC 3501: group start is (NIL NIL "name" NIL), end (NIL NIL NIL NIL).
                    Some(name) => {
                        let _ = write!(out, "(NIL NIL {} NIL)", string(name.as_bytes()));
                        for a in &g.addresses {
                            push_addr(&mut out, a.name.as_deref(), a.address.as_deref());
                        }
                        out.push_str("(NIL NIL NIL NIL)");
                    }
                    None => {
                        for a in &g.addresses {
                            push_addr(&mut out, a.name.as_deref(), a.address.as_deref());
                        }
                    }
                }
            }
        }
    }
    if out.len() == 1 {
        return "NIL".into();
    }
    out.push(')');
    out
}

/// The display name of each address of a raw (unfolded) address-list value, in
/// order: the phrase before its `<`, unquoted; None for an address without one.
/// Commas and angle brackets inside quoted strings and comments do not count.
fn raw_phrases(value: &[u8]) -> Vec<Option<String>> {
    let text = String::from_utf8_lossy(value);
    let mut out = Vec::new();
    let (mut quoted, mut escaped, mut comment, mut angle) = (false, false, 0u32, false);
    let mut segment_start = 0;
    let mut phrase: Option<String> = None;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted || comment > 0 => escaped = true,
            '"' if comment == 0 => quoted = !quoted,
            '(' if !quoted => comment += 1,
            ')' if !quoted && comment > 0 => comment -= 1,
            '<' if !quoted && comment == 0 => {
                angle = true;
                let p = text[segment_start..i].trim();
                let p = p.strip_prefix('"').and_then(|q| q.strip_suffix('"')).unwrap_or(p);
                phrase = (!p.is_empty()).then(|| p.to_string());
            }
            '>' if !quoted && comment == 0 => angle = false,
            ',' if !quoted && comment == 0 && !angle => {
                out.push(phrase.take());
                segment_start = i + 1;
            }
            _ => {}
        }
    }
    if !text[segment_start..].trim().is_empty() {
        out.push(phrase.take());
    }
    out
}

fn push_addr(out: &mut String, name: Option<&str>, address: Option<&str>) {
    let name = name.filter(|n| !n.is_empty()).map(|n| string(encode_word(n).as_bytes()));
    push_addr_as(out, name, address);
}

/// `(name adl mailbox host)`; `name` already in response syntax.
fn push_addr_as(out: &mut String, name: Option<String>, address: Option<&str>) {
    let (mailbox, host) = match address {
        Some(a) => match a.rsplit_once('@') {
            Some((m, h)) => (Some(m), Some(h)),
            None => (Some(a), None),
        },
        None => (None, None),
    };
    if mailbox.is_none() && name.is_none() {
        return;
    }
    // An obsolete source route (`<@relay:user@host>`, RFC 5322 §4.4) is the
    // address's at-domain-list, not part of its mailbox (RFC 3501 §7.4.2).
    let (route, mailbox) = match mailbox {
        Some(m) if m.starts_with('@') => match m.split_once(':') {
            Some((route, local)) => (Some(route), Some(local)),
            None => (None, Some(m)),
        },
        m => (None, m),
    };
    let _ = write!(
        out,
        "({} {} {} {})",
        name.as_deref().unwrap_or("NIL"),
        nstring(route.map(str::as_bytes)),
        nstring(mailbox.map(str::as_bytes)),
        nstring(host.map(str::as_bytes))
    );
}

/// Names were decoded by the parser; non-ASCII ones are re-encoded as an RFC 2047
/// word so the ENVELOPE stays 7-bit like the header it came from.
fn encode_word(name: &str) -> String {
    if name.is_ascii() {
        name.to_string()
    } else {
        format!("=?utf-8?b?{}?=", base64::engine::general_purpose::STANDARD.encode(name))
    }
}

/// The addresses of a header as SEARCH FROM/TO/CC/BCC match them: `Name <a@b>`
/// or `a@b`, comma-separated; a group as `name: <a@b>, …;`, so that its name
/// matches too (it is part of the ENVELOPE, RFC 3501 §7.4.2); its members are
/// bracketed so that SORT tells them from the next item (`sort::first_address`).
fn address_summary(addr: Option<&Address<'_>>) -> String {
    let Some(addr) = addr else { return String::new() };
    let one = |a: &mail_parser::Addr<'_>, bracket: bool| match (a.name.as_deref(), a.address.as_deref()) {
        (Some(n), Some(e)) => Some(format!("{n} <{e}>")),
        (None, Some(e)) if bracket => Some(format!("<{e}>")),
        (None, Some(e)) => Some(e.to_string()),
        (Some(n), None) => Some(n.to_string()),
        (None, None) => None,
    };
    let mut items: Vec<String> = Vec::new();
    match addr {
        Address::List(list) => items.extend(list.iter().filter_map(|a| one(a, false))),
        Address::Group(groups) => {
            for g in groups {
                match &g.name {
                    Some(name) => {
                        let members: Vec<String> = g.addresses.iter().filter_map(|a| one(a, true)).collect();
                        items.push(format!("{name}: {};", members.join(", ")));
                    }
                    None => items.extend(g.addresses.iter().filter_map(|a| one(a, false))),
                }
            }
        }
    }
    items.join(", ")
}

fn quoted_upper(s: &str) -> String {
    string(s.to_ascii_uppercase().as_bytes())
}

/// `nstring`: NIL, or [`string`].
pub fn nstring(v: Option<&[u8]>) -> String {
    match v {
        Some(v) => string(v),
        None => "NIL".into(),
    }
}

/// An IMAP `string`: quoted when every byte may appear in a quoted string, else a
/// literal (8-bit, CR/LF or NUL content).
pub fn string(v: &[u8]) -> String {
    if v.iter().all(|&b| (0x01..0x80).contains(&b) && b != b'\r' && b != b'\n') {
        // All ASCII, so UTF-8.
        quoted(std::str::from_utf8(v).unwrap_or_default())
    } else {
        // Literal bytes that are not UTF-8 cannot live in a Rust String; replace
        // them (and count the replaced length) rather than corrupt the framing.
        let text = String::from_utf8_lossy(v).replace('\0', " ");
        format!("{{{}}}\r\n{}", text.len(), text)
    }
}

/// `text` as a quoted string, `"` and `\\` escaped. The caller knows that it
/// holds no CR, LF or NUL.
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mail_builder::MessageBuilder;
    use mail_builder::headers::address::Address as BAddress;
    use mail_builder::mime::MimePart;

    fn slice<'a>(raw: &'a [u8], p: &PartInfo) -> (&'a [u8], &'a [u8]) {
        (
            &raw[p.header_start as usize..p.body_start as usize],
            &raw[p.body_start as usize..p.body_end as usize],
        )
    }

    /// Found by fuzzing: a message/rfc822 part whose header runs into a closing
    /// boundary of an outer multipart. mail-parser's consistency check on it is a
    /// `debug_assert!` (see the workspace profile); the description must still
    /// stay inside the message.
    #[test]
    fn broken_nested_boundaries_stay_in_bounds() {
        let raw: &[u8] = b"Content-Type: multipart/mixed; boundary=\"b1\"\r\n\r\npre\r\n--b1\r\n\
Content-Type: text/plain\r\n\r\none\r\n--b1\r\nContent-Type: multipart/alternative; boundary=b2\r\n\r\n\
--b2\r\n\r\ntwo\r\n--b2--\r\n--b1\r\nContent-Type: message/rfc822\r\n\r\nSubject:\ntwo\r\n--b2--\r\n\
--b1\r\nContent-Type: message/rfc822\r\n\r\nSubject: inner\r\n\r\nthree\r\n--b1--\r\nepilogue\r\n \
inner\r\n\r\nthree\r\n--b1--\r\nepilogue\r\n";
        let meta = parse_meta(raw);
        assert_eq!(meta.size as usize, raw.len());
        assert!(!meta.parts.is_empty());
        for p in &meta.parts {
            assert!(p.header_start <= p.body_start && p.body_start <= p.body_end);
            assert!(p.body_end as usize <= raw.len());
        }
    }

    #[test]
    fn simple_text_message() {
        let raw = b"From: Alice <alice@example.com>\r\nTo: bob@example.org, \"Carol C\" <carol@example.org>\r\nSubject: Hello\r\n there\r\nDate: Tue, 1 Jul 2003 10:52:37 +0200\r\nMessage-ID: <m1@example.com>\r\n\r\nline one\r\nline two\r\n";
        let meta = parse_meta(raw);
        assert_eq!(meta.size as usize, raw.len());
        assert_eq!(&raw[meta.header_size as usize..], b"line one\r\nline two\r\n");
        assert_eq!(
            meta.envelope,
            "(\"Tue, 1 Jul 2003 10:52:37 +0200\" \"Hello there\" ((\"Alice\" NIL \"alice\" \"example.com\")) ((\"Alice\" NIL \"alice\" \"example.com\")) ((\"Alice\" NIL \"alice\" \"example.com\")) ((NIL NIL \"bob\" \"example.org\")(\"Carol C\" NIL \"carol\" \"example.org\")) NIL NIL NIL \"<m1@example.com>\")"
        );
        assert_eq!(meta.body, "(\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 20 2)");
        assert_eq!(meta.body_structure, "(\"TEXT\" \"PLAIN\" NIL NIL NIL \"7BIT\" 20 2 NIL NIL NIL NIL)");
        assert_eq!(meta.subject, "Hello there");
        assert_eq!(meta.from, "Alice <alice@example.com>");
        assert_eq!(meta.message_id, "m1@example.com");
        assert_eq!(meta.sent_date.map(|d| d.timestamp()), Some(1057049557));
        assert_eq!(meta.parts.len(), 1);
        assert_eq!(meta.parts[0].path, vec![1]);
        assert_eq!(slice(raw, &meta.parts[0]).1, b"line one\r\nline two\r\n");
    }

    #[test]
    fn multipart_alternative_with_attachment() {
        let raw = MessageBuilder::new()
            .from(BAddress::new_address(Some("Zoë"), "zoe@example.com"))
            .to("bob@example.org")
            .subject("Outer")
            .body(MimePart::new(
                "multipart/mixed",
                vec![
                    MimePart::new(
                        "multipart/alternative",
                        vec![
                            MimePart::new("text/plain", "plain body\r\n"),
                            MimePart::new("text/html", "<p>html body</p>\r\n"),
                        ],
                    ),
                    MimePart::new("application/octet-stream", vec![0u8, 1, 2, 3, 255]).attachment("data.bin"),
                ],
            ))
            .write_to_vec()
            .expect("build outer");
        let meta = parse_meta(&raw);
        let paths: Vec<Vec<u32>> = meta.parts.iter().map(|p| p.path.clone()).collect();
        assert_eq!(paths, vec![vec![1], vec![1, 1], vec![1, 2], vec![2]]);

        let part = |path: &[u32]| meta.parts.iter().find(|p| p.path == path).expect("part");
        let (mime, body) = slice(&raw, part(&[1, 1]));
        assert!(String::from_utf8_lossy(mime).to_ascii_lowercase().contains("content-type: text/plain"));
        assert_eq!(body, b"plain body\r\n");
        assert_eq!(slice(&raw, part(&[1, 2])).1, b"<p>html body</p>\r\n");
        let attachment = String::from_utf8_lossy(slice(&raw, part(&[2])).1).to_string();
        assert!(attachment.trim_end().ends_with('='), "base64 body: {attachment}");

        assert!(
            // The name as the header writes it (mail-builder's encoded word).
            meta.envelope.contains("(\"=?utf-8?B?Wm/Dqw==?=\" NIL \"zoe\" \"example.com\")"),
            "{}",
            meta.envelope
        );
        assert!(
            meta.body_structure.starts_with("(((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"utf-8\") NIL NIL"),
            "{}",
            meta.body_structure
        );
        assert!(meta.body_structure.contains("\"ALTERNATIVE\" (\"BOUNDARY\""), "{}", meta.body_structure);
        assert!(
            meta.body_structure.contains("(\"ATTACHMENT\" (\"FILENAME\" \"data.bin\"))"),
            "{}",
            meta.body_structure
        );
        assert!(meta.body_structure.contains("\"MIXED\" (\"BOUNDARY\""));
        assert!(meta.body.ends_with(" \"MIXED\")"), "{}", meta.body);
        assert!(!meta.body.contains("BOUNDARY"));
        assert_eq!(meta.subject, "Outer");
        assert_eq!(meta.from, "Zoë <zoe@example.com>");
        assert_balanced(&meta.body_structure);
        assert_balanced(&meta.body);
        assert_balanced(&meta.envelope);
    }

    #[test]
    fn nested_message_rfc822_sections() {
        let inner = "From: Inner <inner@example.com>\r\nSubject: Inner subject\r\nContent-Type: multipart/mixed; boundary=in\r\n\r\n--in\r\nContent-Type: text/plain\r\n\r\nfirst\r\n--in\r\nContent-Type: text/plain\r\n\r\nsecond\r\n--in--\r\n";
        let raw = format!(
            "From: a@example.com\r\nSubject: fwd\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=out\r\n\r\npreamble\r\n--out\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\nsee attached\r\n--out\r\nContent-Type: message/rfc822\r\n\r\n{inner}\r\n--out--\r\nepilogue\r\n"
        );
        let raw = raw.as_bytes();
        let meta = parse_meta(raw);
        let paths: Vec<Vec<u32>> = meta.parts.iter().map(|p| p.path.clone()).collect();
        assert_eq!(paths, vec![vec![1], vec![2], vec![2, 1], vec![2, 2]]);
        let part = |path: &[u32]| meta.parts.iter().find(|p| p.path == path).expect("part");
        assert_eq!(slice(raw, part(&[1])).1, b"see attached");
        let msg = part(&[2]);
        assert!(msg.is_message);
        assert_eq!(slice(raw, msg).0, b"Content-Type: message/rfc822\r\n\r\n");
        assert_eq!(slice(raw, msg).1, inner.as_bytes());
        assert_eq!(slice(raw, part(&[2, 1])).1, b"first");
        assert_eq!(slice(raw, part(&[2, 2])).1, b"second");
        // The embedded header ends at the first blank line of the part body.
        let body = slice(raw, msg).1;
        let end = find_header_end(body).expect("embedded header");
        assert!(body[..end].ends_with(b"boundary=in\r\n\r\n"));
        assert!(
            meta.body_structure.contains("\"MESSAGE\" \"RFC822\" NIL NIL NIL \"7BIT\""),
            "{}",
            meta.body_structure
        );
        assert!(meta.body_structure.contains("\"Inner subject\""));
        assert!(meta.body_structure.contains("\"MIXED\" (\"BOUNDARY\" \"in\")"), "{}", meta.body_structure);
        assert!(
            meta.body_structure.starts_with(
                "((\"TEXT\" \"PLAIN\" (\"CHARSET\" \"us-ascii\") NIL NIL \"7BIT\" 12 1 NIL NIL NIL NIL)"
            ),
            "{}",
            meta.body_structure
        );
        assert_balanced(&meta.body_structure);
        assert_balanced(&meta.body);
    }

    /// Parentheses balance outside quoted strings: a cheap syntax check that every
    /// rendered structure is closed.
    fn assert_balanced(s: &str) {
        let mut depth = 0i32;
        let mut quoted = false;
        let mut escape = false;
        for c in s.chars() {
            match (quoted, escape, c) {
                (true, true, _) => escape = false,
                (true, false, '\\') => escape = true,
                (true, false, '"') => quoted = false,
                (false, _, '"') => quoted = true,
                (false, _, '(') => depth += 1,
                (false, _, ')') => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0, "{s}");
        }
        assert_eq!(depth, 0, "{s}");
    }

    #[test]
    fn group_addresses_and_non_ascii_subject() {
        let raw =
            "From: a@example.com\r\nTo: Team: x@example.com, y@example.com;\r\nSubject: Grüße\r\n\r\nbody"
                .as_bytes();
        let meta = parse_meta(raw);
        assert!(meta.envelope.contains("((NIL NIL \"Team\" NIL)(NIL NIL \"x\" \"example.com\")(NIL NIL \"y\" \"example.com\")(NIL NIL NIL NIL))"), "{}", meta.envelope);
        // SEARCH TO matches the group's name as well as its members.
        assert_eq!(meta.to, "Team: <x@example.com>, <y@example.com>;");
        // SORT TO: the group's start marker is its first address (its name).
        assert_eq!(crate::sort_keys::first_mailbox(&meta.to), "Team");
        let mixed = parse_meta(b"To: a@example.com, Team: Y <y@example.com>;, Empty:;\r\n\r\n");
        assert_eq!(mixed.to, "a@example.com, Team: Y <y@example.com>;, Empty: ;");
        // 8-bit header text goes out as a literal.
        assert!(meta.envelope.contains("{7}\r\nGrüße"), "{}", meta.envelope);
        assert_eq!(meta.subject, "Grüße");
        assert!(meta.body.ends_with(" 4 1)"), "{}", meta.body);
    }

    /// RFC 3501 §7.4.2: a group is its start marker `(NIL NIL "name" NIL)`,
    /// its members as any address (display names included), and the end marker
    /// `(NIL NIL NIL NIL)`.
    #[test]
    fn group_members_keep_their_display_names() {
        let meta = parse_meta(
            b"From: a@example.com\r\nTo: Friends: \"foo\" <foo@example.com>, Bar Baz <bar@example.com>,\r\n plain@example.com;, \"Doe, John\" <j@example.com>\r\nCc: Team: \"=?utf-8?q?J=C3=B6rg?=\" <jorg@example.com>;\r\nBcc: undisclosed-recipients:;\r\n\r\n",
        );
        let to = "((NIL NIL \"Friends\" NIL)(\"foo\" NIL \"foo\" \"example.com\")(\"Bar Baz\" NIL \"bar\" \"example.com\")(NIL NIL \"plain\" \"example.com\")(NIL NIL NIL NIL)(\"Doe, John\" NIL \"j\" \"example.com\"))";
        assert!(meta.envelope.contains(to), "{}", meta.envelope);
        assert!(
            // The member's name decoded, sent again as an encoded word.
            meta.envelope.contains("((NIL NIL \"Team\" NIL)(\"=?utf-8?b?SsO2cmc=?=\" NIL \"jorg\" \"example.com\")(NIL NIL NIL NIL))"),
            "{}",
            meta.envelope
        );
        assert!(
            meta.envelope.contains("((NIL NIL \"undisclosed-recipients\" NIL)(NIL NIL NIL NIL)) NIL"),
            "{}",
            meta.envelope
        );
    }

    #[test]
    fn encoded_display_names_go_out_as_the_header_writes_them() {
        let meta = parse_meta(
            b"From: =?UTF-8?Q?=C3=84lice?= <a@example.com>\r\nTo: \"Doe, John\" <j@example.com>, =?utf-8?b?w5Zsw6E=?=\r\n <o@example.com>, bare@example.com\r\n\r\n",
        );
        assert!(
            meta.envelope.contains("((\"=?UTF-8?Q?=C3=84lice?=\" NIL \"a\" \"example.com\"))"),
            "{}",
            meta.envelope
        );
        assert!(
            meta.envelope.contains(
                "((\"Doe, John\" NIL \"j\" \"example.com\")(\"=?utf-8?b?w5Zsw6E=?=\" NIL \"o\" \"example.com\")(NIL NIL \"bare\" \"example.com\"))"
            ),
            "{}",
            meta.envelope
        );
        assert_eq!(
            raw_phrases(b"\"a, <b>\" <x@y>, (c, d) e@f, G <g@h>"),
            [Some("a, <b>".to_string()), None, Some("G".to_string())]
        );
    }

    #[test]
    fn a_source_route_is_the_at_domain_list() {
        let meta =
            parse_meta(b"From: <@relay.example:user@example.com>\r\nTo: Bob <@a,@b:bob@example.org>\r\n\r\n");
        assert!(
            meta.envelope.contains("((NIL \"@relay.example\" \"user\" \"example.com\"))"),
            "{}",
            meta.envelope
        );
        assert!(meta.envelope.contains("((\"Bob\" \"@a,@b\" \"bob\" \"example.org\"))"), "{}", meta.envelope);
    }

    #[test]
    fn garbage_never_panics() {
        for raw in [
            &b""[..],
            b"\r\n",
            b"no header",
            b"Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\n",
            b"\xff\xfe\x00",
        ] {
            let meta = parse_meta(raw);
            assert_eq!(meta.size as usize, raw.len());
            assert!(meta.header_size as usize <= raw.len());
            for p in &meta.parts {
                assert!(p.header_start <= p.body_start && p.body_start <= p.body_end);
                assert!(p.body_end as usize <= raw.len());
            }
        }
    }
}
