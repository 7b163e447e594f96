//! SMTP grammar and replies (RFC 5321, 3030, 4954, 6531, 2034): no sockets.
//!
//! Commands are parsed by the `smtp-proto` crate (a well-exercised parser from a
//! production server); this module adds what a session needs around it:
//! - [`Reply`]: a reply with its enhanced status code, written as one or more lines;
//! - [`DataDecoder`]: the DATA body state machine (dot-unstuffing, the only accepted
//!   terminator `CRLF . CRLF`, bare CR/LF detection, a hard size bound);
//! - small helpers for addresses and SASL PLAIN/LOGIN payloads.

use std::borrow::Cow;

use base64::Engine;
pub use smtp_proto::Request;

/// One SMTP reply. `esc` is the RFC 3463 enhanced status code ("2.0.0"); it is
/// empty only for the greeting and the EHLO/HELO answer, which RFC 2034 §3 exempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    pub esc: &'static str,
    pub text: Cow<'static, str>,
}

impl Reply {
    pub fn new(code: u16, esc: &'static str, text: impl Into<Cow<'static, str>>) -> Reply {
        Reply { code, esc, text: text.into() }
    }

    /// Reply class as used in the `result` metric label: "2xx", "3xx", "4xx", "5xx".
    pub fn class(&self) -> &'static str {
        match self.code / 100 {
            2 => "2xx",
            3 => "3xx",
            4 => "4xx",
            _ => "5xx",
        }
    }

    /// Appends the wire form. A text with several lines becomes a multi-line reply
    /// (`250-…` continuation lines, `250 …` last), each line carrying the status code.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let mut lines = self.text.split('\n').peekable();
        while let Some(line) = lines.next() {
            let sep = if lines.peek().is_some() { '-' } else { ' ' };
            out.extend_from_slice(itoa3(self.code).as_slice());
            out.push(sep as u8);
            if !self.esc.is_empty() {
                out.extend_from_slice(self.esc.as_bytes());
                out.push(b' ');
            }
            // A reply line must never carry a bare CR/LF (it would forge a reply).
            out.extend(line.bytes().filter(|b| *b != b'\r'));
            out.extend_from_slice(b"\r\n");
        }
    }
}

fn itoa3(code: u16) -> [u8; 3] {
    let c = code.min(999);
    [b'0' + (c / 100) as u8, b'0' + (c / 10 % 10) as u8, b'0' + (c % 10) as u8]
}

/// Replies every session uses, in one place so transcripts stay consistent.
pub mod replies {
    use super::Reply;

    pub fn ok() -> Reply {
        Reply::new(250, "2.0.0", "OK")
    }
    pub fn bad_sequence(text: &'static str) -> Reply {
        Reply::new(503, "5.5.1", text)
    }
    pub fn unrecognized() -> Reply {
        Reply::new(500, "5.5.2", "Command unrecognized")
    }
    pub fn not_implemented() -> Reply {
        Reply::new(502, "5.5.1", "Command not implemented")
    }
    pub fn line_too_long() -> Reply {
        Reply::new(500, "5.5.6", "Line too long")
    }
    pub fn temp_failure() -> Reply {
        Reply::new(451, "4.3.0", "Temporary failure, please try again later")
    }
    pub fn too_many_errors() -> Reply {
        Reply::new(421, "4.7.0", "Too many errors, closing connection")
    }
    pub fn message_too_big() -> Reply {
        Reply::new(552, "5.3.4", "Message size exceeds fixed maximum message size")
    }
    pub fn shutting_down(host: &str) -> Reply {
        Reply::new(421, "4.3.2", format!("{host} Service shutting down, closing connection"))
    }
    pub fn timeout(host: &str) -> Reply {
        Reply::new(421, "4.4.2", format!("{host} Timeout, closing connection"))
    }
}

