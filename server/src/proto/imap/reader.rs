//! The command reader: a fragmentizer in the spirit of `imap-codec`'s (which its
//! 1.0 release does not ship). It splits the client's bytes into complete commands
//! — a line, and for every `{n}` / `{n+}` it ends with, the `n` literal bytes and the
//! line that follows — and enforces the limits *before* anything is parsed or
//! buffered beyond them:
//!
//! - a line longer than `max_line` is refused without reading the rest of it;
//! - a literal longer than `max_literal` is refused from its announcement alone.
//!   For a synchronising literal the client waits for our `+` before sending data,
//!   so we answer NO and the connection stays usable. A non-synchronising literal
//!   (LITERAL+) is already on its way: the session answers BAD and closes, because
//!   the only alternative is reading and discarding up to gigabytes.
//!
//! The reader also writes the `+` continuation for synchronising literals, which is
//! why it works on a stream that is both readable and writable.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest line (excluding literal data), CRLF included.
    pub max_line: usize,
    /// Largest single literal, and roughly the largest command.
    pub max_literal: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// One complete command, literals inlined, ending with CRLF.
    Command(Vec<u8>),
    /// A line exceeded `max_line`; the stream is no longer in sync.
    LineTooLong,
    /// A literal was announced above `max_literal`. `sync` says whether the client
    /// is waiting for a continuation (and so sent nothing more).
    LiteralTooLarge { tag: String, sync: bool, size: u64 },
    /// The client closed the connection.
    Eof,
}

pub enum LineOutcome {
    Line(Vec<u8>),
    TooLong,
    Eof,
}

pub struct CommandReader {
    buf: BytesMut,
    pub limits: Limits,
}

impl CommandReader {
    pub fn new(limits: Limits) -> Self {
        CommandReader { buf: BytesMut::with_capacity(8 * 1024), limits }
    }

    /// True when the client has sent bytes we have not consumed yet.
    pub fn has_buffered(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Drops buffered input: after STARTTLS, plaintext the client pipelined must not
    /// be interpreted as if it had arrived over TLS (RFC 3501 §6.2.1).
    pub fn discard_buffered(&mut self) {
        self.buf.clear();
    }

    /// One line (CRLF or LF terminated, terminator included), at most `max_line`.
    pub async fn read_line<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> std::io::Result<LineOutcome> {
        let mut scanned = 0;
        loop {
            if let Some(pos) = self.buf[scanned..].iter().position(|&b| b == b'\n') {
                // One read may bring in more than `max_line` at once (the buffer
                // grows for literals), so the bound is checked on the line found,
                // not only while waiting for more input.
                if scanned + pos + 1 > self.limits.max_line {
                    return Ok(LineOutcome::TooLong);
                }
                let line = self.buf.split_to(scanned + pos + 1).to_vec();
                return Ok(LineOutcome::Line(line));
            }
            scanned = self.buf.len();
            if scanned >= self.limits.max_line {
                return Ok(LineOutcome::TooLong);
            }
            self.buf.reserve(4096);
            if s.read_buf(&mut self.buf).await? == 0 {
                return Ok(LineOutcome::Eof);
            }
        }
    }

    /// The next complete command.
    pub async fn read_command<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        s: &mut S,
    ) -> std::io::Result<ReadOutcome> {
        let mut cmd: Vec<u8> = Vec::new();
        loop {
            let line = match self.read_line(s).await? {
                LineOutcome::Line(l) => l,
                LineOutcome::TooLong => return Ok(ReadOutcome::LineTooLong),
                LineOutcome::Eof => return Ok(ReadOutcome::Eof),
            };
            cmd.extend_from_slice(&line);
            let Some((size, sync)) = literal_announcement(&line) else {
                return Ok(ReadOutcome::Command(cmd));
            };
            // The whole command is bounded too: many small literals must not add up
            // to more than one large one.
            if size > self.limits.max_literal as u64
                || cmd.len() as u64 + size > (self.limits.max_literal + self.limits.max_line) as u64
            {
                return Ok(ReadOutcome::LiteralTooLarge { tag: tag_of(&cmd), sync, size });
            }
            let size = size as usize;
            if sync {
                s.write_all(b"+ Ready for literal data\r\n").await?;
                s.flush().await?;
            }
            cmd.reserve(size);
            let mut missing = size;
            loop {
                let take = missing.min(self.buf.len());
                cmd.extend_from_slice(&self.buf[..take]);
                self.buf.advance(take);
                missing -= take;
                if missing == 0 {
                    break;
                }
                self.buf.reserve(missing.min(64 * 1024));
                if s.read_buf(&mut self.buf).await? == 0 {
                    return Ok(ReadOutcome::Eof);
                }
            }
        }
    }
}

