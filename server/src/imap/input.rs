//! The session's side of framing: reads from the socket into a buffer and lets
//! [`CommandFramer`] find commands and lines in it; writes the continuation
//! request a synchronising literal waits for. Every read goes into the buffer
//! before anything is taken from it, so both reads are safe to cancel (IDLE races
//! the client's DONE against notifications).

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::net::budget::{Reservation, TransferBudget};
pub use crate::net::input::LineOutcome;
use crate::net::input::{fill, read_line};
use crate::proto::frame::{Command, CommandFramer, Limits};

/// What [`Input::read_command`] produced.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// One complete command, literals inlined, ending with LF.
    Command(Vec<u8>),
    /// A line exceeded the limit.
    LineTooLong,
    /// A literal was announced above the limit; `sync` says whether the client
    /// waits for a continuation (and so sent nothing more).
    LiteralTooLarge { tag: String, sync: bool, size: u64 },
    /// A literal within the limits found the pod's transfer budget spent; `sync`
    /// as above.
    Busy { tag: String, sync: bool },
    /// The client closed the connection.
    Eof,
}

pub struct Input {
    buf: BytesMut,
    framer: CommandFramer,
    /// The pod's transfer budget held by the literals of the command being read,
    /// or of the one last returned (it runs until the next is read).
    literals: Reservation,
}

impl Input {
    pub fn new(limits: Limits, budget: &Arc<TransferBudget>) -> Self {
        Input {
            buf: BytesMut::with_capacity(8 * 1024),
            framer: CommandFramer::new(limits),
            literals: budget.start("imap"),
        }
    }

    /// Limits for the commands read from now on.
    pub fn set_limits(&mut self, limits: Limits) {
        self.framer.set_limits(limits);
    }

    /// Drops buffered input: after STARTTLS, plaintext the client pipelined must not
    /// be interpreted as if it had arrived over TLS (RFC 3501 §6.2.1); after
    /// COMPRESS, what came uncompressed is not executed either.
    pub fn discard_buffered(&mut self) {
        self.buf.clear();
        self.framer.reset();
        self.literals.clear();
    }

    /// The next complete command.
    pub async fn read_command<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        s: &mut S,
    ) -> std::io::Result<ReadOutcome> {
        // The command before this one has been answered: its literals are gone.
        self.literals.clear();
        loop {
            let literals = &mut self.literals;
            match self.framer.next_command_with(&mut self.buf, |size| literals.grow_to(size)) {
                Command::Complete(cmd) => return Ok(ReadOutcome::Command(cmd)),
                Command::LineTooLong => return Ok(ReadOutcome::LineTooLong),
                Command::LiteralTooLarge { sync, size, tag } => {
                    return Ok(ReadOutcome::LiteralTooLarge { tag, sync, size });
                }
                Command::LiteralRefused { sync, tag, .. } => {
                    self.literals.clear();
                    return Ok(ReadOutcome::Busy { tag, sync });
                }
                Command::SendContinuation => {
                    s.write_all(b"+ Ready for literal data\r\n").await?;
                    s.flush().await?;
                }
                Command::NeedMore => {
                    if !fill(s, &mut self.buf, self.framer.literal_left()).await? {
                        return Ok(ReadOutcome::Eof);
                    }
                }
            }
        }
    }

    /// One line (an AUTHENTICATE response, IDLE's DONE), within the line limit.
    pub async fn read_line<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> std::io::Result<LineOutcome> {
        read_line(s, &mut self.buf, &mut self.framer.lines).await
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn a_synchronising_literal_gets_its_continuation_on_the_stream() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let task = tokio::spawn(async move {
            let budget = TransferBudget::new(1 << 20, &crate::metrics::Metrics::new());
            let mut input = Input::new(Limits { max_line: 64, max_literal: 100 }, &budget);
            let a = input.read_command(&mut server).await.expect("read");
            let b = input.read_command(&mut server).await.expect("read");
            let eof = input.read_command(&mut server).await.expect("read");
            (a, b, eof)
        });
        client.write_all(b"a LOGIN {3}\r\n").await.expect("write");
        let mut plus = [0u8; 26];
        client.read_exact(&mut plus).await.expect("continuation");
        assert_eq!(&plus, b"+ Ready for literal data\r\n");
        client.write_all(b"bob {2+}\r\npw\r\nb NOOP\r\n").await.expect("write");
        drop(client);
        let (a, b, eof) = task.await.expect("join");
        assert_eq!(a, ReadOutcome::Command(b"a LOGIN {3}\r\nbob {2+}\r\npw\r\n".to_vec()));
        assert_eq!(b, ReadOutcome::Command(b"b NOOP\r\n".to_vec()));
        assert_eq!(eof, ReadOutcome::Eof);
    }
}
