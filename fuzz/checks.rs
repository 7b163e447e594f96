//! The properties the fuzz targets check, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/`, libFuzzer-driven, run by hand or nightly) and by
//! `server/tests/proto_fuzz.rs` (a bounded, seeded corpus-and-mutation run that
//! CI executes with the normal test suite). Each function takes arbitrary bytes
//! and panics when a property fails.

// Each fuzz target uses one of these functions.
#![allow(dead_code)]

use bytes::BytesMut;
use mailcluster_server::imap::sort::base_subject_of;
use mailcluster_server::imap::sort_cache::SortKeys;
use mailcluster_server::message::parse_meta;
use mailcluster_server::proto::frame::{Command, CommandFramer, Limits, Line, LineFramer};
use mailcluster_server::proto::imap::parse::{parse, rewritten_criteria, shallow_or_chains};
use mailcluster_server::proto::smtp::{DataDecoder, address_literal, foreign_orcpt, parse_command};
use mailcluster_server::store::SortRow;

/// Limits small enough that short inputs reach them.
pub const IMAP_LIMITS: Limits = Limits { max_line: 1024, max_literal: 4096 };
/// The line limit of the line-framing check.
const MAX_LINE: usize = 512;

/// Read sizes for feeding `data` in pieces: taken from the input's own bytes, so
/// that the fuzzer steers where the read boundaries fall.
fn piece_sizes(data: &[u8]) -> impl Iterator<Item = usize> + '_ {
    (0..).map(move |i| 1 + usize::from(data.get(i % data.len().max(1)).copied().unwrap_or(0)) % 61)
}

/// What a framer makes of `data` arriving in pieces of the given sizes: `next`
/// gives the framer's next finding, `None` when it needs more input. Checks on the
/// way that the buffer never holds more than a partial line and one read.
fn frame<E>(
    data: &[u8],
    mut sizes: impl Iterator<Item = usize>,
    max_line: usize,
    mut next: impl FnMut(&mut BytesMut) -> Option<E>,
) -> Vec<E> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        while let Some(found) = next(&mut buf) {
            out.push(found);
        }
        assert!(buf.len() < max_line + n, "{} octets held between reads", buf.len());
    }
    out
}

/// The command framer's findings; continuation requests are answered at once.
fn frame_commands(data: &[u8], sizes: impl Iterator<Item = usize>) -> Vec<Command> {
    let mut framer = CommandFramer::new(IMAP_LIMITS);
    frame(data, sizes, IMAP_LIMITS.max_line, |buf| match framer.next_command(buf) {
        Command::NeedMore => None,
        other => Some(other),
    })
}

/// The line framer's findings.
fn frame_lines(data: &[u8], sizes: impl Iterator<Item = usize>) -> Vec<Line> {
    let mut framer = LineFramer::new(MAX_LINE);
    frame(data, sizes, MAX_LINE, |buf| match framer.next_line(buf) {
        Line::NeedMore => None,
        other => Some(other),
    })
}

/// The IMAP command framer and parser on arbitrary client bytes: no panic, no
/// command beyond the limits, every command ends with LF, the same commands
/// whether the bytes came in one read or in many, and the parser accepts or
/// rejects each without panicking.
pub fn imap_command(data: &[u8]) {
    let whole = frame_commands(data, std::iter::once(data.len()));
    let pieces = frame_commands(data, piece_sizes(data));
    assert_eq!(whole, pieces, "read boundaries changed the framing");
    let limits = IMAP_LIMITS;
    for event in &whole {
        if let Command::Complete(cmd) = event {
            // A literal is admitted only while the command stays within
            // max_literal + max_line; the line after it adds one more line.
            assert!(cmd.len() <= limits.max_literal + 2 * limits.max_line, "{} bytes", cmd.len());
            assert_eq!(cmd.last(), Some(&b'\n'));
            let _ = parse(cmd);
            // The session's rewrites before parsing: the criteria it replaces lie
            // within the command, and a shallower OR chain still ends its line
            // and goes to the parser.
            for (range, _) in rewritten_criteria(cmd) {
                assert!(range.start < range.end && range.end <= cmd.len());
            }
            if let Some(c) = shallow_or_chains(cmd) {
                assert_eq!(c.last(), Some(&b'\n'));
                let _ = parse(&c);
            }
        }
    }
}

