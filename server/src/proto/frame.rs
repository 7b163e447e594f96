//! Framing of client input, shared by the SMTP, IMAP and POP3 sessions and free of
//! I/O: a session reads bytes into a [`BytesMut`] and asks a framer for the next
//! line (or, for IMAP, the next command with the literals it announces). The
//! framer answers with what it found, that it needs more input, or that a limit
//! was crossed — and then the session decides how to answer and whether to go on.
//!
//! Limits are enforced before anything beyond them is kept:
//!
//! - a line longer than its limit is reported as soon as the buffer shows it (the
//!   client may still be sending it); the framer then drops input up to the next
//!   LF without holding it, so memory stays bounded by the limit plus one read,
//!   and a session that carries on is back in step with the client;
//! - an IMAP literal above its limit is refused from its announcement alone. For a
//!   synchronising literal the client waits for our `+` before sending the data,
//!   so the command can be refused and the connection kept; a non-synchronising
//!   one (LITERAL+, RFC 7888) is already on its way, and the session closes.
//!
//! Keeping this apart from the sockets is what lets one fuzz target drive every
//! byte boundary (`fuzz/checks.rs`, `framing`), and the sessions share one rule
//! for what a line is: bytes up to and including LF, CRLF or bare LF alike (each
//! protocol decides what a bare LF means to it).

use bytes::{Buf, BytesMut};

/// What [`LineFramer::next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// One complete line, its line ending included.
    Complete(BytesMut),
    /// A line exceeded the limit. What the buffer held of it is gone, and the rest,
    /// up to the next LF, will be dropped as it arrives.
    TooLong,
    /// No complete line yet: read more into the buffer and ask again.
    NeedMore,
}

/// Splits input into lines of at most `max_line` octets, line ending included.
#[derive(Debug)]
pub struct LineFramer {
    max_line: usize,
    /// How much of the buffer is known to hold no LF, so that a line arriving in
    /// many small reads is scanned once, not once per read.
    scanned: usize,
    /// The rest of an over-long line is being dropped.
    discarding: bool,
}

impl LineFramer {
    pub fn new(max_line: usize) -> Self {
        LineFramer { max_line, scanned: 0, discarding: false }
    }

    pub fn max_line(&self) -> usize {
        self.max_line
    }

    /// Forgets what it knew of the buffer: for when the session drops buffered
    /// input itself (after STARTTLS, plaintext the client pipelined must not be
    /// read as if it had come over TLS).
    pub fn reset(&mut self) {
        self.scanned = 0;
        self.discarding = false;
    }

    /// The next line of `buf`, which it removes from the buffer.
    pub fn next_line(&mut self, buf: &mut BytesMut) -> Line {
        // The buffer may have been consumed by someone else since the last call
        // (a BDAT chunk, a literal): what was scanned then is no longer known.
        if self.scanned > buf.len() {
            self.scanned = 0;
        }
        if self.discarding {
            match memchr::memchr(b'\n', buf) {
                Some(lf) => {
                    buf.advance(lf + 1);
                    self.discarding = false;
                    self.scanned = 0;
                }
                None => {
                    buf.clear();
                    return Line::NeedMore;
                }
            }
        }
        if let Some(lf) = memchr::memchr(b'\n', &buf[self.scanned..]) {
            let end = self.scanned + lf + 1;
            self.scanned = 0;
            // One read may bring in more than `max_line` at once, so the bound is
            // checked on the line found, not only while waiting for its end.
            if end > self.max_line {
                buf.advance(end);
                return Line::TooLong;
            }
            return Line::Complete(buf.split_to(end));
        }
        if buf.len() >= self.max_line {
            buf.clear();
            self.scanned = 0;
            self.discarding = true;
            return Line::TooLong;
        }
        self.scanned = buf.len();
        Line::NeedMore
    }

    /// True when `buf` holds a complete line (the client pipelined it), so that a
    /// session can answer a batch of commands with one write.
    pub fn has_line(&self, buf: &[u8]) -> bool {
        memchr::memchr(b'\n', buf).is_some()
    }
}

