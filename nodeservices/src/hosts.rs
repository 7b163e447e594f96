//! The names the cluster DNS answers for: every Service's cluster IP, and for a
//! headless Service the ready addresses of its EndpointSlices, kept current from
//! the API server's watches (as CoreDNS's kubernetes plugin keeps them).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Mutex;

#[derive(Default)]
struct Inner {
    /// (namespace, name) → cluster IP.
    services: BTreeMap<(String, String), String>,
    /// Services without a cluster IP: DNS answers with their ready addresses.
    headless: BTreeSet<(String, String)>,
    /// (namespace, EndpointSlice) → (its Service's name, ready addresses).
    slices: BTreeMap<(String, String), (String, Vec<Ipv4Addr>)>,
}

pub struct Hosts {
    domain: String,
    inner: Mutex<Inner>,
}

impl Hosts {
    pub fn new(cluster_domain: &str) -> Self {
        Hosts { domain: cluster_domain.to_string(), inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_service(&self, namespace: &str, name: &str, cluster_ip: Option<String>) {
        let mut inner = self.lock();
        let key = (namespace.to_string(), name.to_string());
        if cluster_ip.as_deref() == Some("None") {
            inner.headless.insert(key.clone());
        } else {
            inner.headless.remove(&key);
        }
        match cluster_ip.filter(|ip| !ip.is_empty() && ip != "None") {
            Some(ip) => inner.services.insert(key, ip),
            None => inner.services.remove(&key),
        };
    }

    /// An EndpointSlice's ready addresses (`service` None: the slice is gone).
    pub fn set_slice(&self, namespace: &str, slice: &str, service: Option<String>, ready: Vec<Ipv4Addr>) {
        let mut inner = self.lock();
        let key = (namespace.to_string(), slice.to_string());
        match service {
            Some(service) => inner.slices.insert(key, (service, ready)),
            None => inner.slices.remove(&key),
        };
    }

    /// The addresses of `name.namespace.svc.<domain>` (any case, trailing dot or
    /// not): its cluster IP, or for a headless Service its ready endpoints (no
    /// address while none is ready); None for a name that is no Service.
    pub fn lookup(&self, fqdn: &str) -> Option<Vec<Ipv4Addr>> {
        let name = fqdn.trim_end_matches('.').to_ascii_lowercase();
        let rest = name.strip_suffix(&format!(".svc.{}", self.domain))?;
        let (svc, ns) = rest.split_once('.')?;
        let key = (ns.to_string(), svc.to_string());
        let inner = self.lock();
        if let Some(ip) = inner.services.get(&key) {
            return Some(ip.parse().into_iter().collect());
        }
        if !inner.headless.contains(&key) {
            return None;
        }
        let ready: BTreeSet<Ipv4Addr> = inner
            .slices
            .iter()
            .filter(|((slice_ns, _), (service, _))| *slice_ns == key.0 && *service == key.1)
            .flat_map(|(_, (_, ready))| ready.iter().copied())
            .collect();
        Some(ready.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Ipv4Addr {
        text.parse().unwrap()
    }

    #[test]
    fn headless_services_answer_with_their_ready_endpoints() {
        let hosts = Hosts::new("cluster.local");
        hosts.set_service("ns", "api", Some("10.96.0.5".into()));
        hosts.set_service("ns", "pods", Some("None".into()));
        assert_eq!(hosts.lookup("API.ns.svc.cluster.local."), Some(vec![ip("10.96.0.5")]));
        assert_eq!(hosts.lookup("pods.ns.svc.cluster.local"), Some(vec![]), "no Pod ready yet");
        hosts.set_slice("ns", "pods-abc", Some("pods".into()), vec![ip("10.244.0.9"), ip("10.244.0.3")]);
        hosts.set_slice("ns", "pods-def", Some("pods".into()), vec![ip("10.244.0.7")]);
        hosts.set_slice("other", "pods-x", Some("pods".into()), vec![ip("10.244.0.2")]);
        assert_eq!(
            hosts.lookup("pods.ns.svc.cluster.local"),
            Some(vec![ip("10.244.0.3"), ip("10.244.0.7"), ip("10.244.0.9")]),
            "every slice of the Service, not another namespace's"
        );
        hosts.set_slice("ns", "pods-abc", None, Vec::new());
        assert_eq!(hosts.lookup("pods.ns.svc.cluster.local"), Some(vec![ip("10.244.0.7")]));
        hosts.set_service("ns", "pods", None);
        assert_eq!(hosts.lookup("pods.ns.svc.cluster.local"), None, "the Service is gone");
        assert_eq!(hosts.lookup("nothing.ns.svc.cluster.local"), None);
    }
}