/// Maps a `smtp-proto` parse error to the reply RFC 5321 §4.2 asks for.
pub fn parse_error_reply(err: &smtp_proto::Error) -> Reply {
    use smtp_proto::Error as E;
    match err {
        E::UnknownCommand => replies::unrecognized(),
        E::InvalidSenderAddress => Reply::new(501, "5.1.7", "Invalid sender address"),
        E::InvalidRecipientAddress => Reply::new(501, "5.1.3", "Invalid recipient address"),
        E::SyntaxError { syntax } => Reply::new(501, "5.5.4", format!("Syntax: {syntax}")),
        E::InvalidParameter { param } => Reply::new(501, "5.5.4", format!("Invalid parameter {param}")),
        E::UnsupportedParameter { param } => {
            Reply::new(555, "5.5.4", format!("Unsupported parameter {}", sanitize(param, 64)))
        }
        E::ResponseTooLong => replies::line_too_long(),
        E::NeedsMoreData { .. } | E::InvalidResponse { .. } => Reply::new(501, "5.5.2", "Syntax error"),
    }
}

/// Parses one complete command line (ending in LF).
pub fn parse_command(line: &[u8]) -> Result<Request<Cow<'_, str>>, smtp_proto::Error> {
    Request::parse(&mut line.iter())
}

/// smtp-proto reads both `RCPT TO:<>` (invalid) and `RCPT TO:<Postmaster>` (which
/// RFC 5321 §4.5.1 requires servers to accept) as an empty address; the raw line
/// tells them apart.
pub fn names_bare_postmaster(line: &[u8]) -> bool {
    line.windows(12).any(|w| w.eq_ignore_ascii_case(b"<postmaster>"))
}

/// A RCPT line whose ORCPT names an address type other than rfc822, which
/// smtp-proto refuses although RFC 3461 §4.2 allows any type (`utf-8`, RFC
/// 6533, is the one SMTPUTF8 senders use): the line without that parameter, the
/// type (lower case) and the address as sent. `None` for any other line, and
/// for a malformed parameter (smtp-proto then refuses the line).
pub fn foreign_orcpt(line: &[u8]) -> Option<(Vec<u8>, String, String)> {
    if !line.get(..4)?.eq_ignore_ascii_case(b"RCPT") {
        return None;
    }
    // Parameters follow the address.
    let close = line.iter().position(|&b| b == b'>')?;
    let at = close + line[close..].windows(7).position(|w| w.eq_ignore_ascii_case(b" ORCPT="))?;
    let start = at + 7;
    let end = line[start..]
        .iter()
        .position(|&b| matches!(b, b' ' | b'\r' | b'\n'))
        .map_or(line.len(), |p| start + p);
    let (kind, value) = std::str::from_utf8(&line[start..end]).ok()?.split_once(';')?;
    let kind_ok = !kind.is_empty() && kind.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !kind_ok
        || kind.eq_ignore_ascii_case("rfc822")
        || !(1..=500).contains(&value.len())
        || value.chars().any(char::is_control)
    {
        return None;
    }
    let mut patched = line[..at].to_vec();
    patched.extend_from_slice(&line[end..]);
    Some((patched, kind.to_ascii_lowercase(), value.to_string()))
}

/// What stands in for an address literal while smtp-proto parses the line.
pub const LITERAL_STAND_IN: &str = "address-literal.invalid";

