//! The message as tests see it: its header fields (which `editheader` may
//! change), values decoded per RFC 2047, addresses, dates and body text.

use mail_parser::parsers::MessageStream;
use mail_parser::{HeaderValue, MessageParser, MimeHeaders, PartType};

/// How much body text `body` tests look at.
pub(crate) const MAX_BODY_TEXT: usize = 1024 * 1024;

#[derive(Debug, Clone)]
pub(crate) struct Field {
    pub name: String,
    /// Everything after the colon, folding included, without the final line
    /// break.
    pub value: Vec<u8>,
    /// The whole field as it was in the message (`None` for added fields).
    pub original: Option<Vec<u8>>,
}

pub(crate) struct Message<'m> {
    pub raw: &'m [u8],
    pub fields: Vec<Field>,
    /// Where the body starts in `raw` (after the blank line).
    pub body_start: usize,
    /// Where the header ends in `raw` (before the blank line).
    header_end: usize,
    pub edited: bool,
}

impl<'m> Message<'m> {
    pub fn new(raw: &'m [u8]) -> Self {
        let mut fields: Vec<Field> = Vec::new();
        let mut at = 0;
        let (header_end, body_start) = loop {
            if at >= raw.len() {
                break (raw.len(), raw.len());
            }
            let line_end = memchr::memchr(b'\n', &raw[at..]).map_or(raw.len(), |i| at + i + 1);
            let line = &raw[at..line_end];
            let bare = trim_eol(line);
            if bare.is_empty() {
                break (at, line_end);
            }
            if matches!(line[0], b' ' | b'\t') {
                if let Some(f) = fields.last_mut() {
                    f.value.extend_from_slice(b"\r\n");
                    f.value.extend_from_slice(bare);
                    if let Some(o) = &mut f.original {
                        o.extend_from_slice(line);
                    }
                }
            } else if let Some(colon) = memchr::memchr(b':', bare) {
                let name = String::from_utf8_lossy(&bare[..colon]).trim_end().to_string();
                fields.push(Field { name, value: bare[colon + 1..].to_vec(), original: Some(line.to_vec()) });
            } else {
                // Not a field: kept in the output, never matched.
                fields.push(Field { name: String::new(), value: Vec::new(), original: Some(line.to_vec()) });
            }
            at = line_end;
        };
        Message { raw, fields, body_start, header_end, edited: false }
    }

    /// The fields named `name` (case-insensitively), top to bottom.
    pub fn named<'s>(&'s self, name: &'s str) -> impl DoubleEndedIterator<Item = &'s Field> + 's {
        self.fields.iter().filter(move |f| !f.name.is_empty() && f.name.eq_ignore_ascii_case(name))
    }

    /// The message with its edited header: the fields in their order, then the
    /// original blank line and body.
    pub fn rebuild(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.raw.len() + 256);
        for f in &self.fields {
            match &f.original {
                Some(o) => {
                    out.extend_from_slice(o);
                    if !o.ends_with(b"\n") {
                        out.extend_from_slice(b"\r\n");
                    }
                }
                None => {
                    out.extend_from_slice(f.name.as_bytes());
                    out.push(b':');
                    out.extend_from_slice(&f.value);
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
        if self.header_end < self.raw.len() {
            out.extend_from_slice(&self.raw[self.header_end..]);
        } else {
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// The undecoded body for `body :raw` (RFC 5173 §5.1), its first
    /// `MAX_BODY_TEXT` bytes.
    pub fn raw_body(&self) -> String {
        let body = &self.raw[self.body_start.min(self.raw.len())..];
        String::from_utf8_lossy(&body[..body.len().min(MAX_BODY_TEXT)]).into_owned()
    }

    /// The decoded text of each text part, in order, until `MAX_BODY_TEXT`
    /// bytes of text in all (`body :text` and `:content`).
    pub fn text_parts(&self) -> Vec<BodyPart> {
        let Some(parsed) = MessageParser::default().parse(self.raw) else { return Vec::new() };
        let mut out = Vec::new();
        let mut room = MAX_BODY_TEXT;
        for part in &parsed.parts {
            if room == 0 {
                break;
            }
            let (ctype, subtype) = match part.content_type() {
                Some(ct) => {
                    (ct.ctype().to_ascii_lowercase(), ct.subtype().unwrap_or("").to_ascii_lowercase())
                }
                None => ("text".to_string(), "plain".to_string()),
            };
            let text = match &part.body {
                PartType::Text(t) => prefix(t, room).to_string(),
                // Markup takes more bytes than the text it holds; what is
                // converted is still bounded.
                PartType::Html(h) => {
                    truncate(mail_parser::decoders::html::html_to_text(prefix(h, 4 * room)), room)
                }
                _ => continue,
            };
            room -= text.len();
            out.push(BodyPart { ctype, subtype, text });
        }
        out
    }
}

pub(crate) struct BodyPart {
    pub ctype: String,
    pub subtype: String,
    pub text: String,
}

/// The first `max` bytes of `s`, on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn trim_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn with_eol(value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(value.len() + 2);
    v.extend_from_slice(value);
    v.extend_from_slice(b"\r\n");
    v
}

/// The field's value unfolded, with RFC 2047 encoded words decoded.
pub(crate) fn decoded(value: &[u8]) -> String {
    let bytes = with_eol(value);
    match MessageStream::new(&bytes).parse_unstructured() {
        HeaderValue::Text(t) => t.into_owned(),
        HeaderValue::TextList(l) => l.join(" "),
        _ => String::new(),
    }
}

/// The addresses (addr-spec) in an address-list field; group names and
/// display names are not addresses.
pub(crate) fn addresses(value: &[u8]) -> Vec<String> {
    let bytes = with_eol(value);
    match MessageStream::new(&bytes).parse_address() {
        HeaderValue::Address(a) => {
            a.iter().filter_map(|a| a.address.as_ref().map(|s| s.to_string())).collect()
        }
        _ => Vec::new(),
    }
}

/// A Date-style field (RFC 5322 §3.3) as a time with its own zone.
pub(crate) fn date(value: &[u8]) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    let text = decoded(value);
    // A Received field carries its date after the last semicolon.
    let text = text.rsplit_once(';').map_or(text.as_str(), |(_, d)| d);
    let d = mail_parser::DateTime::parse_rfc822(text.trim())?;
    if !d.is_valid() {
        return None;
    }
    let secs =
        (i32::from(d.tz_hour) * 3600 + i32::from(d.tz_minute) * 60) * if d.tz_before_gmt { -1 } else { 1 };
    let zone = chrono::FixedOffset::east_opt(secs)?;
    let utc = chrono::DateTime::from_timestamp(d.to_timestamp(), 0)?;
    Some(utc.with_timezone(&zone))
}

/// Splits an address into local part and domain at the last `@`; angle
/// brackets (as an envelope may carry them) are dropped.
pub(crate) fn split_address(a: &str) -> (&str, Option<&str>) {
    let a = a.trim().trim_start_matches('<').trim_end_matches('>');
    match a.rsplit_once('@') {
        Some((l, d)) => (l, Some(d)),
        None => (a, None),
    }
}
