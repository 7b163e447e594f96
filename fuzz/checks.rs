//! The properties the fuzz targets check, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/`, libFuzzer-driven, run by hand or nightly) and by
//! `server/tests/proto_fuzz.rs` (a bounded, seeded corpus-and-mutation run that
//! CI executes with the normal test suite). Each function takes arbitrary bytes
//! and panics when a property fails.

// Each fuzz target uses one of these functions.
#![allow(dead_code)]

use std::future::Future;
use std::io::{Cursor, Read};
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mail_auth::common::resolver::ToFqdn;
use mail_auth::common::verify::VerifySignature;
use mail_auth::hickory_resolver::proto::op::ResponseCode;
use mail_auth::{AuthenticatedMessage, DnsError, ResolverCache, Txt};
use mailcluster_api::config::{DkimConfig, DkimKey, DnsConfig, InboundAuthConfig};
use mailcluster_model::message::parse_meta;
use mailcluster_model::sort_keys::base_subject_of;
use mailcluster_model::{MessageMeta, SortRow};
use mailcluster_server::delivery::forward::fuzzing as forward;
use mailcluster_server::dkim::{Signer, generate, write_key_file};
use mailcluster_server::dns::Dns;
use mailcluster_server::imap::thread::{ThreadMessage, ordered_subject, parent_ids, references, render};
use mailcluster_server::inbound::{self, Envelope, Verdict};
use mailcluster_server::net::deflate::Deflate;
use mailcluster_server::net::proxy::read_header;
use mailcluster_server::proto::frame::{Command, CommandFramer, Limits, Line, LineFramer};
use mailcluster_server::proto::imap::parse::{parse, rewritten_criteria, shallow_or_chains};
use mailcluster_server::proto::managesieve;
use mailcluster_server::proto::smtp::{DataDecoder, address_literal, foreign_orcpt, parse_command};
use mailcluster_server::relay::client::Reply;
use mailcluster_server::relay::client::fuzzing as relay;
use mailcluster_server::relay::dsn::{self, Action, RecipientReport, Report};
use mailcluster_server::view::sort_cache::SortKeys;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// ManageSieve: client bytes through the command framer (as the session frames
/// them: `{n}` and `{n+}` alike) and the parser: no panic, no script or name
/// larger than the framer admits; and any string the server sends back
/// (quoted or as a literal) reads back as the same bytes.
pub fn managesieve_command(data: &[u8]) {
    for event in frame_commands(data, std::iter::once(data.len())) {
        let Command::Complete(cmd) = event else { continue };
        match managesieve::parse_command(&cmd) {
            Ok(managesieve::Command::PutScript { script, name }) => {
                assert!(script.len() <= IMAP_LIMITS.max_literal && name.len() <= IMAP_LIMITS.max_literal);
            }
            Ok(managesieve::Command::CheckScript(script)) => assert!(script.len() <= IMAP_LIMITS.max_literal),
            _ => {}
        }
    }
    let mut out = b"CHECKSCRIPT ".to_vec();
    managesieve::encode_string(&mut out, data);
    out.extend_from_slice(b"\r\n");
    assert_eq!(
        managesieve::parse_command(&out),
        Ok(managesieve::Command::CheckScript(data.to_vec())),
        "a string sent back reads back"
    );
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
    SortKeys::of(&sort_row(&meta, 1));
    let text = String::from_utf8_lossy(data);
    for line in text.lines().take(64) {
        let (base, _) = base_subject_of(line);
        assert!(base.len() <= line.len());
    }
}

/// The stored summary a session sorts and threads by, as `parse_meta` leaves it.
fn sort_row(meta: &MessageMeta, uid: u32) -> SortRow {
    SortRow {
        uid,
        message_id: 1,
        internal_date: Default::default(),
        size: meta.size,
        sent_date: meta.sent_date,
        subject: meta.subject.clone(),
        from: meta.from.clone(),
        to: meta.to.clone(),
        cc: meta.cc.clone(),
        message_id_header: meta.message_id.clone(),
    }
}

/// Runs a future whose I/O is all in memory, so that it never waits.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("waited on input that was all there"),
    }
}

