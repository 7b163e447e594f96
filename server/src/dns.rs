//! The resolver of MX lookups (relay) and sender authentication (inbound): one
//! `mail-auth` authenticator over hickory-resolver, pointed at `dns.nameservers`
//! (or the system's), with this pod's caches of the answers, each kept no longer
//! than its TTL.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mail_auth::hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use mail_auth::{
    DnsError, Error as AuthError, IpLookupStrategy, MX, MessageAuthenticator, Parameters, RecordSet,
    ResolverCache, Txt,
};

use mailcluster_api::config::DnsConfig;

/// Longest a "no such name / no such record" answer is kept.
const NEGATIVE_MAX_TTL: Duration = Duration::from_secs(600);

/// Answers of one record type, at most `capacity`, each until its TTL ends.
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        TtlCache { entries: Mutex::new(HashMap::new()), capacity: capacity.max(1) }
    }
}

impl<K: Hash + Eq, V: Clone> ResolverCache<K, V> for TtlCache<K, V> {
    fn get<Q>(&self, name: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get(name) {
            Some((value, until)) if *until > Instant::now() => Some(value.clone()),
            Some(_) => {
                entries.remove(name);
                None
            }
            None => None,
        }
    }

    fn remove<Q>(&self, name: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(name).map(|(v, _)| v)
    }

    fn insert(&self, key: K, value: V, valid_until: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= self.capacity {
            // Full: drop what has expired; still full, drop everything (answers are
            // cheap to ask again, and a bounded map matters more than a hit rate).
            let now = Instant::now();
            entries.retain(|_, (_, until)| *until > now);
            if entries.len() >= self.capacity {
                entries.clear();
            }
        }
        entries.insert(key, (value, valid_until));
    }
}

pub struct Caches {
    pub txt: TtlCache<Box<str>, Txt>,
    pub mx: TtlCache<Box<str>, RecordSet<MX>>,
    pub ipv4: TtlCache<Box<str>, RecordSet<Ipv4Addr>>,
    pub ipv6: TtlCache<Box<str>, RecordSet<Ipv6Addr>>,
    pub ptr: TtlCache<IpAddr, RecordSet<Box<str>>>,
}

/// The resolver with its caches.
pub struct Dns {
    pub authenticator: MessageAuthenticator,
    pub caches: Caches,
}

/// Where mail for a domain goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Exchanges in preference order (equal preferences in the order DNS gave).
    Hosts(Vec<String>),
    /// The domain publishes a null MX (RFC 7505): it accepts no mail.
    NullMx,
    /// The domain does not exist or has neither MX nor address records.
    NoSuchDomain,
}

/// A lookup that did not get an answer: a temporary condition.
#[derive(Debug, Clone, thiserror::Error)]
#[error("DNS lookup failed: {0}")]
pub struct DnsFailure(pub String);

type CachedParams<'x, P> = Parameters<
    'x,
    P,
    TtlCache<Box<str>, Txt>,
    TtlCache<Box<str>, RecordSet<MX>>,
    TtlCache<Box<str>, RecordSet<Ipv4Addr>>,
    TtlCache<Box<str>, RecordSet<Ipv6Addr>>,
    TtlCache<IpAddr, RecordSet<Box<str>>>,
>;