/// The line framer of the SMTP and POP3 sessions: every line within the limit and
/// ending with LF; the same lines whatever the read boundaries; and where no line
/// was too long, the lines are the input itself, in order, nothing lost.
pub fn lines(data: &[u8]) {
    let whole = frame_lines(data, std::iter::once(data.len()));
    let pieces = frame_lines(data, piece_sizes(data));
    assert_eq!(whole, pieces, "read boundaries changed the framing");
    let mut joined = Vec::new();
    for line in &whole {
        if let Line::Complete(l) = line {
            assert!(l.len() <= MAX_LINE && l.ends_with(b"\n"), "a line of {} octets", l.len());
            joined.extend_from_slice(l);
        }
    }
    if !whole.contains(&Line::TooLong) {
        assert!(data.starts_with(&joined), "the lines are not the input");
        assert!(!data[joined.len()..].contains(&b'\n'), "a complete line was held back");
    }
}

/// SMTP: every line (as the session frames it) through the command parser, and the input (split at a point
/// the input chooses) through the DATA decoder: no panic, the decoder never
/// consumes more than it was given, keeps at most its limit, and stops only right
/// after `CRLF . CRLF` (or `. CRLF` at the very start).
pub fn smtp(data: &[u8]) {
    for line in frame_lines(data, std::iter::once(data.len())) {
        if let Line::Complete(line) = line {
            let _ = parse_command(&line);
            // The session's patches before parsing: what they leave is shorter
            // and parsed as any line.
            for patched in [address_literal(&line).map(|(p, _)| p), foreign_orcpt(&line).map(|(p, _, _)| p)]
                .into_iter()
                .flatten()
            {
                let _ = parse_command(&patched);
            }
        }
    }
    let limit = 512;
    let split = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let mut decoder = DataDecoder::new(limit);
    let mut out = b"Received: x\r\n".to_vec();
    let base = out.len();
    let mut consumed = 0;
    for chunk in [&data[..split], &data[split..]] {
        if decoder.is_done() {
            break;
        }
        let n = decoder.decode(chunk, &mut out, base);
        assert!(n <= chunk.len());
        consumed += n;
    }
    assert!(out.len() - base <= limit, "kept {} > {limit}", out.len() - base);
    assert!(decoder.seen() >= out.len() - base);
    if decoder.is_done() {
        let eaten = &data[..consumed];
        assert!(eaten == b".\r\n" || eaten.ends_with(b"\r\n.\r\n"), "stopped after {eaten:?}");
    }
}

/// `parse_meta` on arbitrary bytes: no panic, and every recorded part lies inside
/// the message.
pub fn message_meta(data: &[u8]) {
    let meta = parse_meta(data);
    assert_eq!(meta.size as usize, data.len());
    for p in &meta.parts {
        assert!(p.header_start <= p.body_start && p.body_start <= p.body_end);
        assert!(p.body_end as usize <= data.len());
    }
    // What SORT and THREAD derive from the headers: base subject, first
    // addresses, display names. The subject rules also get the whole input as
    // text, so any character lands where a marker is looked for.
    let row = SortRow {
        uid: 1,
        message_id: 1,
        internal_date: Default::default(),
        size: meta.size,
        sent_date: meta.sent_date,
        subject: meta.subject.clone(),
        from: meta.from.clone(),
        to: meta.to.clone(),
        cc: meta.cc.clone(),
        message_id_header: meta.message_id.clone(),
    };
    SortKeys::of(&row);
    let text = String::from_utf8_lossy(data);
    for line in text.lines().take(64) {
        let (base, _) = base_subject_of(line);
        assert!(base.len() <= line.len());
    }
}

/// xorshift64*: no dependency and reproducible from the printed seed (the
/// bounded runs in `server/tests/`).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A bounded run's seed and seconds: MAILCLUSTER_FUZZ_SEED replays one (odd,
/// for xorshift), else the clock; MAILCLUSTER_FUZZ_SECS, default 4.
pub fn budget() -> (u64, u64) {
    let seed =
        std::env::var("MAILCLUSTER_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        }) | 1;
    let secs = std::env::var("MAILCLUSTER_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    (seed, secs)
}