/// THREAD: the input is header sections separated by blank lines, one message
/// each (at most 256), read as the session reads them: Subject, Date and
/// Message-ID from the stored summary (`parse_meta`, `SortKeys`), References and
/// In-Reply-To by `parent_ids`. Both algorithms place every message exactly
/// once, leave no empty thread, and render balanced parentheses in a size
/// linear in the messages.
pub fn thread(data: &[u8]) {
    let mut messages = Vec::new();
    let mut rest = data;
    while !rest.is_empty() && messages.len() < 256 {
        // A blank line (LF LF or LF CR LF) ends a header section.
        let end = memchr::memchr_iter(b'\n', rest).find_map(|at| match rest.get(at + 1..) {
            Some([b'\n', ..]) => Some((at + 1, at + 2)),
            Some([b'\r', b'\n', ..]) => Some((at + 1, at + 3)),
            _ => None,
        });
        let (block, next) = match end {
            Some((end, next)) => (&rest[..end], &rest[next..]),
            None => (rest, &b""[..]),
        };
        rest = next;
        let parents = parent_ids(block);
        for id in &parents {
            assert!(!id.contains(['<', '>']), "an id with its brackets: {id:?}");
        }
        assert!(parents.len() <= block.iter().filter(|&&b| b == b'<').count());
        let meta = parse_meta(block);
        let keys = SortKeys::of(&sort_row(&meta, messages.len() as u32 + 1));
        messages.push(ThreadMessage {
            number: keys.uid,
            date: keys.sent,
            subject: keys.subject.to_string(),
            reply: keys.reply,
            message_id: Some(keys.message_id_header.to_string()).filter(|m| !m.is_empty()),
            parents,
        });
    }
    for threads in [references(&messages), ordered_subject(&messages)] {
        let mut seen = vec![0u32; messages.len()];
        // Walked with a stack of our own: the check must not itself overflow on
        // a deep thread.
        let mut stack: Vec<usize> = threads.roots.clone();
        while let Some(n) = stack.pop() {
            match threads.message(n) {
                Some(m) => seen[m] += 1,
                None => assert!(!threads.children(n).is_empty(), "an empty thread"),
            }
            stack.extend(threads.children(n));
        }
        assert!(seen.iter().all(|&n| n == 1), "messages placed {seen:?} times");
        let rendered = render(&threads, &messages);
        let mut depth = 0i64;
        for c in rendered.bytes() {
            match c {
                b'(' => depth += 1,
                b')' => depth -= 1,
                b' ' | b'0'..=b'9' => {}
                other => panic!("{:?} in {rendered}", other as char),
            }
            assert!(depth >= 0, "{rendered}");
        }
        assert_eq!(depth, 0, "{rendered}");
        assert!(
            rendered.len() <= 16 * (messages.len() + 1),
            "{} bytes for {}",
            rendered.len(),
            messages.len()
        );
    }
}

/// The bytes of a v2 PROXY header naming `src` (TCP over IPv4 or IPv6).
fn proxy_v2(src: SocketAddr) -> Vec<u8> {
    let mut out = b"\r\n\r\n\0\r\nQUIT\n\x21".to_vec();
    let (family, ips): (u8, Vec<u8>) = match src.ip() {
        IpAddr::V4(ip) => (0x11, [ip.octets(), [10, 0, 0, 1]].concat()),
        IpAddr::V6(ip) => (0x21, [ip.octets(), std::net::Ipv6Addr::LOCALHOST.octets()].concat()),
    };
    out.push(family);
    out.extend_from_slice(&(ips.len() as u16 + 4).to_be_bytes());
    out.extend_from_slice(&ips);
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&25u16.to_be_bytes());
    out
}

