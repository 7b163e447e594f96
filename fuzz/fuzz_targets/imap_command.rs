//! Feeds arbitrary bytes through the IMAP command reader (limits, literals) and
//! parser: neither may panic, and every command the reader yields is bounded by
//! the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mailcluster_server::proto::imap::parse::parse;
use mailcluster_server::proto::imap::reader::{CommandReader, Limits, ReadOutcome};
use tokio::io::AsyncWriteExt;

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    rt.block_on(async {
        let limits = Limits { max_line: 1024, max_literal: 4096 };
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let _ = client.write_all(data).await;
        drop(client);
        let mut reader = CommandReader::new(limits);
        for _ in 0..64 {
            match reader.read_command(&mut server).await {
                Ok(ReadOutcome::Command(cmd)) => {
                    assert!(cmd.len() <= limits.max_line * 64 + limits.max_literal + limits.max_line);
                    let _ = parse(&cmd);
                }
                _ => break,
            }
        }
    });
});
