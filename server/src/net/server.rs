//! The accept loops and the SIGTERM drain.
//!
//! Shape (after mini-redis' `server.rs`): one task per listener accepts and spawns
//! one task per session. A [`ShutdownController`] is the single switch: when it
//! fires, every accept loop closes its listening socket (new connections are refused
//! by the kernel, so the Service routes them to other pods), every session sees its
//! [`Shutdown`] signal and says goodbye in protocol, and each listener waits for its
//! sessions for the grace period, then aborts the rest (dropping a session closes
//! its socket).
//!
//! Live sessions are tracked in a `JoinSet` per listener rather than with the
//! mpsc-sender-drop trick: the set gives both "wait until empty" and "abort what is
//! left", and reaping finished tasks in the accept loop keeps it as small as the
//! number of open connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::kernel::{MAX_LINGERING, raise_nofile_limit};
use super::listener::{
    ConnCounter, GaugeGuard, Listener, ListenerSpec, PerIpCounter, TlsMode, configure_accepted,
};
use super::{ConnInfo, Protocol, SessionCtx, SessionStream, Shutdown, TlsProvider, proxy};
use crate::metrics::Metrics;

/// The process-wide drain switch. Cheap to clone; all clones share the state.
#[derive(Clone, Debug)]
pub struct ShutdownController {
    tx: Arc<watch::Sender<bool>>,
    grace: Duration,
}

impl ShutdownController {
    /// `grace`: how long sessions get after the signal before they are aborted
    /// (`shutdown_grace_secs`).
    pub fn new(grace: Duration) -> ShutdownController {
        let (tx, _) = watch::channel(false);
        ShutdownController { tx: Arc::new(tx), grace }
    }

    /// Starts the drain (idempotent).
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// True once the drain started: `/readyz` answers 503 from then on.
    pub fn is_draining(&self) -> bool {
        *self.tx.borrow()
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// The signal sessions watch.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown { rx: self.tx.subscribe() }
    }

    /// Resolves once the drain started.
    pub async fn triggered(&self) {
        self.subscribe().signalled().await;
    }

    /// Waits for SIGTERM (Kubernetes) or SIGINT (a terminal), then triggers the drain.
    /// Also returns when the drain is triggered some other way. The handlers are
    /// installed when this is first polled; [`ShutdownController::spawn_signal_handler`]
    /// installs them at once.
    pub async fn wait_for_signal(&self) -> std::io::Result<()> {
        let signals = Signals::install()?;
        signals.wait(self).await;
        Ok(())
    }

    /// Installs the SIGTERM/SIGINT handlers now (from then on those signals no longer
    /// kill the process) and spawns a task that triggers the drain on the first one.
    pub fn spawn_signal_handler(&self) -> std::io::Result<tokio::task::JoinHandle<()>> {
        let signals = Signals::install()?;
        let this = self.clone();
        Ok(tokio::spawn(async move { signals.wait(&this).await }))
    }
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    async fn wait(mut self, shutdown: &ShutdownController) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM: draining"),
            _ = self.int.recv() => tracing::info!("SIGINT: draining"),
            _ = shutdown.triggered() => {}
        }
        shutdown.trigger();
    }
}

/// Binds every listener, then serves them until the drain completes (see [`serve`]).
/// A bind error (port taken, bad address) is returned before anything is served.
pub async fn run_listeners(
    listeners: Vec<(ListenerSpec, Arc<dyn Protocol>)>,
    tls: Option<TlsProvider>,
    metrics: Arc<Metrics>,
    shutdown: ShutdownController,
) -> std::io::Result<()> {
    let bound = listeners
        .into_iter()
        .map(|(spec, protocol)| Listener::bind(spec).map(|l| (l, protocol)))
        .collect::<std::io::Result<Vec<_>>>()?;
    serve(bound, tls, metrics, shutdown).await;
    Ok(())
}

