//! Listening sockets and the per-listener connection limits.
//!
//! Limits follow Stalwart's shape rather than mini-redis': mini-redis takes a
//! semaphore permit *before* `accept`, so a full server simply stops accepting and
//! clients wait in the kernel backlog until they time out. A mail client is better
//! served by an immediate protocol-level "try later" (`421`, `* BYE`, `-ERR`), so we
//! always accept, count the connection with a drop guard, and refuse at once when
//! the count is over the cap.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpStream};

use crate::config::Config;

/// How a listener speaks TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP; the protocol offers STARTTLS/STLS when a [`super::TlsProvider`]
    /// exists.
    Plain,
    /// TLS from the first byte (465, 993, 995).
    Implicit,
}

/// One listening port and its limits.
#[derive(Debug, Clone)]
pub struct ListenerSpec {
    /// Listener name: `ConnInfo.listener` and the `protocol` label of
    /// `mail_connections_active` (e.g. "smtp", "submissions", "imaps").
    pub name: &'static str,
    pub addr: SocketAddr,
    pub tls: TlsMode,
    /// Connections over this are refused at once with the protocol's busy reply.
    pub max_connections: usize,
    /// Per client IP (after PROXY), 0 = unlimited.
    pub max_connections_per_ip: usize,
    /// Given to `listen`; the kernel caps it at `net.core.somaxconn`.
    pub backlog: u32,
    /// TCP keepalive of accepted sockets; `None` sends no probes.
    pub keepalive: Option<Keepalive>,
    /// `Some(trusted CIDRs)`: every connection must start with a PROXY header from
    /// one of these peers.
    pub proxy: Option<Vec<IpNet>>,
}

/// When accepted sockets probe an idle peer. Set on each socket, these win over
/// the pod's `net.ipv4.tcp_keepalive_*` sysctls, so the operator writes the
/// cluster's tuning into both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe.
    pub idle: Duration,
    /// Time between probes.
    pub interval: Duration,
}

impl ListenerSpec {
    /// A listener on `config.listen_addr:port` with the limits of `[net]`, and
    /// for IMAP and POP3 the per-IP cap of their own section too (SMTP's is kept
    /// by its sessions): the smaller one that is set.
    pub fn from_config(name: &'static str, port: u16, tls: TlsMode, config: &Config) -> ListenerSpec {
        let net = &config.net;
        let own = match name {
            "imap" | "imaps" => config.imap.max_connections_per_ip,
            "pop3" | "pop3s" => config.pop3.max_connections_per_ip,
            "managesieve" => config.sieve.max_connections_per_ip,
            _ => 0,
        };
        let max_connections_per_ip = match (net.max_connections_per_ip, own) {
            (0, n) | (n, 0) => n,
            (a, b) => a.min(b),
        };
        ListenerSpec {
            name,
            addr: SocketAddr::new(config.listen_addr, port),
            tls,
            max_connections: net.max_connections,
            max_connections_per_ip,
            backlog: super::kernel::listen_backlog(config).requested,
            keepalive: (net.tcp_keepalive_secs > 0).then(|| Keepalive {
                idle: Duration::from_secs(net.tcp_keepalive_secs),
                interval: Duration::from_secs(net.tcp_keepalive_interval_secs),
            }),
            proxy: net.proxy_protocol.enabled.then(|| net.proxy_protocol.trusted_cidrs.clone()),
        }
    }
}

/// A bound, listening socket. Binding is separate from serving so that `serve` can
/// fail fast on a taken port before it reports ready, and tests can bind port 0 and
/// read the port back.
pub struct Listener {
    pub(crate) spec: ListenerSpec,
    pub(crate) socket: TcpListener,
}

