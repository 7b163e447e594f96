//! Reading client input for the framers of [`crate::proto::frame`]: bytes go into
//! the session's buffer first and are taken out by the framer, so a read cancelled
//! half-way (a timeout, IDLE's race against notifications) loses nothing.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::proto::frame::{Line, LineFramer};

/// Octets asked of the socket per read.
const READ_CHUNK: usize = 4096;
/// The most asked of it at once, however much more is expected.
const MAX_READ_CHUNK: usize = 64 * 1024;

/// What [`read_line`] produced.
#[derive(Debug, PartialEq, Eq)]
pub enum LineOutcome {
    /// One line, its line ending included.
    Line(BytesMut),
    /// The line exceeded the limit; the rest of it is dropped as it arrives.
    TooLong,
    /// The client closed the connection.
    Eof,
}

/// Reads more input into `buf`, with room for at least `room` octets more (a
/// literal or chunk known to be on its way is read in large pieces); false when
/// the client closed the connection.
pub async fn fill<S: AsyncRead + Unpin>(s: &mut S, buf: &mut BytesMut, room: usize) -> std::io::Result<bool> {
    buf.reserve(room.clamp(READ_CHUNK, MAX_READ_CHUNK));
    Ok(s.read_buf(buf).await? > 0)
}

/// The next line, reading as much as it takes.
pub async fn read_line<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    framer: &mut LineFramer,
) -> std::io::Result<LineOutcome> {
    loop {
        match framer.next_line(buf) {
            Line::Complete(line) => return Ok(LineOutcome::Line(line)),
            Line::TooLong => return Ok(LineOutcome::TooLong),
            Line::NeedMore => {
                if !fill(s, buf, READ_CHUNK).await? {
                    return Ok(LineOutcome::Eof);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_the_reader_resynchronises() {
        let long = [b'A'; 100_000];
        let mut input = b"STAT\r\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\r\nQUIT\r\n");
        let mut input = &input[..];
        let mut buf = BytesMut::new();
        let mut framer = LineFramer::new(16);
        let mut next = async || read_line(&mut input, &mut buf, &mut framer).await.expect("read");
        assert_eq!(next().await, LineOutcome::Line(BytesMut::from(&b"STAT\r\n"[..])));
        assert_eq!(next().await, LineOutcome::TooLong);
        assert_eq!(next().await, LineOutcome::Line(BytesMut::from(&b"QUIT\r\n"[..])));
        assert_eq!(next().await, LineOutcome::Eof);
        assert!(buf.capacity() < 16 * 1024, "the long line was never held whole");
    }
}