/// Limits of an IMAP command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest line (excluding literal data), CRLF included.
    pub max_line: usize,
    /// Largest single literal, and roughly the largest command.
    pub max_literal: usize,
}

/// What [`CommandFramer::next_command`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// One complete command, literals inlined, ending with LF.
    Complete(Vec<u8>),
    /// A synchronising literal was announced and admitted: the client waits for a
    /// continuation request (`+ …`) before it sends the data. Send one, then ask
    /// again.
    SendContinuation,
    /// No complete command yet: read more into the buffer and ask again.
    NeedMore,
    /// A line exceeded `max_line`.
    LineTooLong,
    /// A literal was announced above `max_literal` (or would take the command
    /// above `max_literal + max_line`). `sync` says whether the client waits for a
    /// continuation (and so sent nothing more); the command is dropped either way.
    LiteralTooLarge { sync: bool, size: u64, tag: String },
    /// A literal within the limits was announced, but the caller's admission
    /// check (the pod's transfer budget) refused it; the command is dropped, and
    /// `sync` says, as above, whether the client waits for a continuation.
    LiteralRefused { sync: bool, size: u64, tag: String },
}

/// Splits IMAP input into commands: a line, and for every `{n}` / `{n+}` it ends
/// with, the `n` literal octets and the line that follows (RFC 3501 §4.3,
/// RFC 7888).
#[derive(Debug)]
pub struct CommandFramer {
    pub lines: LineFramer,
    max_literal: usize,
    /// The command assembled so far.
    command: Vec<u8>,
    /// Literal octets still to come.
    literal_left: usize,
}

impl CommandFramer {
    pub fn new(limits: Limits) -> Self {
        CommandFramer {
            lines: LineFramer::new(limits.max_line),
            max_literal: limits.max_literal,
            command: Vec::new(),
            literal_left: 0,
        }
    }

    /// Literal octets the command still waits for.
    pub fn literal_left(&self) -> usize {
        self.literal_left
    }

    /// New limits, for the next command (IMAP's are tighter before login).
    pub fn set_limits(&mut self, limits: Limits) {
        self.lines.max_line = limits.max_line;
        self.max_literal = limits.max_literal;
    }

    /// Drops the command being assembled and what is known of the buffer.
    pub fn reset(&mut self) {
        self.lines.reset();
        self.command = Vec::new();
        self.literal_left = 0;
    }

    /// The next command of `buf`, which it removes from the buffer.
    pub fn next_command(&mut self, buf: &mut BytesMut) -> Command {
        self.next_command_with(buf, |_| true)
    }

    /// As [`CommandFramer::next_command`], asking `admit` about every literal
    /// within the limits, with the size the command takes once it is read,
    /// before anything of it is kept or a continuation requested.
    pub fn next_command_with(&mut self, buf: &mut BytesMut, mut admit: impl FnMut(usize) -> bool) -> Command {
        loop {
            if self.literal_left > 0 {
                let take = self.literal_left.min(buf.len());
                // Room was made for the whole literal when it was admitted.
                self.command.extend_from_slice(&buf[..take]);
                buf.advance(take);
                self.literal_left -= take;
                if self.literal_left > 0 {
                    return Command::NeedMore;
                }
            }
            let line = match self.lines.next_line(buf) {
                Line::Complete(line) => line,
                Line::NeedMore => return Command::NeedMore,
                Line::TooLong => {
                    self.command = Vec::new();
                    return Command::LineTooLong;
                }
            };
            extend_by_eighths(&mut self.command, &line);
            let Some((size, sync)) = literal_announcement(&line) else {
                return Command::Complete(std::mem::take(&mut self.command));
            };
            // The whole command is bounded too: many small literals must not add up
            // to more than one large one.
            let max_line = self.lines.max_line();
            if size > self.max_literal as u64
                || self.command.len() as u64 + size > (self.max_literal + max_line) as u64
            {
                let tag = super::imap::tag_of(&self.command);
                self.command = Vec::new();
                return Command::LiteralTooLarge { sync, size, tag };
            }
            if !admit(self.command.len() + size as usize) {
                let tag = super::imap::tag_of(&self.command);
                self.command = Vec::new();
                return Command::LiteralRefused { sync, size, tag };
            }
            self.literal_left = size as usize;
            // Exactly: the admission counted these octets, not a doubled capacity.
            self.command.reserve_exact(self.literal_left);
            if sync {
                return Command::SendContinuation;
            }
        }
    }
}