/// The PROXY protocol header reader on arbitrary bytes from a trusted peer: no
/// panic; it reads no further than a v1 line (107 bytes) or a v2 header (16 +
/// 4096), so the session finds every byte after it; the bytes it read give the
/// same answer alone; and an address it accepts, written again as v1 and as v2,
/// reads back the same.
pub fn proxy_header(data: &[u8]) {
    let mut rest = data;
    let result = ready(read_header(&mut rest));
    let consumed = data.len() - rest.len();
    assert!(consumed <= 16 + 4096, "read {consumed} bytes");
    if data.starts_with(b"PROXY ") {
        assert!(consumed <= 107, "read {consumed} bytes of a v1 header");
    }
    let Ok(addr) = result else { return };
    let mut alone = &data[..consumed];
    assert_eq!(ready(read_header(&mut alone)).ok(), Some(addr), "the header alone reads otherwise");
    assert!(alone.is_empty());
    if data.starts_with(b"PROXY ") {
        assert!(data[..consumed].ends_with(b"\r\n"));
    }
    if let Some(src) = addr {
        let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
        let dst = if src.is_ipv4() { "10.0.0.1" } else { "::1" };
        let v1 = format!("PROXY {family} {} {dst} {} 25\r\n", src.ip(), src.port()).into_bytes();
        for header in [v1, proxy_v2(src)] {
            let mut again = &header[..];
            let got = ready(read_header(&mut again));
            assert_eq!(
                got.ok(),
                Some(Some(src)),
                "{src} did not survive {:?}",
                String::from_utf8_lossy(&header)
            );
        }
    }
}

/// Output a fuzz input may inflate to before the check stops reading (a
/// 64 KiB input can stand for 64 MiB).
const INFLATE_CAP: usize = 64 << 10;

/// COMPRESS=DEFLATE: the input as a client's compressed stream, read in pieces
/// of sizes the input chooses. No read returns more than was asked for (a bomb
/// comes out no faster than the session reads it) or pulls in more than one
/// input buffer of compressed bytes ahead; what comes out agrees byte for byte
/// with a reference inflater, all of it when the reference decodes the whole
/// stream. And the input as plain text, written in pieces with a flush after
/// each, inflates back to itself.
pub fn deflate(data: &[u8]) {
    let mut server = Deflate::new(data);
    let mut out = Vec::new();
    let mut sizes = data.iter().cycle().map(|&b| 1 + usize::from(b) * 67 % 8192);
    let mut reads = 0usize;
    let mut failed = false;
    let mut buf = vec![0u8; 8192];
    while out.len() <= INFLATE_CAP {
        let want = sizes.next().unwrap_or(4096);
        match ready(server.read(&mut buf[..want])) {
            Ok(0) => break,
            Ok(n) => {
                assert!(n <= want, "asked for {want}, got {n}");
                out.extend_from_slice(&buf[..n]);
            }
            Err(_) => {
                failed = true;
                break;
            }
        }
        reads += 1;
        let pulled = data.len() - server.get_ref().len();
        assert!(pulled <= 16 * 1024 * (reads + 1), "{pulled} compressed bytes pulled in by {reads} reads");
    }
    let mut reference = Vec::new();
    let whole = flate2::read::DeflateDecoder::new(data)
        .take(INFLATE_CAP as u64 + 1)
        .read_to_end(&mut reference)
        .is_ok();
    let common = out.len().min(reference.len());
    assert_eq!(out[..common], reference[..common], "inflated differently from the reference");
    if whole && reference.len() <= INFLATE_CAP {
        assert!(!failed, "refused a stream the reference decodes ({} bytes)", reference.len());
        assert_eq!(out.len(), reference.len(), "stopped early");
    }

    let mut writer = Deflate::new(Vec::new());
    let mut rest = data;
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).min(rest.len());
        ready(writer.write_all(&rest[..n])).expect("write to memory");
        ready(writer.flush()).expect("flush to memory");
        rest = &rest[n..];
    }
    let compressed = writer.get_ref().clone();
    let mut reader = Deflate::new(&compressed[..]);
    let mut back = Vec::new();
    ready(reader.read_to_end(&mut back)).expect("our own output inflates");
    assert!(back == data, "round trip changed {} bytes into {}", data.len(), back.len());
}

/// The largest reply the fuzzed relay client accepts.
const MAX_REPLY: usize = 2048;

/// A reply as a server writes it.
fn reply_wire(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, line) in reply.lines.iter().enumerate() {
        let sep = if i + 1 == reply.lines.len() { ' ' } else { '-' };
        out.extend_from_slice(format!("{:03}{sep}{line}\r\n", reply.code).as_bytes());
    }
    out
}