/// Accepts on every listener until `shutdown` fires, then drains; returns when every
/// session has ended (by itself within the grace period, or aborted after it).
///
/// `tls` is required by [`TlsMode::Implicit`] listeners (without it their
/// connections are closed and an error is logged) and is handed to every session so
/// plain listeners can offer STARTTLS.
pub async fn serve(
    listeners: Vec<(Listener, Arc<dyn Protocol>)>,
    tls: Option<TlsProvider>,
    metrics: Arc<Metrics>,
    shutdown: ShutdownController,
) {
    raise_nofile_limit();
    let mut tasks = JoinSet::new();
    for (listener, protocol) in listeners {
        if listener.spec.tls == TlsMode::Implicit && tls.is_none() {
            tracing::error!(listener = listener.spec.name, "implicit-TLS listener without a certificate");
        }
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(listener = listener.spec.name, %addr, "listening");
        }
        let shared = Shared {
            spec: Arc::new(listener.spec.clone()),
            protocol,
            tls: tls.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            total: Arc::new(ConnCounter::default()),
            per_ip: Arc::new(PerIpCounter::default()),
            lingering: Arc::new(ConnCounter::default()),
        };
        tasks.spawn(accept_loop(listener, shared));
    }
    while let Some(res) = tasks.join_next().await {
        if let Err(e) = res {
            tracing::error!(error = %e, "listener task failed");
        }
    }
}

/// What one listener's sessions share.
#[derive(Clone)]
struct Shared {
    spec: Arc<ListenerSpec>,
    protocol: Arc<dyn Protocol>,
    tls: Option<TlsProvider>,
    metrics: Arc<Metrics>,
    shutdown: ShutdownController,
    total: Arc<ConnCounter>,
    per_ip: Arc<PerIpCounter>,
    /// Refused connections still being closed politely (see [`refuse`]).
    lingering: Arc<ConnCounter>,
}

/// Longest pause after failed accepts (EMFILE and friends); retrying at once would
/// spin a core while descriptors are exhausted.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

async fn accept_loop(listener: Listener, shared: Shared) {
    let name = shared.spec.name;
    let mut sessions = JoinSet::new();
    let mut stop = shared.shutdown.subscribe();
    let mut backoff = Duration::from_millis(5);
    let Listener { socket, .. } = listener;
    loop {
        tokio::select! {
            biased;
            _ = stop.signalled() => break,
            Some(res) = sessions.join_next(), if !sessions.is_empty() => log_session_end(name, res),
            accepted = socket.accept() => match accepted {
                Ok((tcp, peer)) => {
                    backoff = Duration::from_millis(5);
                    admit(&shared, &mut sessions, tcp, peer);
                }
                // The client gave up between SYN and accept: nothing to do.
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) => {}
                Err(e) => {
                    tracing::warn!(listener = name, error = %e, ?backoff, "accept failed");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.signalled() => break,
                    }
                    backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                }
            },
        }
    }
    // Connections the kernel has already completed sit in the backlog; closing the
    // socket would reset them (a client that saw its connect succeed, then a RST).
    // They are taken now and, the drain being signalled, their sessions open with
    // the protocol's goodbye (SMTP 421, IMAP BYE, POP3 -ERR): a client retries.
    let queued = take_backlog(socket, &shared, &mut sessions);
    // From here on the kernel refuses new connections to this pod instead of
    // queueing them in a backlog nobody reads.
    let open = sessions.len();
    if open > 0 || queued > 0 {
        tracing::info!(listener = name, sessions = open, queued, "draining");
    }
    let deadline = tokio::time::Instant::now() + shared.shutdown.grace();
    while !sessions.is_empty() {
        match tokio::time::timeout_at(deadline, sessions.join_next()).await {
            Ok(Some(res)) => log_session_end(name, res),
            Ok(None) => break,
            Err(_) => {
                tracing::warn!(listener = name, sessions = sessions.len(), "grace period over; closing");
                sessions.abort_all();
                while let Some(res) = sessions.join_next().await {
                    if let Err(e) = res
                        && e.is_panic()
                    {
                        tracing::error!(listener = name, error = %e, "session panicked");
                    }
                }
            }
        }
    }
}