/// A MAIL or RCPT line whose address ends in an address literal
/// (`user@[192.0.2.1]`, `user@[IPv6:2001:db8::1]`, RFC 5321 §4.1.3), which
/// smtp-proto does not read: the line with [`LITERAL_STAND_IN`] in its place,
/// and the literal, to put back into the parsed address.
pub fn address_literal(line: &[u8]) -> Option<(Vec<u8>, String)> {
    let verb = line.get(..4)?;
    if !verb.eq_ignore_ascii_case(b"MAIL") && !verb.eq_ignore_ascii_case(b"RCPT") {
        return None;
    }
    let open = line.iter().position(|&b| b == b'<')?;
    let close = open + line[open..].iter().position(|&b| b == b'>')?;
    let at = open + memchr::memmem::find(&line[open..close], b"@[")?;
    if line[close - 1] != b']' {
        return None;
    }
    let literal = std::str::from_utf8(&line[at + 1..close]).ok()?;
    let inner = &literal[1..literal.len() - 1];
    let valid = match inner.strip_prefix("IPv6:") {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => inner.parse::<std::net::Ipv4Addr>().is_ok(),
    };
    if !valid {
        return None;
    }
    let mut patched = line[..at + 1].to_vec();
    patched.extend_from_slice(LITERAL_STAND_IN.as_bytes());
    patched.extend_from_slice(&line[close..]);
    Some((patched, literal.to_string()))
}

/// The command name used in metric labels and logs: bounded to the names SMTP has,
/// never client-chosen text (label cardinality).
pub fn command_label(req: &Request<Cow<'_, str>>) -> &'static str {
    req.name()
}

/// Echoes client text in a reply safely: printable ASCII only, bounded.
pub fn sanitize(text: &str, max: usize) -> String {
    text.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').take(max).collect()
}

/// The HELO/EHLO name as a trace header's `from` names it: a domain or address
/// literal keeps its letters, digits, `.`, `-` and (in a literal) `:` and the
/// brackets; anything else a client sent becomes `_`, so that it can neither
/// end the clause (`;`), open or close a comment (`(`, `)`) nor quote
/// (`"`, `\`) in the header it is written into (RFC 5322 §3.6.7).
pub fn trace_name(helo: &str) -> String {
    let literal = helo.starts_with('[') && helo.ends_with(']');
    helo.chars()
        .take(255)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' => c,
            ':' | '[' | ']' if literal => c,
            _ => '_',
        })
        .collect()
}

/// Splits `local@domain`; the domain is lower-cased. `None` when there is no `@`, an
/// empty part, or a domain that is not a plausible host name or address literal.
pub fn split_address(address: &str) -> Option<(&str, String)> {
    let at = address.rfind('@')?;
    let (local, domain) = (&address[..at], &address[at + 1..]);
    if local.is_empty() || domain.is_empty() || domain.len() > 255 {
        return None;
    }
    Some((local, domain.to_lowercase()))
}

/// The SASL mechanisms this server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    Login,
}

impl SaslMechanism {
    pub fn from_smtp_proto(mechanism: u64) -> Option<Self> {
        match mechanism {
            smtp_proto::AUTH_PLAIN => Some(SaslMechanism::Plain),
            smtp_proto::AUTH_LOGIN => Some(SaslMechanism::Login),
            _ => None,
        }
    }
}

/// Decodes a base64 SASL line. `None` when it is not valid base64.
pub fn sasl_decode(line: &str) -> Option<Vec<u8>> {
    let line = line.trim();
    // RFC 4954 §4: "=" is an empty initial response.
    if line == "=" {
        return Some(Vec::new());
    }
    base64::engine::general_purpose::STANDARD.decode(line).ok()
}

