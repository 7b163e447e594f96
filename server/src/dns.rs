//! The resolver of MX lookups (relay) and sender authentication (inbound): one
//! `mail-auth` authenticator over hickory-resolver, pointed at `dns.nameservers`
//! (or the system's), with this pod's caches of the answers, each kept no longer
//! than its TTL.
//!
//! With a shared cache (Redis in a cluster, [`Dns::with_shared`]) the answers a pod
//! gets are also written there, each for what is left of its TTL, and a pod looks
//! there before it asks DNS: the names known before a check runs (the sender's SPF
//! record, each signature's DKIM key, the From domain's DMARC record) and the
//! relay's MX and address lookups. mail-auth's caches take parsed records and its
//! lookups cannot be intercepted, so for those TXT names the raw records are
//! fetched here, shared raw, and parsed the way mail-auth parses them into this
//! pod's cache, where mail-auth then finds them.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use mail_auth::common::parse::TxtRecordParser;
use mail_auth::common::resolver::ToFqdn;
use mail_auth::hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use mail_auth::hickory_resolver::net::{DnsError as NetDnsError, NetError};
use mail_auth::hickory_resolver::proto::op::ResponseCode;
use mail_auth::hickory_resolver::proto::rr::{Name, RData};
use mail_auth::{
    DnsError, DnssecStatus, Error as AuthError, IpLookupStrategy, MX, MessageAuthenticator, Parameters,
    RecordSet, ResolverCache, Txt,
};
use serde::{Deserialize, Serialize};

use crate::cache::Cache;

use mailcluster_api::config::DnsConfig;

/// Nameservers at these addresses, asked over UDP and then TCP on the same port.
pub fn name_servers(addrs: &[std::net::SocketAddr]) -> Vec<NameServerConfig> {
    addrs
        .iter()
        .map(|addr| {
            let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
            for c in &mut ns.connections {
                c.port = addr.port();
            }
            ns
        })
        .collect()
}

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

    /// A live entry and the time it ends.
    fn get_until<Q>(&self, name: &Q) -> Option<(V, Instant)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(name).filter(|(_, until)| *until > Instant::now()).cloned()
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
    shared: Option<Arc<dyn Cache>>,
}

/// One answer as kept in the shared cache; `until` in Unix milliseconds (pods
/// share a clock closely enough for TTLs of seconds to hours).
#[derive(Serialize, Deserialize)]
struct Shared<T> {
    until: i64,
    answer: T,
}

/// A TXT answer: each record's character-strings joined (base64: records may be
/// binary), or the response code of "no such record".
#[derive(Serialize, Deserialize)]
enum SharedTxt {
    Records(Vec<String>),
    Missing(u16),
}

/// A record as the shared cache keeps it.
trait Wire: Clone + Sized {
    type Form: Serialize + for<'de> Deserialize<'de>;
    fn to_wire(&self) -> Self::Form;
    fn from_wire(form: Self::Form) -> Self;
}

impl Wire for MX {
    type Form = (u16, Vec<String>);
    fn to_wire(&self) -> Self::Form {
        (self.preference, self.exchanges.iter().map(|e| e.to_string()).collect())
    }
    fn from_wire((preference, exchanges): Self::Form) -> Self {
        MX { preference, exchanges: exchanges.into_iter().map(String::into_boxed_str).collect() }
    }
}

impl Wire for Ipv4Addr {
    type Form = Ipv4Addr;
    fn to_wire(&self) -> Self::Form {
        *self
    }
    fn from_wire(form: Self::Form) -> Self {
        form
    }
}

impl Wire for Ipv6Addr {
    type Form = Ipv6Addr;
    fn to_wire(&self) -> Self::Form {
        *self
    }
    fn from_wire(form: Self::Form) -> Self {
        form
    }
}

