//! The properties the fuzz targets check, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/`, libFuzzer-driven, run by hand or nightly) and by
//! `server/tests/proto_fuzz.rs` (a bounded, seeded corpus-and-mutation run that
//! CI executes with the normal test suite). Each function takes arbitrary bytes
//! and panics when a property fails.

// Each fuzz target uses one of these functions.
#![allow(dead_code)]

use mailcluster_server::message::parse_meta;
use mailcluster_server::proto::imap::parse::parse;
use mailcluster_server::proto::imap::reader::{CommandReader, Limits, LineOutcome, ReadOutcome};
use mailcluster_server::proto::smtp::{DataDecoder, parse_command};
use tokio::io::AsyncWriteExt;

/// Limits small enough that short inputs reach them.
pub const IMAP_LIMITS: Limits = Limits { max_line: 1024, max_literal: 4096 };

/// The IMAP command reader and parser on a client stream of arbitrary bytes: no
/// panic, no command beyond the limits, every `Command` ends with LF, and the
/// parser accepts or rejects it without panicking.
pub fn imap_command(data: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    rt.block_on(async {
        let limits = IMAP_LIMITS;
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        // The whole input fits the duplex buffer only when small; write it from a
        // task so large inputs are not a deadlock.
        let input = data.to_vec();
        let writer = tokio::spawn(async move {
            let _ = client.write_all(&input).await;
            // Keep reading our "+" continuations so the server side never blocks.
            let _ = client.shutdown().await;
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut client, &mut sink).await;
        });
        let mut reader = CommandReader::new(limits);
        for _ in 0..256 {
            match reader.read_command(&mut server).await {
                Ok(ReadOutcome::Command(cmd)) => {
                    // A literal is admitted only while the command stays within
                    // max_literal + max_line; the line after it adds one more line.
                    assert!(cmd.len() <= limits.max_literal + 2 * limits.max_line, "{} bytes", cmd.len());
                    assert_eq!(cmd.last(), Some(&b'\n'));
                    let _ = parse(&cmd);
                }
                Ok(ReadOutcome::LiteralTooLarge { sync: true, .. }) => continue,
                _ => break,
            }
        }
        // IDLE's line reader on what is left.
        for _ in 0..16 {
            match reader.read_line(&mut server).await {
                Ok(LineOutcome::Line(l)) => assert!(l.len() <= limits.max_line + 4096 && l.ends_with(b"\n")),
                _ => break,
            }
        }
        drop(server);
        let _ = writer.await;
    });
}

/// SMTP: every line through the command parser, and the input (split at a point
/// the input chooses) through the DATA decoder: no panic, the decoder never
/// consumes more than it was given, keeps at most its limit, and stops only right
/// after `CRLF . CRLF` (or `. CRLF` at the very start).
pub fn smtp(data: &[u8]) {
    for line in data.split_inclusive(|&b| b == b'\n') {
        let _ = parse_command(line);
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
}
