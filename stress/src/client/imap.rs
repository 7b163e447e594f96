//! IMAP4rev1 client: greeting, STARTTLS, LOGIN, AUTHENTICATE PLAIN (with SASL-IR when
//! announced), SELECT, UID SEARCH, UID FETCH, APPEND (with the UIDPLUS APPENDUID
//! when the server gives one), NOOP, LOGOUT and any other command as a line
//! (RFC 3501, 4315, 4959).
//!
//! Responses are read line by line; a line ending in `{n}` announces a literal of n
//! bytes which is skipped without buffering, so fetching a 10 MB message costs the
//! generator no memory.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use super::{ClientError, Conn, Endpoint, Result, TlsMode, text};

/// Literal sizes above this are treated as a protocol error (no real mailbox message
/// is that large and it bounds the time a broken server can keep us reading).
const MAX_LITERAL: u64 = 1 << 30;

pub struct ImapClient {
    conn: Conn,
    tag: u32,
    sasl_ir: bool,
    cmd: Vec<u8>,
}

/// What a tagged command returned besides OK.
#[derive(Debug, Default)]
pub struct Response {
    /// Untagged `* SEARCH` numbers.
    pub search: Vec<u32>,
    /// `* n EXISTS`.
    pub exists: Option<u32>,
    /// Bytes of literals received.
    pub literal_bytes: u64,
    /// Untagged FETCH responses seen.
    pub fetches: u32,
    /// `UID n` items of those FETCH responses (when on the response's first line).
    pub uids: Vec<u32>,
    /// Those of them whose first line shows the `\Deleted` flag.
    pub deleted: Vec<u32>,
    /// UID of an appended message from the tagged `OK [APPENDUID validity uid]`.
    pub append_uid: Option<u32>,
}

impl ImapClient {
    pub async fn connect(ep: &Endpoint) -> Result<ImapClient> {
        let conn = Conn::connect(ep).await?;
        let mut c = ImapClient { conn, tag: 0, sasl_ir: false, cmd: Vec::with_capacity(256) };
        let greeting = c.conn.read_line().await?;
        if !greeting.starts_with(b"* OK") && !greeting.starts_with(b"* PREAUTH") {
            return Err(ClientError::Imap("greeting".into(), text(greeting)));
        }
        c.sasl_ir = contains_ci(greeting, b"SASL-IR");
        if ep.tls_mode == TlsMode::Starttls {
            c.command("STARTTLS").await?;
            c.conn = c.conn.upgrade(&ep.tls).await?;
            // Capabilities may change after TLS (RFC 3501 §6.2.1); ask again.
            c.sasl_ir = false;
            let caps = c.command("CAPABILITY").await;
            caps?;
        }
        Ok(c)
    }

    pub async fn login(&mut self, user: &str, pass: &str) -> Result<()> {
        let cmd = format!("LOGIN {} {}", quote(user), quote(pass));
        self.command(&cmd).await.map(drop)
    }

    pub async fn authenticate_plain(&mut self, user: &str, pass: &str) -> Result<()> {
        let token = B64.encode(format!("\0{user}\0{pass}"));
        if self.sasl_ir {
            return self.command(&format!("AUTHENTICATE PLAIN {token}")).await.map(drop);
        }
        self.tag += 1;
        let tag = self.tag;
        self.conn.write_all(format!("a{tag} AUTHENTICATE PLAIN\r\n").as_bytes()).await?;
        let line = self.conn.read_line().await?;
        if !line.starts_with(b"+") {
            return Err(ClientError::Imap("BAD".into(), text(line)));
        }
        self.conn.write_all(format!("{token}\r\n").as_bytes()).await?;
        self.finish(tag).await.map(drop)
    }

    /// SELECT (or EXAMINE when `read_only`) and return the message count.
    pub async fn select(&mut self, mailbox: &str, read_only: bool) -> Result<u32> {
        let verb = if read_only { "EXAMINE" } else { "SELECT" };
        let r = self.command(&format!("{verb} {}", quote(mailbox))).await?;
        Ok(r.exists.unwrap_or(0))
    }