/// Checks one reply as the relay reads it, and returns it.
fn check_reply(reply: Reply) -> Reply {
    assert!(!reply.lines.is_empty() && reply.code <= 999);
    // Lossy UTF-8 turns one byte into at most three.
    let size: usize = reply.lines.iter().map(|l| l.len()).sum();
    assert!(size <= 3 * MAX_REPLY, "a reply of {size} bytes");
    let status = dsn::status_of(reply.code, reply.enhanced());
    let parts: Vec<&str> = status.split('.').collect();
    assert!(parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.len() <= 3), "status {status:?}");
    assert!(["2", "4", "5"].contains(&parts[0]), "status {status:?}");
    let ext = relay::extensions(&reply);
    if reply.lines.len() == 1 {
        assert!(
            !ext.pipelining && !ext.starttls && !ext.dsn && ext.size.is_none(),
            "keywords from the greeting line"
        );
    }
    let mut again = relay::client(Cursor::new(reply_wire(&reply)), usize::MAX / 4);
    let read = ready(relay::read_reply(&mut again)).expect("a reply written back reads");
    assert_eq!(read, reply, "reply did not survive being written back");
    reply
}

/// The relay's SMTP client reading a remote server's replies from arbitrary
/// bytes: replies one after another (pipelined), each within the size bound,
/// with at most that bound and one read buffered; every reply has a code and a
/// line, its enhanced status (or the generic one) is `class.subject.detail`, its
/// EHLO keywords parse, and written back it reads the same.
pub fn relay_replies(data: &[u8]) {
    let mut client = relay::client(Cursor::new(data.to_vec()), MAX_REPLY);
    for _ in 0..data.len() + 1 {
        let result = ready(relay::read_reply(&mut client));
        assert!(relay::buffered(&client) <= MAX_REPLY + 4096, "{} bytes buffered", relay::buffered(&client));
        match result {
            Ok(reply) => {
                check_reply(reply);
            }
            Err(_) => return,
        }
    }
    panic!("more replies than bytes");
}

/// The header fields of a DSN, in order.
const DSN_FIELDS: [&str; 8] =
    ["From", "To", "Subject", "Date", "Message-ID", "Auto-Submitted", "MIME-Version", "Content-Type"];
/// The fields of a message/delivery-status part.
const DELIVERY_STATUS_FIELDS: [&str; 12] = [
    "Reporting-MTA",
    "Original-Envelope-Id",
    "Arrival-Date",
    "Original-Recipient",
    "Final-Recipient",
    "Action",
    "Status",
    "Remote-MTA",
    "Diagnostic-Code",
    "Last-Attempt-Date",
    "Will-Retry-Until",
    // A header folded by the report text is not ours to make: never expected.
    "",
];