/// `{123}\r\n` → (123, true); `{123+}\r\n` → (123, false). Looks only at the end of
/// the line, where RFC 3501 puts a literal's announcement.
pub fn literal_announcement(line: &[u8]) -> Option<(u64, bool)> {
    let line = line.strip_suffix(b"\n")?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_suffix(b"}")?;
    let open = line.iter().rposition(|&b| b == b'{')?;
    let inner = &line[open + 1..];
    let (digits, sync) = match inner.strip_suffix(b"+") {
        Some(d) => (d, false),
        None => (inner, true),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok().map(|n| (n, sync))
}

/// The tag of a command (its first word), or `*` when there is none.
pub fn tag_of(cmd: &[u8]) -> String {
    let end = cmd.iter().position(|&b| b == b' ' || b == b'\r' || b == b'\n').unwrap_or(cmd.len());
    let tag = &cmd[..end.min(64)];
    if tag.is_empty() || !tag.iter().all(|b| b.is_ascii_graphic() && !b"(){%*\"\\+".contains(b)) {
        return "*".into();
    }
    String::from_utf8_lossy(tag).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { max_line: 64, max_literal: 100 }
    }

    #[test]
    fn announcements() {
        assert_eq!(literal_announcement(b"a LOGIN {5}\r\n"), Some((5, true)));
        assert_eq!(literal_announcement(b"a APPEND x {12+}\r\n"), Some((12, false)));
        assert_eq!(literal_announcement(b"a NOOP\r\n"), None);
        assert_eq!(literal_announcement(b"a X {}\r\n"), None);
        assert_eq!(literal_announcement(b"a X {1a}\r\n"), None);
        assert_eq!(literal_announcement(b"a X {99999999999999999999}\r\n"), None);
    }

    #[tokio::test]
    async fn literals_are_inlined_and_sync_ones_get_a_continuation() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let task = tokio::spawn(async move {
            let mut r = CommandReader::new(limits());
            let a = r.read_command(&mut server).await.expect("read");
            let b = r.read_command(&mut server).await.expect("read");
            (a, b)
        });
        client.write_all(b"a LOGIN {3}\r\n").await.expect("write");
        let mut plus = [0u8; 26];
        client.read_exact(&mut plus).await.expect("continuation");
        assert_eq!(&plus, b"+ Ready for literal data\r\n");
        client.write_all(b"bob {2+}\r\npw\r\nb NOOP\r\n").await.expect("write");
        let (a, b) = task.await.expect("join");
        assert_eq!(a, ReadOutcome::Command(b"a LOGIN {3}\r\nbob {2+}\r\npw\r\n".to_vec()));
        assert_eq!(b, ReadOutcome::Command(b"b NOOP\r\n".to_vec()));
    }

    #[tokio::test]
    async fn limits_are_enforced_before_reading() {
        let (mut client, mut server) = tokio::io::duplex(4096);
        client.write_all(b"t1 APPEND INBOX {101}\r\n").await.expect("write");
        client.write_all(b"t2 APPEND INBOX {5000+}\r\n").await.expect("write");
        client.write_all(&[b'x'; 200]).await.expect("write");
        let mut r = CommandReader::new(limits());
        assert_eq!(
            r.read_command(&mut server).await.expect("read"),
            ReadOutcome::LiteralTooLarge { tag: "t1".into(), sync: true, size: 101 }
        );
        assert_eq!(
            r.read_command(&mut server).await.expect("read"),
            ReadOutcome::LiteralTooLarge { tag: "t2".into(), sync: false, size: 5000 }
        );
        assert_eq!(r.read_command(&mut server).await.expect("read"), ReadOutcome::LineTooLong);
        drop(client);
    }

    /// Found by fuzzing: a line longer than `max_line` that arrived in the same
    /// read as a complete one (or after a literal grew the buffer) used to be
    /// accepted whole, so a command could exceed its bound by the buffer size.
    #[tokio::test]
    async fn a_long_line_already_buffered_is_refused() {
        let (mut client, mut server) = tokio::io::duplex(4096);
        let mut input = b"a NOOP\r\nb SEARCH TEXT ".to_vec();
        input.extend_from_slice(&[b'1'; 300]);
        input.extend_from_slice(b"\r\n");
        client.write_all(&input).await.expect("write");
        let mut r = CommandReader::new(limits());
        assert_eq!(
            r.read_command(&mut server).await.expect("read"),
            ReadOutcome::Command(b"a NOOP\r\n".to_vec())
        );
        assert_eq!(r.read_command(&mut server).await.expect("read"), ReadOutcome::LineTooLong);
        // Exactly `max_line` (CRLF included) is still a line.
        let (mut client, mut server) = tokio::io::duplex(4096);
        let mut line = b"c ".to_vec();
        line.extend_from_slice(&[b'x'; 60]);
        line.extend_from_slice(b"\r\n");
        assert_eq!(line.len(), limits().max_line);
        client.write_all(&line).await.expect("write");
        let mut r = CommandReader::new(limits());
        assert_eq!(r.read_command(&mut server).await.expect("read"), ReadOutcome::Command(line));
    }
}