impl Listener {
    /// SO_REUSEADDR (restart while old connections sit in TIME_WAIT), SO_REUSEPORT
    /// (several processes may share a port and the kernel spreads connections),
    /// the configured backlog, non-blocking for tokio. Needs a tokio runtime.
    pub fn bind(spec: ListenerSpec) -> std::io::Result<Listener> {
        let socket = Socket::new(Domain::for_address(spec.addr), Type::STREAM, Some(socket2::Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&spec.addr.into()).map_err(|e| {
            std::io::Error::new(e.kind(), format!("binding {} listener to {}: {e}", spec.name, spec.addr))
        })?;
        socket.listen(spec.backlog.min(i32::MAX as u32) as i32)?;
        let socket = TcpListener::from_std(socket.into())?;
        Ok(Listener { spec, socket })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    pub fn spec(&self) -> &ListenerSpec {
        &self.spec
    }
}

/// Options for accepted sockets: no Nagle delay (replies are small and latency is
/// what clients measure), keepalive so dead peers behind NAT are noticed.
pub(crate) fn configure_accepted(tcp: &TcpStream, keepalive: Option<Keepalive>) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY");
    }
    if let Some(k) = keepalive {
        let params = TcpKeepalive::new().with_time(k.idle).with_interval(k.interval);
        if let Err(e) = SockRef::from(tcp).set_tcp_keepalive(&params) {
            tracing::debug!(error = %e, "SO_KEEPALIVE");
        }
    }
}

/// Counts open connections of one listener; a [`CountGuard`] gives its slot back on
/// drop, however the session ends (return, error, panic, abort).
#[derive(Debug, Default)]
pub(crate) struct ConnCounter {
    active: AtomicUsize,
}

pub(crate) struct CountGuard {
    counter: Arc<ConnCounter>,
}

impl ConnCounter {
    pub(crate) fn try_acquire(self: &Arc<Self>, max: usize) -> Option<CountGuard> {
        // Increment first, then check: concurrent accepts can never both squeeze in.
        let previous = self.active.fetch_add(1, Ordering::AcqRel);
        let guard = CountGuard { counter: self.clone() };
        (previous < max).then_some(guard)
    }

    #[cfg(test)]
    fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

impl Drop for CountGuard {
    fn drop(&mut self) {
        self.counter.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Open connections per client IP of one listener. Entries disappear at zero, so the
/// map holds only IPs that are connected right now.
#[derive(Debug, Default)]
pub(crate) struct PerIpCounter {
    by_ip: Mutex<HashMap<IpAddr, usize>>,
}

pub(crate) struct IpGuard {
    counter: Arc<PerIpCounter>,
    ip: IpAddr,
}

impl PerIpCounter {
    pub(crate) fn try_acquire(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<IpGuard> {
        let mut map = self.by_ip.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let n = map.entry(ip).or_insert(0);
        if max != 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(IpGuard { counter: self.clone(), ip })
    }
}

impl Drop for IpGuard {
    fn drop(&mut self) {
        let mut map = self.counter.by_ip.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// `mail_connections_active{protocol}` up while a session runs, down on drop.
pub(crate) struct GaugeGuard(prometheus::IntGauge);

impl GaugeGuard {
    pub(crate) fn new(gauge: prometheus::IntGauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imap_and_pop3_listeners_take_the_smaller_per_ip_cap() {
        let mut config = Config::default();
        let cap = |name, config: &Config| {
            ListenerSpec::from_config(name, 0, TlsMode::Plain, config).max_connections_per_ip
        };
        assert_eq!((cap("imaps", &config), cap("pop3", &config), cap("smtp", &config)), (256, 256, 0));
        config.net.max_connections_per_ip = 10;
        config.pop3.max_connections_per_ip = 0;
        assert_eq!((cap("imap", &config), cap("pop3s", &config), cap("submission", &config)), (10, 10, 10));
    }

    #[test]
    fn counters_refuse_over_cap_and_release_on_drop() {
        let c = Arc::new(ConnCounter::default());
        let a = c.try_acquire(2);
        let b = c.try_acquire(2);
        assert!(a.is_some() && b.is_some());
        assert!(c.try_acquire(2).is_none());
        assert_eq!(c.active(), 2, "a refused attempt gives its slot back");
        drop(a);
        assert!(c.try_acquire(2).is_some());

        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        let other: IpAddr = "192.0.2.2".parse().expect("ip");
        let p = Arc::new(PerIpCounter::default());
        let g1 = p.try_acquire(ip, 1);
        assert!(g1.is_some());
        assert!(p.try_acquire(ip, 1).is_none());
        assert!(p.try_acquire(other, 1).is_some());
        drop(g1);
        assert!(p.try_acquire(ip, 1).is_some());
        assert!(p.by_ip.lock().expect("lock").is_empty());
        assert!(p.try_acquire(ip, 0).is_some(), "0 means unlimited");
    }
}