/// DSNs built from what remote servers and clients control: the input is the
/// remote server's reply (read by the relay client), the recipient, its ORCPT,
/// the ENVID, the sender and the original message, separated by NUL; the first
/// byte chooses the action and RET. The report has exactly its header fields and
/// delivery-status fields (nothing injected through CR or LF), parses as a
/// multipart/report of three parts, returns the header section only (no body)
/// unless a failure with RET=FULL, and stays within a size linear in the
/// fields it quotes (each at most 1000 characters).
pub fn dsn(data: &[u8]) {
    let Some((&flags, data)) = data.split_first() else { return };
    let mut fields = data.splitn(6, |&b| b == 0);
    let mut field = || fields.next().unwrap_or_default();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let reply_bytes = field();
    let reply = ready(relay::read_reply(&mut relay::client(Cursor::new(reply_bytes.to_vec()), MAX_REPLY)));
    let (status, diagnostic) = match &reply {
        Ok(r) => (dsn::status_of(r.code, r.enhanced()), r.to_string()),
        Err(e) => ("4.0.0".to_string(), e.to_string()),
    };
    let recipient = text(field());
    let orcpt = text(field());
    let envid = text(field());
    let sender = text(field());
    let original = field();
    let action =
        [Action::Failed, Action::Delayed, Action::Delivered, Action::Relayed][usize::from(flags & 3)];
    let return_full = flags & 4 != 0;
    let recipients = vec![
        RecipientReport {
            recipient: recipient.clone(),
            status: status.clone(),
            remote_mta: Some("mx.remote.example".into()),
            diagnostic: diagnostic.clone(),
            original_recipient: (!orcpt.is_empty()).then(|| orcpt.clone()),
        };
        1 + usize::from(flags >> 6)
    ];
    let now = chrono::Utc::now();
    let message = dsn::build(&Report {
        action,
        reporting_mta: "mx.example.org",
        sender: &sender,
        arrival: now,
        expires: now,
        recipients: &recipients,
        original,
        envid: (flags & 8 != 0).then_some(envid.as_str()),
        return_full,
    });
    let full = return_full && action == Action::Failed;
    let returned_max = if full { original.len() } else { 64 * 1024 };
    assert!(
        message.len() <= 4096 + recipients.len() * 8 * 4000 + returned_max + 4,
        "a report of {} bytes",
        message.len()
    );
    let header_end = memchr::memmem::find(&message, b"\r\n\r\n").expect("a header section");
    let head = String::from_utf8_lossy(&message[..header_end]);
    let names: Vec<&str> = head
        .split("\r\n")
        .filter(|l| !l.starts_with([' ', '\t']))
        .map(|l| l.split_once(':').map_or(l, |(name, _)| name))
        .collect();
    assert_eq!(names, DSN_FIELDS, "{head}");
    let text_all = String::from_utf8_lossy(&message);
    // The boundary from the Content-Type field (the last one, after the check
    // above): the sender's address in To: may read `boundary="` too.
    let content_type = head.rsplit("\r\nContent-Type:").next().expect("a Content-Type field");
    let boundary =
        content_type.split("boundary=\"").nth(1).and_then(|b| b.split('"').next()).expect("a boundary");
    let status_part = text_all
        .split(&format!("--{boundary}\r\nContent-Type: message/delivery-status\r\n\r\n"))
        .nth(1)
        .and_then(|p| p.split(&format!("\r\n--{boundary}")).next())
        .expect("a delivery-status part");
    for line in status_part.split("\r\n").filter(|l| !l.is_empty()) {
        let name = line.split_once(':').map_or("", |(n, _)| n);
        assert!(DELIVERY_STATUS_FIELDS[..11].contains(&name), "field {line:?} in the delivery status");
    }
    let returned_from = memchr::memmem::rfind(&message, format!("--{boundary}\r\nContent-Type: ").as_bytes())
        .expect("a returned part");
    let returned = &message[returned_from..];
    let returned = &returned[memchr::memmem::find(returned, b"\r\n\r\n").expect("part header") + 4..];
    let returned = &returned[..returned.len() - boundary.len() - 8];
    if !full {
        assert!(returned.len() <= 64 * 1024 + 2);
        assert!(
            original.starts_with(returned.strip_suffix(b"\r\n").unwrap_or(returned))
                || original.starts_with(returned)
        );
        assert!(
            memchr::memmem::find(returned, b"\r\n\r\n").is_none(),
            "the body went back in a headers-only report"
        );
    }
    let parsed = mail_parser::MessageParser::new().parse(&message).expect("a DSN parses");
    match &parsed.root_part().body {
        mail_parser::PartType::Multipart(parts) => assert_eq!(parts.len(), 3, "parts of the report"),
        other => panic!("not multipart: {other:?}"),
    }
}

/// A world for checking inbound mail without a network: one DKIM key of
/// `org-a.test` (signing with the server's own signer), and the DNS answers of
/// that domain, fixed in the resolver's cache.
struct InboundWorld {
    runtime: tokio::runtime::Runtime,
    dns: Dns,
    signer: Signer,
    fixed: Vec<(String, Txt)>,
}

const INBOUND_DOMAIN: &str = "org-a.test";