impl Dns {
    pub fn from_config(config: &DnsConfig) -> anyhow::Result<Dns> {
        let mut opts = ResolverOpts::default();
        opts.timeout = Duration::from_millis(config.timeout_ms);
        opts.attempts = config.attempts;
        // mail-auth caches the answers it gets (the caches below) but never a "no
        // such record": without the resolver's own cache every message from a
        // domain that publishes no DMARC record, or signs with no key, asks again.
        // The resolver keeps negative answers for the zone's SOA minimum (RFC 2308),
        // at most NEGATIVE_MAX_TTL so a record published later is seen soon.
        opts.cache_size = config.cache_entries as u64;
        opts.negative_max_ttl = Some(NEGATIVE_MAX_TTL);
        let authenticator = if config.nameservers.is_empty() {
            let (conf, mut sys_opts) = mail_auth::hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| anyhow::anyhow!("cannot read the system's resolver configuration: {e}"))?;
            sys_opts.timeout = opts.timeout;
            sys_opts.attempts = opts.attempts;
            sys_opts.cache_size = opts.cache_size;
            sys_opts.negative_max_ttl = opts.negative_max_ttl;
            MessageAuthenticator::new(conf, sys_opts)
        } else {
            let servers = config
                .nameservers
                .iter()
                .map(|addr| {
                    let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                    for c in &mut ns.connections {
                        c.port = addr.port();
                    }
                    ns
                })
                .collect();
            MessageAuthenticator::new(ResolverConfig::from_name_servers(servers), opts)
        }
        .map_err(|e| anyhow::anyhow!("cannot start the DNS resolver: {e}"))?;
        let n = config.cache_entries;
        Ok(Dns {
            authenticator,
            caches: Caches {
                txt: TtlCache::new(n),
                mx: TtlCache::new(n),
                ipv4: TtlCache::new(n),
                ipv6: TtlCache::new(n),
                ptr: TtlCache::new(n),
            },
        })
    }

    /// `params` with this resolver's caches.
    pub fn params<'x, P>(&'x self, params: P) -> CachedParams<'x, P> {
        Parameters::new(params)
            .with_txt_cache(&self.caches.txt)
            .with_mx_cache(&self.caches.mx)
            .with_ipv4_cache(&self.caches.ipv4)
            .with_ipv6_cache(&self.caches.ipv6)
            .with_ptr_cache(&self.caches.ptr)
    }

    /// The mail exchanges of `domain` (RFC 5321 §5.1), at most `max_hosts`: MX
    /// records by preference; none → the domain itself when it has an address
    /// (the implicit MX); a single "." MX → null MX.
    pub async fn route(&self, domain: &str, max_hosts: usize) -> Result<Route, DnsFailure> {
        match self.authenticator.mx_lookup(domain, Some(&self.caches.mx)).await {
            Ok(set) => {
                let mut hosts = Vec::new();
                for mx in set.rrset.iter() {
                    for exchange in mx.exchanges.iter() {
                        hosts.push(exchange.trim_end_matches('.').to_ascii_lowercase());
                    }
                }
                if hosts.len() == 1 && hosts[0].is_empty() {
                    return Ok(Route::NullMx);
                }
                hosts.retain(|h| !h.is_empty());
                if hosts.is_empty() {
                    return self.implicit_mx(domain).await;
                }
                hosts.dedup();
                hosts.truncate(max_hosts);
                Ok(Route::Hosts(hosts))
            }
            Err(e) if is_nxdomain(&e) => Ok(Route::NoSuchDomain),
            Err(e) if is_no_records(&e) => self.implicit_mx(domain).await,
            Err(e) => Err(DnsFailure(e.to_string())),
        }
    }

    async fn implicit_mx(&self, domain: &str) -> Result<Route, DnsFailure> {
        match self.addresses(domain).await {
            Ok(addrs) if !addrs.is_empty() => Ok(Route::Hosts(vec![domain.to_ascii_lowercase()])),
            Ok(_) => Ok(Route::NoSuchDomain),
            Err(e) => Err(e),
        }
    }

    /// The addresses of a host, IPv4 first (loopback test worlds and most of the
    /// world's MX hosts), then IPv6. Empty: the host has none.
    pub async fn addresses(&self, host: &str) -> Result<Vec<IpAddr>, DnsFailure> {
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        match self
            .authenticator
            .ip_lookup(
                host,
                IpLookupStrategy::Ipv4thenIpv6,
                16,
                Some(&self.caches.ipv4),
                Some(&self.caches.ipv6),
            )
            .await
        {
            Ok(addrs) => Ok(addrs),
            Err(e) if is_nxdomain(&e) || is_no_records(&e) => Ok(Vec::new()),
            Err(e) => Err(DnsFailure(e.to_string())),
        }
    }
}

fn is_nxdomain(e: &AuthError) -> bool {
    matches!(e, AuthError::Dns(DnsError::RecordNotFound(code)) if *code == mail_auth::hickory_resolver::proto::op::ResponseCode::NXDomain)
}

fn is_no_records(e: &AuthError) -> bool {
    matches!(e, AuthError::Dns(DnsError::RecordNotFound(_)))
}
