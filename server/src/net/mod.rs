//! Listeners, TLS, PROXY protocol, connection limits and graceful shutdown.
//!
//! Protocol sessions are written against [`SessionStream`]: a plain TCP stream, an
//! implicit-TLS stream, and a plain stream upgraded with STARTTLS all present the
//! same type, so one session code path serves all three and tests can drive a
//! session over an in-memory duplex.
//!
//! Wiring (what `serve` does):
//!
//! ```ignore
//! let shutdown = ShutdownController::new(Duration::from_secs(config.shutdown_grace_secs));
//! shutdown.spawn_signal_handler()?;                       // SIGTERM/SIGINT -> drain
//! let tls = TlsProvider::from_app_config(&config, cache.clone(), &metrics).await?;
//! let listeners = vec![
//!     (Listener::bind(ListenerSpec::from_config("smtp", config.ports.smtp, TlsMode::Plain, &config))?,
//!      smtp_protocol as Arc<dyn Protocol>),
//!     (Listener::bind(ListenerSpec::from_config("imaps", config.ports.imaps, TlsMode::Implicit, &config))?,
//!      imap_protocol),
//! ];
//! let admin = admin::bind(SocketAddr::new(config.listen_addr, config.ports.admin)).await?;
//! let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
//! let admin_task = tokio::spawn(admin::serve_admin(
//!     admin,
//!     AdminState::new(store, cache, metrics.clone(), shutdown.clone()),
//!     async { let _ = admin_stopped.await; },
//! ));
//! net::serve(listeners, Some(tls), metrics, shutdown).await; // returns after the drain
//! let _ = stop_admin.send(());                                // admin goes last
//! admin_task.await??;
//! ```

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The connection a session reads and writes.
pub enum SessionStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// In-memory, for tests.
    Memory(DuplexStream),
    /// Any of the above after IMAP COMPRESS=DEFLATE.
    Deflate(Box<deflate::Deflate<SessionStream>>),
}

impl SessionStream {
    pub fn is_tls(&self) -> bool {
        match self {
            SessionStream::Tls(_) => true,
            SessionStream::Deflate(d) => d.get_ref().is_tls(),
            _ => false,
        }
    }

    pub fn is_compressed(&self) -> bool {
        matches!(self, SessionStream::Deflate(_))
    }

    /// DEFLATE from here on in both directions (IMAP COMPRESS). Called after the
    /// command's OK has been flushed uncompressed.
    pub fn compress(self) -> SessionStream {
        SessionStream::Deflate(Box::new(deflate::Deflate::new(self)))
    }

    /// Ends a session: half-closes, then reads and drops what the client still
    /// sends until it closes too, for at most [`CLOSE_LINGER`] and
    /// [`CLOSE_LINGER_BYTES`]. Closing a socket with unread input makes the kernel
    /// send a RST, and a RST destroys the last reply — the drain's 421, the BYE —
    /// when it reaches the client before the client has read it: a client that
    /// pipelined commands behind that reply would see the connection vanish
    /// instead of being told to come back later.
    pub async fn close(&mut self) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = tokio::time::timeout(CLOSE_LINGER, async {
            self.shutdown().await?;
            let mut sink = [0u8; 1024];
            let mut left = CLOSE_LINGER_BYTES;
            while left > 0 {
                let n = self.read(&mut sink).await?;
                if n == 0 {
                    break;
                }
                left = left.saturating_sub(n);
            }
            std::io::Result::Ok(())
        })
        .await;
    }
}

/// How long [`SessionStream::close`] waits for the client to close its side.
pub const CLOSE_LINGER: std::time::Duration = std::time::Duration::from_secs(2);
/// How much late input [`SessionStream::close`] reads and drops before giving up.
pub const CLOSE_LINGER_BYTES: usize = 256 * 1024;

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            SessionStream::Plain($s) => $e,
            SessionStream::Tls($s) => $e,
            SessionStream::Memory($s) => $e,
            SessionStream::Deflate($s) => $e,
        }
    };
}

impl AsyncRead for SessionStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        delegate!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for SessionStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        delegate!(self, s => Pin::new(s).poll_write(cx, buf))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        delegate!(self, s => Pin::new(s).poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        delegate!(self, s => Pin::new(s).poll_shutdown(cx))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        delegate!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            SessionStream::Plain(s) => s.is_write_vectored(),
            SessionStream::Tls(s) => s.is_write_vectored(),
            SessionStream::Memory(s) => s.is_write_vectored(),
            SessionStream::Deflate(s) => s.is_write_vectored(),
        }
    }
}

/// What a session knows about its connection when it starts.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client as seen after the PROXY header (if any was accepted).
    pub remote: SocketAddr,
    pub local: SocketAddr,
    /// Which listener accepted it (e.g. "smtp", "submission", "imaps").
    pub listener: &'static str,
}

pub mod budget;
pub mod deflate;
pub mod input;
pub mod kernel;
pub mod listener;
pub mod output;
pub mod proxy;
pub mod server;
pub mod tls;

pub use kernel::raise_nofile_limit;
pub use listener::{Keepalive, Listener, ListenerSpec, TlsMode};
pub use server::{ShutdownController, run_listeners, serve};
pub use tls::{TLS_HANDSHAKE_TIMEOUT, TlsProvider};

impl SessionStream {
    /// STARTTLS / STLS: performs the server side of a TLS handshake on a plain
    /// stream. Called after the protocol's "go ahead" reply has been flushed and any
    /// bytes the client pipelined after the command have been discarded (RFC 3207 §4.2).
    /// Bounded by [`TLS_HANDSHAKE_TIMEOUT`] and counted like implicit-TLS handshakes.
    pub async fn upgrade(self, tls: &TlsProvider) -> std::io::Result<SessionStream> {
        match self {
            SessionStream::Plain(tcp) => {
                let tls_stream = tls.accept(tcp).await?;
                Ok(SessionStream::Tls(Box::new(tls_stream)))
            }
            SessionStream::Tls(_) => Err(std::io::Error::other("TLS already active")),
            SessionStream::Memory(_) => Err(std::io::Error::other("in-memory streams cannot start TLS")),
            SessionStream::Deflate(_) => Err(std::io::Error::other("TLS cannot start inside compression")),
        }
    }
}

/// A signal every session watches: when it fires, the session says goodbye in its
/// protocol (`421`, `* BYE`, `-ERR`) and closes.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: tokio::sync::watch::Receiver<bool>,
}

impl Shutdown {
    pub fn new() -> (tokio::sync::watch::Sender<bool>, Shutdown) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (tx, Shutdown { rx })
    }
    pub fn is_signalled(&self) -> bool {
        *self.rx.borrow()
    }
    /// Resolves once shutdown has been requested (immediately if it already was).
    pub async fn signalled(&mut self) {
        // An error means the sender is gone, which also means "stop".
        let _ = self.rx.wait_for(|stop| *stop).await;
    }
}

/// Everything a protocol session gets from the network layer.
pub struct SessionCtx {
    pub conn: ConnInfo,
    /// Present when a certificate is configured: enables STARTTLS/STLS.
    pub tls: Option<TlsProvider>,
    pub shutdown: Shutdown,
}

/// A protocol served on a listener. Implementations own the whole connection.
#[async_trait::async_trait]
pub trait Protocol: Send + Sync + 'static {
    /// Called when the listener is full: write a one-line protocol refusal
    /// (`421 4.7.0 …`, `* BYE …`, `-ERR [SYS/TEMP] …`) before the socket is closed.
    fn busy_reply(&self) -> &'static [u8];
    async fn handle(&self, stream: SessionStream, ctx: SessionCtx);
}