fn inbound_world() -> &'static InboundWorld {
    static WORLD: OnceLock<InboundWorld> = OnceLock::new();
    WORLD.get_or_init(|| {
        let key = generate("ed25519").expect("key");
        let path = std::env::temp_dir().join(format!("mailcluster-fuzz-dkim-{}.pem", std::process::id()));
        write_key_file(&path, &key.private_pem).expect("key file");
        let signer = Signer::load(&DkimConfig {
            keys: vec![DkimKey {
                domain: INBOUND_DOMAIN.into(),
                selector: "s1".into(),
                key_file: path.clone(),
                algorithm: "ed25519".into(),
            }],
        })
        .expect("signer");
        let _ = std::fs::remove_file(&path);
        // A name server nobody answers on: a lookup the fixed answers miss costs
        // a short timeout (and shows as a slow run), never traffic elsewhere.
        let dns = Dns::from_config(&DnsConfig {
            nameservers: vec!["127.0.0.1:9".parse().expect("addr")],
            timeout_ms: 5,
            attempts: 1,
            cache_entries: 100_000,
        })
        .expect("resolver");
        let txt = |record: &str, parse: fn(&[u8]) -> Txt| parse(record.as_bytes());
        use mail_auth::common::parse::TxtRecordParser;
        let fixed = vec![
            (
                format!("s1._domainkey.{INBOUND_DOMAIN}"),
                txt(&key.dns_txt, |r| mail_auth::common::verify::DomainKey::parse(r).into()),
            ),
            (
                INBOUND_DOMAIN.to_string(),
                txt("v=spf1 ip4:127.0.0.1 -all", |r| mail_auth::spf::Spf::parse(r).into()),
            ),
            (
                format!("_dmarc.{INBOUND_DOMAIN}"),
                txt("v=DMARC1; p=reject", |r| mail_auth::dmarc::Dmarc::parse(r).into()),
            ),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        InboundWorld { runtime, dns, signer, fixed }
    })
}

impl InboundWorld {
    /// Every name the checks of `message` ask: the fixed answers, "no such
    /// record" for the others.
    fn answer(&self, message: &[u8], mail_from: &str) {
        let until = Instant::now() + Duration::from_secs(3600);
        let missing = || Txt::Error(mail_auth::Error::Dns(DnsError::RecordNotFound(ResponseCode::NXDomain)));
        let mut names: Vec<String> = Vec::new();
        if let Some(parsed) = AuthenticatedMessage::parse(message) {
            for d in &parsed.dkim_headers {
                names.push(d.header.domain_key());
                names.push(format!("_report._domainkey.{}", d.header.domain()));
            }
            for a in &parsed.ams_headers {
                names.push(a.header.domain_key());
            }
            for a in &parsed.as_headers {
                names.push(a.header.domain_key());
            }
            for from in &parsed.from {
                if let Some((_, domain)) = from.rsplit_once('@') {
                    let labels: Vec<&str> = domain.split('.').collect();
                    for i in 0..labels.len() {
                        names.push(format!("_dmarc.{}", labels[i..].join(".")));
                    }
                }
            }
        }
        if let Some((_, domain)) = mail_from.rsplit_once('@') {
            names.push(domain.to_string());
        }
        for name in names {
            self.dns.caches.txt.insert(name.to_fqdn().into_owned().into_boxed_str(), missing(), until);
        }
        for (name, answer) in &self.fixed {
            self.dns.caches.txt.insert(name.to_fqdn().into_owned().into_boxed_str(), answer.clone(), until);
        }
    }

    fn verdict(&self, message: &[u8], remote: IpAddr, mail_from: &str) -> Verdict {
        self.answer(message, mail_from);
        let envelope = Envelope { remote_ip: remote, helo: INBOUND_DOMAIN, mail_from };
        let config = InboundAuthConfig { dns_budget_ms: 2000, ..Default::default() };
        self.runtime.block_on(inbound::check(&self.dns, &config, "mx.example.org", &envelope, message))
    }
}

/// What every verdict must be: an `Authentication-Results` field that is one
/// header field (every line break folded, CRLF at the end) of a size linear in
/// the message, or a reply text on one line.
fn check_verdict(verdict: &Verdict, message: &[u8]) {
    match verdict {
        Verdict::Accept { header, .. } => {
            assert!(header.starts_with("Authentication-Results: mx.example.org;"), "{header:?}");
            let body = header.strip_suffix("\r\n").expect("ends with CRLF");
            for (i, _) in body.match_indices(['\r', '\n']) {
                let after = &body[i..];
                assert!(
                    after.starts_with("\r\n ") || after.starts_with("\r\n\t") || after.starts_with("\n"),
                    "a line break that is not folding: {header:?}"
                );
            }
            for (i, _) in body.match_indices('\n') {
                assert!(i > 0 && body.as_bytes()[i - 1] == b'\r', "a bare LF: {header:?}");
            }
            assert!(header.len() <= 4096 + 4 * message.len(), "a header of {} bytes", header.len());
        }
        Verdict::Reject(text) | Verdict::Defer(_, text) => {
            assert!(!text.contains(['\r', '\n']), "a reply text over lines: {text:?}");
        }
    }
}