/// Appends `bytes`, growing `v` by an eighth when it is full rather than
/// doubling it: a command holding a large literal must not end up with twice its
/// size in capacity because a short line followed the literal.
fn extend_by_eighths(v: &mut Vec<u8>, bytes: &[u8]) {
    if v.capacity() - v.len() < bytes.len() {
        v.reserve_exact(bytes.len().max(v.len() / 8));
    }
    v.extend_from_slice(bytes);
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

/// Removes up to `*left` octets from the front of `buf` (a BDAT chunk, a literal
/// being skipped), counting them off `left`.
pub fn take_octets(buf: &mut BytesMut, left: &mut usize) -> BytesMut {
    let n = (*left).min(buf.len());
    *left -= n;
    buf.split_to(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { max_line: 64, max_literal: 100 }
    }

    #[test]
    fn a_literal_the_caller_refuses_is_dropped_before_its_continuation() {
        let mut framer = CommandFramer::new(limits());
        let mut buf = BytesMut::from(&b"a LOGIN {50}\r\n"[..]);
        let mut asked = Vec::new();
        let out = framer.next_command_with(&mut buf, |n| {
            asked.push(n);
            false
        });
        assert_eq!(out, Command::LiteralRefused { sync: true, size: 50, tag: "a".into() });
        assert_eq!(asked, [b"a LOGIN {50}\r\n".len() + 50]);
        // The framer is back in step: the next command is read as usual.
        buf.extend_from_slice(b"b NOOP\r\n");
        assert_eq!(framer.next_command(&mut buf), Command::Complete(b"b NOOP\r\n".to_vec()));
        // Tighter limits apply from the next command on.
        framer.set_limits(Limits { max_line: 64, max_literal: 10 });
        buf.extend_from_slice(b"c LOGIN {11}\r\n");
        assert_eq!(
            framer.next_command(&mut buf),
            Command::LiteralTooLarge { sync: true, size: 11, tag: "c".into() }
        );
    }

    /// Feeds `input` in pieces of `step` octets, collecting what the framer says;
    /// continuation requests are answered at once, as the sessions do.
    fn commands(input: &[u8], step: usize) -> Vec<Command> {
        let mut framer = CommandFramer::new(limits());
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                match framer.next_command(&mut buf) {
                    Command::NeedMore => break,
                    other => out.push(other),
                }
            }
        }
        out
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

    #[test]
    fn literals_are_inlined_and_sync_ones_ask_for_a_continuation() {
        let input = b"a LOGIN {3}\r\nbob {2+}\r\npw\r\nb NOOP\r\n";
        for step in [1, 2, 5, input.len()] {
            assert_eq!(
                commands(input, step),
                vec![
                    Command::SendContinuation,
                    Command::Complete(b"a LOGIN {3}\r\nbob {2+}\r\npw\r\n".to_vec()),
                    Command::Complete(b"b NOOP\r\n".to_vec()),
                ],
                "in pieces of {step}"
            );
        }
    }

    #[test]
    fn a_literal_may_hold_line_endings_and_announcements() {
        let input = b"a APPEND INBOX {9+}\r\nx\r\n{99}\r\n\r\nb NOOP\r\n";
        assert_eq!(
            commands(input, 3),
            vec![
                Command::Complete(b"a APPEND INBOX {9+}\r\nx\r\n{99}\r\n\r\n".to_vec()),
                Command::Complete(b"b NOOP\r\n".to_vec()),
            ]
        );
    }

    #[test]
    fn literal_limits_are_enforced_from_the_announcement() {
        let mut input = b"t1 APPEND INBOX {101}\r\nt2 APPEND INBOX {5000+}\r\n".to_vec();
        input.extend_from_slice(&[b'x'; 200]);
        let out = commands(&input, 7);
        assert_eq!(out[0], Command::LiteralTooLarge { sync: true, size: 101, tag: "t1".into() });
        assert_eq!(out[1], Command::LiteralTooLarge { sync: false, size: 5000, tag: "t2".into() });
        // Several small literals may not add up past one large one.
        let mut input = Vec::new();
        for _ in 0..4 {
            input.extend_from_slice(b"{40+}\r\n");
            input.extend_from_slice(&[b'y'; 40]);
        }
        input.splice(0..0, b"t3 X ".iter().copied());
        assert_eq!(
            commands(&input, 64),
            vec![Command::LiteralTooLarge { sync: false, size: 40, tag: "t3".into() }]
        );
    }

    /// Found by fuzzing the former reader: a line longer than `max_line` that
    /// arrived in the same read as a complete one used to be accepted whole.
    #[test]
    fn a_long_line_already_buffered_is_refused() {
        let mut input = b"a NOOP\r\nb SEARCH TEXT ".to_vec();
        input.extend_from_slice(&[b'1'; 300]);
        input.extend_from_slice(b"\r\nc NOOP\r\n");
        for step in [1, 13, input.len()] {
            assert_eq!(
                commands(&input, step),
                vec![
                    Command::Complete(b"a NOOP\r\n".to_vec()),
                    Command::LineTooLong,
                    Command::Complete(b"c NOOP\r\n".to_vec()),
                ],
                "in pieces of {step}"
            );
        }
        // Exactly `max_line` (CRLF included) is still a line.
        let mut line = b"c ".to_vec();
        line.extend_from_slice(&[b'x'; 60]);
        line.extend_from_slice(b"\r\n");
        assert_eq!(line.len(), limits().max_line);
        assert_eq!(commands(&line, 10), vec![Command::Complete(line.clone())]);
    }

    #[test]
    fn an_endless_line_is_never_held_whole() {
        let mut framer = LineFramer::new(16);
        let mut buf = BytesMut::new();
        let mut told = 0;
        for _ in 0..10_000 {
            buf.extend_from_slice(&[b'A'; 100]);
            match framer.next_line(&mut buf) {
                Line::TooLong => told += 1,
                Line::NeedMore => {}
                Line::Complete(l) => panic!("a line of {} octets", l.len()),
            }
            assert!(buf.len() <= 16 + 100);
        }
        assert_eq!(told, 1, "the over-long line is reported once");
        buf.extend_from_slice(b"tail\r\nQUIT\r\n");
        assert_eq!(framer.next_line(&mut buf), Line::Complete(BytesMut::from(&b"QUIT\r\n"[..])));
        assert_eq!(framer.next_line(&mut buf), Line::NeedMore);
    }

    #[test]
    fn bare_lf_ends_a_line_and_octets_are_counted_off() {
        let mut framer = LineFramer::new(16);
        let mut buf = BytesMut::from(&b"STAT\nNOOP\r\n12345"[..]);
        assert!(framer.has_line(&buf));
        assert_eq!(framer.next_line(&mut buf), Line::Complete(BytesMut::from(&b"STAT\n"[..])));
        assert_eq!(framer.next_line(&mut buf), Line::Complete(BytesMut::from(&b"NOOP\r\n"[..])));
        assert!(!framer.has_line(&buf));
        let mut left = 3;
        assert_eq!(&take_octets(&mut buf, &mut left)[..], b"123");
        assert_eq!(left, 0);
        let mut left = 10;
        assert_eq!(&take_octets(&mut buf, &mut left)[..], b"45");
        assert_eq!(left, 8);
    }
}