/// Accepts every connection waiting in the backlog without waiting for more, then
/// closes the listening socket. Returns how many were taken.
fn take_backlog(socket: tokio::net::TcpListener, shared: &Shared, sessions: &mut JoinSet<()>) -> usize {
    let Ok(socket) = socket.into_std() else { return 0 };
    let mut taken = 0;
    // `into_std` leaves the socket non-blocking: `WouldBlock` means the backlog is empty.
    loop {
        match socket.accept() {
            Ok((tcp, peer)) => {
                if let Ok(tcp) = tcp.set_nonblocking(true).and_then(|()| TcpStream::from_std(tcp)) {
                    admit(shared, sessions, tcp, peer);
                    taken += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
            Err(_) => return taken,
        }
    }
}

fn log_session_end(listener: &'static str, res: Result<(), tokio::task::JoinError>) {
    if let Err(e) = res
        && e.is_panic()
    {
        tracing::error!(listener, error = %e, "session panicked");
    }
}

/// Admits or refuses a freshly accepted connection. Runs in the accept loop, so it
/// never awaits: anything slow happens in the spawned task.
fn admit(shared: &Shared, sessions: &mut JoinSet<()>, tcp: TcpStream, peer: SocketAddr) {
    let Some(slot) = shared.total.try_acquire(shared.spec.max_connections) else {
        refused(shared, "max_connections");
        let reply = shared.protocol.busy_reply();
        match shared.lingering.try_acquire(MAX_LINGERING) {
            Some(linger) => {
                let mode = shared.spec.tls;
                sessions.spawn(async move {
                    let _linger = linger;
                    refuse(tcp, mode, reply).await;
                });
            }
            // A fresh socket's send buffer is empty, so a one-line reply fits.
            None if shared.spec.tls == TlsMode::Plain => {
                let _ = tcp.try_write(reply);
            }
            None => {}
        }
        return;
    };
    let shared = shared.clone();
    sessions.spawn(async move {
        let _slot = slot;
        session(shared, tcp, peer).await;
    });
}

fn refused(shared: &Shared, reason: &str) {
    tracing::debug!(listener = shared.spec.name, reason, "connection refused");
    shared.metrics.connections_refused_total.with_label_values(&[shared.spec.name, reason]).inc();
}

/// Writes the protocol's busy reply and closes the way sessions do
/// ([`SessionStream::close`]: no RST to destroy the reply). Implicit-TLS clients cannot read a plaintext line, and completing a
/// handshake just to refuse would spend the CPU the cap protects, so they are only
/// closed.
async fn refuse(tcp: TcpStream, mode: TlsMode, reply: &'static [u8]) {
    if mode == TlsMode::Implicit {
        return;
    }
    let mut stream = SessionStream::Plain(tcp);
    // A fresh socket's send buffer is empty: the one-line reply never waits.
    if stream.write_all(reply).await.is_ok() {
        stream.close().await;
    }
}

async fn session(shared: Shared, mut tcp: TcpStream, peer: SocketAddr) {
    let spec = &shared.spec;
    // On a dual-stack `[::]` listener IPv4 clients appear as ::ffff:a.b.c.d; sessions,
    // logs and per-IP limits should see the plain IPv4 address.
    let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
    configure_accepted(&tcp, spec.keepalive);
    let local = tcp.local_addr().unwrap_or(peer);

    let remote = match &spec.proxy {
        None => peer,
        Some(trusted) => {
            match proxy::accept_header(&mut tcp, peer, trusted, proxy::PROXY_HEADER_TIMEOUT).await {
                Ok(Some(client)) => client,
                Ok(None) => peer,
                Err(e) => {
                    tracing::debug!(listener = spec.name, %peer, error = %e, "PROXY header refused");
                    refused(&shared, "proxy");
                    return;
                }
            }
        }
    };

    let Some(_ip_slot) = shared.per_ip.try_acquire(remote.ip(), spec.max_connections_per_ip) else {
        refused(&shared, "max_connections_per_ip");
        refuse(tcp, spec.tls, shared.protocol.busy_reply()).await;
        return;
    };
    let _active = GaugeGuard::new(shared.metrics.connections_active.with_label_values(&[spec.name]));

    let stream = match spec.tls {
        TlsMode::Plain => SessionStream::Plain(tcp),
        TlsMode::Implicit => {
            let Some(tls) = &shared.tls else { return };
            match tls.accept(tcp).await {
                Ok(stream) => SessionStream::Tls(Box::new(stream)),
                Err(e) => {
                    tracing::debug!(listener = spec.name, %remote, error = %e, "TLS handshake failed");
                    return;
                }
            }
        }
    };
    let ctx = SessionCtx {
        conn: ConnInfo { remote, local, listener: spec.name },
        tls: shared.tls.clone(),
        shutdown: shared.shutdown.subscribe(),
    };
    shared.protocol.handle(stream, ctx).await;
}