/// Shared answers shorter-lived than this are not worth a round trip.
const SHARED_MIN_TTL: Duration = Duration::from_secs(1);

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
            MessageAuthenticator::new(
                ResolverConfig::from_name_servers(name_servers(&config.nameservers)),
                opts,
            )
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
            shared: None,
        })
    }

    /// Shares answers with every other pod through `cache` (see the module).
    pub fn with_shared(mut self, cache: Arc<dyn Cache>) -> Dns {
        self.shared = Some(cache);
        self
    }

    /// Makes the TXT record at `name`, parsed as `T`, present in this pod's cache:
    /// from the shared cache, or asked here and then shared. Does nothing without a
    /// shared cache, when this pod has the answer, or when DNS fails (mail-auth
    /// then asks itself and reports the failure as it always does).
    pub async fn share_txt<T: TxtRecordParser + Into<Txt>>(&self, name: &str) {
        let Some(shared) = &self.shared else { return };
        let fqdn = name.to_fqdn();
        if self.caches.txt.get_until::<str>(&fqdn).is_some() {
            return;
        }
        let key = format!("dns:txt:{fqdn}");
        if let Ok(Some(raw)) = shared.value_get(&key).await
            && let Ok(entry) = serde_json::from_slice::<Shared<SharedTxt>>(&raw)
            && let Some(until) = instant_of(entry.until)
        {
            let txt = match entry.answer {
                SharedTxt::Records(records) => {
                    let records: Vec<Vec<u8>> = records
                        .iter()
                        .filter_map(|r| base64::engine::general_purpose::STANDARD.decode(r).ok())
                        .collect();
                    parse_txt::<T>(&records)
                }
                SharedTxt::Missing(code) => missing(code),
            };
            self.caches.txt.insert(fqdn.into_owned().into_boxed_str(), txt, until);
            return;
        }
        let Ok(qname) = Name::from_str_relaxed(fqdn.as_ref()) else { return };
        let (answer, txt, until) = match self.authenticator.0.txt_lookup(qname).await {
            Ok(lookup) => {
                let records = txt_records(lookup.answers().iter().map(|r| &r.data));
                let txt = parse_txt::<T>(&records);
                let encoded =
                    records.iter().map(|r| base64::engine::general_purpose::STANDARD.encode(r)).collect();
                (SharedTxt::Records(encoded), txt, lookup.valid_until())
            }
            Err(NetError::Dns(NetDnsError::NoRecordsFound(none))) => {
                // Without an SOA there is no negative TTL: nothing to share.
                let Some(ttl) = none.negative_ttl else { return };
                let ttl = Duration::from_secs(u64::from(ttl)).min(NEGATIVE_MAX_TTL);
                let code = u16::from(none.response_code);
                (SharedTxt::Missing(code), missing(code), Instant::now() + ttl)
            }
            Err(_) => return,
        };
        self.caches.txt.insert(fqdn.clone().into_owned().into_boxed_str(), txt, until);
        put_shared(shared.as_ref(), &key, answer, until).await;
    }

    /// Before a lookup of `name` in one of this pod's record-set caches: the shared
    /// answer, if any, copied into it. True when the lookup will find its answer in
    /// this pod (or nothing is shared): then there is nothing new to share after it.
    async fn share_in<T: Wire>(
        &self,
        kind: &str,
        name: &str,
        cache: &TtlCache<Box<str>, RecordSet<T>>,
    ) -> bool {
        let Some(shared) = &self.shared else { return true };
        let fqdn = name.to_fqdn();
        if cache.get_until::<str>(&fqdn).is_some() {
            return true;
        }
        if let Ok(Some(raw)) = shared.value_get(&format!("dns:{kind}:{fqdn}")).await
            && let Ok(entry) = serde_json::from_slice::<Shared<Vec<T::Form>>>(&raw)
            && let Some(until) = instant_of(entry.until)
        {
            let rrset: Vec<T> = entry.answer.into_iter().map(T::from_wire).collect();
            let set = RecordSet { rrset: rrset.into(), dnssec_status: DnssecStatus::Indeterminate };
            cache.insert(fqdn.into_owned().into_boxed_str(), set, until);
            return true;
        }
        false
    }

    /// After a lookup of `name` that asked DNS: what this pod's cache now holds, shared.
    async fn share_out<T: Wire>(&self, kind: &str, name: &str, cache: &TtlCache<Box<str>, RecordSet<T>>) {
        let Some(shared) = &self.shared else { return };
        let fqdn = name.to_fqdn();
        if let Some((set, until)) = cache.get_until::<str>(&fqdn) {
            let answer: Vec<T::Form> = set.rrset.iter().map(T::to_wire).collect();
            put_shared(shared.as_ref(), &format!("dns:{kind}:{fqdn}"), answer, until).await;
        }
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
        // A cached answer is not written back: only one that came from DNS.
        let known = self.share_in("mx", domain, &self.caches.mx).await;
        let looked_up = self.authenticator.mx_lookup(domain, Some(&self.caches.mx)).await;
        if !known {
            self.share_out("mx", domain, &self.caches.mx).await;
        }
        match looked_up {
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
        let known_v4 = self.share_in("a", host, &self.caches.ipv4).await;
        let known_v6 = self.share_in("aaaa", host, &self.caches.ipv6).await;
        let looked_up = self
            .authenticator
            .ip_lookup(
                host,
                IpLookupStrategy::Ipv4thenIpv6,
                16,
                Some(&self.caches.ipv4),
                Some(&self.caches.ipv6),
            )
            .await;
        if !known_v4 {
            self.share_out("a", host, &self.caches.ipv4).await;
        }
        if !known_v6 {
            self.share_out("aaaa", host, &self.caches.ipv6).await;
        }
        match looked_up {
            Ok(addrs) => Ok(addrs),
            Err(e) if is_nxdomain(&e) || is_no_records(&e) => Ok(Vec::new()),
            Err(e) => Err(DnsFailure(e.to_string())),
        }
    }
}