    pub async fn uid_search(&mut self, criteria: &str) -> Result<Vec<u32>> {
        Ok(self.command(&format!("UID SEARCH {criteria}")).await?.search)
    }

    /// `UID FETCH uid item`; returns the literal bytes received.
    pub async fn uid_fetch(&mut self, uid: u32, item: &str) -> Result<u64> {
        let r = self.command(&format!("UID FETCH {uid} {item}")).await?;
        if r.fetches == 0 {
            return Err(ClientError::Imap("NO".into(), format!("UID {uid} not returned")));
        }
        Ok(r.literal_bytes)
    }

    /// `APPEND mailbox (flags) {n}` with a synchronizing literal (every server
    /// speaks it; LITERAL+ is an extension), the message being `parts` in order.
    /// Returns the new message's UID when the server reports it (UIDPLUS).
    pub async fn append(&mut self, mailbox: &str, flags: &str, parts: &[&[u8]]) -> Result<Option<u32>> {
        let size: usize = parts.iter().map(|p| p.len()).sum();
        self.tag += 1;
        let tag = self.tag;
        self.cmd.clear();
        self.cmd.extend_from_slice(
            format!("a{tag} APPEND {} ({flags}) {{{size}}}\r\n", quote(mailbox)).as_bytes(),
        );
        self.conn.write_all(&self.cmd).await?;
        let line = self.conn.read_line().await?;
        if !line.starts_with(b"+") {
            // The server refused the literal (e.g. too large, over quota): that is
            // the tagged completion.
            let status = if contains_ci(line, b" NO ") { "NO" } else { "BAD" };
            return Err(ClientError::Imap(status.into(), text(line)));
        }
        let mut body: Vec<&[u8]> = parts.to_vec();
        body.push(b"\r\n");
        self.conn.write_all_parts(&body).await?;
        Ok(self.finish(tag).await?.append_uid)
    }

    pub async fn noop(&mut self) -> Result<()> {
        self.command("NOOP").await.map(drop)
    }

    pub async fn logout(mut self) -> Result<()> {
        let r = self.command("LOGOUT").await;
        self.conn.shutdown().await;
        r.map(drop)
    }

    /// Send `aN command` and read until its tagged completion.
    pub async fn command(&mut self, command: &str) -> Result<Response> {
        self.tag += 1;
        let tag = self.tag;
        self.cmd.clear();
        self.cmd.extend_from_slice(format!("a{tag} {command}\r\n").as_bytes());
        self.conn.write_all(&self.cmd).await?;
        self.finish(tag).await
    }

    async fn finish(&mut self, tag: u32) -> Result<Response> {
        let prefix = format!("a{tag} ");
        let mut resp = Response::default();
        loop {
            let line = self.conn.read_line().await?;
            if line.starts_with(prefix.as_bytes()) {
                let rest = &line[prefix.len()..];
                if rest.len() >= 2 && rest[..2].eq_ignore_ascii_case(b"OK") {
                    resp.append_uid = appenduid(rest);
                    return Ok(resp);
                }
                let status =
                    if rest.len() >= 2 && rest[..2].eq_ignore_ascii_case(b"NO") { "NO" } else { "BAD" };
                return Err(ClientError::Imap(status.into(), text(line)));
            }
            if line.starts_with(b"* ") {
                let bye = line.len() >= 5 && line[2..5].eq_ignore_ascii_case(b"BYE");
                if bye && !self.cmd.windows(6).any(|w| w.eq_ignore_ascii_case(b"LOGOUT")) {
                    return Err(ClientError::Imap("BYE".into(), text(line)));
                }
                parse_untagged(&line[2..], &mut resp);
            }
            // A literal may follow on this line; after it the response continues on
            // the next line, which the loop reads as usual.
            let mut literal = literal_len(line);
            while let Some(n) = literal {
                if n > MAX_LITERAL {
                    return Err(ClientError::Protocol(format!("literal of {n} bytes")));
                }
                self.conn.skip_exact(n).await?;
                resp.literal_bytes += n;
                let rest = self.conn.read_line().await?;
                literal = literal_len(rest);
            }
        }
    }
}

