//! Service names inside Pods: the node writes each Pod's /etc/hosts with every
//! Service's cluster IP under the names cluster DNS would answer for
//! (`name.namespace.svc.cluster.local`, `name.namespace.svc`, `name.namespace`, and
//! `name` within the Pod's namespace), and rewrites the files in place whenever a
//! Service changes, so the bind mount in the Pod sees the new content.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Result;

struct Entry {
    hostname: String,
    ip: Ipv4Addr,
    namespace: String,
}

#[derive(Default)]
struct Inner {
    /// (namespace, name) → cluster IP.
    services: BTreeMap<(String, String), String>,
    /// Services without a cluster IP: DNS answers with their ready addresses.
    headless: BTreeSet<(String, String)>,
    /// (namespace, EndpointSlice) → (its Service's name, ready addresses).
    slices: BTreeMap<(String, String), (String, Vec<Ipv4Addr>)>,
    files: BTreeMap<PathBuf, Entry>,
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

    fn render(&self, inner: &Inner, e: &Entry) -> String {
        let mut out = format!(
            "# Written by the test node; Service names as cluster DNS answers them.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n",
            e.ip, e.hostname
        );
        for ((ns, name), ip) in &inner.services {
            let short = if *ns == e.namespace { format!(" {name}") } else { String::new() };
            out.push_str(&format!(
                "{ip}\t{name}.{ns}.svc.{} {name}.{ns}.svc {name}.{ns}{short}\n",
                self.domain
            ));
        }
        out
    }

    fn write(&self, inner: &Inner, path: &Path, e: &Entry) -> Result<()> {
        // Truncate and write the same inode: a bind mount follows the inode, not the name.
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
        f.write_all(self.render(inner, e).as_bytes())?;
        Ok(())
    }

    pub fn register(&self, path: PathBuf, hostname: String, ip: Ipv4Addr) -> Result<()> {
        let mut inner = self.lock();
        let namespace = path
            .file_name()
            .and_then(|_| path.parent())
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('_').next())
            .unwrap_or("default")
            .to_string();
        let e = Entry { hostname, ip, namespace };
        self.write(&inner, &path, &e)?;
        inner.files.insert(path, e);
        Ok(())
    }

    pub fn forget(&self, path: &Path) {
        self.lock().files.remove(path);
    }

    pub fn set_service(&self, namespace: &str, name: &str, cluster_ip: Option<String>) {
        let mut inner = self.lock();
        let key = (namespace.to_string(), name.to_string());
        if cluster_ip.as_deref() == Some("None") {
            inner.headless.insert(key.clone());
        } else {
            inner.headless.remove(&key);
        }
        let changed = match cluster_ip.filter(|ip| !ip.is_empty() && ip != "None") {
            Some(ip) => inner.services.insert(key, ip.clone()).as_deref() != Some(ip.as_str()),
            None => inner.services.remove(&key).is_some(),
        };
        if changed {
            for (path, e) in &inner.files {
                if let Err(err) = self.write(&inner, path, e) {
                    tracing::warn!("rewrite {}: {err}", path.display());
                }
            }
        }
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

    /// /etc/resolv.conf of a Pod in `namespace` (dnsPolicy ClusterFirst).
    pub fn resolv_conf(&self, nameserver: Ipv4Addr, namespace: &str) -> String {
        let d = &self.domain;
        format!("nameserver {nameserver}\nsearch {namespace}.svc.{d} svc.{d} {d}\noptions ndots:5\n")
    }

    /// The variables every container gets for the API server, as the kubelet sets
    /// them even with `enableServiceLinks: false`.
    pub fn api_server_env(&self) -> Vec<(String, String)> {
        let inner = self.lock();
        let mut env = vec![(
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        )];
        if let Some(ip) = inner.services.get(&("default".to_string(), "kubernetes".to_string())) {
            env.extend([
                ("KUBERNETES_SERVICE_HOST".to_string(), ip.clone()),
                ("KUBERNETES_SERVICE_PORT".to_string(), "443".to_string()),
                ("KUBERNETES_SERVICE_PORT_HTTPS".to_string(), "443".to_string()),
                ("KUBERNETES_PORT".to_string(), format!("tcp://{ip}:443")),
                ("KUBERNETES_PORT_443_TCP".to_string(), format!("tcp://{ip}:443")),
                ("KUBERNETES_PORT_443_TCP_PROTO".to_string(), "tcp".to_string()),
                ("KUBERNETES_PORT_443_TCP_PORT".to_string(), "443".to_string()),
                ("KUBERNETES_PORT_443_TCP_ADDR".to_string(), ip.clone()),
            ]);
        }
        env
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
