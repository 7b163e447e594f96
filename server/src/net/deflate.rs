//! A DEFLATE-compressed connection (IMAP COMPRESS=DEFLATE, RFC 4978): raw DEFLATE
//! (RFC 1951, no zlib header) in both directions over an existing stream, each
//! flush of ours ending with a sync flush so that the client can decode every
//! response as soon as it arrives.
//!
//! Memory stays bounded whatever the client sends: compressed input is read
//! `INPUT_CHUNK` bytes at a time and inflated straight into the caller's buffer (a
//! "zip bomb" only ever produces as much as the session's reader asks for, and that
//! reader enforces the protocol's line and literal limits); compressed output is
//! written out before more is accepted once `OUTPUT_HIGH_WATER` bytes are pending.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Compressed bytes read from the connection at a time.
const INPUT_CHUNK: usize = 16 * 1024;
/// Compressed bytes held for writing before `poll_write` waits for the connection.
const OUTPUT_HIGH_WATER: usize = 64 * 1024;

pub struct Deflate<S> {
    inner: S,
    inflate: Decompress,
    deflate: Compress,
    /// Compressed input not yet inflated: `input[start..end]`.
    input: Box<[u8]>,
    start: usize,
    end: usize,
    /// The client ended its DEFLATE stream (or the connection): nothing more to read.
    input_done: bool,
    /// Compressed output not yet written to `inner`: `output[written..]`.
    output: Vec<u8>,
    written: usize,
    /// Data went in since the last sync flush.
    unflushed: bool,
}

impl<S> Deflate<S> {
    pub fn new(inner: S) -> Self {
        Deflate {
            inner,
            // false: raw DEFLATE, no zlib header or checksum (RFC 4978 §3).
            inflate: Decompress::new(false),
            deflate: Compress::new(Compression::default(), false),
            input: vec![0; INPUT_CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
            input_done: false,
            output: Vec::new(),
            written: 0,
            unflushed: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Deflates `data` (all of it) into `output` with `flush`.
    fn compress(&mut self, mut data: &[u8], flush: FlushCompress) -> std::io::Result<()> {
        loop {
            self.output.reserve(data.len() / 2 + 64);
            let before_in = self.deflate.total_in();
            let before_out = self.output.len();
            self.deflate.compress_vec(data, &mut self.output, flush).map_err(std::io::Error::other)?;
            let consumed = (self.deflate.total_in() - before_in) as usize;
            data = &data[consumed..];
            let produced = self.output.len() - before_out;
            // Done when all input is in and the last call had room to spare (a
            // full output buffer may mean more is waiting to come out).
            if data.is_empty() && self.output.len() < self.output.capacity() {
                return Ok(());
            }
            if consumed == 0 && produced == 0 && data.is_empty() {
                return Ok(());
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> Deflate<S> {
    /// Writes pending compressed output to `inner`.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.output.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.output[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.output.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Deflate<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            // Inflate first, even without new input: output the inflater could not
            // hand over last time (the caller's buffer was full) comes out now.
            let out = buf.initialize_unfilled();
            let (before_in, before_out) = (this.inflate.total_in(), this.inflate.total_out());
            let status = this
                .inflate
                .decompress(&this.input[this.start..this.end], out, FlushDecompress::None)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            let consumed = (this.inflate.total_in() - before_in) as usize;
            let produced = (this.inflate.total_out() - before_out) as usize;
            this.start += consumed;
            buf.advance(produced);
            if produced > 0 {
                return Poll::Ready(Ok(()));
            }
            if status == Status::StreamEnd {
                // The client ended its DEFLATE stream: end of input for the session.
                this.input_done = true;
            }
            if this.input_done {
                return Poll::Ready(Ok(()));
            }
            if this.start < this.end && consumed > 0 {
                continue;
            }
            // Keep what is left, then read more behind it.
            this.input.copy_within(this.start..this.end, 0);
            this.end -= this.start;
            this.start = 0;
            if this.end == this.input.len() {
                // A full buffer the inflater makes nothing of: not DEFLATE data.
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "undecodable compressed input",
                )));
            }
            let mut read = ReadBuf::new(&mut this.input[this.end..]);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                this.input_done = true;
            }
            this.end += n;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Deflate<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.output.len() - this.written >= OUTPUT_HIGH_WATER {
            ready!(this.poll_drain(cx))?;
        }
        this.compress(data, FlushCompress::None)?;
        this.unflushed |= !data.is_empty();
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        // A sync flush makes everything written so far decodable; once per batch
        // of writes (a retried poll, the connection not ready, adds none).
        if this.unflushed {
            this.compress(&[], FlushCompress::Sync)?;
            this.unflushed = false;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// The other end with flate2's synchronous codec, flushing after each message
    /// the way clients do (Z_SYNC_FLUSH).
    fn client_compress(enc: &mut flate2::write::DeflateEncoder<Vec<u8>>, text: &[u8]) -> Vec<u8> {
        enc.write_all(text).unwrap();
        enc.flush().unwrap();
        std::mem::take(enc.get_mut())
    }

    #[tokio::test]
    async fn both_directions_decode_message_by_message() {
        let (server_side, mut client_side) = tokio::io::duplex(1 << 20);
        let mut server = Deflate::new(server_side);
        let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut dec = flate2::write::DeflateDecoder::new(Vec::new());

        for round in 0..50 {
            let command = format!("a{round} UID FETCH 1:* (FLAGS)\r\n");
            client_side.write_all(&client_compress(&mut enc, command.as_bytes())).await.unwrap();
            let mut got = vec![0; command.len()];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(got, command.as_bytes());

            let reply = format!("* {round} FETCH (FLAGS (\\Seen))\r\na{round} OK done\r\n").repeat(round + 1);
            server.write_all(reply.as_bytes()).await.unwrap();
            server.flush().await.unwrap();
            // Everything the flush sent decodes now, without waiting for more.
            let mut wire = vec![0; 1 << 16];
            let n = client_side.read(&mut wire).await.unwrap();
            dec.write_all(&wire[..n]).unwrap();
            dec.flush().unwrap();
            assert_eq!(std::mem::take(dec.get_mut()), reply.as_bytes());
        }
    }

    #[tokio::test]
    async fn a_bomb_comes_out_no_faster_than_it_is_read() {
        let (server_side, mut client_side) = tokio::io::duplex(1 << 20);
        let mut server = Deflate::new(server_side);
        let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        // 64 MiB of zeros compress to a few tens of KiB.
        let bomb = client_compress(&mut enc, &vec![0u8; 64 << 20]);
        assert!(bomb.len() < 200 * 1024, "{}", bomb.len());
        client_side.write_all(&bomb).await.unwrap();
        let mut small = [0u8; 4096];
        let n = server.read(&mut small).await.unwrap();
        assert!(n > 0 && n <= small.len());
        assert!(small[..n].iter().all(|&b| b == 0));
    }

    #[tokio::test]
    async fn garbage_is_an_error_not_a_hang() {
        let (server_side, mut client_side) = tokio::io::duplex(1 << 16);
        let mut server = Deflate::new(server_side);
        client_side.write_all(&[0xff; 64]).await.unwrap();
        drop(client_side);
        let mut buf = [0u8; 64];
        let r = server.read(&mut buf).await;
        assert!(r.is_err() || r.unwrap() == 0, "undecodable input ends the read");
        // And the sync reader agrees the bytes are not DEFLATE.
        let mut d = flate2::read::DeflateDecoder::new(&[0xffu8; 64][..]);
        assert!(d.read_to_end(&mut Vec::new()).is_err());
    }
}