/// The records of a TXT answer as mail-auth reads them: each record's
/// character-strings joined.
fn txt_records<'a>(data: impl Iterator<Item = &'a RData>) -> Vec<Vec<u8>> {
    data.filter_map(|d| match d {
        RData::TXT(txt) => Some(txt.txt_data.iter().flat_map(|s| s.iter().copied()).collect()),
        _ => None,
    })
    .filter(|r: &Vec<u8>| !r.is_empty())
    .collect()
}

/// mail-auth's reading of TXT records as `T`: the first record that parses, else the
/// last error (or "no record of this type").
fn parse_txt<T: TxtRecordParser + Into<Txt>>(records: &[Vec<u8>]) -> Txt {
    let mut result = Err(AuthError::Dns(DnsError::InvalidRecordType));
    for record in records {
        result = T::parse(record);
        if result.is_ok() {
            break;
        }
    }
    result.into()
}

/// "No such record", as mail-auth reports it from a lookup.
fn missing(code: u16) -> Txt {
    Txt::Error(AuthError::Dns(DnsError::RecordNotFound(<ResponseCode as From<u16>>::from(code))))
}

fn unix_ms_of(until: Instant) -> i64 {
    let left = until.saturating_duration_since(Instant::now());
    chrono::Utc::now().timestamp_millis() + i64::try_from(left.as_millis()).unwrap_or(i64::MAX / 2)
}

/// The local instant of a shared expiry; `None` once it has passed.
fn instant_of(unix_ms: i64) -> Option<Instant> {
    let left = unix_ms - chrono::Utc::now().timestamp_millis();
    (left > 0).then(|| Instant::now() + Duration::from_millis(left.unsigned_abs()))
}

/// Writes one answer to the shared cache for what is left of its TTL. A cache
/// that does not answer costs only the sharing.
async fn put_shared<T: Serialize>(shared: &dyn Cache, key: &str, answer: T, until: Instant) {
    let ttl = until.saturating_duration_since(Instant::now());
    if ttl < SHARED_MIN_TTL {
        return;
    }
    let entry = Shared { until: unix_ms_of(until), answer };
    if let Ok(raw) = serde_json::to_vec(&entry) {
        let _ = shared.value_put(key, &raw, ttl).await;
    }
}

fn is_nxdomain(e: &AuthError) -> bool {
    matches!(e, AuthError::Dns(DnsError::RecordNotFound(code)) if *code == mail_auth::hickory_resolver::proto::op::ResponseCode::NXDomain)
}

fn is_no_records(e: &AuthError) -> bool {
    matches!(e, AuthError::Dns(DnsError::RecordNotFound(_)))
}
