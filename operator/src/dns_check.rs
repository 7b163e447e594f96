//! Whether the DNS records a `MailDomain` lists are published: each is looked up
//! with hickory-resolver, at the nameservers the operator is given or else the
//! system's (in a pod, the cluster's resolver, which is what the mail pods and,
//! through it, the rest of the world see).
//!
//! A record is `True` when DNS holds a record of its type at its name with its
//! value (TXT compared with whitespace removed, as tag lists ignore it; MX by
//! preference and host, without regard to case), `False` when DNS answers with
//! none that matches (including "no such name"), and `Unknown` when DNS could
//! not be asked (a timeout, a server failure). The MTA-STS policy, a URL, counts
//! as published when its host has an address: the policy document itself is
//! served over HTTPS, which is not the resolver's to check.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ResolverConfig, ResolverOpts};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use mailcluster_api::accounts::DnsRecord;

/// One lookup may take this long before the record is `Unknown`.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The resolver of the checks.
pub struct RecordChecker {
    resolver: TokioResolver,
}

impl RecordChecker {
    /// A resolver asking `nameservers` (UDP, then TCP), or the system's
    /// configured ones when the list is empty. Nothing is cached: a record
    /// published a moment ago is seen at the next check, and a check is rare.
    pub fn new(nameservers: &[SocketAddr]) -> anyhow::Result<RecordChecker> {
        let (config, mut opts) = if nameservers.is_empty() {
            hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| anyhow::anyhow!("cannot read the system's resolver configuration: {e}"))?
        } else {
            let servers = mailcluster_server::dns::name_servers(nameservers);
            (ResolverConfig::from_name_servers(servers), ResolverOpts::default())
        };
        opts.timeout = LOOKUP_TIMEOUT;
        opts.attempts = 1;
        opts.cache_size = 0;
        let resolver = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
            .with_options(opts)
            .build()
            .map_err(|e| anyhow::anyhow!("cannot start the DNS resolver: {e}"))?;
        Ok(RecordChecker { resolver })
    }

    /// `True`, `False` or `Unknown` for `record` (see the module).
    pub async fn published(&self, record: &DnsRecord) -> &'static str {
        let name = record.name.as_str();
        let found = match record.type_.as_str() {
            "TXT" => {
                let wanted = squeezed(&unquoted(&record.value));
                self.resolver.txt_lookup(name).await.map(|lookup| {
                    lookup.answers().iter().any(|r| match &r.data {
                        RData::TXT(txt) => {
                            let joined: Vec<u8> =
                                txt.txt_data.iter().flat_map(|s| s.iter().copied()).collect();
                            squeezed(&String::from_utf8_lossy(&joined)) == wanted
                        }
                        _ => false,
                    })
                })
            }
            "MX" => {
                let wanted = record.value.to_ascii_lowercase();
                self.resolver.mx_lookup(name).await.map(|lookup| {
                    lookup.answers().iter().any(|r| match &r.data {
                        RData::MX(mx) => {
                            format!("{} {}", mx.preference, mx.exchange.to_ascii()).to_ascii_lowercase()
                                == wanted
                        }
                        _ => false,
                    })
                })
            }
            "URL" => self.resolver.lookup_ip(name).await.map(|ips| ips.iter().next().is_some()),
            _ => return "Unknown",
        };
        match found {
            Ok(true) => "True",
            Ok(false) => "False",
            Err(e) if absent(&e) => "False",
            Err(e) => {
                tracing::debug!(record = %name, error = %e, "DNS check failed");
                "Unknown"
            }
        }
    }
}

/// DNS answered that there is no such record or name.
fn absent(e: &NetError) -> bool {
    e.is_no_records_found() || e.is_nx_domain()
}

/// A zone-file TXT value (`"a" "b"`) as the resolver returns it (`ab`).
fn unquoted(value: &str) -> String {
    if !value.starts_with('"') {
        return value.to_string();
    }
    value.split('"').skip(1).step_by(2).collect()
}

fn squeezed(value: &str) -> String {
    value.chars().filter(|c| !c.is_whitespace()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_file_values_read_as_the_resolver_joins_them() {
        assert_eq!(unquoted("\"v=spf1 mx -all\""), "v=spf1 mx -all");
        assert_eq!(unquoted("\"v=DKIM1; p=ab\" \"cd\""), "v=DKIM1; p=abcd");
        assert_eq!(unquoted("10 mx.example.com."), "10 mx.example.com.");
        assert_eq!(squeezed("v=DKIM1; k=ed25519;  p=x"), "v=DKIM1;k=ed25519;p=x");
    }
}