/// Inbound SPF, DKIM, ARC and DMARC (`inbound::check`, mail-auth underneath)
/// on an arbitrary message, with every DNS answer fixed: the verdict is well
/// formed (see `check_verdict`); and the message signed by our own signer for
/// `org-a.test` (its From) passes DKIM and DMARC from an address outside SPF.
pub fn inbound_auth(data: &[u8]) {
    let world = inbound_world();
    let Some((&flags, message)) = data.split_first() else { return };
    let remote: IpAddr = if flags & 1 == 0 { [127, 0, 0, 1].into() } else { [192, 0, 2, 9].into() };
    let mail_from = if flags & 2 == 0 { "alice@org-a.test" } else { "" };
    check_verdict(&world.verdict(message, remote, mail_from), message);
    // Signed as the submission port signs: below the Received field it always
    // puts first (a message starting with a folded line would otherwise fold
    // into the signature's field on the receiving side).
    let message = &[
        &b"Received: from client ([192.0.2.1])\r\n\tby mx.org-a.test (Mailcluster) with ESMTPSA id 1\r\n"[..],
        message,
    ]
    .concat();
    if let Some(signature) = world.signer.sign(INBOUND_DOMAIN, message) {
        let signed = [signature.as_bytes(), message].concat();
        let verdict = world.verdict(&signed, [192, 0, 2, 9].into(), mail_from);
        check_verdict(&verdict, &signed);
        // Only a message mail-auth reads as one signed by us can be asked to pass.
        let ours = AuthenticatedMessage::parse(&signed).is_some_and(|m| {
            m.dkim_headers.first().is_some_and(|d| d.header.domain() == INBOUND_DOMAIN)
                && m.from.len() == 1
                && m.from[0].to_ascii_lowercase().ends_with("@org-a.test")
        });
        if ours {
            let Verdict::Accept { header, junk: false, .. } = &verdict else { panic!("{verdict:?}") };
            assert!(header.contains("dkim=pass"), "our own signature did not verify: {header}");
        }
    }
}

/// Group commit across pods, both sides' decoders on arbitrary frames: no
/// panic; a request the leader accepts, written again, decodes to the same
/// delivery; an answer the follower accepts, written again, decodes to the same
/// outcome; and the frame reader over the input as a stream yields frames of
/// at most its limit, each as long as its length prefix said.
pub fn group_commit_frames(data: &[u8]) {
    if let Ok((id, delivery)) = forward::decode_request(data) {
        let frame = forward::encode_request(id, &delivery).expect("a decoded request encodes");
        assert_eq!(u32::from_be_bytes(frame[..4].try_into().expect("prefix")) as usize, frame.len() - 4);
        let (again_id, again) = forward::decode_request(&frame[4..]).expect("an encoded request decodes");
        assert_eq!(again_id, id);
        assert_eq!(
            (&again.raw, &again.meta, &again.targets, &again.flags, again.internal_date),
            (&delivery.raw, &delivery.meta, &delivery.targets, &delivery.flags, delivery.internal_date)
        );
    }
    if let Ok((id, answer)) = forward::decode_answer(data) {
        let frame = answer.encode(id);
        assert_eq!(u32::from_be_bytes(frame[..4].try_into().expect("prefix")) as usize, frame.len() - 4);
        let (again_id, again) = forward::decode_answer(&frame[4..]).expect("an encoded answer decodes");
        assert_eq!(again_id, id);
        assert_eq!(format!("{again:?}"), format!("{answer:?}"));
    }
    let max = 512;
    let mut rest = data;
    loop {
        let before = rest.len();
        match ready(forward::read_frame(&mut rest, max)) {
            Ok(Some(frame)) => {
                assert!(frame.len() <= max);
                assert_eq!(before - rest.len(), 4 + frame.len(), "read past the frame");
            }
            Ok(None) | Err(_) => break,
        }
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