fn parse_untagged(rest: &[u8], resp: &mut Response) {
    let t = String::from_utf8_lossy(rest);
    let mut words = t.split_ascii_whitespace();
    match words.next() {
        Some(w) if w.eq_ignore_ascii_case("SEARCH") => {
            resp.search.extend(words.filter_map(|n| n.parse::<u32>().ok()));
        }
        Some(n) => {
            if let Some(kind) = words.next() {
                if kind.eq_ignore_ascii_case("EXISTS") {
                    resp.exists = n.parse().ok();
                } else if kind.eq_ignore_ascii_case("FETCH") {
                    resp.fetches += 1;
                    // The items are `(NAME value NAME value …`; a UID value is a number.
                    let mut items = words.map(|w| w.trim_start_matches('('));
                    while let Some(item) = items.next() {
                        if item.eq_ignore_ascii_case("UID") {
                            let uid = items.next().map(|v| v.trim_end_matches(')'));
                            if let Some(uid) = uid.and_then(|v| v.parse().ok()) {
                                resp.uids.push(uid);
                                if contains_ci(rest, b"\\Deleted") {
                                    resp.deleted.push(uid);
                                }
                            }
                            break;
                        }
                    }
                }
            }
        }
        None => {}
    }
}

/// `OK [APPENDUID 38505 3955] …` → Some(3955).
fn appenduid(tagged_rest: &[u8]) -> Option<u32> {
    let t = std::str::from_utf8(tagged_rest).ok()?;
    let start = t.find('[')? + 1;
    let code = &t[start..start + t[start..].find(']')?];
    let mut words = code.split_ascii_whitespace();
    if !words.next()?.eq_ignore_ascii_case("APPENDUID") {
        return None;
    }
    words.nth(1)?.parse().ok()
}

/// `... {123}\r\n` or `{123+}` → Some(123).
fn literal_len(line: &[u8]) -> Option<u64> {
    let end = line.strip_suffix(b"\r\n").or_else(|| line.strip_suffix(b"\n"))?;
    let end = end.strip_suffix(b"}")?;
    let open = end.iter().rposition(|&b| b == b'{')?;
    let digits = &end[open + 1..];
    let digits = digits.strip_suffix(b"+").unwrap_or(digits);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// IMAP quoted string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals() {
        assert_eq!(literal_len(b"* 1 FETCH (UID 3 BODY[] {42}\r\n"), Some(42));
        assert_eq!(literal_len(b"* 1 FETCH (BODY[] {7+}\r\n"), Some(7));
        assert_eq!(literal_len(b"* 1 FETCH (FLAGS ())\r\n"), None);
        assert_eq!(literal_len(b"{}\r\n"), None);
    }

    #[test]
    fn untagged() {
        let mut r = Response::default();
        parse_untagged(b"SEARCH 1 5 9\r\n", &mut r);
        parse_untagged(b"12 EXISTS\r\n", &mut r);
        parse_untagged(b"3 FETCH (UID 9)\r\n", &mut r);
        assert_eq!(r.search, vec![1, 5, 9]);
        assert_eq!(r.exists, Some(12));
        assert_eq!(r.fetches, 1);
        assert_eq!(r.uids, vec![9]);
        // UID anywhere in the item list, FLAGS with parentheses before it.
        parse_untagged(b"4 FETCH (FLAGS (\\Seen \\Flagged) UID 12)\r\n", &mut r);
        parse_untagged(b"5 FETCH (FLAGS ())\r\n", &mut r);
        assert_eq!(r.uids, vec![9, 12]);
        parse_untagged(b"6 FETCH (UID 14 FLAGS (\\Seen \\Deleted))\r\n", &mut r);
        assert_eq!((r.uids.len(), &r.deleted[..]), (3, &[14][..]));
        assert_eq!(r.fetches, 4);
    }

    #[test]
    fn append_uid() {
        assert_eq!(appenduid(b"OK [APPENDUID 38505 3955] APPEND completed\r\n"), Some(3955));
        assert_eq!(appenduid(b"OK [appenduid 1 7] done\r\n"), Some(7));
        assert_eq!(appenduid(b"OK APPEND completed\r\n"), None);
        assert_eq!(appenduid(b"OK [READ-WRITE] x\r\n"), None);
    }

    #[test]
    fn quoting() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
