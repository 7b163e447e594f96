//! Minimal line-oriented SMTP / IMAP / POP3 clients over tokio.
//!
//! These are load-generator clients, not general-purpose libraries: they speak just
//! the commands the scenarios issue, keep one small read buffer per connection and
//! never hold a whole message or FETCH literal in memory (literals are read and
//! discarded, only their size is counted). Plain, implicit TLS and STARTTLS share one
//! [`Conn`] type so each protocol has a single code path.
//!
//! Every error is classified into a short, stable key ([`ClientError::key`]) because
//! the report counts errors by that key (`smtp-451`, `imap-NO`, `refused`, `tls`, ...).

pub mod imap;
pub mod pop3;
pub mod smtp;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf,
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub use crate::tls::TlsSettings;
pub use mailcluster_api::stress::TlsMode;

/// Longest response line accepted; a server sending more is broken or hostile and the
/// connection is dropped rather than growing the buffer.
pub const MAX_LINE: usize = 64 * 1024;

/// Why an operation failed, classified for the error counters.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection refused")]
    Refused,
    #[error("connect failed: {0}")]
    Connect(io::Error),
    #[error("TLS handshake failed: {0}")]
    Tls(io::Error),
    #[error("timed out")]
    Timeout,
    #[error("connection closed by server")]
    Closed,
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("SMTP reply {0}: {1}")]
    Smtp(u16, String),
    #[error("IMAP {0}: {1}")]
    Imap(String, String),
    #[error("POP3 -ERR {0}")]
    Pop3(String),
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// Stable key used to count errors by kind or reply code.
    pub fn key(&self) -> String {
        match self {
            ClientError::Refused => "refused".into(),
            ClientError::Connect(e) => format!("connect-{}", io_kind(e)),
            ClientError::Tls(_) => "tls".into(),
            ClientError::Timeout => "timeout".into(),
            ClientError::Closed => "closed".into(),
            ClientError::Io(e) => format!("io-{}", io_kind(e)),
            ClientError::Smtp(code, _) => format!("smtp-{code}"),
            ClientError::Imap(status, _) => format!("imap-{status}"),
            ClientError::Pop3(_) => "pop3-ERR".into(),
            ClientError::Protocol(_) => "protocol".into(),
        }
    }
}

fn io_kind(e: &io::Error) -> String {
    format!("{:?}", e.kind()).to_lowercase()
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// A TCP stream, possibly wrapped in TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Where to connect and how.
#[derive(Clone)]
pub struct Endpoint {
    pub address: String,
    pub tls_mode: TlsMode,
    pub tls: TlsSettings,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.address, self.tls_mode)
    }
}

/// A buffered connection. Reads go through a `BufReader` (so a response of many
/// short lines costs one syscall); writes go straight to the stream, and every
/// command is written with a single `write_all` so it leaves in one segment.
pub struct Conn {
    io: BufReader<Stream>,
    line: Vec<u8>,
}

