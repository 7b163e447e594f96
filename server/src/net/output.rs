//! A session's pending output. Reply text is copied into one buffer; a large
//! message body is kept by reference instead (a shared `Bytes`, usually the body
//! cache's own) and written from where it lies, in one vectored write with the
//! text around it. A FETCH of a 10 MB attachment, or a POP3 RETR of a message
//! that needs no dot-stuffing, then costs no copy of the message into the
//! session, and no second 10 MB held per session.

use std::io::IoSlice;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Bodies at least this large are written from where they are; smaller ones are
/// copied, which costs less than the extra slice in the write.
pub const SHARE_MIN: usize = 16 * 1024;
/// Kept capacity of the text buffer between flushes.
const KEEP_CAPACITY: usize = 16 * 1024;

#[derive(Default)]
pub struct Output {
    text: Vec<u8>,
    /// Shared bodies and the offset in `text` they come before.
    shared: Vec<(usize, Bytes)>,
    shared_len: usize,
}

impl Output {
    pub fn with_capacity(n: usize) -> Self {
        Output { text: Vec::with_capacity(n), shared: Vec::new(), shared_len: 0 }
    }

    /// Octets waiting to be written.
    pub fn len(&self) -> usize {
        self.text.len() + self.shared_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.text.extend_from_slice(data);
    }

    pub fn push(&mut self, byte: u8) {
        self.text.push(byte);
    }

    /// The text buffer, for encoders that append to a `Vec`.
    pub fn text(&mut self) -> &mut Vec<u8> {
        &mut self.text
    }

    /// Appends `data`, by reference when it is large.
    pub fn put_shared(&mut self, data: Bytes) {
        if data.len() < SHARE_MIN {
            self.text.extend_from_slice(&data);
        } else {
            self.shared_len += data.len();
            self.shared.push((self.text.len(), data));
        }
    }

    /// Appends `part`, a slice of `whole`, by reference when it is large. A slice
    /// from anywhere else is copied.
    pub fn put_slice_of(&mut self, whole: &Bytes, part: &[u8]) {
        let inside = whole.as_ptr_range();
        let range = part.as_ptr_range();
        if part.len() >= SHARE_MIN && inside.start <= range.start && range.end <= inside.end {
            self.put_shared(whole.slice_ref(part));
        } else {
            self.text.extend_from_slice(part);
        }
    }

    /// Writes everything pending to `w` (not flushed) and empties the output.
    pub async fn write_to<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> std::io::Result<()> {
        if self.shared.is_empty() {
            w.write_all(&self.text).await?;
        } else {
            let mut slices = Vec::with_capacity(2 * self.shared.len() + 1);
            let mut from = 0;
            for (at, data) in &self.shared {
                slices.push(IoSlice::new(&self.text[from..*at]));
                slices.push(IoSlice::new(data));
                from = *at;
            }
            slices.push(IoSlice::new(&self.text[from..]));
            slices.retain(|s| !s.is_empty());
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                let n = w.write_vectored(rest).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut rest, n);
            }
        }
        self.text.clear();
        if self.text.capacity() > KEEP_CAPACITY {
            self.text.shrink_to(KEEP_CAPACITY);
        }
        self.shared.clear();
        self.shared_len = 0;
        Ok(())
    }
}

impl std::fmt::Write for Output {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.text.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A writer that takes at most `step` octets per call, vectored or not, so
    /// that every partial-write path is taken.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
        vectored_calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            self.vectored_calls += 1;
            let mut left = self.step;
            for b in bufs {
                let n = b.len().min(left);
                self.got.extend_from_slice(&b[..n]);
                left -= n;
                if left == 0 {
                    break;
                }
            }
            Poll::Ready(Ok(self.step - left))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn text_and_shared_bodies_are_written_in_order() {
        let big = Bytes::from((0..SHARE_MIN + 5).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        for step in [1, 7, 4096, usize::MAX] {
            let mut out = Output::with_capacity(64);
            let mut expected = Vec::new();
            out.extend_from_slice(b"* 1 FETCH (BODY[] {..}\r\n");
            expected.extend_from_slice(b"* 1 FETCH (BODY[] {..}\r\n");
            out.put_shared(big.clone());
            expected.extend_from_slice(&big);
            out.put_shared(Bytes::from_static(b"small"));
            expected.extend_from_slice(b"small");
            out.put_shared(big.clone());
            out.put_slice_of(&big, &big[3..SHARE_MIN + 4]);
            out.put_slice_of(&big, &[7u8; SHARE_MIN]);
            expected.extend_from_slice(&big);
            expected.extend_from_slice(&big[3..SHARE_MIN + 4]);
            expected.extend_from_slice(&[7u8; SHARE_MIN]);
            out.push(b')');
            expected.push(b')');
            assert_eq!(out.len(), expected.len());
            let mut w = Trickle { got: Vec::new(), step, vectored_calls: 0 };
            out.write_to(&mut w).await.expect("write");
            assert_eq!(w.got, expected, "in writes of {step}");
            assert!(w.vectored_calls > 0);
            assert!(out.is_empty());
            // Reused after a flush: nothing of the last round is written again.
            out.extend_from_slice(b"a OK\r\n");
            let mut w = Trickle { got: Vec::new(), step, vectored_calls: 0 };
            out.write_to(&mut w).await.expect("write");
            assert_eq!(w.got, b"a OK\r\n");
        }
    }
}