pub fn sasl_encode(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// RFC 4616 PLAIN message `authzid NUL authcid NUL passwd` → (authcid, passwd).
/// An authorization identity different from the authentication identity is
/// refused: this server has no proxy-authorization.
pub fn sasl_plain(decoded: &[u8]) -> Option<SaslPlain> {
    let mut parts = decoded.split(|b| *b == 0);
    let authzid = parts.next()?;
    let authcid = parts.next()?;
    let passwd = parts.next()?;
    if parts.next().is_some() || authcid.is_empty() {
        return None;
    }
    let authcid = std::str::from_utf8(authcid).ok()?;
    if !authzid.is_empty() && std::str::from_utf8(authzid).ok()? != authcid {
        return Some(SaslPlain::OtherIdentity);
    }
    Some(SaslPlain::Credentials(authcid.to_string(), std::str::from_utf8(passwd).ok()?.to_string()))
}

/// A well-formed SASL PLAIN message (RFC 4616).
#[derive(Debug, PartialEq, Eq)]
pub enum SaslPlain {
    /// The user (authcid) and password, acting as themselves.
    Credentials(String, String),
    /// An authorization identity other than the user's: acting for someone
    /// else, which is not supported. Refused as an authorization failure, not as
    /// a malformed message.
    OtherIdentity,
}

/// What a DATA body contained that RFC 5321 forbids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataFlaws {
    /// A CR not followed by LF, or an LF not preceded by CR (§2.3.8). Such bytes
    /// are what SMTP smuggling relies on, so the message is refused as a whole.
    pub bare_line_ending: bool,
    /// More octets than the limit: the excess was discarded, not stored.
    pub too_big: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataState {
    /// At the start of a line (just after CRLF, or at the start of the body).
    LineStart,
    /// Saw "." at the start of a line.
    Dot,
    /// Saw "." CR at the start of a line.
    DotCr,
    /// Inside a line.
    InLine,
    /// Saw CR inside a line.
    Cr,
    Done,
}

/// Streams a DATA body: removes dot-stuffing, stops at exactly `CRLF . CRLF` (never
/// at `LF . LF`, `CR . CR` or mixtures), flags bare CR/LF and keeps at most `limit`
/// octets, however much the client sends. The terminating CRLF of the last line
/// belongs to the message; the final "." CRLF does not.
#[derive(Debug)]
pub struct DataDecoder {
    state: DataState,
    limit: usize,
    /// Octets of message content seen (kept or not), for the discard bound.
    seen: usize,
    flaws: DataFlaws,
}

impl DataDecoder {
    pub fn new(limit: usize) -> Self {
        DataDecoder { state: DataState::LineStart, limit, seen: 0, flaws: DataFlaws::default() }
    }

    pub fn flaws(&self) -> DataFlaws {
        self.flaws
    }

    /// Octets of content received so far, including any discarded ones.
    pub fn seen(&self) -> usize {
        self.seen
    }

    pub fn is_done(&self) -> bool {
        self.state == DataState::Done
    }

    /// Consumes bytes from `input` into `out` (which should start empty or hold
    /// only what this decoder produced beyond `base`): returns how many input bytes
    /// were consumed. Stops right after the terminator, leaving pipelined commands
    /// that follow it unconsumed. `base` is the length of `out` before the body
    /// (trace headers written by the session), excluded from the size limit.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>, base: usize) -> usize {
        let mut i = 0;
        while i < input.len() {
            match self.state {
                DataState::Done => return i,
                DataState::InLine => {
                    // Fast path: copy up to the next CR or LF in one go.
                    let rest = &input[i..];
                    let n = memchr::memchr2(b'\r', b'\n', rest).unwrap_or(rest.len());
                    self.emit(out, base, &rest[..n]);
                    i += n;
                    if let Some(&b) = input.get(i) {
                        i += 1;
                        if b == b'\r' {
                            self.state = DataState::Cr;
                        } else {
                            self.flaws.bare_line_ending = true;
                            self.emit(out, base, b"\n");
                        }
                    }
                }
                DataState::Cr => {
                    if input[i] == b'\n' {
                        i += 1;
                        self.emit(out, base, b"\r\n");
                        self.state = DataState::LineStart;
                    } else {
                        // Bare CR; the current byte is handled as ordinary line content.
                        self.flaws.bare_line_ending = true;
                        self.emit(out, base, b"\r");
                        self.state = DataState::InLine;
                    }
                }
                DataState::LineStart => {
                    if input[i] == b'.' {
                        i += 1;
                        self.state = DataState::Dot;
                    } else {
                        self.state = DataState::InLine;
                    }
                }
                DataState::Dot => {
                    if input[i] == b'\r' {
                        i += 1;
                        self.state = DataState::DotCr;
                    } else {
                        // A stuffed dot: drop it, the rest of the line is content.
                        self.state = DataState::InLine;
                    }
                }
                DataState::DotCr => {
                    if input[i] == b'\n' {
                        i += 1;
                        self.state = DataState::Done;
                        return i;
                    }
                    // ". CR x": the dot was stuffing and the CR is bare.
                    self.flaws.bare_line_ending = true;
                    self.emit(out, base, b"\r");
                    self.state = DataState::InLine;
                }
            }
        }
        i
    }

    fn emit(&mut self, out: &mut Vec<u8>, base: usize, bytes: &[u8]) {
        self.seen = self.seen.saturating_add(bytes.len());
        if self.flaws.too_big {
            return;
        }
        if out.len() - base + bytes.len() > self.limit {
            // Keep nothing more: the message will be refused, and memory stays
            // bounded by the limit whatever the client sends.
            self.flaws.too_big = true;
            return;
        }
        out.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orcpt_of_another_address_type() {
        let (line, kind, address) =
            foreign_orcpt(b"RCPT TO:<b@x.test> ORCPT=UTF-8;b\\x{F6}b@x.test NOTIFY=SUCCESS\r\n").unwrap();
        assert_eq!(line, b"RCPT TO:<b@x.test> NOTIFY=SUCCESS\r\n");
        assert_eq!((kind.as_str(), address.as_str()), ("utf-8", "b\\x{F6}b@x.test"));
        assert!(parse_command(&line).is_ok());
        // rfc822 is smtp-proto's; malformed ones are left to it to refuse.
        for keep in [
            &b"RCPT TO:<b@x.test> ORCPT=rfc822;b@x.test\r\n"[..],
            b"RCPT TO:<b@x.test> ORCPT=utf-8;\r\n",
            b"RCPT TO:<b@x.test> ORCPT=;b@x.test\r\n",
            b"RCPT TO:<b@x.test> ORCPT=ut f-8;b\r\n",
            b"RCPT TO:<b@x.test> ORCPT=x_y;b\r\n",
            b"MAIL FROM:<b@x.test> ORCPT=utf-8;b\r\n",
            b"RCPT TO:<b@x.test>\r\n",
        ] {
            assert!(foreign_orcpt(keep).is_none(), "{}", String::from_utf8_lossy(keep));
        }
    }

    fn decode_all(chunks: &[&[u8]], limit: usize) -> (Vec<u8>, DataFlaws, bool, Vec<u8>) {
        let mut d = DataDecoder::new(limit);
        let mut out = Vec::new();
        let mut rest = Vec::new();
        for c in chunks {
            if d.is_done() {
                rest.extend_from_slice(c);
                continue;
            }
            let n = d.decode(c, &mut out, 0);
            rest.extend_from_slice(&c[n..]);
        }
        (out, d.flaws(), d.is_done(), rest)
    }

    #[test]
    fn terminator_and_unstuffing() {
        let (out, flaws, done, rest) = decode_all(&[b"a\r\n..b\r\n.\r\nQUIT\r\n"], 100);
        assert_eq!(out, b"a\r\n.b\r\n");
        assert!(done);
        assert_eq!(rest, b"QUIT\r\n");
        assert_eq!(flaws, DataFlaws::default());
    }

    #[test]
    fn terminator_split_across_reads() {
        let input = b"Subject: x\r\n\r\nbody\r\n.\r\n";
        for split in 0..input.len() {
            let (out, flaws, done, rest) = decode_all(&[&input[..split], &input[split..]], 100);
            assert!(done, "split at {split}");
            assert_eq!(out, b"Subject: x\r\n\r\nbody\r\n");
            assert!(rest.is_empty());
            assert!(!flaws.bare_line_ending);
        }
    }

    #[test]
    fn empty_body() {
        let (out, _, done, _) = decode_all(&[b".\r\n"], 100);
        assert!(done);
        assert!(out.is_empty());
    }

    #[test]
    fn smuggling_sequences_do_not_terminate() {
        for bad in [&b"a\n.\nMAIL FROM:<x@y>\r\n"[..], b"a\r.\r\nX\r\n", b"a\r\n.\nX\r\n", b"a\n.\r\nX\r\n"] {
            let (_, flaws, done, _) = decode_all(&[bad], 1000);
            assert!(!done, "{bad:?} must not end the data");
            assert!(flaws.bare_line_ending, "{bad:?} has a bare line ending");
            let mut full = bad.to_vec();
            full.extend_from_slice(b"\r\n.\r\n");
            let (_, _, done, _) = decode_all(&[&full], 1000);
            assert!(done);
        }
    }

    #[test]
    fn size_limit_keeps_memory_bounded() {
        let big = vec![b'x'; 10_000];
        let mut d = DataDecoder::new(1000);
        let mut out = Vec::new();
        for _ in 0..10 {
            d.decode(&big, &mut out, 0);
        }
        d.decode(b"\r\n.\r\n", &mut out, 0);
        assert!(d.is_done());
        assert!(d.flaws().too_big);
        assert!(out.len() <= 1000);
        assert_eq!(d.seen(), 100_002);
    }

    #[test]
    fn reply_wire_form() {
        let mut out = Vec::new();
        Reply::new(250, "2.0.0", "one\ntwo").write_to(&mut out);
        Reply::new(220, "", "host ESMTP").write_to(&mut out);
        assert_eq!(out, b"250-2.0.0 one\r\n250 2.0.0 two\r\n220 host ESMTP\r\n");
    }

    #[test]
    fn address_literals_are_read_around() {
        let (line, literal) = address_literal(b"MAIL FROM:<a@[192.0.2.1]> SIZE=10\r\n").expect("v4");
        assert_eq!(line, b"MAIL FROM:<a@address-literal.invalid> SIZE=10\r\n");
        assert_eq!(literal, "[192.0.2.1]");
        let (_, literal) = address_literal(b"rcpt to:<b@[IPv6:2001:db8::1]>\r\n").expect("v6");
        assert_eq!(literal, "[IPv6:2001:db8::1]");
        assert!(address_literal(b"MAIL FROM:<a@[999.1.1.1]>\r\n").is_none());
        assert!(address_literal(b"MAIL FROM:<a@example.org>\r\n").is_none());
        assert!(address_literal(b"VRFY <a@[192.0.2.1]>\r\n").is_none());
    }

    #[test]
    fn trace_names_cannot_break_the_header() {
        assert_eq!(trace_name("mail.example.org"), "mail.example.org");
        assert_eq!(trace_name("[IPv6:2001:db8::1]"), "[IPv6:2001:db8::1]");
        assert_eq!(trace_name("a;b"), "a_b");
        assert_eq!(trace_name("evil) by fake.example (x"), "evil__by_fake.example__x");
        assert_eq!(trace_name("a\"b\\c:d"), "a_b_c_d");
        assert_eq!(trace_name(&"x".repeat(300)).len(), 255);
    }

    #[test]
    fn sasl_plain_forms() {
        assert_eq!(sasl_plain(b"\0u@x\0pw"), Some(SaslPlain::Credentials("u@x".into(), "pw".into())));
        assert_eq!(sasl_plain(b"u@x\0u@x\0pw"), Some(SaslPlain::Credentials("u@x".into(), "pw".into())));
        assert_eq!(sasl_plain(b"other\0u@x\0pw"), Some(SaslPlain::OtherIdentity));
        assert_eq!(sasl_plain(b"\0\0pw"), None);
        assert_eq!(sasl_plain(b"nonul"), None);
        assert_eq!(sasl_decode("="), Some(Vec::new()));
        assert_eq!(sasl_decode("!!"), None);
    }
}