impl Conn {
    /// TCP connect (+ TLS handshake for implicit TLS).
    pub async fn connect(ep: &Endpoint) -> Result<Conn> {
        let tcp = TcpStream::connect(&ep.address).await.map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => ClientError::Refused,
            _ => ClientError::Connect(e),
        })?;
        // Commands are small and latency-bound; Nagle would add up to 40 ms per
        // round trip against delayed ACKs.
        let _ = tcp.set_nodelay(true);
        let stream = match ep.tls_mode {
            TlsMode::Implicit => Stream::Tls(Box::new(handshake(tcp, &ep.tls).await?)),
            _ => Stream::Plain(tcp),
        };
        Ok(Conn { io: BufReader::with_capacity(8 * 1024, stream), line: Vec::with_capacity(256) })
    }

    /// Replace the plain stream by TLS after a successful STARTTLS/STLS reply.
    pub async fn upgrade(self, tls: &TlsSettings) -> Result<Conn> {
        // Anything the server sent after its STARTTLS reply would be a plaintext
        // injection; refuse rather than feed it into the TLS layer.
        if !self.io.buffer().is_empty() {
            return Err(ClientError::Protocol("data after STARTTLS reply".into()));
        }
        let line = self.line;
        match self.io.into_inner() {
            Stream::Plain(tcp) => {
                let tls = handshake(tcp, tls).await?;
                Ok(Conn { io: BufReader::with_capacity(8 * 1024, Stream::Tls(Box::new(tls))), line })
            }
            Stream::Tls(_) => Err(ClientError::Protocol("STARTTLS on a TLS connection".into())),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self.io.get_ref(), Stream::Tls(_))
    }

    pub async fn write_all(&mut self, data: &[u8]) -> Result<()> {
        let stream = self.io.get_mut();
        stream.write_all(data).await?;
        // TLS: a write that met a full socket leaves records queued inside rustls;
        // only a flush sends them (a later read does not).
        stream.flush().await?;
        Ok(())
    }

    /// Write several buffers as one (vectored where the stream supports it), so a
    /// short header in front of a large pooled body costs no extra segment or copy.
    pub async fn write_all_parts(&mut self, parts: &[&[u8]]) -> Result<()> {
        let stream = self.io.get_mut();
        let (mut i, mut off) = (0, 0);
        while i < parts.len() {
            if off >= parts[i].len() {
                i += 1;
                off = 0;
                continue;
            }
            let mut slices = Vec::with_capacity(parts.len() - i);
            slices.push(io::IoSlice::new(&parts[i][off..]));
            slices.extend(parts[i + 1..].iter().map(|p| io::IoSlice::new(p)));
            let mut n = stream.write_vectored(&slices).await?;
            if n == 0 {
                return Err(ClientError::Io(io::ErrorKind::WriteZero.into()));
            }
            // Advance over what was written, possibly several parts.
            while n > 0 && i < parts.len() {
                let left = parts[i].len() - off;
                if n < left {
                    off += n;
                    n = 0;
                } else {
                    n -= left;
                    i += 1;
                    off = 0;
                }
            }
        }
        // See `write_all`: without it the tail of the body can stay in rustls.
        stream.flush().await?;
        Ok(())
    }

    /// Read one line (with its CRLF) into the internal buffer and return it.
    pub async fn read_line(&mut self) -> Result<&[u8]> {
        self.line.clear();
        let n = (&mut self.io).take(MAX_LINE as u64).read_until(b'\n', &mut self.line).await?;
        if n == 0 {
            return Err(ClientError::Closed);
        }
        if self.line.last() != Some(&b'\n') {
            if n >= MAX_LINE {
                return Err(ClientError::Protocol("response line too long".into()));
            }
            return Err(ClientError::Closed);
        }
        Ok(&self.line)
    }

    /// Read and discard exactly `n` bytes (a literal or message body).
    pub async fn skip_exact(&mut self, mut n: u64) -> Result<()> {
        while n > 0 {
            let buf = self.io.fill_buf().await?;
            if buf.is_empty() {
                return Err(ClientError::Closed);
            }
            let take = (buf.len() as u64).min(n) as usize;
            self.io.consume(take);
            n -= take as u64;
        }
        Ok(())
    }

    pub async fn shutdown(&mut self) {
        let _ = self.io.get_mut().shutdown().await;
    }

    /// Between commands nothing is due from the server, so anything readable now —
    /// an unsolicited 421 (RFC 5321 §3.8, a server draining), end of stream, an
    /// error — means it has closed the session. Never waits.
    pub fn server_hung_up(&mut self) -> bool {
        if !self.io.buffer().is_empty() {
            return true;
        }
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::pin::Pin::new(&mut self.io).poll_fill_buf(&mut cx).is_ready()
    }
}

async fn handshake(tcp: TcpStream, tls: &TlsSettings) -> Result<TlsStream<TcpStream>> {
    let connector = TlsConnector::from(Arc::clone(&tls.config));
    connector.connect(tls.server_name.clone(), tcp).await.map_err(ClientError::Tls)
}

/// Text of a response line without CRLF, lossy, for error messages.
pub(crate) fn text(line: &[u8]) -> String {
    let end = line.iter().rposition(|b| !matches!(b, b'\r' | b'\n')).map_or(0, |i| i + 1);
    String::from_utf8_lossy(&line[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::net::TcpSocket;

    /// A body written while the socket is full leaves its tail as TLS records inside
    /// rustls (`poll_write` reports the plaintext accepted, not sent). Without a
    /// flush the server never sees the end of the message and both sides wait.
    #[tokio::test]
    async fn tls_body_written_against_slow_reader_reaches_the_server() {
        let acceptor = crate::sink::self_signed_acceptor().unwrap();
        let sock = TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = sock.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();

        let mut body = vec![b'x'; 1024 * 1024];
        body.extend_from_slice(b"\r\n.\r\n");
        let total = body.len();

        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let mut got = Vec::with_capacity(total);
            let mut buf = vec![0u8; 4096];
            // A slow reader keeps the client's socket full until the last write.
            while !got.ends_with(b"\r\n.\r\n") {
                let n = tls.read(&mut buf).await.unwrap();
                assert!(n > 0, "client closed early");
                got.extend_from_slice(&buf[..n]);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            tls.write_all(b"250 ok\r\n").await.unwrap();
            tls.flush().await.unwrap();
            got.len()
        });

        // A small send buffer so the body cannot all sit in the kernel: the last
        // writes meet a full socket, as on a real 1500-MTU path.
        let client = TcpSocket::new_v4().unwrap();
        client.set_send_buffer_size(4096).unwrap();
        let tcp = client.connect(addr).await.unwrap();
        let settings = TlsSettings::new("localhost", false, None).unwrap();
        let stream = Stream::Tls(Box::new(handshake(tcp, &settings).await.unwrap()));
        let mut conn = Conn { io: BufReader::new(stream), line: Vec::new() };
        conn.write_all_parts(&[b"header\r\n", &body[..]]).await.unwrap();
        let line = tokio::time::timeout(Duration::from_secs(5), conn.read_line())
            .await
            .expect("reply never came: the end of the body stayed buffered in TLS")
            .unwrap()
            .to_vec();
        assert_eq!(line, b"250 ok\r\n");
        assert_eq!(server.await.unwrap(), total + 8);
    }
}
